"""torch-flash, torch-efficient, torch-cudnn on the CPU: every decline rule (with device
facts of the GPUs they target), the plan's engine probes, the adapter's LSE / O forms,
and the call plumbing of each aten op run on meta tensors (shapes only)."""
import math

import pytest
import torch

from bench.torch_sdpa_selfcheck import cases, check
from bundlegen import reasons as R
from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.generator import expand
from bundlegen.graph import Attributes, Graph, TensorSpec
from bundlegen.engines.registry import engine_class
from bundlegen.engines.torch_sdpa_common import (TARGET_ARCHS, DeviceFacts, bshd_packed_copy,
                                       call_by_schema, cuda_facts, cudnn_lse_has_unit_dim,
                                       lse_padded, lse_rows, lse_unit_last, matching_layout_copy,
                                       write_gradients)
from bundlegen.plans import sdpa_bwd
from bundlegen.validate import frontend_reason
from tests.graph_factory import make_graph, packed_strides

NAMES = ("torch-flash", "torch-efficient", "torch-cudnn")
H200 = cuda_facts(9, 0, cudnn_version=91002)


def engine(name, facts=H200):
    return engine_class(name)("cpu", facts=facts)


def code(name, graph, facts=H200):
    reason = engine(name, facts).is_applicable(graph)
    return None if reason is None else R.code_of(reason)


def g(**kw):
    base = dict(B=2, H_q=4, H_k=4, H_v=4, S_q=64, S_kv=64, D_qk=64, D_v=64, dtype="bf16")
    base.update(kw)
    return make_graph(**base)


def with_strides(graph: Graph, **strides) -> Graph:
    tensors = {p: TensorSpec(t.dims, tuple(strides.get(p, t.strides)), t.dtype, t.offset)
               for p, t in graph.tensors.items()}
    return Graph(tensors, graph.attributes)


def with_offsets(graph: Graph, **offsets) -> Graph:
    tensors = {p: TensorSpec(t.dims, t.strides, t.dtype, offsets.get(p, t.offset))
               for p, t in graph.tensors.items()}
    return Graph(tensors, graph.attributes)


def padded_rows(dims, extra):
    B, H, S, D = dims
    return (H * S * (D + extra), S * (D + extra), D + extra, 1)


# ----------------------------------------------------------------------------- registry, device
@pytest.mark.parametrize("name", NAMES)
def test_registered_with_target_archs(name):
    e = engine_class(name)("cpu")
    assert e.name == name and e.archs() == TARGET_ARCHS and e.deterministic is False


@pytest.mark.parametrize("name", NAMES)
def test_plain_graph_served_on_h200(name):
    assert code(name, g()) is None


@pytest.mark.parametrize("name", NAMES)
def test_declines_cpu_and_rocm(name):
    assert code(name, g(), DeviceFacts(kind="cpu")) == R.DEVICE_NOT_SERVED
    assert engine_class(name)("cpu").is_applicable(g()).startswith(R.DEVICE_NOT_SERVED)
    rocm = DeviceFacts(kind="cuda", capability=(9, 4), hip=True, cudnn_version=None)
    assert code(name, g(), rocm) == R.ARCH_NOT_SERVED


@pytest.mark.parametrize("name,cap,want", [
    ("torch-flash", (7, 5), R.ARCH_NOT_SERVED),       # check_flash_attention_hardware_support
    ("torch-flash", (12, 0), None),
    ("torch-efficient", (7, 5), R.DTYPE_NOT_SERVED),  # sm75 is served, bf16 is not
    ("torch-efficient", (4, 0), R.ARCH_NOT_SERVED),
    ("torch-cudnn", (7, 5), R.ARCH_NOT_SERVED),
    ("torch-cudnn", (13, 0), R.ARCH_NOT_SERVED),
])
def test_arch_ranges(name, cap, want):
    assert code(name, g(), cuda_facts(*cap)) == want


def test_cudnn_needs_cudnn_9():
    assert code("torch-cudnn", g(), cuda_facts(9, 0, cudnn_version=None)) == R.DEVICE_NOT_SERVED
    assert code("torch-cudnn", g(), cuda_facts(9, 0, cudnn_version=8907)) == R.DEVICE_NOT_SERVED


# ----------------------------------------------------------------------------- common rules
@pytest.mark.parametrize("name", NAMES)
def test_outputs_before_everything_graph_specific(name):
    zero = with_strides(g(dtype="fp32"), dq=(0, 64 * 64, 64, 1))      # fp32 declined later
    assert code(name, zero) == R.ZERO_STRIDE_OUTPUT
    overlap = with_strides(g(), dq=(4 * 64 * 64, 64 * 64, 32, 1))
    assert code(name, overlap) == R.OVERLAPPING_OUTPUT


@pytest.mark.parametrize("name", NAMES)
def test_dropout_served_only_as_the_ops_own_mask(name):
    """flash and efficient draw their own mask, recovered for the oracle; cuDNN's is not
    recovered; no op takes a mask port."""
    from bundlegen.graph import with_modifiers
    graph = g()
    dropped = Graph(graph.tensors, Attributes(graph.attributes.attn_scale, dropout_probability=0.1))
    drawn = R.DROPOUT_NOT_SERVED if name == "torch-cudnn" else None
    assert code(name, dropped) == drawn
    assert code(name, with_modifiers(graph, dropout=0.1)) == R.DROPOUT_NOT_SERVED
    zero = Graph(graph.tensors, Attributes(graph.attributes.attn_scale, dropout_probability=0.0))
    assert code(name, zero) == code(name, graph)          # p = 0: the plain graph


@pytest.mark.parametrize("name,want", [("torch-flash", R.DTYPE_NOT_SERVED),
                                       ("torch-efficient", None),
                                       ("torch-cudnn", R.DTYPE_NOT_SERVED)])
def test_fp32(name, want):
    assert code(name, g(dtype="fp32")) == want


@pytest.mark.parametrize("name", NAMES)
def test_head_dim_stride_one(name):
    graph = with_strides(g(), q=tuple(2 * s for s in packed_strides((2, 4, 64, 64)))[:3] + (2,))
    assert code(name, graph) == R.HEAD_DIM_STRIDE_NOT_ONE


@pytest.mark.parametrize("name", NAMES)
def test_non_packed_stats_and_broadcast_inputs_served(name):
    stats = with_strides(g(), stats=(4 * 128, 128, 1, 1))
    assert code(name, stats) is None
    bcast = with_strides(g(), k=(0, 64 * 64, 64, 1), v=(0, 64 * 64, 64, 1))
    assert code(name, bcast) is None


# ----------------------------------------------------------------------------- head dims
@pytest.mark.parametrize("name,dims,facts,want", [
    ("torch-flash", (128, 64), H200, R.UNEQUAL_HEAD_DIMS),
    ("torch-flash", (36, 36), H200, R.HEAD_DIM_NOT_SERVED),
    ("torch-flash", (256, 256), H200, None),
    ("torch-flash", (264, 264), H200, R.HEAD_DIM_TOO_LARGE),
    ("torch-flash", (208, 208), cuda_facts(12, 0), R.HEAD_DIM_NOT_SERVED),
    ("torch-flash", (208, 208), H200, None),
    ("torch-efficient", (36, 36), H200, R.HEAD_DIM_NOT_SERVED),
    ("torch-efficient", (96, 8), H200, None),
    ("torch-efficient", (512, 512), H200, None),
    ("torch-cudnn", (36, 36), H200, R.HEAD_DIM_NOT_SERVED),
    ("torch-cudnn", (128, 64), H200, None),
    ("torch-cudnn", (256, 256), H200, R.HEAD_DIM_TOO_LARGE),
    ("torch-cudnn", (192, 128), cuda_facts(9, 0, cudnn_version=91100), None),
    ("torch-cudnn", (192, 128), cuda_facts(9, 0, cudnn_version=91002), R.HEAD_DIM_TOO_LARGE),
    ("torch-cudnn", (192, 128), cuda_facts(12, 0, cudnn_version=91100), R.HEAD_DIM_TOO_LARGE),
])
def test_head_dims(name, dims, facts, want):
    assert code(name, g(D_qk=dims[0], D_v=dims[1]), facts) == want


# ----------------------------------------------------------------------------- heads, sizes
@pytest.mark.parametrize("name,heads,want", [
    ("torch-flash", (8, 2, 2), None), ("torch-flash", (8, 1, 1), None),
    ("torch-flash", (4, 4, 2), R.HV_NOT_HK), ("torch-flash", (4, 1, 2), R.HV_NOT_HK),
    ("torch-efficient", (8, 2, 2), R.GQA_NOT_SERVED), ("torch-efficient", (4, 4, 2), R.GQA_NOT_SERVED),
    ("torch-cudnn", (8, 2, 2), None), ("torch-cudnn", (4, 4, 2), R.HV_NOT_HK),
])
def test_heads(name, heads, want):
    assert code(name, g(H_q=heads[0], H_k=heads[1], H_v=heads[2])) == want


def test_cudnn_sizes():
    assert code("torch-cudnn", g(S_q=16, S_kv=1)) == R.SEQ_LEN_NOT_SERVED
    assert code("torch-cudnn", g(B=70000, H_q=1, H_k=1, H_v=1)) == R.TOO_LARGE
    assert code("torch-flash", g(S_q=16, S_kv=1)) is None


# ----------------------------------------------------------------------------- masks
@pytest.mark.parametrize("mask,seqs,served_by", [
    ((None, None, "TOP_LEFT"), (64, 96), set(NAMES)),
    ((None, 0, "TOP_LEFT"), (64, 64), set(NAMES)),
    ((None, 0, "BOTTOM_RIGHT"), (64, 64), set(NAMES)),       # the alignments coincide
    ((None, 0, "TOP_LEFT"), (64, 96), {"torch-efficient", "torch-cudnn"}),
    ((None, 0, "BOTTOM_RIGHT"), (64, 96), {"torch-flash"}),
    ((None, 0, "BOTTOM_RIGHT"), (96, 64), {"torch-flash"}),   # rows with no key
    ((None, -1, "TOP_LEFT"), (64, 64), set()),                # strict causal
    ((24, 0, "TOP_LEFT"), (64, 64), set()),                   # sliding window
    ((None, 16, "TOP_LEFT"), (64, 64), set()),                # lookahead
])
def test_masks(mask, seqs, served_by):
    left, right, alignment = mask
    graph = g(S_q=seqs[0], S_kv=seqs[1], left=left, right=right, alignment=alignment)
    for name in NAMES:
        got = code(name, graph)
        if name in served_by:
            assert got is None, name
        else:
            assert got in (R.MASK_NOT_SERVED, R.ALIGNMENT_NOT_SERVED), (name, got)
    if right == 0 and left is None and seqs[0] != seqs[1]:
        assert {code(n, graph) for n in NAMES if n not in served_by} == {R.ALIGNMENT_NOT_SERVED}


# ----------------------------------------------------------------------------- alignment
def test_row_pitch_alignment():
    qkv = {p: padded_rows(g().tensors[p].dims, 4) for p in ("q", "k", "v")}
    pad4 = with_strides(g(), **qkv)                  # rows D+4: 8-byte aligned, not 16
    assert code("torch-flash", pad4) == R.MISALIGNED_STRIDE
    assert code("torch-cudnn", pad4) == R.MISALIGNED_STRIDE
    assert code("torch-efficient", pad4) is None     # cutlassB needs multiples of 4
    pad1 = with_strides(g(), **{p: padded_rows(g().tensors[p].dims, 1) for p in ("q", "k", "v")})
    assert {code(n, pad1) for n in NAMES} == {R.MISALIGNED_STRIDE}
    pad8 = with_strides(g(), **{p: padded_rows(g().tensors[p].dims, 8) for p in ("q", "k", "v")})
    assert {code(n, pad8) for n in NAMES} == {None}


def test_do_strides_free_except_for_cudnn():
    do_pad1 = with_strides(g(), do=padded_rows(g().tensors["do"].dims, 1))
    assert code("torch-flash", do_pad1) is None       # the op copies dO to packed BSHD
    assert code("torch-efficient", do_pad1) is None
    assert code("torch-cudnn", do_pad1) == R.MISALIGNED_STRIDE


def test_offsets():
    four = with_offsets(g(), q=4)
    assert {code(n, four) for n in NAMES} == {R.MISALIGNED_STRIDE}
    eight = with_offsets(g(), q=8, k=16, v=24, do=8)
    assert {code(n, eight) for n in NAMES} == {None}
    fp32_four = with_offsets(g(dtype="fp32"), q=4)    # efficient: 128 bits of fp32
    assert code("torch-efficient", fp32_four) is None


def test_length_one_axes_exempt_except_efficient_heads():
    graph = g(B=1, H_q=1, H_k=1, H_v=1)
    odd = with_strides(graph, q=(3, 3, 64, 1))         # B and H strides of length-1 axes
    assert code("torch-flash", odd) is None
    assert code("torch-cudnn", odd) is None
    assert code("torch-efficient", odd) == R.MISALIGNED_STRIDE   # the launcher checks H always


# ----------------------------------------------------------------------------- the plan's probes
def test_engine_probes_rejected_with_their_reason():
    probes = [p for p in sdpa_bwd.PLAN.padded.probes if p.by == "engine"]
    assert probes
    for probe in probes:
        graph = expand.graph_of(sdpa_bwd.PLAN, probe.spec)
        for name in NAMES:
            assert code(name, graph) == probe.reason, (probe.item, name)


@pytest.mark.parametrize("name", NAMES)
def test_every_decline_code_is_a_known_engine_reason(name):
    graphs = [g(dtype="fp32"), g(D_qk=36, D_v=36), g(H_q=4, H_k=4, H_v=2), g(right=0, left=8),
              g(S_q=64, S_kv=96, right=0, alignment="BOTTOM_RIGHT"), with_offsets(g(), q=2),
              g(D_qk=264, D_v=264), g(S_kv=1)]
    for graph in graphs:
        reason = engine(name).is_applicable(graph)
        if reason is not None:
            assert R.code_of(reason) in R.ENGINE, reason


# ----------------------------------------------------------------------------- adapter forms
def test_lse_forms_from_non_packed_stats():
    B, H, S = 2, 3, 70
    values = torch.randn(B, H, S, 1)
    storage = torch.full((B * H * (S + 5) + 7,), float("nan"))
    stats = storage.as_strided((B, H, S, 1), (H * (S + 5), S + 5, 1, 1), 7)
    stats.copy_(values)
    rows = lse_rows(stats)
    assert rows.shape == (B, H, S) and rows.is_contiguous() and torch.equal(rows, values[..., 0])
    padded = lse_padded(stats)
    assert padded.shape == (B, H, 96) and padded.stride() == (H * 96, 96, 1)
    assert torch.equal(padded[..., :S], values[..., 0]) and bool(torch.isinf(padded[..., S:]).all())
    assert bool((padded[..., S:] > 0).all())
    unit = lse_unit_last(stats)
    assert unit.shape == (B, H, S, 1) and unit.stride() == (H * S, S, 1, 1)
    assert torch.equal(unit, values)


def test_lse_keeps_minus_inf_rows():
    stats = torch.full((1, 1, 4, 1), -math.inf)
    assert bool(torch.isneginf(lse_padded(stats)[..., :4]).all())
    assert bool(torch.isneginf(lse_rows(stats)).all())


def test_o_forms():
    o = torch.randn(2, 3, 5, 8).transpose(2, 3).contiguous().transpose(2, 3)   # odd layout
    packed = bshd_packed_copy(o)
    assert packed.stride() == (5 * 3 * 8, 8, 3 * 8, 1) and torch.equal(packed, o)
    q_bshd = torch.empty(2, 5, 3, 16).transpose(1, 2)                          # D_qk 16, BSHD
    matched = matching_layout_copy(q_bshd, o)                                  # D_v 8
    assert matched.stride() == (5 * 3 * 8, 8, 3 * 8, 1) and torch.equal(matched, o)
    q_bcast = torch.empty(1, 1, 5, 16).expand(2, 3, 5, 16)                     # zero B, H strides
    matched = matching_layout_copy(q_bcast, o)
    assert matched.stride()[-1] == 1 and torch.equal(matched, o)
    q_same = torch.empty(2, 5, 3, 8).transpose(1, 2)                           # same shape: empty_like
    assert matching_layout_copy(q_same, o).stride() == q_same.stride()


def test_write_gradients_checks_shapes():
    outs = {p: torch.zeros(1, 2, 3, 4) for p in ("dq", "dk", "dv")}
    grads = [torch.ones(1, 2, 3, 4)] * 3
    write_gradients(outs, *grads)
    assert all(bool((t == 1).all()) for t in outs.values())
    with pytest.raises(RuntimeError, match="dk"):
        write_gradients(outs, grads[0], torch.ones(1, 1, 3, 4), grads[2])


def test_call_by_schema_matches_names_and_aliases():
    op = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default
    assert op._schema.arguments[0].name == "grad_out_"          # filled through the alias
    with pytest.raises(TypeError, match="'query'"):    # grad_out_ was found as grad_out
        call_by_schema(op, {"grad_out": None})


def test_cudnn_lse_form_of_this_torch():
    if torch.__version__.startswith("2.13"):
        assert cudnn_lse_has_unit_dim()       # torch 2.13's cudnn forward: [B, H, S_q, 1]


# ----------------------------------------------------------------------------- ops on meta tensors
def meta_tensors(graph: Graph) -> dict:
    return {p: torch.empty_strided(t.dims, t.strides, dtype=TORCH_DTYPES[t.dtype], device="meta")
            for p, t in graph.tensors.items()}


@pytest.mark.parametrize("name,graph", [
    ("torch-flash", g(H_q=8, H_k=2, H_v=2, S_q=70, S_kv=50, layout="bshd",
                      right=0, alignment="BOTTOM_RIGHT")),
    ("torch-efficient", g(S_q=70, S_kv=50, D_qk=128, D_v=64, right=0)),
    ("torch-cudnn", g(H_q=8, H_k=2, H_v=2, S_q=70, S_kv=50, D_qk=128, D_v=64, layout="bshd")),
])
def test_op_plumbing_on_meta(name, graph):
    e = engine(name)
    assert e.is_applicable(graph) is None
    tensors = meta_tensors(graph)
    dq, dk, dv = e.backward(graph, tensors)[:3]
    assert (tuple(dq.shape), tuple(dk.shape), tuple(dv.shape)) == tuple(
        graph.tensors[p].dims for p in ("dq", "dk", "dv"))
    e.run(graph, tensors)


@pytest.mark.parametrize("name", NAMES)
def test_run_refuses_a_declined_graph(name):
    with pytest.raises(ValueError, match="window|mask"):
        engine(name).run(g(left=8, right=0), meta_tensors(g(left=8, right=0)))


# ----------------------------------------------------------------------------- the GPU self-check
class MathStub:
    """A correct backward in float64 (autograd), standing in for an aten engine on the CPU."""
    name = "stub"

    def __init__(self, decline=None, scale_dq=1.0):
        self.decline, self.scale_dq = decline, scale_dq

    def is_applicable(self, graph):
        return self.decline

    def backward(self, graph, t):
        from bundlegen.mask import keep_mask

        q, k, v = (t[p].detach().double().requires_grad_() for p in ("q", "k", "v"))
        kk = k.repeat_interleave(graph.H_q // graph.H_k, 1)
        vv = v.repeat_interleave(graph.H_q // graph.H_v, 1)
        s = q @ kk.transpose(-1, -2) * graph.attributes.attn_scale
        keep = keep_mask(graph.S_q, graph.S_kv, graph.attributes)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        (torch.softmax(s, -1).nan_to_num(0.0) @ vv).backward(t["do"].double())
        return q.grad * self.scale_dq, k.grad, v.grad

    def run(self, graph, t):
        write_gradients(t, *self.backward(graph, t))


def test_selfcheck_cases_are_valid_graphs():
    labels = [c.label for c in cases()]
    assert len(labels) == len(set(labels))
    assert all(frontend_reason(c.graph) is None for c in cases())


def test_selfcheck_judges_engines():
    case = next(c for c in cases() if c.label == "causal-BR-sq>skv")
    cpu = torch.device("cpu")
    assert check("torch-flash", MathStub(), case, cpu)[0] == "ok"
    assert check("torch-flash", MathStub(scale_dq=1.01), case, cpu)[0] == "SUSPECT"
    declined = MathStub(decline="alignment-not-served: x")
    assert check("torch-flash", declined, case, cpu)[0] == "declined"
    forced = frozenset({"alignment-not-served"})
    assert check("torch-flash", declined, case, cpu, forced)[0] == "forced:ok"
