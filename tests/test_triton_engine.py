"""The Triton engine's gradients against a float64 autograd reference, in the Triton
interpreter on the CPU: head configs, head dims, sequence tails, every mask kind and
alignment, fully masked rows, strided/broadcast/padded layouts, scale, fp16 and bf16.
Each case also checks output canaries, untouched inputs and no NaN (triton_reference.check)."""
import dataclasses

import pytest
import torch

from bundlegen.graph import dense_graph, packed_strides, ragged_graph
from bundlegen.engines.triton import addressing, configs, launch
from bundlegen.engines.triton.engine import TritonEngine
from tests.triton_reference import check, permuted, prepare
from tests.triton_tiles import TEST_TILES, SmallTileEngine, engine  # noqa: F401  (fixture)


def _layout(kind: str, **g) -> dict:
    """Named layouts (dense_graph's strides and offsets) over the dims dense_graph builds
    from the same arguments."""
    graph = dense_graph(**g)
    dims = {p: t.dims for p, t in graph.tensors.items()}
    B, H_q, S_q = dims["q"][:3]
    if kind == "bshd":
        return dict(strides={p: permuted(d, (0, 2, 1, 3)) for p, d in dims.items() if p != "stats"},
                    offsets={p: 3 * i for i, p in enumerate(dims)})
    if kind == "padded-rows":
        return dict(strides={p: permuted(d, (0, 1, 2, 3), pad=8) for p, d in dims.items()
                             if p != "stats"}, offsets={"q": 1, "dq": 5, "dv": 2})
    if kind == "rows-of-16":       # every row padded to 16 elements (16-byte aligned rows)
        return dict(strides={p: permuted(d, (0, 1, 2, 3), pad=16 - d[3]) for p, d in dims.items()
                             if p != "stats"})
    if kind == "head-dim-stride-2":
        return dict(strides={p: tuple(2 * s for s in packed_strides(d)) for p, d in dims.items()
                             if p != "stats"})
    if kind == "broadcast-kv":     # K and V read through zero batch and head strides
        k, v = dims["k"], dims["v"]
        return dict(strides={"k": (0, 0, k[3], 1), "v": (0, 0, v[3], 1)})
    if kind == "do-not-o":         # dO stored BSHD with a pad, O BHSD with padded rows
        return dict(strides={"do": permuted(dims["do"], (0, 2, 1, 3), pad=5),
                             "o": permuted(dims["o"], (0, 1, 2, 3), pad=3)}, offsets={"do": 4})
    if kind == "stats-padded-head":
        return dict(strides={"stats": (H_q * (S_q + 5), S_q + 5, 1, 1)}, offsets={"stats": 2})
    if kind == "stats-s-major":    # stats stored [B, S_q, H_q]
        return dict(strides={"stats": (S_q * H_q, 1, H_q, 1)})
    if kind == "odd-outputs":      # dQ BSHD with odd pitch, dK head-dim stride 3, dV D-major
        dk = dims["dk"]
        return dict(strides={"dq": permuted(dims["dq"], (0, 2, 1, 3), pad=3),
                             "dk": tuple(3 * s for s in packed_strides(dk)),
                             "dv": permuted(dims["dv"], (0, 1, 3, 2))},
                    offsets={"dq": 1, "dk": 2, "dv": 7})
    raise ValueError(kind)


CASES = {
    # head configurations
    "mha": dict(H_q=2, S_q=32, D_qk=32),
    "gqa-2": dict(H_q=4, H_k=2, S_q=24, D_qk=16, dtype="bf16"),
    "gqa-4": dict(H_q=8, H_k=2, S_q=16, S_kv=20, D_qk=16),
    "mqa": dict(H_q=4, H_k=1, S_q=20, D_qk=16, right=0),
    "hk-eq-hq-gt-hv": dict(H_q=4, H_k=4, H_v=2, S_q=16, D_qk=16, dtype="bf16"),
    "hv-gt-hk": dict(H_q=4, H_k=1, H_v=2, S_q=16, D_qk=16),
    # a dK pass and a dV pass under a band: each pass's form of the edge blocks' branch
    "hk-ne-hv-causal-br": dict(H_q=4, H_k=2, H_v=1, S_q=21, S_kv=30, D_qk=16, right=0,
                               alignment="BOTTOM_RIGHT"),
    # head dims
    "dqk-40-dv-24": dict(H_q=2, S_q=17, S_kv=33, D_qk=40, D_v=24, dtype="bf16"),
    "d-8": dict(H_q=2, S_q=16, D_qk=8),
    "dqk-192-dv-130": dict(H_q=1, S_q=16, D_qk=192, D_v=130, dtype="bf16"),
    # sequence tails and S_q != S_kv
    "tails-17-33": dict(B=2, H_q=1, S_q=17, S_kv=33, D_qk=24),
    "s-1": dict(H_q=2, S_q=1, S_kv=1, D_qk=16),
    "sq-1-skv-37": dict(H_q=2, S_q=1, S_kv=37, D_qk=16, right=0, alignment="BOTTOM_RIGHT"),
    "sq-gt-skv": dict(H_q=2, S_q=40, S_kv=9, D_qk=16),
    # masks x alignments (S_q != S_kv so the alignments differ)
    "causal-tl": dict(H_q=2, S_q=33, S_kv=47, D_qk=16, right=0),
    "causal-br": dict(H_q=2, S_q=33, S_kv=47, D_qk=16, right=0, alignment="BOTTOM_RIGHT"),
    "window-tl": dict(H_q=2, S_q=40, S_kv=40, D_qk=16, left=7, right=0),
    "window-br": dict(H_q=2, S_q=21, S_kv=50, D_qk=16, left=9, right=0,
                      alignment="BOTTOM_RIGHT", dtype="bf16"),
    # a band edge on a block edge: KV block 0 (keys 0..31) is kept by rows up to 32 only,
    # and row 32 starts a Q block of the dK/dV kernel (TEST_TILES: M1=16, N1=32)
    "window-edge-tl": dict(H_q=1, S_q=48, D_qk=16, left=2, right=0),
    "band-tl": dict(H_q=2, S_q=37, S_kv=29, D_qk=16, left=3, right=2),
    "band-br": dict(H_q=2, S_q=29, S_kv=37, D_qk=16, left=4, right=5, alignment="BOTTOM_RIGHT"),
    "left-only-br": dict(H_q=2, S_q=33, S_kv=20, D_qk=16, left=6, alignment="BOTTOM_RIGHT"),
    "right-only-tl": dict(H_q=2, S_q=33, S_kv=20, D_qk=16, right=9),
    "right-minus-1-tl": dict(H_q=2, S_q=20, S_kv=20, D_qk=16, right=-1),
    "right-minus-1-br": dict(H_q=2, S_q=20, S_kv=31, D_qk=16, right=-1, left=3,
                             alignment="BOTTOM_RIGHT"),
    # rows with no kept key: BOTTOM_RIGHT causal with S_q > S_kv, windows cut by the start
    "masked-rows-br-causal": dict(H_q=2, S_q=45, S_kv=13, D_qk=16, right=0,
                                  alignment="BOTTOM_RIGHT"),
    "masked-rows-window": dict(H_q=2, S_q=40, S_kv=12, D_qk=16, left=3, right=-1,
                               alignment="BOTTOM_RIGHT", dtype="bf16"),
    # scale and dtype
    "scale-0.3": dict(H_q=2, S_q=24, D_qk=16, scale=0.3, dtype="bf16"),
    "scale-2": dict(H_q=2, S_q=24, D_qk=16, scale=2.0, right=0),
}

LAYOUT_CASES = {
    "bshd": dict(B=2, H_q=2, S_q=19, S_kv=23, D_qk=24, dtype="bf16"),
    "padded-rows": dict(H_q=4, H_k=2, S_q=17, D_qk=40, D_v=24),
    "rows-of-16": dict(H_q=2, S_q=17, D_qk=12, D_v=12, right=0),  # aligned rows, D % 8 != 0
    "head-dim-stride-2": dict(H_q=2, H_k=1, S_q=17, D_qk=24, right=0),
    "broadcast-kv": dict(B=2, H_q=2, H_k=2, S_q=16, S_kv=21, D_qk=16, dtype="bf16"),
    "do-not-o": dict(H_q=2, S_q=17, D_qk=16, D_v=24, left=5, right=0),
    "stats-padded-head": dict(B=2, H_q=2, S_q=17, D_qk=16),
    "stats-s-major": dict(H_q=4, H_k=2, S_q=17, D_qk=16, right=0, alignment="BOTTOM_RIGHT"),
    "odd-outputs": dict(H_q=4, H_k=2, H_v=1, S_q=18, S_kv=22, D_qk=24, D_v=16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradients(engine, name):
    graph = dense_graph(**CASES[name])
    assert engine.is_applicable(graph) is None
    check(prepare(graph, seed=len(name)), engine)


#: graphs whose every tile is whole under TEST_TILES (S_q, S_kv multiples of 32, head dims equal
#: to their tiles): the kernels' EVEN variants, loads and stores without masks
WHOLE_TILE_CASES = {
    "mha": dict(H_q=2, S_q=64, D_qk=32),
    "gqa-4-kv-64": dict(H_q=8, H_k=2, S_q=32, S_kv=64, D_qk=16, dtype="bf16"),
    "hk-ne-hv": dict(H_q=4, H_k=4, H_v=2, S_q=32, D_qk=32, D_v=16),   # a dK pass and a dV pass
    "hk-ne-hv-band": dict(H_q=4, H_k=4, H_v=2, S_q=64, D_qk=32, D_v=16, left=9, right=3),
    "causal-br": dict(H_q=2, S_q=32, S_kv=96, D_qk=16, right=0, alignment="BOTTOM_RIGHT"),
    "band": dict(H_q=2, S_q=64, D_qk=16, left=9, right=3, dtype="bf16"),
    "masked-rows": dict(H_q=2, S_q=96, S_kv=32, D_qk=16, right=0, alignment="BOTTOM_RIGHT"),
}


@pytest.mark.parametrize("name", list(WHOLE_TILE_CASES))
def test_whole_tiles(engine, name):
    graph = dense_graph(**WHOLE_TILE_CASES[name])
    assert launch.whole_tiles(graph, TEST_TILES, launch.head_tiles(graph, TEST_TILES))
    check(prepare(graph, seed=len(name)), engine)


def test_whole_tiles_only_where_no_tile_is_cut():
    tiles = lambda g: launch.head_tiles(g, TEST_TILES)  # noqa: E731
    for args in (dict(S_q=48), dict(S_q=32, S_kv=48), dict(S_q=32, D_qk=24), dict(S_q=32, D_v=8)):
        graph = dense_graph(**dict(dict(H_q=2, D_qk=16), **args))
        assert not launch.whole_tiles(graph, TEST_TILES, tiles(graph)), args
    ragged = ragged_graph((0, 32, 64), (0, 32, 64), H_q=2, H_k=2, H_v=2, D_qk=16, D_v=16)
    assert not launch.whole_tiles(ragged, TEST_TILES, tiles(ragged))
    split = dataclasses.replace(TEST_TILES, dv_pass=(16, 64, 4, 1))   # the dV pass's 64 rows
    graph = dense_graph(H_q=2, S_q=32, D_qk=16)
    assert launch.whole_tiles(graph, TEST_TILES, tiles(graph))
    assert not launch.whole_tiles(graph, split, tiles(graph))


TMA_TILES = dataclasses.replace(TEST_TILES, tma=True)

#: aligned padded graphs, their Q, dO, K and V tiles loaded through TMA descriptors
#: (TMA_TILES): sequence tails and head dims short of their tiles (the descriptors' zero
#: fill), GQA and H_k != H_v (a query head's K and V heads), bands, BSHD strides, both dtypes
TMA_CASES = {
    "tails-17-33-d24": dict(B=2, H_q=1, S_q=17, S_kv=33, D_qk=24),
    "gqa-4-causal-br": dict(H_q=8, H_k=2, S_q=16, S_kv=20, D_qk=16, right=0,
                            alignment="BOTTOM_RIGHT", dtype="bf16"),
    "hk-eq-hq-gt-hv": dict(H_q=4, H_k=4, H_v=2, S_q=16, D_qk=16, dtype="bf16"),
    "dqk-40-dv-24-band": dict(H_q=2, S_q=37, S_kv=29, D_qk=40, D_v=24, left=3, right=2),
    "whole-tiles": dict(H_q=2, S_q=64, D_qk=32),
    "bshd": dict(B=2, H_q=2, S_q=19, S_kv=23, D_qk=24, dtype="bf16"),
}


@pytest.mark.parametrize("name", list(TMA_CASES))
def test_descriptor_loads(name):
    args = TMA_CASES[name]
    layout = {}
    if name == "bshd":
        dims = {p: t.dims for p, t in dense_graph(**args).tensors.items()}
        layout = dict(strides={p: permuted(d, (0, 2, 1, 3)) for p, d in dims.items()
                               if p != "stats"})
    graph = dense_graph(**layout, **args)
    prep = prepare(graph, seed=len(name))
    assert launch.prepare(graph, prep.views, TMA_TILES).flags["TMA"]
    check(prep, ConfigEngine(TMA_TILES))


def test_descriptor_loads_only_where_the_hardware_takes_them():
    """Descriptors only when the config asks for them, for a padded graph of one head-dim
    chunk whose io tensors are VEC-aligned and whose streamed ports have positive dims and
    strides; each condition alone falls back to pointer loads."""
    def meta(graph):
        return {p: torch.empty(1, dtype=torch.float16, device="meta").as_strided(
                    t.dims, t.strides, t.offset) for p, t in graph.tensors.items()}

    def tma(cfg=TMA_TILES, **kw):
        graph = dense_graph(**dict(dict(H_q=2, S_q=17, D_qk=16), **kw))
        return launch.prepare(graph, meta(graph), cfg).flags["TMA"]

    assert tma() and tma(offsets={"dv": 8})
    assert not tma(cfg=TEST_TILES)
    assert not tma(offsets={"q": 1})
    assert not tma(strides={"k": (0, 0, 16, 1)})
    assert not tma(S_kv=0)
    assert tma(D_qk=192, D_v=192)
    assert not tma(cfg=dataclasses.replace(TMA_TILES, two_chunks=True), D_qk=192, D_v=192)
    ragged = ragged_graph((0, 9, 16), (0, 12, 20), H_q=2, H_k=2, H_v=2, D_qk=16, D_v=16)
    assert not launch.descriptor_loads(ragged, TMA_TILES, launch.head_tiles(ragged, TMA_TILES),
                                       launch.VEC, addressing.kernel_views(ragged, meta(ragged)))
    # a launch without descriptors runs the config's pointer_loads config, where it has one
    pointers = dataclasses.replace(TEST_TILES, num_stages=2)
    both = dataclasses.replace(TMA_TILES, block_m1=32, pointer_loads=pointers)
    for kw, cfg in ((dict(), both), (dict(offsets={"q": 1}), pointers),
                    (dict(strides={"k": (0, 0, 16, 1)}), pointers)):
        graph = dense_graph(H_q=2, S_q=17, D_qk=16, **kw)
        assert launch.prepare(graph, meta(graph), both).cfg == cfg, kw
    assert launch.prepare(graph, meta(graph), TMA_TILES).cfg == TMA_TILES


@pytest.mark.parametrize("name", list(LAYOUT_CASES))
def test_layouts(engine, name):
    args = LAYOUT_CASES[name]
    graph = dense_graph(**_layout(name, **args), **args)
    assert engine.is_applicable(graph) is None
    check(prepare(graph, seed=len(name)), engine)


def test_fully_masked_rows_are_zero(engine):
    """Rows with LSE = -inf give exactly zero dQ (and no NaN anywhere)."""
    graph = dense_graph(H_q=2, S_q=30, S_kv=10, D_qk=16, right=0, alignment="BOTTOM_RIGHT")
    prep = prepare(graph, seed=3)
    check(prep, engine)
    assert torch.isneginf(prep.views["stats"][:, :, :20]).all()
    assert (prep.views["dq"][:, :, :20] == 0).all()


def test_rows_with_lse_minus_inf_are_zero(engine):
    """The contract, independent of the mask: a row whose stats say -inf (no kept key) has
    P = 0, so zero dQ and no contribution to dK/dV, never NaN (here without any mask)."""
    graph = dense_graph(H_q=2, S_q=20, S_kv=24, D_qk=16)
    prep = prepare(graph, seed=4)
    prep.views["stats"][:, :, 3:9] = float("-inf")
    prep.views["o"][:, :, 3:9] = 0
    engine.run(graph, prep.views)
    for p in ("dq", "dk", "dv"):
        assert torch.isfinite(prep.views[p]).all(), p
    assert (prep.views["dq"][:, :, 3:9] == 0).all()


def test_extreme_lse(engine):
    """LSE far below -88.7 (exp(LSE) underflows fp32): P must still be formed in one piece.
    Q and K are -5 and +5 on half the head dims (scores near -100), random on the rest."""
    graph = dense_graph(H_q=1, S_q=17, S_kv=19, D_qk=16, scale=0.5)
    gen = torch.Generator().manual_seed(5)
    randn = lambda *d: torch.randn(*d, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k = randn(1, 1, 17, 16), randn(1, 1, 19, 16)
    q[..., :8], k[..., :8] = -5.0, 5.0
    inputs = {"q": q, "k": k, "v": randn(1, 1, 19, 16), "do": randn(1, 1, 17, 16)}
    prep = prepare(graph, inputs=inputs)
    assert prep.views["stats"].max() < -88.7
    check(prep, engine)


def test_default_cpu_tiles():
    """The shipped cpu config (not TEST_TILES) on a multi-block GQA causal case."""
    engine = TritonEngine("cpu")
    assert engine.config(dense_graph()) == configs.config_for("cpu", 16, 16) != TEST_TILES
    graph = dense_graph(H_q=4, H_k=2, H_v=1, S_q=97, S_kv=150, D_qk=40, D_v=24, right=0,
                       alignment="BOTTOM_RIGHT", dtype="bf16")
    check(prepare(graph, seed=2), engine)


class ConfigEngine(TritonEngine):
    """The engine with a given config in place of its table's."""
    def __init__(self, cfg):
        super().__init__("cpu")
        self.cfg = cfg

    def config(self, graph):
        return self.cfg


#: head dims past one 128-column chunk (the two-chunk kernels), with heads, masks, tails,
#: ragged-free layouts; each run with dK/dV fused and split into two passes
TWO_CHUNK_CASES = {
    "d192-no-mask": dict(H_q=2, S_q=64, D_qk=192, dtype="bf16"),
    "d192-causal-br": dict(H_q=2, S_q=37, S_kv=50, D_qk=192, right=0, alignment="BOTTOM_RIGHT"),
    "dqk-192-dv-130-gqa": dict(H_q=4, H_k=2, S_q=33, D_qk=192, D_v=130, dtype="bf16", left=9),
    "dqk-144-dv-176-hv-lt-hk": dict(H_q=4, H_k=2, H_v=1, S_q=20, S_kv=35, D_qk=144, D_v=176,
                                    left=6, right=3),
}


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
@pytest.mark.parametrize("name", list(TWO_CHUNK_CASES))
def test_two_chunks_and_split_passes(name, split):
    """Head dims in (128, 192] as two column chunks (kernels.py, "Two chunks"), and dK/dV in two
    passes (BlockConfig.split_dkdv, K and V loaded once when H_k == H_v)."""
    from bundlegen.engines.triton import launch
    args = TWO_CHUNK_CASES[name]
    graph = dense_graph(**args)
    cfg = dataclasses.replace(TEST_TILES, two_chunks=True, split_dkdv=split)
    tiles = launch.head_tiles(graph, cfg)
    assert tiles["BLOCK_DQK"] == tiles["BLOCK_DV"] == configs.CHUNK and tiles["BLOCK_DQK2"] > 0
    check(prepare(graph, seed=len(name)), ConfigEngine(cfg))


def test_two_chunks_in_odd_layouts():
    """The two-chunk kernels on unaligned strided outputs (VEC 1) and on BSHD (VEC 8)."""
    cfg = dataclasses.replace(TEST_TILES, two_chunks=True)
    args = dict(H_q=4, H_k=2, H_v=1, S_q=18, S_kv=22, D_qk=192, D_v=136, right=0)
    check(prepare(dense_graph(**_layout("odd-outputs", **args), **args), seed=3), ConfigEngine(cfg))
    args = dict(B=2, H_q=2, S_q=19, S_kv=23, D_qk=160, dtype="bf16")
    check(prepare(dense_graph(**_layout("bshd", **args), **args), seed=4), ConfigEngine(cfg))


def test_two_chunk_tiles_only_where_narrower_than_one_padded_tile():
    assert configs.two_chunk_tiles(192, 192) == (64, 64)
    assert configs.two_chunk_tiles(192, 130) == (64, 16)
    assert configs.two_chunk_tiles(256, 256) is None      # 128 + 128: no narrower
    assert configs.two_chunk_tiles(200, 192) is None      # 128 + 128 again
    assert configs.two_chunk_tiles(192, 64) is None       # one head dim within one chunk
    assert configs.tier_key(192, 192) == 192 and configs.tier_key(256, 256) == 256
    assert configs.tier_key(160, 136) == 160 and configs.tier_key(192, 64) == 256


@pytest.mark.parametrize("order", [False, True], ids=["head-major", "block-major"])
@pytest.mark.parametrize("mask", [dict(right=0), dict(left=7)], ids=["causal", "left-only"])
def test_program_orders(monkeypatch, order, mask):
    """Both program orders (tile_ops.block_batch_head) give the right gradients on a
    multi-block GQA case with a one-sided band, whatever the launcher picks by default."""
    from bundlegen.engines.triton import launch
    monkeypatch.setattr(launch, "block_major", lambda graph: order)
    graph = dense_graph(H_q=4, H_k=2, H_v=1, S_q=45, S_kv=70, D_qk=16, alignment="BOTTOM_RIGHT",
                       **mask)
    check(prepare(graph, seed=6), SmallTileEngine("cpu"))


@pytest.mark.parametrize("heads, mask, expected", [
    ((4, 2, 2), dict(right=0), True), ((4, 4, 2), dict(left=7), True),
    ((4, 4, 4), dict(right=0), False), ((4, 2, 2), {}, False), ((4, 2, 2), dict(left=3, right=2), False)],
    ids=["gqa-causal", "gqa-v-left-only", "mha-causal", "gqa-no-mask", "gqa-two-sided"])
def test_block_major_only_for_a_one_sided_band_over_a_head_group(heads, mask, expected):
    from bundlegen.engines.triton import launch
    H_q, H_k, H_v = heads
    assert launch.block_major(dense_graph(H_q=H_q, H_k=H_k, H_v=H_v, S_q=64, **mask)) is expected


def test_wide_tile_offsets(engine, monkeypatch):
    """The 64-bit tile-offset variant (WIDE), forced on a strided GQA band case."""
    from bundlegen.engines.triton import launch, tile_plan
    monkeypatch.setattr(tile_plan, "TILE_OFFSET_LIMIT", 0)
    args = dict(H_q=4, H_k=2, H_v=1, S_q=19, S_kv=35, D_qk=24, D_v=40, left=9, right=2,
                alignment="BOTTOM_RIGHT")
    graph = dense_graph(**_layout("odd-outputs", **args), **args)
    prep = prepare(graph, seed=9)
    assert launch.needs_wide(prep.views, TEST_TILES)
    check(prep, engine)


def test_vec_only_for_whole_16_byte_rows(monkeypatch):
    """VEC = 8 (vectorised loads) only when every io tensor's offset and batch/head/row
    strides are multiples of 8 elements, its head-dim stride is 1, its head dim a multiple
    of 8 and its storage 16-byte aligned; each condition alone falls back to VEC = 1."""
    def vec(**kw):
        layout = kw.pop("layout", None)
        args = dict(dict(H_q=2, S_q=8, D_qk=16), **kw)
        graph = dense_graph(**args)
        if layout is not None:
            graph = dense_graph(**layout(graph), **args)
        return addressing.vec_for(prepare(graph).views)

    def only(port, strides=None, offset=0):
        return lambda g: dict(strides={port: strides(g.tensors[port].dims)} if strides else {},
                              offsets={port: offset})

    assert vec() == 8
    assert vec(layout=only("dv", offset=8)) == 8
    assert vec(layout=only("dv", offset=4)) == 1
    assert vec(layout=only("k", lambda d: tuple(2 * s for s in packed_strides(d)))) == 1
    assert vec(layout=only("o", lambda d: permuted(d, (0, 1, 2, 3), pad=4))) == 1
    assert vec(D_v=12) == 1
    assert vec(D_qk=12, D_v=12, layout=lambda g: dict(
        strides={p: permuted(t.dims, (0, 1, 2, 3), 4) for p, t in g.tensors.items()})) == 1
    assert vec(layout=only("stats", lambda d: (99, 33, 3, 1), offset=5)) == 8
    monkeypatch.setattr(addressing, "ALIGN_BYTES", 1 << 40)
    assert vec() == 1


def test_needs_wide_past_2_31():
    """A head's tiles spanning 2^31 elements from its row 0 select WIDE (the rows of the
    sequence, rounded up to the tiles: 100 -> 128); the launcher's rule, on meta tensors."""
    from bundlegen.engines.triton.launch import needs_wide
    cfg = configs.BlockConfig(64, 64, 64, 64)

    def view(strides, dims=(1, 1, 100, 64)):
        return torch.empty_strided(dims, strides, device="meta")
    small = {"q": view((128 * 64, 128 * 64, 64, 1))}
    assert not needs_wide(small, cfg)
    assert needs_wide(dict(small, k=view((0, 0, 2 ** 31 // 127, 1))), cfg)
    assert not needs_wide(dict(small, k=view((0, 0, 2 ** 31 // 128, 1))), cfg)
    assert needs_wide(dict(small, dv=view((1, 1, 1, 2 ** 31 // 63))), cfg)
    stats = (1, 1, 100, 1)
    assert needs_wide(dict(small, stats=view((0, 0, 2 ** 31 // 127 + 1, 1), stats)), cfg)
    assert not needs_wide(dict(small, stats=view((0, 0, 2 ** 31 // 127, 2 ** 40), stats)), cfg)


def test_deterministic(engine):
    """Two runs on the same inputs give bitwise equal outputs (the engine declares it)."""
    graph = dense_graph(H_q=4, H_k=1, H_v=2, S_q=33, S_kv=17, D_qk=16, right=0,
                       alignment="BOTTOM_RIGHT", dtype="bf16")
    prep = prepare(graph, seed=11)
    check(prep, engine)
    first = {p: prep.views[p].clone() for p in ("dq", "dk", "dv")}
    engine.run(graph, prep.views)
    for p, t in first.items():
        assert torch.equal(t.view(torch.int16), prep.views[p].view(torch.int16)), p


@pytest.mark.parametrize("mask, lone", [(dict(right=0), 2), (dict(left=7), 1),
                                        (dict(left=7, right=3), 0)],
                         ids=["causal", "left-only", "window"])
def test_every_band_kind_launches_the_kernels_of_both_bounds(mask, lone):
    """launch.band_flags: one kernel (both bounds) for every band kind, an absent bound passed
    as `far`; the two-chunk kernels keep each kind's own constexprs; lone_bound says which
    bound a band has alone (the program order's)."""
    graph = dense_graph(S_q=64, S_kv=80, D_qk=64, **mask)
    shift, left, right = launch._bounds(graph)
    far = 2 * (64 + 80 + 1)
    assert launch.band_flags(graph, dict(BLOCK_DQK2=0)) == dict(HAS_LEFT=True, HAS_RIGHT=True,
                                                                lone_bound=lone)
    assert (left, right) == (mask.get("left", far), mask.get("right", far))
    assert launch.band_flags(graph, dict(BLOCK_DQK2=64)) == dict(
        HAS_LEFT="left" in mask, HAS_RIGHT="right" in mask, lone_bound=lone)
    none = dense_graph(S_q=64, D_qk=64)
    assert launch.band_flags(none, dict(BLOCK_DQK2=0)) == dict(HAS_LEFT=False, HAS_RIGHT=False,
                                                               lone_bound=0)


@pytest.mark.parametrize("mask", [dict(right=0), dict(left=9), dict(left=40, right=2)],
                         ids=["causal", "left-only", "window"])
@pytest.mark.parametrize("alignment", ["TOP_LEFT", "BOTTOM_RIGHT"])
def test_the_kernel_of_both_bounds_serves_each_band_kind(mask, alignment):
    """Gradients against the oracle for each band kind through the one kernel, with the
    sequences longer than a tile on both sides and S_q != S_kv (a shift either way)."""
    graph = dense_graph(H_q=2, H_k=1, H_v=1, S_q=45, S_kv=70, D_qk=16, alignment=alignment,
                        **mask)
    check(prepare(graph, seed=11), SmallTileEngine("cpu"))
