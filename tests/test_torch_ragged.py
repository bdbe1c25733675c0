"""Ragged (THD / varlen) graphs in the PyTorch engines (DESIGN section 10).

torch-math on the CPU against an independent float64 reference written out here (explicit
softmax-backward formulas per sequence, its own mask), on tensors laid in NaN-filled storage
so that any element read outside a sequence or written outside a good sequence shows.
torch-flash / torch-efficient / torch-cudnn only run on a CUDA GPU: here their decline
rules, the pure helpers that build each varlen op's arguments (offsets, LSE forms, row
copies) and the call plumbing on meta tensors are checked."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.engines.registry import engine_class
from bundlegen.engines.torch_efficient.engine import (CAUSAL_FROM_BOTTOM_RIGHT, CAUSAL_FROM_TOP_LEFT,
                                                     NO_CUSTOM_MASK, efficient_varlen_values)
from bundlegen.engines.torch_flash.engine import flash_varlen_values
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.engines.torch_sdpa_common import (contained_offsets, cuda_facts, lse_heads_tokens,
                                                 lse_per_sequence, ragged_rows,
                                                 write_ragged_gradients)
from bundlegen.graph import INPUT_PORTS, OUTPUT_PORTS, Graph, ragged_graph
from bundlegen.validate import frontend_finding, good_sequences

GUARD = 13  # canary elements after every port's last addressed element


# ----------------------------------------------------------------------------- materialize
def offsets_of(graph: Graph) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return graph.ragged.cu_seqlens_q, graph.ragged.cu_seqlens_kv


def rows_of(cu, b) -> slice:
    return slice(cu[b], cu[b + 1])


def materialize(graph: Graph, seed: int, cu_q=None, cu_kv=None, device="cpu"):
    """(storages, views): one NaN-filled storage per port with a guard band, its declared
    view on it; input rows inside the good sequences of (cu_q, cu_kv) (default: the graph's)
    get random values (stats: the sequence's true LSE), everything else stays NaN."""
    cu_q = cu_q if cu_q is not None else graph.ragged.cu_seqlens_q
    cu_kv = cu_kv if cu_kv is not None else graph.ragged.cu_seqlens_kv
    gen = torch.Generator().manual_seed(seed)
    storages, views = {}, {}
    for port, spec in graph.tensors.items():
        storage = torch.full((spec.storage_elements + GUARD,), math.nan,
                             dtype=TORCH_DTYPES[spec.dtype], device=device)
        storages[port] = storage
        views[port] = storage.as_strided(spec.dims, spec.strides, spec.offset)
    seen = with_offsets(graph, cu_q, cu_kv)
    for b in good_sequences(seen):
        rq, rk = rows_of(cu_q, b), rows_of(cu_kv, b)
        for port, rows in (("q", rq), ("k", rk), ("v", rk), ("do", rq)):
            block = views[port][rows]
            block.copy_(torch.randn(block.shape, generator=gen).to(block.dtype))
        _, o, lse = reference_sequence(graph, views, rq, rk, want_forward=True)
        views["o"][rq].copy_(o.to(views["o"].dtype))
        views["stats"][rq].copy_(lse.unsqueeze(-1).float())
    views["cu_seqlens_q"] = torch.tensor(cu_q, dtype=torch.int32, device=device)
    views["cu_seqlens_kv"] = torch.tensor(cu_kv, dtype=torch.int32, device=device)
    return storages, views


def with_offsets(graph: Graph, cu_q, cu_kv) -> Graph:
    return dataclasses.replace(graph, ragged=dataclasses.replace(
        graph.ragged, cu_seqlens_q=tuple(cu_q), cu_seqlens_kv=tuple(cu_kv)))


def written_mask(graph: Graph, port: str, rows: list[slice]) -> torch.Tensor:
    """Bool over the port's storage: the elements of `rows` of its view."""
    spec = graph.tensors[port]
    index = torch.arange(spec.storage_elements + GUARD)
    view = index.as_strided(spec.dims, spec.strides, spec.offset)
    mask = torch.zeros(index.shape, dtype=torch.bool)
    for r in rows:
        mask[view[r].reshape(-1)] = True
    return mask


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


# ----------------------------------------------------------------------------- the reference
def kept(S_q: int, S_kv: int, attrs) -> torch.Tensor:
    """The mask of DESIGN section 2, written out element by element."""
    shift = S_kv - S_q if attrs.diagonal_alignment == "BOTTOM_RIGHT" else 0
    out = torch.ones(S_q, S_kv, dtype=torch.bool)
    for i in range(S_q):
        for j in range(S_kv):
            jp = j - shift
            if attrs.right_bound is not None and jp - i > attrs.right_bound:
                out[i, j] = False
            if attrs.left_bound is not None and i - jp >= attrs.left_bound:
                out[i, j] = False
    return out


def reference_sequence(graph: Graph, t, rq: slice, rk: slice, want_forward=False):
    """float64 dQ, dK, dV ([S, H, D]) of one sequence by the softmax-backward formulas
    (or, with want_forward, (None, O, LSE) for the inputs)."""
    a = graph.attributes
    q, k, v, do = (t[p][r].double() for p, r in (("q", rq), ("k", rk), ("v", rk), ("do", rq)))
    S_q, S_kv, H_q = q.shape[0], k.shape[0], q.shape[1]
    gk, gv = H_q // k.shape[1], H_q // v.shape[1]
    keep = kept(S_q, S_kv, a)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    o = torch.zeros(S_q, H_q, v.shape[2], dtype=torch.float64)
    lse = torch.full((S_q, H_q), -math.inf, dtype=torch.float64)
    for h in range(H_q):
        qh, kh, vh = q[:, h], k[:, h // gk], v[:, h // gv]
        s = (qh @ kh.T) * a.attn_scale
        s = s.masked_fill(~keep, -math.inf)
        m = torch.cat([s, torch.full((S_q, 1), -math.inf, dtype=s.dtype)], 1).max(1, True).values
        live = torch.isfinite(m)
        e = torch.where(live, torch.exp(s - torch.where(live, m, 0.0)), 0.0)
        z = e.sum(dim=1, keepdim=True)
        p = torch.where(live, e / torch.where(live, z, 1.0), 0.0)
        o[:, h] = p @ vh
        lse[:, h] = torch.where(live, m + torch.log(torch.where(live, z, 1.0)), -math.inf)[:, 0]
        if want_forward:
            continue
        dp = do[:, h] @ vh.T
        delta = (do[:, h] * o[:, h]).sum(dim=1, keepdim=True)
        ds = p * (dp - delta)
        dq[:, h] = ds @ kh * a.attn_scale
        dk[:, h // gk] += ds.T @ qh * a.attn_scale
        dv[:, h // gv] += p.T @ do[:, h]
    return (None, o, lse) if want_forward else (dq, dk, dv)


def check_against_reference(graph: Graph, storages, t, cu_q, cu_kv, before):
    """Good sequences within tolerance of the reference, no NaN in them; every output
    element outside them and every input element unchanged (bitwise)."""
    seen = with_offsets(graph, cu_q, cu_kv)
    good = good_sequences(seen)
    rows = {"dq": [], "dk": [], "dv": []}
    tol = dict(rtol=2e-2, atol=2e-2) if graph.dtype == "bf16" else dict(rtol=5e-3, atol=5e-3)
    for b in good:
        rq, rk = rows_of(cu_q, b), rows_of(cu_kv, b)
        rows["dq"].append(rq)
        rows["dk"].append(rk)
        rows["dv"].append(rk)
        want = reference_sequence(graph, t, rq, rk)
        for port, w, r in zip(OUTPUT_PORTS, want, (rq, rk, rk)):
            got = t[port][r].double()
            assert not bool(torch.isnan(got).any()), (port, b)
            torch.testing.assert_close(got, w, **tol, msg=lambda m: f"{port} sequence {b}: {m}")
    for port in OUTPUT_PORTS:
        outside = ~written_mask(graph, port, rows[port])
        assert torch.equal(bits(storages[port])[outside], bits(before[port])[outside]), port
    for port in INPUT_PORTS:
        assert torch.equal(bits(storages[port]), bits(before[port])), port
    return good


def run_math(graph: Graph, seed: int = 0, cu_q=None, cu_kv=None):
    cu_q = cu_q if cu_q is not None else graph.ragged.cu_seqlens_q
    cu_kv = cu_kv if cu_kv is not None else graph.ragged.cu_seqlens_kv
    storages, t = materialize(graph, seed, cu_q, cu_kv)
    before = {p: s.clone() for p, s in storages.items()}
    engine = TorchMathEngine("cpu")
    launched = graph.as_launched()
    assert engine.is_applicable(launched) is None
    engine.run(launched, t)
    return check_against_reference(graph, storages, t, cu_q, cu_kv, before), t


# ----------------------------------------------------------------------------- torch-math
CASES = {
    "equal": dict(cu_seqlens_q=(0, 5, 10, 15)),
    "ragged": dict(cu_seqlens_q=(0, 3, 11, 12, 20), cu_seqlens_kv=(0, 7, 9, 20, 26)),
    "zero-length-q": dict(cu_seqlens_q=(0, 4, 4, 9), cu_seqlens_kv=(0, 3, 8, 12)),
    "zero-length-kv": dict(cu_seqlens_q=(0, 4, 7, 9), cu_seqlens_kv=(0, 3, 3, 8)),
    "length-one": dict(cu_seqlens_q=(0, 1, 2, 7), cu_seqlens_kv=(0, 1, 4, 7)),
    "causal-bottom-right": dict(cu_seqlens_q=(0, 9, 12, 17), cu_seqlens_kv=(0, 4, 12, 17),
                                right=0, alignment="BOTTOM_RIGHT"),
    "causal-top-left": dict(cu_seqlens_q=(0, 9, 12, 17), cu_seqlens_kv=(0, 4, 12, 17),
                            right=0, alignment="TOP_LEFT"),
    "window-bottom-right": dict(cu_seqlens_q=(0, 6, 13), cu_seqlens_kv=(0, 10, 13),
                                left=3, right=1, alignment="BOTTOM_RIGHT"),
    "gqa-and-dqk-ne-dv": dict(cu_seqlens_q=(0, 5, 13), cu_seqlens_kv=(0, 6, 10),
                              H_q=4, H_k=2, H_v=1, D_qk=16, D_v=8),
    # rows before cu[0] and from cu[B] on belong to no sequence; max_seqlen above the longest
    "rows-outside-every-sequence": dict(cu_seqlens_q=(3, 7, 12), cu_seqlens_kv=(2, 4, 9),
                                        T_q=16, T_kv=13, max_seqlen_q=9, max_seqlen_kv=7),
}


def build(name: str, dtype: str = "fp16", **extra) -> Graph:
    kw = dict(H_q=2, D_qk=16, dtype=dtype)
    kw.update(CASES[name])
    kw.update(extra)
    cu_q = kw.pop("cu_seqlens_q")
    cu_kv = kw.pop("cu_seqlens_kv", None)
    graph = ragged_graph(cu_q, cu_kv, **kw)
    assert frontend_finding(graph) is None
    return graph


@pytest.mark.parametrize("name", sorted(CASES))
def test_math_matches_the_reference(name):
    graph = build(name)
    good, _ = run_math(graph, seed=len(name))
    assert good == tuple(range(graph.B))


def test_math_bf16_and_padded_token_stride():
    # q and dq rows 24 elements apart for 2 heads of 8 (a gap of 8 per token), dk head-major
    graph = build("ragged", dtype="bf16", D_qk=8,
                  strides={"q": (24, 8, 1), "dq": (24, 8, 1), "dk": (8, 26 * 8, 1)})
    run_math(graph, seed=5)


def test_math_zero_lengths_give_zero_gradients():
    _, t = run_math(build("zero-length-q"), seed=1)
    assert bool((t["dk"][4:8] == 0).all()) and bool((t["dv"][4:8] == 0).all())
    assert bool((t["dk"][0:3] != 0).any())
    _, t = run_math(build("zero-length-kv"), seed=1)
    assert bool((t["dq"][4:7] == 0).all()) and bool((t["dq"][0:4] != 0).any())


PROBES = {
    # (cu_q, cu_kv) put on the device for a graph valid with its own offsets; T_q=16, T_kv=14
    "length-over-max": ((0, 4, 13, 16), (0, 5, 9, 14)),            # q sequence 1: 9 > max 6
    "negative-offset": ((-5, 4, 9, 16), (0, 5, 9, 14)),
    "offsets-decrease": ((0, 4, 9, 16), (0, 6, 3, 14)),
    "past-storage": ((0, 5, 10, 40), (0, 5, 9, 14)),
    "far-past-storage": ((0, 5, 10, 16), (0, 5, 2 ** 30, 14)),
}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_math_device_probe_keeps_good_sequences_and_touches_nothing_else(name):
    graph = ragged_graph((0, 5, 10, 16), (0, 5, 9, 14), H_q=2, D_qk=16, dtype="fp16",
                         max_seqlen_q=6, max_seqlen_kv=6)
    assert frontend_finding(graph) is None
    cu_q, cu_kv = PROBES[name]
    bad = with_offsets(graph, cu_q, cu_kv)
    assert frontend_finding(bad) is not None          # the offsets break a rule...
    assert frontend_finding(bad, offsets_on_device=True) is None   # ...only device code sees
    good, _ = run_math(graph, seed=3, cu_q=cu_q, cu_kv=cu_kv)
    assert len(good) < graph.B
    if name != "offsets-decrease":                     # there, every sequence is bad
        assert good


def test_math_declines_as_for_padded_graphs():
    engine = TorchMathEngine("cpu")
    assert engine.is_applicable(build("equal", dtype="fp32")) is None
    zero = build("ragged", strides={"dq": (0, 16, 1)})
    assert R.code_of(engine.is_applicable(zero)) == R.ZERO_STRIDE_OUTPUT


# ----------------------------------------------------------------------------- the GPU adapters
def random_offsets(rng: random.Random, B: int, T: int) -> tuple[int, ...]:
    cu = [rng.randint(0, T // 2)]
    for _ in range(B):
        cu.append(cu[-1] + rng.randint(0, 6))
    for _ in range(rng.randint(0, 2)):        # break some: negative, decreasing, far past
        cu[rng.randrange(B + 1)] = rng.choice([-7, -1, 0, T + 3, 2 ** 31 - 1, cu[0] + 1])
    return tuple(cu)


def test_contained_offsets_keep_good_sequences_and_stay_inside():
    rng = random.Random(11)
    checked_good = checked_bad = 0
    for _ in range(300):
        B, T = rng.randint(1, 5), rng.randint(1, 30)
        cu_q, cu_kv = random_offsets(rng, B, T), random_offsets(rng, B, T)
        graph = ragged_graph((0, T), H_q=1, D_qk=8)
        graph = dataclasses.replace(graph, ragged=dataclasses.replace(
            graph.ragged, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=T,
            max_seqlen_kv=T, batch=B))
        good = good_sequences(graph)
        for cu in (cu_q, cu_kv):
            out = contained_offsets(torch.tensor(cu, dtype=torch.int32), T).tolist()
            assert out == sorted(out) and 0 <= out[0] and out[-1] <= T
            for b in range(B):
                if b in good:
                    assert (out[b], out[b + 1]) == (cu[b], cu[b + 1])
                    checked_good += 1
                else:
                    checked_bad += 1
    assert checked_good > 100 and checked_bad > 100


def test_ragged_rows_map_tokens_to_sequences():
    cu = (2, 5, 5, 9)
    rows = ragged_rows(torch.tensor(cu, dtype=torch.int32), 11)
    want_in, want_seq, want_pos = [], [], []
    for t in range(11):
        b = next((b for b in range(3) if cu[b] <= t < cu[b + 1]), None)
        want_in.append(b is not None)
        if b is not None:
            want_seq.append(b)
            want_pos.append(t - cu[b])
    assert rows.in_sequence.tolist() == want_in
    assert rows.sequence[rows.in_sequence].tolist() == want_seq
    assert rows.position[rows.in_sequence].tolist() == want_pos
    assert rows.lengths.tolist() == [3, 0, 4]


def stats_with_empty_rows(T: int, H: int, seed: int = 0) -> torch.Tensor:
    stats = torch.randn(T, H, 1, generator=torch.Generator().manual_seed(seed))
    stats[1, 0, 0] = -math.inf                 # a row with no kept key
    return stats


def test_flash_lse_is_heads_by_tokens():
    cu = (1, 4, 8)
    stats = stats_with_empty_rows(10, 3)
    lse = lse_heads_tokens(stats, ragged_rows(torch.tensor(cu, dtype=torch.int32), 10))
    assert tuple(lse.shape) == (3, 10) and lse.is_contiguous() and lse.dtype == torch.float32
    for t in range(10):
        for h in range(3):
            want = stats[t, h, 0].item() if cu[0] <= t < cu[-1] else math.inf
            assert lse[h, t].item() == (math.inf if want == -math.inf else want)


def test_efficient_lse_is_per_sequence_padded_to_32():
    cu = (1, 4, 4, 9)
    stats = stats_with_empty_rows(10, 2)
    lse = lse_per_sequence(stats, ragged_rows(torch.tensor(cu, dtype=torch.int32), 10), 40)
    assert tuple(lse.shape) == (3, 2, 64) and lse.is_contiguous()
    assert lse.stride(0) % 8 == 0 and lse.stride(1) % 8 == 0  # check_supported: lse strides
    for b in range(3):
        for h in range(2):
            for i in range(64):
                t = cu[b] + i
                want = stats[t, h, 0].item() if t < cu[b + 1] else math.inf
                assert lse[b, h, i].item() == (math.inf if want == -math.inf else want)


def test_ragged_write_touches_sequence_rows_only():
    cu_q, cu_kv = (2, 5, 7), (1, 1, 6)          # sequence 0 has no key
    T_q, T_kv, H, D = 9, 8, 2, 4
    q_rows = ragged_rows(torch.tensor(cu_q, dtype=torch.int32), T_q)
    kv_rows = ragged_rows(torch.tensor(cu_kv, dtype=torch.int32), T_kv)
    outs = {"dq": torch.full((T_q, H, D), math.nan), "dk": torch.full((T_kv, H, D), math.nan),
            "dv": torch.full((T_kv, H, D), math.nan)}
    grads = [torch.randn(T_q, H, D), torch.randn(T_kv, H, D), torch.randn(T_kv, H, D)]
    write_ragged_gradients(outs, *grads, q_rows, kv_rows)
    dq, dk = outs["dq"], outs["dk"]
    assert bool(torch.isnan(dq[:2]).all()) and bool(torch.isnan(dq[7:]).all())
    assert bool((dq[2:5] == 0).all())                        # no key: dQ = 0
    assert torch.equal(dq[5:7], grads[0][5:7])
    assert bool(torch.isnan(dk[:1]).all()) and bool(torch.isnan(dk[6:]).all())
    assert torch.equal(dk[1:6], grads[1][1:6])


def cpu_tensors(graph: Graph, cu_q, cu_kv) -> dict:
    _, t = materialize(graph, 0, cu_q, cu_kv)
    return t


def test_flash_varlen_arguments():
    graph = ragged_graph((0, 8, 24, 32), (0, 16, 24, 40), H_q=4, H_k=2, D_qk=64, dtype="bf16",
                         right=0, alignment="BOTTOM_RIGHT", T_q=36, max_seqlen_q=64)
    t = cpu_tensors(graph, *offsets_of(graph))
    q_rows = ragged_rows(t["cu_seqlens_q"], graph.T_q)
    kv_rows = ragged_rows(t["cu_seqlens_kv"], graph.T_kv)
    args = flash_varlen_values(graph.as_launched(), t, q_rows, kv_rows)
    for name, port in (("query", "q"), ("key", "k"), ("value", "v"), ("grad_out", "do")):
        assert args[name] is t[port]                        # read as declared, no copy
    assert args["cum_seq_q"].dtype == torch.int32 and args["cum_seq_q"].is_contiguous()
    assert args["cum_seq_q"].tolist() == [0, 8, 24, 32]
    assert args["cum_seq_k"].tolist() == [0, 16, 24, 40]
    assert (args["max_q"], args["max_k"]) == (36, 16)       # capped by T_q; the graph's bound
    assert args["is_causal"] is True and args["dropout_p"] == 0.0
    assert tuple(args["logsumexp"].shape) == (4, 36) and args["out"].is_contiguous()
    assert torch.equal(args["out"][:32], t["o"][:32]) and bool((args["out"][32:] == 0).all())


@pytest.mark.parametrize("alignment,right,want", [
    ("TOP_LEFT", None, NO_CUSTOM_MASK), ("TOP_LEFT", 0, CAUSAL_FROM_TOP_LEFT),
    ("BOTTOM_RIGHT", 0, CAUSAL_FROM_BOTTOM_RIGHT)])
def test_efficient_varlen_arguments(alignment, right, want):
    graph = ragged_graph((0, 8, 24), (0, 16, 40), H_q=2, D_qk=64, D_v=32, dtype="fp16",
                         right=right, alignment=alignment, strides={"o": (2 * 32 + 8, 32, 1)})
    t = cpu_tensors(graph, *offsets_of(graph))
    q_rows = ragged_rows(t["cu_seqlens_q"], graph.T_q)
    kv_rows = ragged_rows(t["cu_seqlens_kv"], graph.T_kv)
    args = efficient_varlen_values(graph.as_launched(), t, q_rows, kv_rows)
    for name, port in (("query", "q"), ("key", "k"), ("value", "v"), ("grad_out_", "do")):
        a = args["grad_out" if name == "grad_out_" else name]
        assert tuple(a.shape) == (1, *t[port].shape) and a.data_ptr() == t[port].data_ptr()
    assert args["custom_mask_type"] == want
    assert (args["max_seqlen_q"], args["max_seqlen_k"]) == (24, 24)  # T_q: contains any length
    assert tuple(args["logsumexp"].shape) == (2, 2, 32)
    assert tuple(args["out"].shape) == (1, 24, 2, 32) and args["out"].is_contiguous()
    assert torch.equal(args["out"][0], t["o"])             # packed: the kernel's O layout


H200 = cuda_facts(9, 0, cudnn_version=91002)


def code(name, graph):
    reason = engine_class(name)("cpu", facts=H200).is_applicable(graph.as_launched())
    return None if reason is None else R.code_of(reason)


def rg(**kw):
    base = dict(H_q=4, D_qk=64, dtype="bf16")
    base.update(kw)
    return ragged_graph((0, 8, 24, 32), (0, 16, 24, 40), **base)


@pytest.mark.parametrize("name,graph,want", [
    ("torch-flash", rg(), None),
    ("torch-flash", rg(H_k=2), None),
    ("torch-flash", rg(right=0, alignment="BOTTOM_RIGHT"), None),
    ("torch-flash", rg(right=0, alignment="TOP_LEFT"), R.ALIGNMENT_NOT_SERVED),
    ("torch-flash", rg(left=4, right=0, alignment="BOTTOM_RIGHT"), R.MASK_NOT_SERVED),
    ("torch-flash", rg(D_v=32), R.UNEQUAL_HEAD_DIMS),
    ("torch-flash", rg(dtype="fp32"), R.DTYPE_NOT_SERVED),
    ("torch-flash", rg(strides={"q": (4 * 64 + 4, 64, 1)}), R.MISALIGNED_STRIDE),
    ("torch-flash", rg(strides={"q": (4 * 64 + 8, 64, 1)}), None),
    ("torch-efficient", rg(), None),
    ("torch-efficient", rg(dtype="fp32", D_v=32), None),
    ("torch-efficient", rg(right=0, alignment="TOP_LEFT"), None),
    ("torch-efficient", rg(right=0, alignment="BOTTOM_RIGHT"), None),
    ("torch-efficient", rg(left=4, right=0), R.MASK_NOT_SERVED),
    ("torch-efficient", rg(H_k=2), R.GQA_NOT_SERVED),
    ("torch-efficient", rg(strides={"k": (4 * 64 + 2, 64, 1)}), R.MISALIGNED_STRIDE),
    ("torch-cudnn", rg(), R.RAGGED_NOT_SERVED),
    ("torch-cudnn", rg(right=0), R.RAGGED_NOT_SERVED),
])
def test_ragged_decline_rules(name, graph, want):
    assert frontend_finding(graph) is None
    assert code(name, graph) == want


@pytest.mark.parametrize("name", ["torch-flash", "torch-efficient", "torch-cudnn"])
def test_ragged_declined_off_nvidia(name):
    reason = engine_class(name)("cpu").is_applicable(rg().as_launched())
    assert R.code_of(reason) in (R.DEVICE_NOT_SERVED, R.RAGGED_NOT_SERVED)


def meta_tensors(graph: Graph) -> dict:
    t = {p: torch.empty_strided(s.dims, s.strides, dtype=TORCH_DTYPES[s.dtype], device="meta")
         for p, s in graph.tensors.items()}
    t["cu_seqlens_q"] = torch.empty(graph.B + 1, dtype=torch.int32, device="meta")
    t["cu_seqlens_kv"] = torch.empty(graph.B + 1, dtype=torch.int32, device="meta")
    return t


def test_flash_varlen_plumbing_on_meta():
    graph = rg(H_k=2, right=0, alignment="BOTTOM_RIGHT")
    e = engine_class("torch-flash")("cpu", facts=H200)
    launched = graph.as_launched()
    assert e.is_applicable(launched) is None
    t = meta_tensors(graph)
    dq, dk, dv = e.ragged_backward(launched, t, ragged_rows(t["cu_seqlens_q"], graph.T_q),
                                   ragged_rows(t["cu_seqlens_kv"], graph.T_kv))
    assert [tuple(x.shape) for x in (dq, dk, dv)] == [graph.tensors[p].dims for p in OUTPUT_PORTS]
    e.run(launched, t)          # the aten op's meta kernel checks the argument list and shapes


class Recorder:
    """Stands in for an aten overload: its schema, and the arguments it was called with."""

    def __init__(self, op):
        self._schema = op._schema
        self.bound = None

    def __call__(self, *args, **kwargs):
        positional = [a.name for a in self._schema.arguments if not a.kwarg_only]
        self.bound = {**dict(zip(positional, args)), **kwargs}
        return "called"


def test_efficient_varlen_call_binds_by_schema():
    # torch 2.13's meta kernel for _efficient_attention_backward lacks the `out` argument of
    # the op's schema, so the op cannot run on meta tensors here: check the binding instead.
    from bundlegen.engines.torch_sdpa_common import call_by_schema

    graph = rg(D_v=32, right=0, alignment="BOTTOM_RIGHT")
    t = meta_tensors(graph)
    q_rows = ragged_rows(t["cu_seqlens_q"], graph.T_q)
    kv_rows = ragged_rows(t["cu_seqlens_kv"], graph.T_kv)
    op = Recorder(torch.ops.aten._efficient_attention_backward.default)
    assert call_by_schema(op, efficient_varlen_values(graph.as_launched(), t, q_rows, kv_rows)) == "called"
    b = op.bound
    names = {a.name for a in op._schema.arguments}
    assert set(b) <= names and all(a.name in b for a in op._schema.arguments
                                   if not a.has_default_value())
    assert tuple(b["out"].shape) == (1, graph.T_q, 4, 32)
    assert tuple(b["logsumexp"].shape) == (3, 4, 32)
    assert b["cu_seqlens_q"].dtype == b["cu_seqlens_k"].dtype == torch.int32
    assert b["custom_mask_type"] == CAUSAL_FROM_BOTTOM_RIGHT and b["bias"] is None
    assert (b["max_seqlen_q"], b["max_seqlen_k"]) == (graph.T_q, 16)
