"""Where the CI workflow gets bundlegen: lanes.yaml's `install` lines must bring it from a
source that resolves on a fresh runner. bundlegen is not on the public package index, so a
bare `pip install bundlegen` would fail there (or install someone else's package of that
name); what resolves is

- a git URL pinned to a tag or commit: `"bundlegen[report] @ git+https://host/bundlegen.git@v1.0"`
  or `git+https://host/bundlegen.git@<sha>#egg=bundlegen`;
- a wheel: `wheels/bundlegen-1.0-py3-none-any.whl` (a path or URL);
- a checkout of bundlegen: a folder whose pyproject.toml names the project `bundlegen`
  (this repository's own `pip install -e ".[triton,report]"`);
- the name from an index the line names (`--index-url`, `--extra-index-url`, `--find-links`).

install_problem says, in one line naming the file, why the lines do not."""
from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

from bundlegen.workspace import find_workspace

#: pip options whose next word is their value, not a requirement
VALUE_OPTIONS = frozenset({"-r", "--requirement", "-c", "--constraint", "-i", "--index-url",
                           "--extra-index-url", "-f", "--find-links", "--target", "-t", "--prefix",
                           "--root", "--upgrade-strategy", "--python", "--only-binary", "--no-binary"})
#: pip options that name where packages come from besides the public index
INDEX_OPTIONS = frozenset({"-i", "--index-url", "--extra-index-url", "-f", "--find-links"})
NAMED_RE = re.compile(r"^bundlegen(\[[^\]]*\])?\s*(?:@\s*(\S+))?$", re.I)
EXTRAS_RE = re.compile(r"\[[^\]]*\]$")
EXAMPLE = 'python -m pip install "bundlegen[report] @ git+https://example.org/bundlegen.git@v1.0"'


def install_problem(lanes) -> str | None:
    """None when some install line brings bundlegen from a source that resolves; else one
    line naming lanes.yaml and what to write."""
    where = f"{lanes.path}: install"
    if lanes.install is None:
        return (f"{where}: missing: name where the workflow gets bundlegen (not on the package index); "
                f"e.g. {EXAMPLE}")
    root = _root(lanes.path)
    refused = []
    for line in lanes.install:
        for verdict in _bundlegen_sources(line, root):
            if verdict is None:
                return None
            refused.append(verdict)
    if refused:
        return f"{where}: {refused[0]}; e.g. {EXAMPLE}"
    return f"{where}: no line installs bundlegen; e.g. {EXAMPLE}"


def _root(lanes_path: Path) -> Path:
    workspace = find_workspace(lanes_path.parent)
    return workspace.root if workspace is not None else lanes_path.parent


def _bundlegen_sources(line: str, root: Path) -> list[str | None]:
    """For each requirement of a `pip install` line that is bundlegen: None when it resolves,
    else why not."""
    try:
        words = shlex.split(line)
    except ValueError:
        return []
    if "install" not in words or not any(w == "pip" or w.endswith("/pip") or w == "pip3" for w in words):
        return []
    after = words[words.index("install") + 1:]
    requirements, has_index, skip = [], False, False
    for word in after:
        if skip:
            skip = False
            continue
        option = word.split("=", 1)[0]
        if option in INDEX_OPTIONS:
            has_index = True
        if word in VALUE_OPTIONS:
            skip = True
        elif not word.startswith("-"):
            requirements.append(word)
    return [verdict for req in requirements if (verdict := _verdict(req, root, has_index)) != "other"]


def _verdict(requirement: str, root: Path, has_index: bool) -> str | None:
    """None: bundlegen, resolvable; a reason: bundlegen, not resolvable; "other": not bundlegen."""
    named = NAMED_RE.match(requirement)
    if named:
        url = named.group(2)
        if url is None:
            return None if has_index else (f"{requirement!r} asks the public package index, which has no "
                                           "bundlegen: give a pinned git URL, a wheel or a checkout")
        return _url_verdict(url)
    if requirement.startswith("git+") and "egg=bundlegen" in requirement:
        return _url_verdict(requirement)
    name = requirement.rsplit("/", 1)[-1]
    if name.endswith(".whl"):
        return None if name.lower().startswith("bundlegen-") else "other"
    folder = Path(EXTRAS_RE.sub("", requirement))
    if requirement.startswith((".", "/")) or (root / folder / "pyproject.toml").is_file():
        return None if _project_name(root / folder) == "bundlegen" else "other"
    return "other"


def _url_verdict(url: str) -> str | None:
    if url.startswith("git+"):
        return None if _pinned(url) else (f"{url!r} is not pinned: add @<tag or commit> "
                                                      "so every run tests the same bundlegen")
    return None if url.endswith(".whl") or url.startswith("file:") else f"{url!r}: expected git+URL@ref or a wheel"


def _pinned(url: str) -> bool:
    """git+<scheme>://host/path@<ref>: a ref after the repository's path (the host's own
    `user@` does not count)."""
    body = url[len("git+"):].split("#", 1)[0]
    path = body.split("://", 1)[-1].partition("/")[2]
    return "@" in path.rsplit("/", 1)[-1] and not path.endswith("@")


def _project_name(folder: Path) -> str | None:
    try:
        return tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
