"""The Triton engine's score modifiers (bias and dBias, ALiBi, sinks and dSinks, softcap)
against the float64 autograd reference (tests/triton_reference.py), in the Triton interpreter:
each bias broadcast with its dBias, masks, GQA / MQA, odd bias and dBias layouts, both VEC
variants, fully masked rows and tiles, and bitwise re-runs. Each case also checks canaries
around every output (dBias, dSinks included), untouched inputs and no NaN (triton_reference.check)."""
import dataclasses

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.graph import TensorSpec, dense_graph, ragged_graph, with_modifiers
from bundlegen.engines.triton.capabilities import ROWS
from bundlegen.engines.triton.engine import TritonEngine
from bundlegen.engines.triton.addressing import vec_for
from tests.triton_reference import alibi, check, permuted, prepare
from tests.triton_tiles import TEST_TILES, SmallTileEngine, engine  # noqa: F401  (fixture)


CASES = {
    # each bias broadcast with its dBias (summed over the broadcast axes), with masks and GQA
    "bias-full": (dict(B=2, H_q=2, S_q=24, S_kv=40, D_qk=16), dict(bias="full", dbias=True)),
    "bias-batch-causal-gqa": (dict(B=2, H_q=4, H_k=2, S_q=33, S_kv=47, D_qk=16, right=0),
                              dict(bias="batch", dbias=True)),
    "bias-head-br-causal-mqa": (dict(B=2, H_q=3, H_k=1, S_q=40, S_kv=21, D_qk=16, right=0,
                                     alignment="BOTTOM_RIGHT", dtype="bf16"),
                                dict(bias="head", dbias=True)),
    "bias-both-window": (dict(B=2, H_q=4, H_k=2, H_v=1, S_q=45, S_kv=50, D_qk=24, D_v=16,
                              left=9, right=0, alignment="BOTTOM_RIGHT"),
                         dict(bias="both", dbias=True)),
    "bias-no-dbias-band": (dict(H_q=2, S_q=37, S_kv=29, D_qk=16, left=3, right=2),
                           dict(bias="full")),
    # sinks: in the LSE only; dSinks over batches and rows (rows without a kept key: P = 0)
    "sinks-dsinks": (dict(B=2, H_q=4, H_k=2, S_q=30, S_kv=20, D_qk=16), dict(sinks=True, dsinks=True)),
    "sinks-masked-rows": (dict(B=2, H_q=2, S_q=45, S_kv=13, D_qk=16, right=0,
                               alignment="BOTTOM_RIGHT"), dict(sinks=True, dsinks=True)),
    "sinks-no-dsinks": (dict(H_q=2, S_q=24, D_qk=16, right=0), dict(sinks=True)),
    # softcap (a small cap, so tanh saturates and its gradient factor matters)
    "softcap": (dict(H_q=2, S_q=24, S_kv=40, D_qk=16, scale=2.0), dict(softcap=2.0)),
    "softcap-causal-gqa-bf16": (dict(B=2, H_q=4, H_k=1, H_v=2, S_q=33, S_kv=20, D_qk=16,
                                     right=0, dtype="bf16", scale=1.5), dict(softcap=3.0)),
    # all of them
    "all-window-gqa": (dict(B=2, H_q=4, H_k=2, S_q=37, S_kv=45, D_qk=40, D_v=24, left=11,
                            right=3, alignment="BOTTOM_RIGHT", scale=1.0),
                       dict(bias="batch", dbias=True, sinks=True, dsinks=True, softcap=4.0)),
    "all-causal-bf16": (dict(B=2, H_q=2, S_q=33, S_kv=33, D_qk=16, right=0, dtype="bf16",
                             scale=1.0), dict(bias="both", dbias=True, sinks=True, dsinks=True,
                                              softcap=2.5)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradients(engine, name):
    sizes, mods = CASES[name]
    graph = with_modifiers(dense_graph(**sizes), **mods)
    assert engine.is_applicable(graph) is None
    check(prepare(graph, seed=len(name)), engine)


def _restrided(graph, port: str, strides, offset: int = 0):
    spec = graph.tensors[port]
    tensors = dict(graph.tensors, **{port: dataclasses.replace(spec, strides=tuple(strides),
                                                                offset=offset)})
    return dataclasses.replace(graph, tensors=tensors)


def test_odd_bias_and_dbias_layouts(engine):
    """A bias stored key-major with padded rows and an offset, a dBias stored [H, S_kv, S_q]
    with an offset, the io ports unaligned (VEC = 1)."""
    base = dense_graph(B=2, H_q=2, S_q=19, S_kv=23, D_qk=16, right=0, offsets={"q": 1})
    graph = with_modifiers(base, bias="batch", dbias=True)
    bias = graph.tensors["bias"]
    B, H, S_q, S_kv = bias.dims
    graph = _restrided(graph, "bias", (0, S_kv * (S_q + 3), 1, S_q + 3), offset=5)
    graph = _restrided(graph, "dbias", permuted(graph.tensors["dbias"].dims, (0, 1, 3, 2)), 3)
    assert engine.is_applicable(graph) is None
    prep = prepare(graph, seed=7)
    assert vec_for(prep.views) == 1
    check(prep, engine)


def test_aligned_variant(engine):
    """Aligned io ports (VEC = 8) with every modifier."""
    graph = with_modifiers(dense_graph(B=2, H_q=2, S_q=40, S_kv=24, D_qk=16, right=0),
                           bias="head", dbias=True, sinks=True, dsinks=True, softcap=3.0)
    prep = prepare(graph, seed=8)
    assert vec_for(prep.views) == 8
    check(prep, engine)


def test_alibi(engine):
    """An ALiBi bias (per-head slopes, batch broadcast, bottom-right shift) with causal."""
    S_q, S_kv, H = 20, 37, 4
    graph = with_modifiers(dense_graph(B=2, H_q=H, H_k=2, S_q=S_q, S_kv=S_kv, D_qk=16, right=0,
                                       alignment="BOTTOM_RIGHT"), bias="batch", dbias=True)
    gen = torch.Generator().manual_seed(9)
    inputs = {p: torch.randn(graph.tensors[p].dims, generator=gen, dtype=torch.float64)
              for p in ("q", "k", "v", "do")}
    inputs["bias"] = alibi(H, S_q, S_kv, shift=S_kv - S_q)
    check(prepare(graph, inputs=inputs), engine)


def test_masked_tiles_get_zero_dbias(engine):
    """dBias is dS: exactly 0 wherever the mask drops (i, j), also in whole tiles no loop
    visits (a causal case several tiles wide), and nowhere NaN (the canary fill)."""
    graph = with_modifiers(dense_graph(H_q=2, S_q=64, S_kv=70, D_qk=16, left=5, right=0),
                           bias="full", dbias=True)
    prep = prepare(graph, seed=10)
    check(prep, engine)
    i = torch.arange(64).view(-1, 1)
    j = torch.arange(70).view(1, -1)
    dropped = (j - i > 0) | (i - j >= 5)
    dbias = prep.views["dbias"]
    assert (dbias[:, :, dropped] == 0).all()
    assert (dbias[:, :, ~dropped] != 0).any()


def test_softcap_saturates(engine):
    """Scores far beyond the cap (tanh near +-1): the gradient factor 1 - t^2 near 0, dQ and
    dK small but right; no overflow in tanh."""
    graph = with_modifiers(dense_graph(H_q=1, S_q=17, S_kv=19, D_qk=16, scale=4.0),
                           softcap=1.0)
    check(prepare(graph, seed=11), engine)


def test_reruns_are_bitwise_equal(engine):
    """dBias summed over batch and heads, and dSinks: the same bits on a second run."""
    graph = with_modifiers(dense_graph(B=3, H_q=4, H_k=2, S_q=33, S_kv=40, D_qk=16, right=0),
                           bias="both", dbias=True, sinks=True, dsinks=True, softcap=3.0)
    prep = prepare(graph, seed=12)
    check(prep, engine)
    first = {p: prep.views[p].clone() for p in ("dq", "dk", "dv", "dbias", "dsinks")}
    engine.run(graph, prep.views)
    for p, t in first.items():
        assert torch.equal(t.view(torch.uint8) if t.dtype != torch.float32 else t, prep.views[p]
                           .view(torch.uint8) if t.dtype != torch.float32 else prep.views[p]), p


def test_every_row_serves_modifiers_on_ragged_graphs():
    """Ragged variants with score modifiers are resource-checked for each GPU arch: every row
    serves them (the CPU interpreter runs them: tests/test_triton_ragged_modifiers.py); a row
    without ragged_modifiers declines them, with reason."""
    graph = ragged_graph((0, 9, 16), (0, 12, 20), H_q=2, D_qk=16)
    capped = dataclasses.replace(graph, attributes=dataclasses.replace(graph.attributes,
                                                                       softcap=5.0))
    sinks = dataclasses.replace(graph, tensors=dict(
        graph.tensors, sinks=TensorSpec(dims=(2,), strides=(1,), dtype="fp32")))
    for arch, row in ROWS.items():
        assert row.mismatch(graph) is None
        for g in (capped, sinks):
            assert row.mismatch(g) is None, arch
            reason = dataclasses.replace(row, ragged_modifiers=False).mismatch(g)
            assert reason is not None and reason.startswith(R.MODIFIER_COMBINATION_NOT_SERVED)


def test_engine_lists_every_modifier():
    """Every row serves every modifier, ALiBi slopes too (HAS_ALIBI variants are resource-checked
    for each GPU arch: engines/triton/resources.json)."""
    from bundlegen.graph import MODIFIERS
    assert TritonEngine.score_modifiers == frozenset(MODIFIERS)
    assert all(row.score_modifiers == frozenset(MODIFIERS) for row in ROWS.values())


#: each score-modifier mutant of the catalog (mutants/catalog.py), the graph it shows on
MUTANT_GRAPHS = {
    "softcap-grad-dropped": (dict(H_q=2, S_q=24, S_kv=40, D_qk=16, scale=2.0),
                             dict(softcap=2.0)),
    "dbias-masked-tiles-unwritten": (dict(H_q=2, S_q=64, S_kv=70, D_qk=16, right=0),
                                     dict(bias="full", dbias=True)),
    "dsinks-sign-flipped": (dict(H_q=2, S_q=24, D_qk=16), dict(sinks=True, dsinks=True)),
    "bias-indexed-by-kv-head": (dict(H_q=4, H_k=2, S_q=24, D_qk=16), dict(bias="full")),
}


@pytest.mark.parametrize("name", sorted(MUTANT_GRAPHS))
def test_modifier_mutants_fail_the_checks(name):
    """The modifier mutants fail triton_reference.check (the same graph passes with the correct
    engine in test_gradients-style runs above)."""
    from bundlegen.mutants import catalog
    sizes, mods = MUTANT_GRAPHS[name]
    graph = with_modifiers(dense_graph(**sizes), **mods)
    check(prepare(graph, seed=3), SmallTileEngine("cpu"))
    mutant = catalog.by_name(name).wrap(SmallTileEngine("cpu"))
    with pytest.raises(AssertionError):
        check(prepare(graph, seed=3), mutant)


def test_sm120_declines_the_split_pass_with_modifiers_past_d64():
    """sm120's row: H_k != H_v (a separate dK pass) with modifiers only up to D 64."""
    row = ROWS["sm120"]
    for d, served in ((64, True), (128, False)):
        split = with_modifiers(dense_graph(H_q=4, H_k=2, H_v=1, D_qk=d), softcap=5.0)
        grouped = with_modifiers(dense_graph(H_q=4, H_k=2, D_qk=d), softcap=5.0)
        assert row.mismatch(grouped) is None
        reason = row.mismatch(split)
        assert (reason is None) == served, reason
        if not served:
            assert reason.startswith(R.MODIFIER_COMBINATION_NOT_SERVED)
        assert row.mismatch(dense_graph(H_q=4, H_k=2, H_v=1, D_qk=d)) is None
        assert ROWS["sm90"].mismatch(split) is None


def test_gfx942_declines_modifiers_on_unaligned_rows():
    aligned = with_modifiers(dense_graph(H_q=2, D_qk=64), bias="full")
    unaligned = with_modifiers(dense_graph(H_q=2, D_qk=64, offsets={"q": 1}), bias="full")
    assert ROWS["gfx942"].mismatch(aligned) is None
    assert ROWS["gfx942"].mismatch(unaligned).startswith(R.MODIFIER_COMBINATION_NOT_SERVED)
    assert ROWS["gfx942"].mismatch(dense_graph(H_q=2, D_qk=64, offsets={"q": 1})) is None
    assert ROWS["sm90"].mismatch(unaligned) is None


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
def test_two_chunks_with_every_modifier(split):
    """Head dims in (128, 192] held as two column chunks (kernels.py, "Two chunks") serve
    the score modifiers too: bias, dBias, sinks, dSinks and the softcap, under a band."""
    from bundlegen.engines.triton import launch
    cfg = dataclasses.replace(TEST_TILES, two_chunks=True, split_dkdv=split)
    engine = type("TwoChunks", (TritonEngine,), {"config": lambda self, g: cfg})("cpu")
    graph = with_modifiers(dense_graph(B=2, H_q=4, H_k=2, S_q=33, S_kv=40, D_qk=192, D_v=144,
                                       left=20, right=0, scale=1.0),
                           bias="head", dbias=True, sinks=True, dsinks=True, softcap=4.0)
    assert launch.head_tiles(graph, cfg)["BLOCK_DQK2"] == 64
    check(prepare(graph, seed=11), engine)


#: one small case per modifier for the two-chunk head dims: (modifiers, mask); "alibi" is a
#: batch-broadcast bias filled with ALiBi slopes (tests/triton_reference.alibi)
TWO_CHUNK_MODIFIERS = {
    "bias-dbias": (dict(bias="full", dbias=True), dict(left=9, right=2)),
    "alibi": (dict(bias="batch", dbias=True), dict(right=0, alignment="BOTTOM_RIGHT")),
    "sinks-dsinks": (dict(sinks=True, dsinks=True), dict(right=0)),
    "softcap": (dict(softcap=2.0), dict()),
}


@pytest.mark.parametrize("mod", list(TWO_CHUNK_MODIFIERS))
@pytest.mark.parametrize("d", [160, 192])
def test_two_chunk_head_dims_with_each_modifier(d, mod):
    """Head dims 160 and 192 held as two column chunks (128 + 32, 128 + 64; kernels.py, "Two
    chunks"), not padded to 256, with each score modifier alone: the chunk branch of the
    dK/dV and dQ kernels serves every modifier the one-chunk kernels serve."""
    from bundlegen.engines.triton import launch
    cfg = dataclasses.replace(TEST_TILES, two_chunks=True)
    engine = type("TwoChunks", (TritonEngine,), {"config": lambda self, g: cfg})("cpu")
    mods, mask = TWO_CHUNK_MODIFIERS[mod]
    S_q, S_kv, H = 20, 27, 2
    graph = with_modifiers(dense_graph(B=2, H_q=H, S_q=S_q, S_kv=S_kv, D_qk=d, D_v=d,
                                       scale=0.1, **mask), **mods)
    assert launch.head_tiles(graph, cfg)["BLOCK_DQK2"] == d - 128
    assert engine.is_applicable(graph) is None
    inputs = None
    if mod == "alibi":
        gen = torch.Generator().manual_seed(d)
        inputs = {p: torch.randn(graph.tensors[p].dims, generator=gen, dtype=torch.float64)
                  for p in ("q", "k", "v", "do")}
        inputs["bias"] = alibi(H, S_q, S_kv, shift=S_kv - S_q)
    check(prepare(graph, seed=d, inputs=inputs), engine)


def _dkdv_dp_first(graph, arch: str) -> set:
    """DP_FIRST of every dK/dV launch the engine makes for `graph` with `arch`'s table
    config, recorded on meta tensors (nothing runs)."""
    from bundlegen.dtypes import TORCH_DTYPES
    from bundlegen.engines.triton import configs, launch, warm
    from bundlegen.engines.triton.engine import banded

    tensors = {p: torch.empty(s.storage_elements, device="meta", dtype=TORCH_DTYPES[s.dtype])
               .as_strided(s.dims, s.strides, s.offset) for p, s in graph.tensors.items()}
    cfg = configs.config_for(arch, graph.D_qk, graph.D_v, banded(graph))
    recorder = warm._Launches()
    launch.run(dataclasses.replace(launch.prepare(graph, tensors, cfg), kernels=recorder))
    return {kwargs["DP_FIRST"] for name, _, kwargs in recorder.calls if name == "bwd_dkdv"}


@pytest.mark.parametrize("mods", [dict(bias="full"), dict(softcap=1.0),
                                  dict(bias="head", softcap=2.0)])
def test_score_modifiers_keep_dp_after_dv(mods):
    """A config's dp_first holds only without score modifiers: with their tiles dP^T first
    spilled in sm90's aligned D 128 and D 192 variants (launch.dp_first)."""
    for d in (128, 192):
        graph = dense_graph(B=1, H_q=2, S_q=256, D_qk=d, dtype="bf16")
        assert _dkdv_dp_first(graph, "sm90") == {True}
        assert _dkdv_dp_first(with_modifiers(graph, **mods), "sm90") == {False}
