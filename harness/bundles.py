"""Finding and loading the bundles of a level and every lower level
(`bundles/<level>/sdpa_bwd/<group>.json`). A malformed file or case becomes a
BundleError beside the good cases; it never stops the others from loading."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bundlegen.graph import BundleError, Case, load_bundle

PLAN = "sdpa_bwd"
#: the CONTRACTS order, used only while plans/sdpa_bwd.py does not exist
DEFAULT_LEVELS = ("quick", "pr", "nightly", "full")


def level_names() -> tuple[str, ...]:
    try:
        from bundlegen.plans.sdpa_bwd import LEVELS
    except ImportError:
        return DEFAULT_LEVELS
    return tuple(level.name for level in LEVELS)


def levels_upto(level: str) -> tuple[str, ...]:
    """The level and every lower one, lowest first."""
    names = level_names()
    if level not in names:
        raise ValueError(f"unknown level {level!r} (known: {', '.join(names)})")
    return names[: names.index(level) + 1]


def default_bundle_root() -> Path:
    try:
        from bundlegen.generator.paths import BUNDLE_ROOT
    except ImportError:
        return Path(__file__).resolve().parent.parent / "bundles"
    return Path(BUNDLE_ROOT)


@dataclass(frozen=True)
class LoadedCases:
    cases: tuple[Case, ...]
    errors: tuple[BundleError, ...]
    files: tuple[Path, ...]


def bundle_files(root: Path, level: str) -> list[Path]:
    return sorted((Path(root) / level / PLAN).glob("*.json"))


def load_level(root: Path | str, level: str) -> LoadedCases:
    """Every case of `level` and the lower levels, in level then file order."""
    cases: list[Case] = []
    errors: list[BundleError] = []
    files: list[Path] = []
    seen: dict[str, str] = {}  # case id -> file
    for lvl in levels_upto(level):
        for path in bundle_files(Path(root), lvl):
            files.append(path)
            file_cases, file_errors = _load_file(path, lvl)
            errors.extend(file_errors)
            for case in file_cases:
                if case.id in seen:
                    errors.append(BundleError(f"duplicate id (first in {seen[case.id]})",
                                              file=str(path), case_id=case.id, field="id"))
                    continue
                seen[case.id] = str(path)
                cases.append(case)
    return LoadedCases(cases=tuple(cases), errors=tuple(errors), files=tuple(files))


def _load_file(path: Path, level: str) -> tuple[list[Case], list[BundleError]]:
    try:
        bundle, errors = load_bundle(path)
    except BundleError as exc:
        return [], [exc]
    file = str(path)
    # The file's place decides its level and group; a header that disagrees is a defect.
    for fieldname, have, want in (("plan", bundle.plan, PLAN), ("level", bundle.level, level),
                                  ("group", bundle.group, path.stem)):
        if have != want:
            return [], [*errors, BundleError(f"is {have!r} but the file lies at {want!r}",
                                             file=file, case_id="-", field=fieldname)]
    return list(bundle.cases), list(errors)


def error_location(error: BundleError) -> tuple[str, str]:
    """(level, group) of a malformed file, read from its path."""
    path = Path(error.file)
    return (path.parent.parent.name, path.stem)


def case_file(case: Case) -> str:
    """The bundle file of a loaded case, relative to the bundle root (its place is checked
    against its header when it is loaded)."""
    return f"{case.level}/{PLAN}/{case.group}.json" if case.level else ""
