"""The FlexAttention and TransformerEngine peer grids (plans/peers.py): cited at a pinned
commit, their values mapped onto our classes, and no declared pair that no graph can hold."""
from __future__ import annotations

import re

import pytest

from bundlegen.generator import peer_coverage
from bundlegen.plans import peers as P

NEW = {"flex-attention": P.FLEX_ATTENTION, "transformer-engine": P.TRANSFORMER_ENGINE}


@pytest.mark.parametrize("name", sorted(NEW))
def test_grid_cites_a_pinned_commit_and_declares_every_shared_axis(name):
    grid = NEW[name]
    assert grid in P.PEER_GRIDS
    assert re.search(r" @ [0-9a-f]{40}$", grid.source)
    for test in grid.tests:
        assert set(test.axes) == set(P.PEER_AXES), test.name
        for axis, values in test.axes.items():
            assert values and all(P.peer_classes(axis, v) for v in values), (test.name, axis)


def _impossible(pair) -> bool:
    """A pair no graph can hold: Q, K, V packed in one buffer share S and H; K and V packed
    share their heads; an unequal (S_q, S_kv) class cannot meet qkv-packed."""
    (a, x), (b, y) = pair
    values = {a: x, b: y}
    if values.get("layout") == "qkv-packed":
        if "seq" in values and not values["seq"].startswith("eq-"):
            return True
        if "group" in values and values["group"] != "r1":
            return True
        if "head_dims" in values and "-" in values["head_dims"]:
            return True
    if values.get("layout") == "kv-packed" and "head_dims" in values and "-" in values["head_dims"]:
        return True
    return False


@pytest.mark.parametrize("name", sorted(NEW))
def test_no_declared_pair_is_impossible(name):
    pairs = peer_coverage.peer_pairs(P.PEERS, NEW[name])
    assert pairs
    assert [p for p in pairs if _impossible(p)] == []


def test_te_packed_layouts_follow_te_defaults():
    """TE packs Q, K, V for self-attention MHA with equal head dims (sb3hd) and K, V for
    cross-attention (bshd_bs2hd); GQA, MQA and MLA get separate tensors."""
    by_name = {t.name: t for t in P.TRANSFORMER_ENGINE.tests}
    self_packed = by_name["test_dot_product_attention (base) (self, packed)"]
    assert self_packed.axes["layout"] == ("qkv-packed", "sbhd")
    mla = [t for n, t in by_name.items() if n.startswith("test_dpa_mla")]
    assert mla and all("qkv-packed" not in t.axes["layout"] and "kv-packed" not in t.axes["layout"] for t in mla)
    mqa = by_name["test_dpa_mask (self, GQA, MQA or MLA)"]
    assert (24, 1) in mqa.axes["group"] and mqa.axes["layout"] == ("sbhd",)
