"""The dry-run report's lines for values that joined the ragged space's pair suites in a
later pass (Axis.joined, Axis.values_joined): each such value with its legal pairs and how
many of them the cases cover by pr (core axes) and by nightly (all axes), so a value added
after the suites' rows were fixed shows its own pair proof beside the space's."""
from __future__ import annotations

from bundlegen.generator import pairs
from bundlegen.generator.legality import Legality
from bundlegen.generator.records import GeneratedPlan

#: the level each scope is proved by (the ragged pair suites' levels)
SCOPE_LEVELS = (("core", "pr"), ("all", "nightly"))


def later_value_lines(g: GeneratedPlan) -> list[str]:
    space = g.plan.ragged
    later = [(a, v, a.value_pass(v)) for a in space.axes for v in a.values
             if a.value_pass(v) > 0 and v != a.default]
    if not later:
        return []
    legality = Legality(space)
    proved = {}
    for scope, level in SCOPE_LEVELS:
        combos = [c for case in g.at_level(level) for c in g.ragged_combos.get(case.id, ())]
        legal = pairs.universe(legality, scope)
        proved[scope] = (legal, pairs.covered_units(legality, combos, scope) & legal)
    out = ["Ragged values of later passes (their legal pairs, covered by pr on the core axes and by "
           "nightly on all axes)"]
    for k in sorted({p for _, _, p in later}):
        cells = []
        for axis, value, _ in (x for x in later if x[2] == k):
            counts = []
            for scope, level in SCOPE_LEVELS:
                legal, covered = proved[scope]
                mine = [u for u in legal if (axis.name, value) in u]
                counts.append(f"{level} {sum(u in covered for u in mine)} of {len(mine)}" if mine
                              else f"{level}: not a core axis")
            cells.append(f"{axis.name}={value} ({', '.join(counts)})")
        out.append(f"  pass {k}: " + "; ".join(cells))
    out.append("")
    return out
