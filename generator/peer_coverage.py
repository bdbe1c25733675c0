"""Peer pair coverage: the share of each peer suite's distinct value pairs (plans/peers.py)
that the generated cases of a level hold.

A peer's pairs: for each of its tests, every (axis class, axis class) pair of two different
shared axes the test declares, over the classes its values map to (a test's grid is the
product of its parametrize lists); the union over its tests. A case holds a pair when its
own classes (from its graph, by the plan's rules) hold both values. Counted: the claim and
regression cases of the padded space (probes are never run; ragged graphs are their own space).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Mapping

from bundlegen.graph import Case, Graph
from bundlegen.plans.records import PeerGrid, PeerPlan

Pair = tuple[tuple[str, str], tuple[str, str]]
_ORDER_AXES = "bhs"


@dataclass(frozen=True)
class PeerCoverage:
    peer: str
    level: str
    total: int
    covered: int
    missing: tuple[Pair, ...]
    target: float | None          # the least share the plan asks of this level, if any

    @property
    def share(self) -> float:
        return self.covered / self.total if self.total else 1.0

    @property
    def meets_target(self) -> bool:
        return self.target is None or self.share >= self.target


# ----------------------------------------------------------------------------- peer side
def peer_pairs(peers: PeerPlan, grid: PeerGrid) -> frozenset:
    """Every distinct value pair of the peer over the shared axes (axes in PEER_AXES order)."""
    out: set = set()
    for test in grid.tests:
        classes = {a: set().union(*(peers.peer_classes(a, v) for v in test.axes[a]))
                   for a in peers.axes if a in test.axes}
        for a, b in itertools.combinations([a for a in peers.axes if a in classes], 2):
            out.update(((a, x), (b, y)) for x in classes[a] for y in classes[b])
    return frozenset(out)


# ----------------------------------------------------------------------------- case side
def _order(strides: tuple[int, ...]) -> str:
    """B, H, S by falling stride (ties keep B, H, S order), D innermost."""
    idx = sorted(range(3), key=lambda i: (-strides[i], i))
    return "".join(_ORDER_AXES[i] for i in idx) + "d"


def graph_facts(graph: Graph) -> dict:
    """The plain numbers and names the plan's case rules read (plans/peers.py case_classes)."""
    t = graph.tensors
    q, k, v, o, do = (t[p] for p in ("q", "k", "v", "o", "do"))
    orders = {_order(x.strides) for x in (q, k, v, o, do)}
    kv_slot = graph.H_k * graph.D_qk
    qkv_packed = (q.strides == k.strides == v.strides and k.offset - q.offset == graph.H_q * graph.D_qk
                  and v.offset - k.offset == kv_slot)
    kv_packed = (not qkv_packed and k.strides == v.strides and graph.H_k == graph.H_v
                 and v.offset - k.offset == kv_slot and k.strides[2] == 2 * kv_slot)
    a = graph.attributes
    return {"dtype": graph.dtype, "D_qk": graph.D_qk, "D_v": graph.D_v, "S_q": graph.S_q, "S_kv": graph.S_kv,
            "H_q": graph.H_q, "H_k": graph.H_k, "left": a.left_bound, "right": a.right_bound,
            "alignment": a.diagonal_alignment, "order": orders.pop() if len(orders) == 1 else "mixed",
            "qkv_packed": qkv_packed, "kv_packed": kv_packed, "do_differs": do.strides != o.strides}


def counted(case: Case) -> bool:
    return case.purpose != "probe" and case.graph.ragged is None


def case_pairs(peers: PeerPlan, case: Case) -> set:
    facts = graph_facts(case.graph)
    classes = {a: peers.case_classes(a, facts) for a in peers.axes}
    out: set = set()
    for a, b in itertools.combinations(peers.axes, 2):
        out.update(((a, x), (b, y)) for x in classes[a] for y in classes[b])
    return out


# ----------------------------------------------------------------------------- proof
def coverage(peers: PeerPlan, levels: Iterable[str], cases_at: Mapping[str, Iterable[Case]]) -> tuple[PeerCoverage, ...]:
    """Per level (cases_at[level]: the cases a run of that level executes) and peer."""
    wanted = {g.name: peer_pairs(peers, g) for g in peers.grids}
    out = []
    held_by: dict[str, set] = {}
    for level in levels:
        held: set = set()
        for c in cases_at[level]:
            if counted(c):
                if c.id not in held_by:
                    held_by[c.id] = case_pairs(peers, c)
                held |= held_by[c.id]
        for g in peers.grids:
            pairs = wanted[g.name]
            missing = tuple(sorted(pairs - held))
            out.append(PeerCoverage(g.name, level, len(pairs), len(pairs) - len(missing), missing,
                                    peers.targets.get(level)))
    return tuple(out)


def of_generated(generated) -> tuple[PeerCoverage, ...]:
    """coverage() of a GeneratedPlan (empty when its plan declares no peers)."""
    peers = generated.plan.peers
    if peers is None:
        return ()
    names = [lv.name for lv in generated.plan.levels]
    return coverage(peers, names, {n: generated.at_level(n) for n in names})


def pair_text(pair: Pair) -> str:
    return " + ".join(f"{a}={v}" for a, v in pair)
