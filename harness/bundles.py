"""Finding and loading the bundles of a level and every lower level
(`<bundle root>/<level>/<plan>/<group>.json`, levels and plan from the root's manifest).
A malformed file or case becomes a BundleError beside the good cases; it never stops the
others from loading; a missing or malformed manifest is a BundleError raised.

A workspace plan that extends the built-in one (bundlegen.plans.extension) has two layers:
the built-in plan's bundles, read where the package installed them, less the cases of the
items the extension removes or gates, and the extension's own bundles, which hold only the
cases it adds. A run loads both as one level."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bundlegen.graph import BundleError, Case, load_bundle
from bundlegen.manifest import Manifest, load_manifest, manifest_path
from bundlegen.tolerance import Tolerance
from bundlegen.tolerance_rule import NoClass, class_for
from bundlegen.validate import stray_reach_problem
from bundlegen.workspace import builtin_bundle_root, default_bundle_root


def manifest_of(root: Path | str | None = None, plan: str | None = None) -> Manifest:
    """The manifest of `plan` (default: the only plan) in bundle root `root` (default: the
    workspace's generated bundles, else the built-in ones). BundleError when there is none."""
    return load_manifest(default_bundle_root() if root is None else root, plan)


def levels_upto(level: str, root: Path | str | None = None, plan: str | None = None) -> tuple[str, ...]:
    """The level and every lower one, lowest first, in the manifest's order."""
    return manifest_of(root, plan).levels_upto(level)


@dataclass(frozen=True)
class LoadedCases:
    cases: tuple[Case, ...]
    errors: tuple[BundleError, ...]
    files: tuple[Path, ...]
    manifest: Manifest
    file_of: Mapping[str, Path] = field(default_factory=dict)    # case id -> the bundle file it came from


def bundle_files(root: Path, level: str, plan: str) -> list[Path]:
    """The level's bundle files: `*.json`, less dotfiles (an editor's backup, `.hidden.json`),
    which pathlib's glob would match and no generator writes."""
    return sorted(p for p in (Path(root) / level / plan).glob("*.json") if not p.name.startswith("."))


@dataclass(frozen=True)
class Layer:
    """One plan's bundles in one bundle root, less the cases of `removed` items."""
    root: Path
    plan: str
    removed: frozenset[str] = frozenset()

    def leaves_out(self, case: Case) -> bool:
        return not self.removed.isdisjoint(case.items)


def layers(root: Path | str, manifest: Manifest) -> tuple[Layer, ...]:
    """The bundle layers of `manifest`'s plan in `root`, the built-in one first for an
    extension (load_manifest has checked that its digest is the one recorded)."""
    own = Layer(Path(root), manifest.plan)
    if manifest.extends is None:
        return (own,)
    return (Layer(builtin_bundle_root(), manifest.extends.plan, frozenset(manifest.extends.removed)), own)


def manifest_files(root: Path | str, manifest: Manifest) -> list[Path]:
    """The manifest of every layer: what a run's bundles digest covers besides the bundles."""
    return [manifest_path(layer.root, layer.plan) for layer in layers(root, manifest)]


def file_name(path: Path | str, root: Path | str) -> str:
    """A bundle file's name in results and digests: its path under bundle root `root`, or,
    for the built-in layer an extension reads from the package, `built-in/<its path there>`."""
    path = Path(path)
    if path.is_relative_to(root):
        return path.relative_to(root).as_posix()
    return "built-in/" + path.relative_to(builtin_bundle_root()).as_posix()


def level_files(root: Path | str, level: str, manifest: Manifest) -> list[Path]:
    """Every file a run of `level` reads: each layer's bundles of the level and the lower
    ones, and the layers' manifests (what the run's bundles digest is taken over)."""
    return [*(path for layer in layers(root, manifest) for lvl in manifest.levels_upto(level)
              for path in bundle_files(layer.root, lvl, layer.plan)),
            *manifest_files(root, manifest)]


def load_level(root: Path | str, level: str, plan: str | None = None) -> LoadedCases:
    """Every case of `level` and the lower levels of `plan` (default: the root's only plan),
    in layer, level then file order."""
    manifest = load_manifest(root, plan)
    cases: list[Case] = []
    errors: list[BundleError] = []
    files: list[Path] = []
    seen: dict[str, str] = {}  # case id -> file
    for layer, lvl in ((layer, lvl) for layer in layers(root, manifest) for lvl in manifest.levels_upto(level)):
        for path in bundle_files(layer.root, lvl, layer.plan):
            files.append(path)
            file_cases, file_errors = _load_file(path, lvl, layer.plan)
            errors.extend(file_errors)
            for case in file_cases:
                if layer.leaves_out(case):
                    continue
                wrong_class = class_error(case, manifest.tolerance_classes, path) or probe_error(case, path)
                if wrong_class is not None:
                    errors.append(wrong_class)
                    continue
                if case.id in seen:
                    errors.append(BundleError(f"duplicate id (first in {seen[case.id]})",
                                              file=str(path), case_id=case.id, field="id"))
                    continue
                seen[case.id] = str(path)
                cases.append(case)
    return LoadedCases(cases=tuple(cases), errors=tuple(errors), files=tuple(files), manifest=manifest,
                       file_of={case_id: Path(file) for case_id, file in seen.items()})


def _load_file(path: Path, level: str, plan: str) -> tuple[list[Case], list[BundleError]]:
    try:
        bundle, errors = load_bundle(path)
    except BundleError as exc:
        return [], [exc]
    file = str(path)
    # The file's place decides its level and group; a header that disagrees is a defect.
    for fieldname, have, want in (("plan", bundle.plan, plan), ("level", bundle.level, level),
                                  ("group", bundle.group, path.stem)):
        if have != want:
            return [], [*errors, BundleError(f"is {have!r} but the file lies at {want!r}",
                                             file=file, case_id="-", field=fieldname)]
    return list(bundle.cases), list(errors)


def class_error(case: Case, classes: Mapping[str, Tolerance], path: Path) -> BundleError | None:
    """A case naming a tolerance class other than the one its graph takes under the
    manifest's classes (bundlegen.tolerance_rule), else None. The id leaves the class out,
    so this is what refuses a class edited after generation. A case naming no class is
    left to the engine config (an override row, or an error when it has none)."""
    if case.tolerance_class is None:
        return None
    try:
        want = class_for(case.graph, classes)
    except NoClass as exc:
        want, why = None, str(exc)
    except (KeyError, IndexError, ZeroDivisionError):
        return None     # a graph too malformed to measure: frontend validation refuses it when it runs
    if case.tolerance_class == want:
        return None
    taken = f"its graph takes {want!r}" if want is not None else why
    return BundleError(f"names class {case.tolerance_class!r} but {taken} (edited after generation? run "
                       "`bundlegen generate`)", file=str(path), case_id=case.id, field="tolerance_class")


def probe_error(case: Case, path: Path) -> BundleError | None:
    """A device probe the generator would refuse to write (its bad sequences reach past the
    guard band: a kernel's stray rows would land where no canary sees them), else None."""
    if case.expected_rejection is None or case.expected_rejection.by != "device" or case.graph.ragged is None:
        return None
    try:
        problem = stray_reach_problem(case.graph)
    except (KeyError, IndexError, TypeError):
        return None     # a graph too malformed to measure: frontend validation refuses it when it runs
    if problem is None:
        return None
    return BundleError(f"a device probe the generator would refuse: {problem}", file=str(path),
                       case_id=case.id, field="graph.ragged")


def error_location(error: BundleError) -> tuple[str, str]:
    """(level, group) of a malformed file, read from its path."""
    path = Path(error.file)
    return (path.parent.parent.name, path.stem)


def case_file(case: Case, plan: str) -> str:
    """The bundle file of a loaded case, relative to the bundle root (its place is checked
    against its header when it is loaded)."""
    return f"{case.level}/{plan}/{case.group}.json" if case.level else ""
