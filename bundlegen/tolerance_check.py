"""What a run checks of the numbers that judge it, before a worker starts:

1. The tolerance TOML against the plan's own derivation. The numbers of every class are a
   function of the plan (its declared error model): a run that can import the plan (always
   for the built-in one) derives them again and refuses a class whose numbers differ, so a
   hand edit of the TOML, even with its digest rewritten in the manifest, is seen. The
   comparison is field by field over every numeric field of the class record (rtol, atol,
   max_reduction and any the record gains later), so a new field needs no new rule.
2. Ceilings per dtype: no class and no override row may have an rtol above the loosest one
   the error model derives for its dtype (the longest reduction bucket), times a slack
   (TOLERANCE_SLACK) an engine's documented override may take, nor an atol above that same
   ceiling (an element of magnitude about 1 may be off by no more than the loosest relative
   bound allows). 1.0 would pass a gradient wrong by its whole size.
3. The generated block of an engine TOML (bundlegen.tolerance_block) against the tolerance
   TOML it records: a block edited by hand, or left behind by a regenerate, is refused
   (unless the run is told --allow-stale-tolerances, which every result then records).

Each refusal is one line naming the file, the class or row, and both numbers."""
from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from pathlib import Path
from typing import Mapping

from bundlegen.tolerance import Tolerance
from bundlegen.tolerance_block import BEGIN, END, block_text
from bundlegen.tolerances import tolerances_name

#: how far above the loosest derived bound of its dtype an override may go: an engine that
#: sums in another order may need some room, never an order of magnitude
TOLERANCE_SLACK = 4.0
#: the fields of a class record that are its identity or words for a reviewer, not numbers
#: the derivation fixes
NOT_DERIVED = ("source", "name", "dtype", "covers", "derivation")
DIGEST_RE = re.compile(r"\((sha256:[0-9a-f]+)\)")


def numeric_fields(tc: Tolerance) -> dict[str, float]:
    """Every numeric field of a class record, by name (bools are not numbers here)."""
    out = {}
    for f in dataclasses.fields(tc):
        value = getattr(tc, f.name)
        if f.name not in NOT_DERIVED and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f.name] = value
    return out


def derivation_mismatches(classes: Mapping[str, Tolerance], derived: Mapping[str, Tolerance],
                          file: str, used: frozenset[str] | None = None) -> list[str]:
    """One line per class (of `used`, default every class) whose numbers in the tolerance
    TOML `file` differ from the plan's derivation, or which the derivation does not know."""
    out = []
    for name in sorted(classes if used is None else used & set(classes)):
        want = derived.get(name)
        if want is None:
            out.append(f"{file}: class {name}: the plan derives no such class (derived: {', '.join(sorted(derived))})")
            continue
        have_fields, want_fields = numeric_fields(classes[name]), numeric_fields(want)
        for key in sorted(set(have_fields) | set(want_fields)):
            have, expected = have_fields.get(key), want_fields.get(key)
            if have is None or expected is None or not _same(have, expected):
                out.append(f"{file}: class {name}: {key} is {have!r}, the plan derives {expected!r} "
                           "(edited by hand? run `bundlegen generate`)")
    return out


def _same(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def ceilings(derived: Mapping[str, Tolerance]) -> dict[str, tuple[float, float]]:
    """dtype -> (rtol ceiling, atol ceiling): the loosest derived rtol of the dtype times
    TOLERANCE_SLACK, for both (see the module's doc)."""
    out: dict[str, tuple[float, float]] = {}
    for tc in derived.values():
        ceiling = max(out.get(tc.dtype, (0.0, 0.0))[0], tc.rtol * TOLERANCE_SLACK, tc.atol)
        out[tc.dtype] = (ceiling, ceiling)
    return out


def ceiling_problem(rtol: float, atol: float, dtype: str | None,
                    limits: Mapping[str, tuple[float, float]]) -> str | None:
    """Why an override row's numbers exceed the ceilings (of `dtype`; of the loosest dtype
    when the row names none), else None."""
    if not limits:
        return None
    rtol_max, atol_max = limits[dtype] if dtype in limits else (max(v[0] for v in limits.values()),
                                                                 max(v[1] for v in limits.values()))
    of = f"for {dtype}" if dtype in limits else "for any dtype"
    if rtol > rtol_max:
        return f"rtol {rtol!r} is above the ceiling {rtol_max!r} {of} ({TOLERANCE_SLACK:g} x the loosest derived rtol)"
    if atol > atol_max:
        return f"atol {atol!r} is above the ceiling {atol_max!r} {of} ({TOLERANCE_SLACK:g} x the derived atol)"
    return None


# ----------------------------------------------------------------------------- engine TOML block
@dataclasses.dataclass(frozen=True)
class StaleBlock:
    path: str
    recorded: str        # the tolerance TOML digest the block says it was written from
    current: str         # the digest of the tolerance TOML the run reads

    def message(self) -> str:
        return (f"{self.path}: the generated tolerance block does not match the tolerance TOML "
                f"(block records {self.recorded or 'no digest'}, the run reads {self.current}"
                f"{'' if self.recorded != self.current else ', rows edited by hand'}): run "
                f"`bundlegen tolerances --engine-toml {self.path}`, or pass --allow-stale-tolerances")


def stale_block(path: Path | str, text: str, plan: str, classes: Mapping[str, Tolerance],
                digest: str) -> StaleBlock | None:
    """The engine TOML `text`'s generated block, when it is for `plan` and differs from the
    block the tolerance TOML (`classes`, `digest`) gives; None when it matches, or when the
    file has no block, or a block of another plan."""
    lines = text.replace("\r\n", "\n").split("\n")
    if BEGIN not in lines or END not in lines:
        return None
    begin, end = lines.index(BEGIN), lines.index(END)
    held = "\n".join(lines[begin:end + 1])
    try:
        rows = tomllib.loads(held).get("tolerance_overrides", [])
    except tomllib.TOMLDecodeError:
        rows = None          # a block that does not parse is stale by any measure
    if rows is not None and rows and not any(r.get("filters", {}).get("plan") == plan for r in rows):
        return None
    want = block_text(plan, classes, tolerances_name(plan), digest)
    if held == want:
        return None
    found = DIGEST_RE.search(held)
    return StaleBlock(str(path), found.group(1) if found else "", digest)


# ----------------------------------------------------------------------------- the plan's derivation
BUILTIN_PLAN_MODULE = "bundlegen.plans.sdpa_bwd"


def derived_classes(plan: str) -> Mapping[str, Tolerance] | None:
    """The tolerance classes plan `plan` derives, from its module (the workspace's plan
    modules, then the built-in one; an extension's are the classes of the plan it
    extends); None when no importable module declares that plan. A plan module is a
    declaration: importing it runs no harness code, and the run imports only by name."""
    from bundlegen.workspace import find_workspace

    workspace = find_workspace()
    names = [*(workspace.plans if workspace is not None else ()), BUILTIN_PLAN_MODULE]
    for name in dict.fromkeys(names):
        declared = _plan_of(name, workspace.root if workspace is not None else None)
        if getattr(declared, "name", None) != plan:
            continue
        extends = getattr(declared, "extends", None)
        if isinstance(extends, str):
            declared = _plan_of(extends, None)
        classes = getattr(declared, "tolerance_classes", None)
        return classes if isinstance(classes, Mapping) else None
    return None


def builtin_ceilings() -> dict[str, tuple[float, float]]:
    """The ceilings of the built-in plan's error model (every run can derive them)."""
    classes = getattr(_plan_of(BUILTIN_PLAN_MODULE, None), "tolerance_classes", None) or {}
    return ceilings(classes)


def _plan_of(module_name: str, root: Path | None):
    """The PLAN of a module, imported with the workspace folder on sys.path; None when it
    does not import (an extension's own faults are `bundlegen generate`'s to report)."""
    import importlib
    import sys

    added = root is not None and str(root) not in sys.path
    if added:
        sys.path.insert(0, str(root))
    try:
        return getattr(importlib.import_module(module_name), "PLAN", None)
    except (Exception, SystemExit):
        return None
    finally:
        if added:
            sys.path.remove(str(root))
