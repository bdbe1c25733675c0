"""What the claims side needs to know about a bundle root's cases (read from the bundles,
never the plan): which claim/regression cases trace to each item, each case's items, and
each level's cases."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from bundlegen.graph import BundleError, load_bundle
from bundlegen.manifest import MANIFEST_SUFFIX, load_manifest
from bundlegen.harness.bundles import Layer, layers


@dataclass(frozen=True)
class BundleCases:
    items: Mapping[str, frozenset[str]]          # item -> claim/regression case ids
    case_items: Mapping[str, frozenset[str]]     # claim/regression case id -> its items
    levels: tuple[tuple[str, frozenset[str]], ...]   # (level, every case id of that level's own bundles), lowest first
    errors: tuple[str, ...] = ()                 # bundle errors met (the bad case is left out)

    def level_of(self, case_id: str) -> str | None:
        return next((name for name, ids in self.levels if case_id in ids), None)

    def upto(self, level: str) -> frozenset[str]:
        """Every case a run of `level` holds (the level includes every lower one)."""
        out: set[str] = set()
        for name, ids in self.levels:
            out |= ids
            if name == level:
                break
        return frozenset(out)


def plan_layers(bundle_root: Path | str, plan: str) -> tuple[Layer, ...]:
    """The bundle layers of `plan` in `bundle_root` (an extension's built-in layer first);
    the plan's own bundles alone when the root has no manifest for it."""
    if not (Path(bundle_root) / f"{plan}{MANIFEST_SUFFIX}").is_file():
        return (Layer(Path(bundle_root), plan),)
    return layers(bundle_root, load_manifest(bundle_root, plan))


def _layer_bundles(bundle_root: Path | str, plan: str):
    """(layer, bundle file) of every bundle of every layer of `plan`."""
    for layer in plan_layers(bundle_root, plan):
        for path in sorted(layer.root.glob(f"*/{layer.plan}/*.json")):
            yield layer, path


def bundle_cases(bundle_root: Path | str, plan: str, level_order: Sequence[str]) -> BundleCases:
    items: dict[str, set[str]] = defaultdict(set)
    case_items: dict[str, frozenset[str]] = {}
    levels: dict[str, set[str]] = defaultdict(set)
    errors: list[str] = []
    for layer, path in _layer_bundles(bundle_root, plan):
        try:
            bundle, bad = load_bundle(path)
        except BundleError as exc:
            errors.append(str(exc))
            continue
        errors.extend(str(e) for e in bad)
        for case in bundle.cases:
            if layer.leaves_out(case):
                continue
            levels[case.level or path.parent.parent.name].add(case.id)
            if case.purpose == "probe":
                continue
            case_items[case.id] = frozenset(case.items)
            for item in case.items:
                items[item].add(case.id)
    order = list(level_order) + sorted(set(levels) - set(level_order))
    return BundleCases(items={i: frozenset(ids) for i, ids in items.items()}, case_items=case_items,
                       levels=tuple((name, frozenset(levels.get(name, ()))) for name in order),
                       errors=tuple(errors))


def graph_lines(bundle_root: Path | str, plan: str, case_ids: Iterable[str]) -> dict[str, str]:
    """case id -> its graph in one line (bundlegen.describe.graph_line, with the score
    modifiers it uses), for the ids the bundles of every level hold."""
    from bundlegen.describe import graph_line

    wanted, found = set(case_ids), {}
    if not wanted:
        return found
    for _layer, path in _layer_bundles(bundle_root, plan):
        try:
            bundle, _ = load_bundle(path)
        except BundleError:
            continue
        for case in bundle.cases:
            if case.id in wanted and case.id not in found:
                modifiers = sorted(case.graph.modifiers)
                found[case.id] = graph_line(case.graph) + (f" | modifiers {','.join(modifiers)}" if modifiers else "")
    return found
