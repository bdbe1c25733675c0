"""Risk interactions: the 3-way combinations of the plan's risky values (plan.risks).

A unit is a triple ((axis, value), (axis, value), (axis, value)) of risky values of three
different risk axes (axes in plan order) that some legal full combination holds; the
generator enumerates them itself. allpairspy (n=3) proposes rows over the risk axes, each
axis's risky values and its default (a row may need the default to be legal), every other
axis at its default; its coverage is not trusted (it leaves triples out): the rows are
proved and the missing triples packed into repair rows, several compatible triples per row.

Two suites: the top one over the values of rank <= top_rank (its rows from `top_by`,
its cheapest `sample` rows on the cpu class from `sample_at`), and the whole one (from
`every_by`). A case holds a triple when one of its axis combinations does and, where a
triple names a layout, the case's layout is no other layout's memory (layout_distinct).
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable

from bundlegen.generator.errors import PlanError
from bundlegen.generator.legality import Legality
from bundlegen.generator.pairs import pack_rows, propose
from bundlegen.generator.records import Combo, RiskProof
from bundlegen.plans.records import LEVEL_NAMES, Plan, RiskPlan

REQUIRED = ("none", "sample", "top", "every")


def check_plan(plan: Plan) -> None:
    r = plan.risks
    axes = {a.name: a for a in plan.padded.axes}
    for axis, values in r.values.items():
        if axis not in axes:
            raise PlanError(f"risks '{r.item}': unknown axis {axis!r}")
        for v, rank in values.items():
            if v not in axes[axis].values:
                raise PlanError(f"risks '{r.item}': {v!r} is not a value of axis {axis!r}")
            if v == axes[axis].default:
                raise PlanError(f"risks '{r.item}': {axis}={v} is the axis default, never a risk")
            if not (isinstance(rank, int) and rank >= 1):
                raise PlanError(f"risks '{r.item}': {axis}={v} needs a rank >= 1")
    if len(r.values) < 3:
        raise PlanError(f"risks '{r.item}': triples need three risk axes")
    order = [r.sample_at, r.top_by, r.every_by]
    if any(lv not in LEVEL_NAMES for lv in order) or order != sorted(order, key=LEVEL_NAMES.index):
        raise PlanError(f"risks '{r.item}': sample_at <= top_by <= every_by, each a level")


def _axes(legality: Legality, risks: RiskPlan) -> list[int]:
    return sorted(legality.position[a] for a in risks.values)


def _risky(legality: Legality, risks: RiskPlan, p: int, max_rank: int | None) -> list[str]:
    ranks = risks.values[legality.axes[p]]
    return [v for v in legality.values[p] if v in ranks and (max_rank is None or ranks[v] <= max_rank)]


def universe(legality: Legality, risks: RiskPlan, max_rank: int | None) -> frozenset:
    """Every legal triple of risky values (of rank <= max_rank; None: any)."""
    out = set()
    names = legality.axes
    for p, q, s in itertools.combinations(_axes(legality, risks), 3):
        for a, b, c in itertools.product(*(_risky(legality, risks, x, max_rank) for x in (p, q, s))):
            if legality.complete({names[p]: a, names[q]: b, names[s]: c}) is not None:
                out.add(((names[p], a), (names[q], b), (names[s], c)))
    return frozenset(out)


def triples(legality: Legality, risks: RiskPlan, combo: Combo) -> set:
    """The risky triples (of any rank) one axis combination holds."""
    names = legality.axes
    held = [(names[p], combo[p]) for p in _axes(legality, risks) if combo[p] in risks.values[names[p]]]
    return set(itertools.combinations(held, 3))


def suite_rows(legality: Legality, risks: RiskPlan, max_rank: int | None, wanted: frozenset) -> list[Combo]:
    """allpairspy's n=3 rows over the risk axes, then packed repairs of what it left out of
    `wanted` (the suite's universe)."""
    allowed = {}
    for p in _axes(legality, risks):
        axis = legality.space.axes[p]
        keep = {axis.default, *_risky(legality, risks, p, max_rank)}
        allowed[p] = [i for i, v in enumerate(axis.values) if v in keep]
    rows = propose(legality, f"risks '{risks.item}'", allowed, n=3)
    held = set().union(*(triples(legality, risks, r) for r in rows)) if rows else set()
    return rows + repair_rows(legality, risks, wanted - held)


def repair_rows(legality: Legality, risks: RiskPlan, missing: Iterable[tuple]) -> list[Combo]:
    """Rows for the missing triples, several compatible triples packed into each."""
    return pack_rows(legality, missing, lambda combo: triples(legality, risks, combo), "risk triple")


def sample_rows(rows: list[Combo], cpu_seconds: Callable[[Combo], float], count: int) -> list[Combo]:
    """The `count` rows cheapest on the cpu class (ties: the suite's order)."""
    ranked = sorted(range(len(rows)), key=lambda i: (cpu_seconds(rows[i]), i))
    return [rows[i] for i in sorted(ranked[:count])]


def required(risks: RiskPlan, level: str) -> str:
    names = list(LEVEL_NAMES)
    i = names.index(level)
    if i >= names.index(risks.every_by):
        return "every"
    if i >= names.index(risks.top_by):
        return "top"
    if i >= names.index(risks.sample_at):
        return "sample"
    return "none"


def prove(risks: RiskPlan, levels: list[str], held_at: Callable[[str], set], top: frozenset,
          every: frozenset, sample: frozenset) -> tuple[RiskProof, ...]:
    """Per level: the triples its cases hold (`held_at(level)`: cumulative) against what it
    requires; `top` and `every` are the two universes, `sample` the triples the sample's
    rows hold."""
    out = []
    for level in levels:
        held = held_at(level)
        need = required(risks, level)
        wanted = {"none": frozenset(), "sample": sample, "top": top, "every": every}[need]
        out.append(RiskProof(level=level, required=need, top_total=len(top), top_covered=len(top & held),
                             total=len(every), covered=len(every & held),
                             missing=tuple(sorted(wanted - held))))
    return tuple(out)
