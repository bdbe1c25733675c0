"""Focused pairs (Plan.focus): pairs of chosen values a level must hold beyond its own pair
scope, e.g. the newest values with each other and with the core axes' risky values at quick,
or every port form with every risky value by pr.

A unit is a pair ((axis, value), (axis, value)) of two different axes, in axis order, where
one value is a subject and the other a subject or a partner, and some legal combination holds
both (the generator enumerates them itself). Rows: the units the suites' cases of that level
and below do not hold yet, packed several to a row (each row starts from the first unit
left and takes every later one that agrees with it and keeps it legal), the cheapest on the
cpu class first, so a level with a cpu budget gets few, small rows.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterable

from bundlegen.generator.errors import PlanError
from bundlegen.generator.legality import Legality
from bundlegen.generator.pairs import pack_rows
from bundlegen.generator.records import Combo
from bundlegen.plans.records import LEVEL_NAMES, FocusPairs, Plan


@dataclass(frozen=True)
class FocusProof:
    item: str
    storage: str
    level: str
    required: bool           # the level is at or above the focus's level
    total: int
    covered: int
    missing: tuple

    @property
    def complete(self) -> bool:
        return not self.required or not self.missing


def check_plan(plan: Plan) -> None:
    for f in plan.focus:
        space = plan.space(f.storage)
        axes = {a.name: a for a in space.axes}
        if f.level not in LEVEL_NAMES:
            raise PlanError(f"focus '{f.item}': unknown level {f.level!r}")
        for role, table in (("subjects", f.subjects), ("partners", f.partners)):
            for axis, values in table.items():
                if axis not in axes:
                    raise PlanError(f"focus '{f.item}': {role} name unknown axis {axis!r}")
                for v in values:
                    if v not in axes[axis].values:
                        raise PlanError(f"focus '{f.item}': {v!r} is not a value of axis {axis!r}")
        for name in f.left_out:
            axis, _, value = name.partition("=")
            if axis not in axes or value not in axes[axis].values:
                raise PlanError(f"focus '{f.item}': left_out names no axis value: {name!r}")
            if value in f.subjects.get(axis, ()):
                raise PlanError(f"focus '{f.item}': {name} is both a subject and left out")


def universe(legality: Legality, f: FocusPairs) -> frozenset:
    """Every legal pair the focus asks for."""
    names = legality.axes
    out = set()
    for p, q in itertools.combinations(range(len(names)), 2):
        a, b = names[p], names[q]
        for u in (*f.subjects.get(a, ()), *f.partners.get(a, ())):
            for w in (*f.subjects.get(b, ()), *f.partners.get(b, ())):
                if u not in f.subjects.get(a, ()) and w not in f.subjects.get(b, ()):
                    continue
                if legality.complete({a: u, b: w}) is not None:
                    out.add(((a, u), (b, w)))
    return frozenset(out)


def held(legality: Legality, combo: Combo) -> set:
    """Every value pair one axis combination holds."""
    cells = list(zip(legality.axes, combo))
    return set(itertools.combinations(cells, 2))


def rows(legality: Legality, missing: Iterable[tuple], cpu_seconds: Callable[[Combo], float]) -> list[Combo]:
    """Packed rows for the missing units (pairs.pack_rows), cheapest on the cpu class first."""
    return sorted(pack_rows(legality, missing, lambda combo: held(legality, combo), "focused pair"), key=cpu_seconds)


def prove(f: FocusPairs, levels: list[str], wanted: frozenset, held_at: Callable[[str], set]) -> tuple[FocusProof, ...]:
    start = levels.index(f.level)
    return tuple(FocusProof(f.item, f.storage, lv, i >= start, len(wanted), len(wanted & held_at(lv)),
                            tuple(sorted(wanted - held_at(lv))))
                 for i, lv in enumerate(levels))


def report_lines(plan: Plan, proofs: tuple[FocusProof, ...]) -> list[str]:
    if not proofs:
        return []
    levels = [lv.name for lv in plan.levels]
    out = ["Focused pair proof (Plan.focus: pairs of chosen values with each other and with the other axes' "
           "risky values, by the level named; counted from every case's axis combinations)"]
    for f in plan.focus:
        mine = {p.level: p for p in proofs if p.item == f.item}
        subjects = "; ".join(f"{a} {', '.join(v)}" for a, v in f.subjects.items())
        partners = "; ".join(f"{a} {', '.join(v)}" for a, v in f.partners.items())
        cells = []
        for lv in levels:
            p = mine[lv]
            share = f"{p.covered}/{p.total} {100.0 * p.covered / p.total if p.total else 100.0:.1f}%"
            cells.append(f"{lv} {share}" + ((" ok" if p.complete else " SHORT") if p.required else ""))
        out.append(f"  {f.item} ({f.storage}, by {f.level}): {f.title}")
        out.append(f"    subjects: {subjects}")
        out.append(f"    partners: {partners or '-'}")
        for name, why in sorted(f.left_out.items()):
            out.append(f"    left out: {name}: {why}")
        out.append("    " + "  ".join(cells))
        short = mine[f.level].missing if mine[f.level].required else ()
        if short:
            out.append(f"    missing at {f.level}: " + ", ".join(f"{a}={u} + {b}={w}" for (a, u), (b, w) in short[:8])
                       + (f" (+{len(short) - 8} more)" if len(short) > 8 else ""))
    out.append("")
    return out
