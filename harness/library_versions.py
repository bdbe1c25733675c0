"""The library versions a skip row is scoped by (CONTRACTS "Engine TOML", `seen_with`):
which versions of torch, cuDNN, Triton and the GPU driver this process runs with, and the
small version-specifier language a row names them in.

Versions are spelled as run.json's `versions` spells them: torch's own string
("2.11.0+cu130"), Triton's package version, cuDNN as torch reports it ("91900" for 9.19.0)
and the driver as nvidia-smi prints it ("580.159.04"). cuDNN and the driver belong to an
NVIDIA GPU: on any other arch (a CPU run, ROCm) they are absent, so a row scoped to a cuDNN
or driver version never applies there.

A specifier is one or more clauses joined by commas, all of which must hold:
`2.11.*` (any 2.11 release), `9.19.0` (that release: `==` is implied), `>=9.10, <9.20`,
`!=2.12.*`. Versions compare by their release numbers (the leading dotted integers, zeros
padded: 9.19 == 9.19.0); pre-release, dev and local labels (`a0`, `.dev2026`, `+cu130`) are
ignored, so a nightly or a CUDA build of a release counts as that release."""
from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass

#: the libraries a row may be scoped by, as run.json's `versions` names them
LIBRARIES = ("torch", "cudnn", "triton", "driver")
#: the libraries only an NVIDIA GPU arch (sm*) has
GPU_LIBRARIES = frozenset({"cudnn", "driver"})
OPERATORS = ("==", "!=", ">=", "<=", ">", "<")
_RELEASE = r"\d+(?:\.\d+)*"
#: one clause of a specifier: an optional operator (== when none), a release, an optional .*
CLAUSE_RE = re.compile(rf"^\s*(==|!=|>=|<=|>|<)?\s*({_RELEASE})(\.\*)?\s*$")
#: a whole specifier as one regular expression (the JSON Schema's pattern): clauses joined by
#: commas, a wildcard only after ==, != or no operator
_CLAUSE_TEXT = rf"\s*(?:(?:==|!=)?\s*{_RELEASE}(?:\.\*)?|(?:>=|<=|>|<)\s*{_RELEASE})\s*"
SPECIFIER_PATTERN = rf"^{_CLAUSE_TEXT}(?:,{_CLAUSE_TEXT})*$"
RELEASE_RE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")


class BadSpecifier(ValueError):
    """A version specifier that is not `[op]N(.N)*[.*]` clauses joined by commas."""


@dataclass(frozen=True)
class Clause:
    operator: str               # one of OPERATORS
    release: tuple[int, ...]
    prefix: bool = False        # `2.11.*`: the leading numbers match

    def holds(self, have: tuple[int, ...]) -> bool:
        if self.prefix:
            same = _padded(have, len(self.release))[:len(self.release)] == self.release
            return same if self.operator == "==" else not same
        width = max(len(have), len(self.release))
        a, b = _padded(have, width), _padded(self.release, width)
        return {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[self.operator]


@dataclass(frozen=True)
class Specifier:
    text: str                   # as written, for messages
    clauses: tuple[Clause, ...]

    def admits(self, library: str, version: str | None) -> bool:
        """Whether `version` (as run.json spells it; None: absent) satisfies every clause;
        an absent or unreadable version satisfies none."""
        release = release_of(library, version)
        return release is not None and all(c.holds(release) for c in self.clauses)


def parse_specifier(text: str) -> Specifier:
    if not isinstance(text, str) or not text.strip():
        raise BadSpecifier(f"{text!r}: expected a version specifier such as '2.11.*' or '>=9.10, <9.20'")
    clauses = []
    for part in text.split(","):
        found = CLAUSE_RE.match(part)
        if found is None:
            raise BadSpecifier(f"{text!r}: {part.strip()!r} is not a version clause "
                               f"([{'|'.join(OPERATORS)}]N.N[.*])")
        operator, release, star = found.group(1) or "==", found.group(2), bool(found.group(3))
        if star and operator not in ("==", "!="):
            raise BadSpecifier(f"{text!r}: a wildcard (.*) goes only with == or !=")
        clauses.append(Clause(operator, tuple(int(n) for n in release.split(".")), star))
    return Specifier(text=text.strip(), clauses=tuple(clauses))


def release_of(library: str, version: str | None) -> tuple[int, ...] | None:
    """The release numbers of a version as run.json spells it: cuDNN's integer decoded
    (9.x and later: major*10000 + minor*100 + patch; 8.x: major*1000 + minor*100 + patch),
    any other version's leading dotted integers. None when absent or unreadable."""
    if version is None:
        return None
    text = str(version).strip()
    if library == "cudnn" and text.isdigit():
        n = int(text)
        return (n // 10000, n // 100 % 100, n % 100) if n >= 10000 else (n // 1000, n // 100 % 10, n % 100)
    found = RELEASE_RE.match(text)
    return None if found is None else tuple(int(n) for n in found.group(1).split("."))


def _padded(release: tuple[int, ...], width: int) -> tuple[int, ...]:
    return release + (0,) * max(0, width - len(release))


def present_on(library: str, arch: str) -> bool:
    """cuDNN and the driver only on an NVIDIA GPU arch; torch and Triton anywhere."""
    return library not in GPU_LIBRARIES or arch.startswith("sm")


@functools.cache
def running_version(library: str, arch: str) -> str | None:
    """This process's version of `library`, spelled as run.json spells it, for a case on
    `arch`; None where absent. Read on first use only (torch is imported then, and the driver
    asked through nvidia-smi), so a run whose skip rows name no version reads none."""
    if library not in LIBRARIES:
        raise KeyError(library)
    if not present_on(library, arch):
        return None
    if library == "triton":
        from importlib import metadata
        try:
            return metadata.version("triton")
        except metadata.PackageNotFoundError:
            return None
    if library == "driver":
        return _nvidia_driver()
    import torch

    if library == "torch":
        return str(torch.__version__)
    return str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None


def _nvidia_driver() -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None
