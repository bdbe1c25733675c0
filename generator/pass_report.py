"""The dry-run report's lines for values that joined a space's pair suites in a later pass
(Axis.joined, Axis.values_joined): each such value with its legal pairs and how many of them
the cases cover at quick and by pr (core axes) and by nightly (all axes), so a value added
after the suites' rows were fixed shows its own pair proof beside the space's, and the pair
share of the later values at quick (the newest ones are crossed there: Plan.focus) is seen."""
from __future__ import annotations

from bundlegen.generator import pairs
from bundlegen.generator.legality import Legality
from bundlegen.generator.records import GeneratedPlan
from bundlegen.plans.records import PADDED, RAGGED

#: (scope, level) each share is counted for
SCOPE_LEVELS = (("core", "quick"), ("core", "pr"), ("all", "nightly"))


def later_value_lines(g: GeneratedPlan) -> list[str]:
    out = []
    for storage, combos in ((PADDED, g.combos), (RAGGED, g.ragged_combos)):
        space = g.plan.padded if storage == PADDED else g.plan.ragged
        if space is not None:
            out += _space_lines(g, storage, space, combos)
    return out


def _space_lines(g: GeneratedPlan, storage: str, space, case_combos) -> list[str]:
    later = [(a, v, a.value_pass(v)) for a in space.axes for v in a.values
             if a.value_pass(v) > 0 and v != a.default]
    if not later:
        return []
    legality = Legality(space)
    proved = {}
    for scope, level in SCOPE_LEVELS:
        combos = [c for case in g.at_level(level) for c in case_combos.get(case.id, ())]
        legal = pairs.universe(legality, scope)
        proved[(scope, level)] = (legal, pairs.covered_units(legality, combos, scope) & legal)
    out = [f"{storage.capitalize()} values of later passes (their legal pairs with the core axes' values, held at "
           "quick and by pr, and with every axis's by nightly)"]
    for k in sorted({p for _, _, p in later}):
        cells, share = [], [0, 0]
        for axis, value, _ in (x for x in later if x[2] == k):
            counts = []
            for scope, level in SCOPE_LEVELS:
                legal, covered = proved[(scope, level)]
                mine = [u for u in legal if (axis.name, value) in u]
                held = sum(u in covered for u in mine)
                if level == "quick" and mine:
                    share[0] += held
                    share[1] += len(mine)
                counts.append(f"{level} {held} of {len(mine)}" if mine else f"{level}: not a core axis")
            cells.append(f"{axis.name}={value} ({', '.join(counts)})")
        quick = f"{100.0 * share[0] / share[1]:.1f}%" if share[1] else "-"
        out.append(f"  pass {k} (pairs held at quick: {share[0]} of {share[1]}, {quick}): " + "; ".join(cells))
    out.append("")
    return out
