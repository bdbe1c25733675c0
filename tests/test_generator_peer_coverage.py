"""Peer pair coverage (plans/peers.py, generator/peer_coverage.py): the mapping rules, the
per-level proof on the built plan, and that removing a value a peer needs shows as a gap."""
from __future__ import annotations

import pytest

from bundlegen.generator import peer_coverage
from bundlegen.generator.generate import build_default
from bundlegen.plans import peers as P


@pytest.fixture(scope="module")
def generated():
    return build_default()


def test_seq_classes():
    assert P.seq_class(128, 128) == "eq-tile"
    assert P.seq_class(97, 97) == "eq-tail"
    assert P.seq_class(1, 239) == "q1" and P.seq_class(239, 1) == "kv1"
    assert P.seq_class(512, 256) == "gt-x2-tile"
    assert P.seq_class(1024, 128) == "gt-x8-tile"
    assert P.seq_class(2048, 64) == "gt-wide-tile"
    assert P.seq_class(64, 800) == "lt-wide-tail"
    assert P.seq_class(217, 128) == "gt-x2-tail"


def test_mask_classes_merge_alignments_on_equal_lengths():
    base = dict(dtype="bf16", D_qk=64, D_v=64, H_q=2, H_k=2, order="bhsd", qkv_packed=False,
                kv_packed=False, do_differs=False, alignment="TOP_LEFT")
    assert P.case_classes("mask", {**base, "S_q": 64, "S_kv": 64, "left": None, "right": 0}) == {"causal-tl", "causal-br"}
    assert P.case_classes("mask", {**base, "S_q": 64, "S_kv": 65, "left": None, "right": 0}) == {"causal-tl"}
    assert P.case_classes("mask", {**base, "S_q": 64, "S_kv": 65, "left": 24, "right": None}) == {"left-only-tl"}


def test_graph_facts_see_packed_buffers_and_orders(generated):
    seen = {}
    for c in generated.cases:
        if peer_coverage.counted(c):
            f = peer_coverage.graph_facts(c.graph)
            seen.setdefault("qkv", f["qkv_packed"] or seen.get("qkv", False))
            seen["qkv"] = seen["qkv"] or f["qkv_packed"]
            seen["kv"] = seen.get("kv", False) or f["kv_packed"]
            seen.setdefault("orders", set()).add(f["order"])
    assert seen["qkv"] and seen["kv"]
    assert {"bhsd", "bshd", "sbhd", "hbsd", "hsbd", "shbd"} <= seen["orders"]


def test_every_peer_meets_the_plan_targets(generated):
    proofs = peer_coverage.of_generated(generated)
    peers = generated.plan.peers
    assert {p.peer for p in proofs} == {g.name for g in peers.grids}
    for p in proofs:
        assert p.total > 0
        assert p.meets_target, (p.peer, p.level, p.share, [peer_coverage.pair_text(x) for x in p.missing[:5]])
    assert peers.targets                       # the plan asks something of some level


def test_removing_a_value_a_peer_needs_is_a_gap(generated):
    """Cases with D = 59 (FlashAttention 2's head dim) gone: its pairs go missing."""
    levels = [lv.name for lv in generated.plan.levels]
    peers = generated.plan.peers
    kept = {lv: [c for c in generated.at_level(lv) if c.graph.D_qk != 59] for lv in levels}
    full = {p.peer: p for p in peer_coverage.coverage(peers, levels[-1:], {levels[-1]: generated.at_level(levels[-1])})}
    cut = {p.peer: p for p in peer_coverage.coverage(peers, levels[-1:], kept)}
    fa2 = "flash-attention-2"
    assert cut[fa2].covered < full[fa2].covered
    assert all(("head_dims", "d59") in pair for pair in set(cut[fa2].missing) - set(full[fa2].missing))
    assert any(("head_dims", "d59") in pair for pair in peer_coverage.peer_pairs(peers, peers.grids[0]))


def test_every_grid_cites_its_source():
    for g in P.PEER_GRIDS:
        assert " @ " in g.source and g.tests
        for t in g.tests:
            assert set(t.axes) <= set(P.PEER_AXES)
