"""Boundary values (plan.boundaries): each class's values just below, at and just above its
tiles become graphs, and the proof reads back from every case's graph which values it
realises.

A quantity is what a class varies: how a value is set on a base Spec, the least value it
may take, and how it is read from a graph. A case covers a unit of a class when it traces
to the class's item and its graph reads that unit's value (so a merged or trimmed case is
judged by what it is, not by the entry that asked for it)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Iterable

from bundlegen.graph import Case, Graph
from bundlegen.generator.errors import PlanError
from bundlegen.generator.expand import graph_of, spec_items
from bundlegen.generator.records import BoundaryProof, Draft
from bundlegen.plans.records import SIDES, BoundaryClass, BoundaryPlan, Plan, Spec, attr

EXTRA = "extra"
SIDE_OFFSET = {"below": -1, "at": 0, "above": 1}
SIDE_MARK = {"below": "-", "at": "=", "above": "+"}


def _programs(g: Graph, rows: int) -> int:
    return g.B * g.H_q * math.ceil(g.S_q / rows)


def _set_grid(spec: Spec, v: int, rows: int) -> Spec:
    s = spec.shape
    per_batch = s.H_q * math.ceil(s.S_q / rows)
    if v % per_batch:
        raise PlanError(f"grid {v}: not a whole number of batches of {per_batch} programs "
                        f"(H_q {s.H_q} x ceil(S_q {s.S_q} / {rows}))")
    return dataclasses.replace(spec, shape=dataclasses.replace(s, B=v // per_batch))


def _bounded_br(g: Graph) -> bool:
    a = g.attributes
    return a.diagonal_alignment == "BOTTOM_RIGHT" and (a.left_bound is not None or a.right_bound is not None)


def _shape(**fields) -> Callable[[Spec, int, int], Spec]:
    """A setter that replaces shape fields: each a function of (shape, value)."""
    def set_(spec: Spec, v: int, _rows: int) -> Spec:
        s = spec.shape
        return dataclasses.replace(spec, shape=dataclasses.replace(s, **{k: f(s, v) for k, f in fields.items()}))
    return set_


def _attr(name: str) -> Callable[[Spec, int, int], Spec]:
    def set_(spec: Spec, v: int, _rows: int) -> Spec:
        return dataclasses.replace(spec, mutations=spec.mutations + (attr(name, v),))
    return set_


@dataclass(frozen=True)
class Quantity:
    title: str
    set: Callable[[Spec, int, int], Spec]          # (base, value, grid rows) -> spec
    read: Callable[[Graph, int], set]              # (graph, grid rows) -> the values it realises
    least: int | None = 1                          # None: any integer (S_q, S_kv must stay >= 1)


QUANTITIES: dict[str, Quantity] = {
    "S_q": Quantity("S_q", _shape(S_q=lambda s, v: v), lambda g, r: {g.S_q}),
    "S_kv": Quantity("S_kv", _shape(S_kv=lambda s, v: v), lambda g, r: {g.S_kv}),
    "br-offset": Quantity("S_kv - S_q under a bounded BOTTOM_RIGHT mask", _shape(S_kv=lambda s, v: s.S_q + v),
                          lambda g, r: {g.S_kv - g.S_q} if _bounded_br(g) else set(), least=None),
    "left-bound": Quantity("left_bound", _attr("left_bound"),
                           lambda g, r: set() if g.attributes.left_bound is None else {g.attributes.left_bound}),
    "right-bound": Quantity("right_bound > 0 with no left bound", _attr("right_bound"),
                            lambda g, r: {g.attributes.right_bound} if g.attributes.left_bound is None
                            and g.attributes.right_bound is not None and g.attributes.right_bound > 0 else set()),
    "head-dim": Quantity("D_qk = D_v", _shape(D_qk=lambda s, v: v, D_v=lambda s, v: v),
                         lambda g, r: {g.D_qk, g.D_v}),
    "group": Quantity("H_q / H_k (H_v = H_k)", _shape(H_q=lambda s, v: v * s.H_k, H_v=lambda s, v: s.H_k),
                      lambda g, r: {g.H_q // g.H_k, g.H_q // g.H_v}),
    "grid": Quantity("programs B x H_q x ceil(S_q / grid rows)", _set_grid, lambda g, r: {_programs(g, r)}),
}


# ----------------------------------------------------------------------------- units
def units(c: BoundaryClass) -> tuple[tuple, ...]:
    """The class's units in order: (tile, side, value) per tile and side, then
    ("extra", value, value); values below the quantity's least or above the cap are left out."""
    q = QUANTITIES[c.quantity]
    out = []
    for t in c.tiles:
        for side in SIDES:
            v = t + SIDE_OFFSET[side]
            if (q.least is None or v >= q.least) and (c.cap is None or v <= c.cap):
                out.append((t, side, v))
    out += [(EXTRA, v, v) for v in c.extras]
    return tuple(out)


def class_values(c: BoundaryClass) -> tuple[int, ...]:
    return tuple(dict.fromkeys(u[2] for u in units(c)))


def unit_text(unit: tuple) -> str:
    tile, side, value = unit
    return f"{value}" if tile == EXTRA else f"{tile}{SIDE_MARK[side]}"


def case_units(bp: BoundaryPlan, items: Iterable[str], graph: Graph) -> set[tuple[str, tuple]]:
    """(class item, unit) of every unit the graph realises of each class it traces to."""
    items, out = set(items), set()
    if graph.ragged is not None:
        return out
    for c in bp.classes:
        if c.item not in items:
            continue
        read = QUANTITIES[c.quantity].read(graph, bp.grid_rows)
        out.update((c.item, u) for u in units(c) if u[2] in read)
    return out


# ----------------------------------------------------------------------------- drafts
def drafts(plan: Plan) -> list[Draft]:
    bp, out = plan.boundaries, []
    for c in bp.classes:
        q, declared = QUANTITIES[c.quantity], class_values(c)
        for k, s in enumerate(c.sets):
            for v in (declared if s.values is None else s.values):
                entry = f"boundary {c.item}[{k}] {c.quantity}={v}"
                try:
                    spec = q.set(s.base, v, bp.grid_rows)
                except PlanError as exc:
                    raise PlanError(f"{entry}: {exc}") from None
                graph = graph_of(plan, spec)
                if v not in q.read(graph, bp.grid_rows):
                    raise PlanError(f"{entry}: the graph built does not realise it (reads "
                                    f"{sorted(q.read(graph, bp.grid_rows))}): check the base's mask")
                out.append(Draft(entry=entry, group=c.group, purpose="claim", items=(c.item,) + spec_items(plan, spec),
                                 graph=graph, distribution=spec.distribution, rejection=None, min_level=s.level))
    return out


def check_plan(plan: Plan, level_names: tuple[str, ...]) -> None:
    """Names and numbers of the boundary part (its base specs are checked with the rest)."""
    bp = plan.boundaries
    for name, tiles in bp.tiles.items():
        if not tiles or min(tiles) < 1:
            raise PlanError(f"boundary tiles '{name}': needs tile sizes >= 1")
    for lv in (bp.each_class_by, bp.every_value_by):
        if lv not in level_names:
            raise PlanError(f"boundaries: unknown level {lv!r}")
    if level_names.index(bp.each_class_by) > level_names.index(bp.every_value_by) or bp.grid_rows < 1:
        raise PlanError("boundaries: each_class_by must not come after every_value_by; grid_rows >= 1")
    for c in bp.classes:
        entry = f"boundary class '{c.item}'"
        if c.quantity not in QUANTITIES:
            raise PlanError(f"{entry}: unknown quantity {c.quantity!r} (known: {', '.join(QUANTITIES)})")
        if not c.sets or not units(c):
            raise PlanError(f"{entry}: needs values and at least one set")
        declared = set(class_values(c))
        for k, s in enumerate(c.sets):
            if s.level not in level_names:
                raise PlanError(f"{entry}[{k}]: unknown level {s.level!r}")
            stray = sorted(set(s.values or ()) - declared)
            if stray:
                raise PlanError(f"{entry}[{k}]: values {stray} are not the class's (tiles +/- 1, extras, cap)")


# ----------------------------------------------------------------------------- proof
def requirement(bp: BoundaryPlan, level_names: list[str], level: str) -> str:
    """What a level must cover of each class: none, one (a unit) or every (unit)."""
    i = level_names.index(level)
    if i >= level_names.index(bp.every_value_by):
        return "every"
    return "one" if i >= level_names.index(bp.each_class_by) else "none"


def prove(plan: Plan, cases: Iterable[Case]) -> tuple[BoundaryProof, ...]:
    """Per level (cumulative) and class: the units its claim and regression cases realise."""
    bp = plan.boundaries
    if bp is None:
        return ()
    names = [lv.name for lv in plan.levels]
    by_level: dict[str, set] = {n: set() for n in names}
    for case in cases:
        if case.purpose != "probe":
            by_level[case.level] |= case_units(bp, case.items, case.graph)
    out, seen = [], set()
    for level in names:
        seen |= by_level[level]
        need = requirement(bp, names, level)
        for c in bp.classes:
            all_units = units(c)
            covered = tuple(u for u in all_units if (c.item, u) in seen)
            missing = tuple(u for u in all_units if (c.item, u) not in seen)
            out.append(BoundaryProof(level=level, item=c.item, required=need, total=len(all_units),
                                     covered=covered, missing=missing))
    return tuple(out)
