"""Ragged (THD / varlen) batches in the Triton engine, in the Triton interpreter on the CPU,
against a float64 autograd reference run sequence by sequence.

Every port lives in a storage with NaN canary guard bands (GUARD elements) on both sides and
NaN in every gap; after a run the guards, the gaps and every output row that no in-bounds
sequence side owns must hold their canary bit for bit, the inputs must be untouched, and the
good sequences (validate.good_sequences) must match the reference. The bad-offset test puts
offsets before the storage, past its end, decreasing and over max_seqlen, and the engine
must still touch nothing outside its tensors; the seed-001 mutant (the token-base bound
dropped) fails that very check."""
import dataclasses
import math

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.graph import Graph, packed_strides, ragged_graph
from bundlegen.mask import keep_mask
from bundlegen.harness.checks import bit_pattern
from bundlegen.validate import frontend_reason, good_sequences
from bundlegen.engines.triton import launch
from bundlegen.engines.triton.capabilities import Capabilities
from bundlegen.engines.triton.engine import TritonEngine
from bundlegen.mutants import catalog as C

#: a mutant's NaN and overflow are expected; numpy warns of them inside the interpreter
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

GUARD = 512                                   # canary elements before and after every port
OUTPUTS = ("dq", "dk", "dv")
IO = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: canary NaN bit patterns (output storages, input storages): distinct payloads, so an output
#: computed from an input canary (a stray read) is still a changed output canary
CANARY = {torch.float16: (0x7E5A, 0x7E0B), torch.bfloat16: (0x7FDA, 0x7FC5),
          torch.float32: (0x7FC0005A, 0x7FC0000B)}
from tests.triton_tiles import TEST_TILES as TILES, SmallTileEngine, engine, small_tile  # noqa: F401


# ----------------------------------------------------------------------------- reference
def reference(q, k, v, do, attrs):
    """One sequence, [S, H, D] each: float64 (O, LSE [S_q, H_q], dQ, dK, dV) by autograd of
    masked GQA attention over that sequence's own lengths (BOTTOM_RIGHT shifts by its own
    S_kv - S_q). A row with no kept key has LSE = -inf, O = 0 and no gradient."""
    q, k, v, do = (t.detach().double().transpose(0, 1) for t in (q, k, v, do))   # [H, S, D]
    S_q, S_kv, H_q = q.shape[1], k.shape[1], q.shape[0]
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    kk = k.repeat_interleave(H_q // k.shape[0], 0)
    vv = v.repeat_interleave(H_q // v.shape[0], 0)
    s = attrs.attn_scale * q @ kk.transpose(-1, -2)
    keep = keep_mask(S_q, S_kv, attrs) if S_q and S_kv else None
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    m = s.amax(-1, keepdim=True).detach() if S_kv else torch.zeros(H_q, S_q, 1, dtype=s.dtype)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    o = (e / torch.where(den == 0, torch.ones_like(den), den)) @ vv
    (o * do).sum().backward()
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (q, k, v)]
    lse = (torch.log(den) + m).squeeze(-1)
    back = lambda t: t.detach().transpose(0, 1)
    return back(o), back(lse), *(back(g) for g in grads)


# ----------------------------------------------------------------------------- storage
_bits = bit_pattern


def _canaries(n: int, dtype: torch.dtype, output: bool) -> torch.Tensor:
    bits = CANARY[dtype][0 if output else 1]
    return torch.full((n,), bits, dtype=torch.int32 if dtype == torch.float32 else torch.int16).view(dtype)


def _side_ok(cu, b, rows, bound):
    """The kernels' bound (kernels._sequence): does sequence b's side address rows in storage?"""
    start, end = cu[b], cu[b + 1]
    return start >= 0 and end <= rows and 0 <= end - start <= bound


@dataclasses.dataclass
class Run:
    graph: Graph          # with its offsets (the harness's view)
    views: dict
    storages: dict
    marks: dict           # output element -> may the engine write it (rows of in-bound sides)
    expected: dict        # float64 expected gradients, NaN where not judged


def prepare(graph: Graph, seed: int = 0) -> Run:
    rag, attrs = graph.ragged, graph.attributes
    io = IO[graph.dtype]
    gen = torch.Generator().manual_seed(seed)
    storages, views = {}, {}
    for port, spec in graph.tensors.items():
        storage = _canaries(GUARD + spec.storage_elements + GUARD,
                            torch.float32 if port == "stats" else io, port in OUTPUTS)
        storages[port] = storage
        views[port] = storage.as_strided(spec.dims, spec.strides, GUARD + spec.offset)
    for port in ("q", "k", "v", "do", "o", "stats"):   # every row finite, gaps and guards NaN
        views[port].copy_(torch.randn(views[port].shape, generator=gen))
    expected = {p: torch.full(views[p].shape, math.nan, dtype=torch.float64) for p in OUTPUTS}
    cu_q, cu_kv = rag.cu_seqlens_q, rag.cu_seqlens_kv
    for b in good_sequences(graph):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_kv[b], cu_kv[b + 1])
        o, lse, dq, dk, dv = reference(views["q"][qs], views["k"][ks], views["v"][ks],
                                       views["do"][qs], attrs)
        views["o"][qs] = o.to(io)
        views["stats"][qs] = lse.unsqueeze(-1).float()
        expected["dq"][qs], expected["dk"][ks], expected["dv"][ks] = dq, dk, dv
    # where the kernels may write: the rows of every side that passes the bound (a side
    # whose other side is out of bounds gets zeros; judged below where the sequence is good)
    marks = {}
    for port, cu, rows, bound in (("dq", cu_q, graph.T_q, rag.max_seqlen_q),
                                  ("dk", cu_kv, graph.T_kv, rag.max_seqlen_kv),
                                  ("dv", cu_kv, graph.T_kv, rag.max_seqlen_kv)):
        spec = graph.tensors[port]
        owned = torch.zeros(spec.dims, dtype=torch.bool)
        for b in range(rag.batch):
            if _side_ok(cu, b, rows, bound):
                owned[cu[b]:cu[b + 1]] = True
        mark = torch.zeros(storages[port].shape, dtype=torch.bool)
        mark.as_strided(spec.dims, spec.strides, GUARD + spec.offset).copy_(owned)
        marks[port] = mark
    return Run(graph, views, storages, marks, expected)


def offsets(graph: Graph) -> dict:
    rag = graph.ragged
    return {"cu_seqlens_q": torch.tensor(rag.cu_seqlens_q, dtype=torch.int32),
            "cu_seqlens_kv": torch.tensor(rag.cu_seqlens_kv, dtype=torch.int32)}


def check(run: Run, engine, rel: float = 0.02) -> None:
    """Run the engine as the harness does (graph as launched, offsets as device tensors) and
    assert: inputs untouched, no output element outside the rows of in-bound sides changed
    (guards, gaps, rows of no sequence), good sequences within rel * max|ref|, no NaN there."""
    before = {p: _bits(s).clone() for p, s in run.storages.items()}
    launched = run.graph.as_launched()
    assert launched.ragged.cu_seqlens_q is None
    assert engine.is_applicable(launched) is None
    engine.run(launched, {**run.views, **offsets(run.graph)})
    for port, storage in run.storages.items():
        if port not in OUTPUTS:
            assert torch.equal(before[port], _bits(storage)), f"input {port} modified"
            continue
        kept = ~run.marks[port]
        changed = (before[port] != _bits(storage)) & kept
        assert not changed.any(), (
            f"{port}: {int(changed.sum())} element(s) outside the sequences changed, first at "
            f"storage index {int(changed.nonzero()[0])} (guard {GUARD}, tensor ends at "
            f"{GUARD + run.graph.tensors[port].storage_elements})")
    rag = run.graph.ragged
    for port in OUTPUTS:
        out, ref = run.views[port].double(), run.expected[port]
        judged = ~torch.isnan(ref)
        if not judged.any():
            continue
        assert not torch.isnan(out[judged]).any(), f"{port}: NaN in a good sequence"
        bound = rel * max(ref[judged].abs().max().item(), 1e-4)
        err = (out[judged] - ref[judged]).abs().max().item()
        assert err <= bound, f"{port}: max err {err:.3g} > {bound:.3g}"
    # a sequence with an empty side: the rows of its other side are written as zeros
    for b in good_sequences(run.graph):
        q_rows = slice(rag.cu_seqlens_q[b], rag.cu_seqlens_q[b + 1])
        kv_rows = slice(rag.cu_seqlens_kv[b], rag.cu_seqlens_kv[b + 1])
        if q_rows.stop == q_rows.start:
            assert (run.views["dk"][kv_rows] == 0).all() and (run.views["dv"][kv_rows] == 0).all()
        if kv_rows.stop == kv_rows.start:
            assert (run.views["dq"][q_rows] == 0).all()


# ----------------------------------------------------------------------------- valid batches
def _thd_padded(graph: Graph, pad: int) -> dict:
    """Every port's token stride padded by `pad` elements (stats keeps its own layout)."""
    strides = {}
    for port, spec in graph.tensors.items():
        if port != "stats":
            T, H, D = spec.dims
            strides[port] = (H * D + pad, D, 1)
    return strides


CASES = {
    "equal-lengths": dict(cu_q=(0, 20, 40), D_qk=32),
    "ragged": dict(cu_q=(0, 5, 38, 50), cu_kv=(0, 17, 20, 50)),
    "zero-length-q": dict(cu_q=(0, 9, 9, 30), cu_kv=(0, 12, 31, 40)),
    "zero-length-kv-with-q-rows": dict(cu_q=(0, 7, 20), cu_kv=(0, 0, 18), right=0),
    "length-1": dict(cu_q=(0, 1, 2, 19), cu_kv=(0, 1, 20, 21)),
    "tile-tails-63-65": dict(cu_q=(0, 63, 128), cu_kv=(0, 65, 128), H_q=1),
    "causal-tl-sq-ne-skv": dict(cu_q=(0, 30, 39), cu_kv=(0, 11, 48), right=0),
    "causal-br-sq-ne-skv": dict(cu_q=(0, 30, 39), cu_kv=(0, 11, 48), right=0,
                                alignment="BOTTOM_RIGHT"),
    "window-br": dict(cu_q=(0, 17, 50), cu_kv=(0, 40, 49), left=5, right=2,
                      alignment="BOTTOM_RIGHT", dtype="bf16"),
    "gqa-4-2": dict(cu_q=(0, 13, 40), cu_kv=(0, 21, 35), H_q=4, H_k=2, right=0),
    "dqk-32-dv-16": dict(cu_q=(0, 19, 36), cu_kv=(0, 7, 40), D_qk=32, D_v=16),
    # rows before cu[0] and from cu[B] on belong to no sequence; max_seqlen above the longest
    "rows-outside-sequences": dict(cu_q=(3, 10, 24), cu_kv=(5, 20, 29), T_q=30, T_kv=33,
                                   max_seqlen_q=40, max_seqlen_kv=17),
}


def _graph(cu_q, cu_kv=None, layout="thd", H_q=2, D_qk=16, **kw) -> Graph:
    return ragged_graph(cu_q, cu_kv, H_q=H_q, D_qk=D_qk, layout=layout, **kw)


@pytest.mark.parametrize("name", list(CASES))
def test_ragged_gradients(engine, name):
    graph = _graph(**CASES[name])
    assert frontend_reason(graph) is None
    check(prepare(graph, seed=len(name)), engine)


def test_token_stride_padding(engine):
    base = _graph(cu_q=(0, 11, 30), cu_kv=(0, 20, 37), right=0, alignment="BOTTOM_RIGHT")
    graph = _graph(cu_q=(0, 11, 30), cu_kv=(0, 20, 37), right=0, alignment="BOTTOM_RIGHT",
                   strides=_thd_padded(base, 8), offsets={"q": 3, "dq": 5, "dv": 1})
    check(prepare(graph, seed=2), engine)


def test_htd_layout(engine):
    graph = _graph(cu_q=(0, 11, 30), cu_kv=(0, 20, 37), layout="htd", H_q=4, H_k=2, left=6)
    assert graph.tensors["q"].strides == packed_strides((30, 4, 16), (1, 0, 2))
    check(prepare(graph, seed=3), engine)


def test_ragged_kernels_read_offsets_only_on_the_device():
    """The launcher prepares a ragged launch from tensors that hold no values (the meta
    device): it reads no offset, nor anything else, back to the host."""
    graph = _graph(cu_q=(0, 11, 30), cu_kv=(0, 20, 37)).as_launched()
    tensors = {p: torch.empty_strided(s.dims, s.strides, device="meta",
                                      dtype=torch.float32 if p == "stats" else torch.float16)
               for p, s in graph.tensors.items()}
    tensors.update({n: torch.empty(3, dtype=torch.int32, device="meta")
                    for n in ("cu_seqlens_q", "cu_seqlens_kv")})
    L = launch.prepare(graph, tensors, TILES)
    assert L.ragged[:2] == (tensors["cu_seqlens_q"], tensors["cu_seqlens_kv"])
    assert L.ragged[2:] == (30, 37) and L.flags["RAGGED"] and L.delta.shape == (2, 2, 19)
    with pytest.raises(ValueError, match="int32"):
        launch.prepare(graph, {**tensors, "cu_seqlens_kv": tensors["cu_seqlens_kv"].long()}, TILES)


def test_capability_row_declines_ragged_where_not_served():
    graph = _graph(cu_q=(0, 11, 30)).as_launched()
    assert Capabilities("sm90").mismatch(graph) is None
    assert R.code_of(Capabilities("sm90", ragged=False).mismatch(graph)) == R.RAGGED_NOT_SERVED


# ----------------------------------------------------------------------------- bad offsets
#: offsets only device code sees (the harness's device probes): starts before the storage,
#: ends past it, a decreasing offset, a length over max_seqlen. Stray rows of an unbounded
#: kernel stay inside the guard bands (at most 8 rows of 32 elements).
BAD = {
    "negative-and-past-end": dict(cu_q=(-2, 6, 14, 24), cu_kv=(0, 7, 15, 30), T_q=20, T_kv=22,
                                  max_seqlen_q=10, max_seqlen_kv=15),
    # q: [9, 16) overlaps [12, 28), [16, 12) decreases, [12, 28) is longer than 12
    "decreasing-and-over-max": dict(cu_q=(0, 9, 16, 12, 28), cu_kv=(0, 10, 14, 19, 30),
                                    T_q=28, T_kv=30, max_seqlen_q=12, max_seqlen_kv=12,
                                    right=0, alignment="BOTTOM_RIGHT"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_offsets_touch_nothing_outside(engine, name):
    graph = _graph(**BAD[name])
    assert frontend_reason(graph) in R.DEVICE            # only the device can see it
    assert good_sequences(graph)                         # something left to get right
    check(prepare(graph, seed=7), engine)


def test_the_unbounded_token_base_mutant_fails_the_bad_offset_check():
    """Seed 001's defect put back (kernels use the raw first token): the same check fails,
    on the canaries outside the tensors."""
    mutant = C.by_name("ragged-token-base-unbounded").wrap(small_tile(TritonEngine)("cpu"))
    assert not mutant.inner.launches_own_modules()
    graph = _graph(**BAD["negative-and-past-end"])
    with pytest.raises(AssertionError, match="outside the sequences changed"):
        check(prepare(graph, seed=7), mutant)
    # and on valid offsets it is the correct engine: only bad offsets tell them apart
    check(prepare(_graph(**CASES["ragged"]), seed=1), mutant)


def test_the_top_left_mutant_fails_a_ragged_bottom_right_batch():
    """The alignment mutant reaches the ragged path too (each sequence's own shift)."""
    mutant = C.by_name("top-left-for-bottom-right").wrap(small_tile(TritonEngine)("cpu"))
    with pytest.raises(AssertionError, match="max err"):
        check(prepare(_graph(**CASES["causal-br-sq-ne-skv"]), seed=5), mutant)


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
def test_two_chunk_kernels_ragged(split):
    """The two-chunk kernels (head dims in (128, 192], kernels.py, "Two chunks") on a ragged
    bottom-right causal GQA batch with a zero-length sequence, dK/dV fused or split."""
    import dataclasses
    cfg = dataclasses.replace(TILES, two_chunks=True, split_dkdv=split)
    engine = type("TwoChunkSmallTiles", (TritonEngine,), {"config": lambda self, g: cfg})("cpu")
    graph = _graph(cu_q=(0, 30, 30, 45), cu_kv=(0, 11, 30, 48), H_q=4, H_k=2, D_qk=192,
                   D_v=144, right=0, alignment="BOTTOM_RIGHT", dtype="bf16")
    assert launch.head_tiles(graph, cfg).get("BLOCK_DQK2") == 64
    check(prepare(graph, seed=7), engine)
