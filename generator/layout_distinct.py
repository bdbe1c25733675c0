"""Layouts that differ: a case tests a layout only where that layout is not another one's
memory. At B = 1, SBHD places every element where BSHD does (a batch stride of a length-1
axis is never used), HBSD where BHSD does, and so on; such a case still runs, but it tests
the other layout, so it is not counted for its own.

Per layout value of the plan: the cases that name it (their AX-LAYOUT item), those that
are another layout's memory, and from which level on a case that is not holds B, H and S
(query and key) of at least 2, and, per gradient port, a head dim in each tail class.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from bundlegen.graph import Case, Graph
from bundlegen.generator import layouts
from bundlegen.generator.expand import axis_item
from bundlegen.plans.records import Plan

GRADIENT_PORTS = {"dq": "D_qk", "dk": "D_qk", "dv": "D_v"}
#: head-dim tail classes: a multiple of 16 that is not one of 32, and not a multiple of 16
TAILS = {"d%32=16": lambda d: d % 32 == 16, "d%16!=0": lambda d: d % 16 != 0}
DATA_PORTS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")


@dataclass(frozen=True)
class LayoutRow:
    layout: str
    cases: int                                 # cases naming the layout
    same_memory: Mapping[str, int]             # other layout -> cases that are its memory
    multi_from: str | None                     # first level with a distinct case of B, H, S >= 2
    tails_from: Mapping[tuple[str, str], str | None]   # (gradient port, tail) -> first level


@dataclass(frozen=True)
class LayoutProof:
    required_by: str | None
    rows: tuple[LayoutRow, ...]

    def short(self, levels: list[str]) -> list[str]:
        """What a layout lacks by `required_by` (empty when nothing)."""
        if self.required_by is None:
            return []
        upto = levels[: levels.index(self.required_by) + 1]
        out = []
        for r in self.rows:
            if r.multi_from not in upto:
                out.append(f"{r.layout}: no case of B, H, S >= 2 that is not another layout's memory")
            for (port, tail), lv in sorted(r.tails_from.items()):
                if lv not in upto:
                    out.append(f"{r.layout}: {port} never meets a head dim {tail}")
        return out


def _same(dims, a: tuple, b: tuple) -> bool:
    """Two (strides, offset) placements of `dims` address the same elements."""
    (sa, oa), (sb, ob) = a, b
    return oa == ob and all(x == y for n, x, y in zip(dims, sa, sb) if n > 1)


def _placed(graph: Graph) -> dict[str, tuple]:
    return {p: (graph.tensors[p].strides, graph.tensors[p].offset) for p in DATA_PORTS}


def same_memory_as(plan: Plan, graph: Graph, layout: str) -> str | None:
    """The first other layout of the plan that places every data port of `graph` where
    `layout` does (None: none does)."""
    mine = _placed(graph)
    for other, spec in plan.layouts.items():
        if other == layout or spec.stats_batch_broadcast != plan.layouts[layout].stats_batch_broadcast:
            continue
        if all(_same(graph.tensors[p].dims, mine[p], layouts.place(spec.ports[p], graph.tensors[p].dims))
               for p in DATA_PORTS):
            return other
    return None


def layout_of(plan: Plan, case: Case) -> str | None:
    """The layout value a case names (its AX-LAYOUT item), if any."""
    for name in plan.layouts:
        if axis_item("layout", name) in case.items:
            return name
    return None


def prove(plan: Plan, cases: Iterable[Case], level_names: list[str], required_by: str | None) -> LayoutProof:
    cases = [c for c in cases if c.purpose != "probe" and c.graph.ragged is None]
    rows = []
    for name in plan.layouts:
        mine = [c for c in cases if layout_of(plan, c) == name]
        same: dict[str, int] = {}
        multi, tails = None, {(p, t): None for p in GRADIENT_PORTS for t in TAILS}

        def earlier(a, b):
            return b if a is None or (b is not None and level_names.index(b) < level_names.index(a)) else a
        for c in mine:
            other = same_memory_as(plan, c.graph, name)
            if other is not None:
                same[other] = same.get(other, 0) + 1
                continue
            g = c.graph
            if min(g.B, g.H_q, g.S_q, g.S_kv) >= 2:
                multi = earlier(multi, c.level)
            for port, dim in GRADIENT_PORTS.items():
                for tail, holds in TAILS.items():
                    if holds(getattr(g, dim)):
                        tails[(port, tail)] = earlier(tails[(port, tail)], c.level)
        rows.append(LayoutRow(name, len(mine), dict(sorted(same.items())), multi, tails))
    return LayoutProof(required_by, tuple(rows))
