"""Dropout through the dropout_mask port (issue 43, item 2): the frontend's rules, the
drawn mask, the oracle against float64 autograd, and torch-math and the Triton interpreter
against the oracle."""
import dataclasses
import math

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.graph import dense_graph, with_modifiers
from bundlegen.harness import materialize as M
from bundlegen.harness import oracle
from bundlegen.harness.checks import judge_outputs
from bundlegen.harness.config import Tolerance
from bundlegen.harness.distributions import dropout_keep
from bundlegen.plans import sdpa_bwd as P
from bundlegen.validate import frontend_reason
from tests.graph_factory import make_case


def dropped(p=0.5, mask="full", **kw):
    base = dict(dtype="bf16", B=2, H_q=4, H_k=2, S_q=17, S_kv=33, D_qk=16)
    return with_modifiers(dense_graph(**{**base, **kw}), dropout=p, dropout_mask=mask)


def _with_attr(graph, **attrs):
    return dataclasses.replace(graph, attributes=dataclasses.replace(graph.attributes, **attrs))


def _with_port(graph, **fields):
    t = graph.tensors["dropout_mask"]
    return dataclasses.replace(graph, tensors={**graph.tensors, "dropout_mask": dataclasses.replace(t, **fields)})


def test_frontend_rules():
    g = dropped()
    assert frontend_reason(g) is None
    assert frontend_reason(dropped(mask="both")) is None                       # batch and heads broadcast
    assert frontend_reason(_with_attr(g, dropout_probability=-0.1)) == R.DROPOUT_PROBABILITY_RANGE
    assert frontend_reason(_with_attr(g, dropout_probability=1.0)) == R.DROPOUT_PROBABILITY_RANGE
    assert frontend_reason(_with_attr(g, dropout_probability=float("nan"))) == R.DROPOUT_PROBABILITY_RANGE
    assert frontend_reason(_with_attr(g, dropout_probability=None)) == R.DROPOUT_MASK_WITHOUT_PROBABILITY
    assert frontend_reason(_with_attr(g, dropout_probability=0.0)) == R.DROPOUT_MASK_WITHOUT_PROBABILITY
    assert frontend_reason(_with_port(g, dims=(2, 4, 17, 32), strides=(4 * 17 * 32, 17 * 32, 32, 1))) \
        == R.DROPOUT_MASK_DIMS_MISMATCH
    assert frontend_reason(_with_port(g, dtype="fp16")) == R.DTYPE_MISMATCH
    assert frontend_reason(_with_port(g, strides=(4 * 17 * 33, 17 * 33, 0, 1))) == R.DROPOUT_MASK_BROADCAST_AXIS
    plain = dense_graph()
    assert frontend_reason(_with_attr(plain, dropout_probability=0.0)) is None    # p = 0: the plain graph
    assert frontend_reason(_with_attr(plain, dropout_probability=0.3)) is None    # an engine draws its own


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drawn_keep_mask_is_binomial_and_follows_the_seed(p):
    n = 64 * 1000
    keep = dropout_keep((1, 1, 64, 1000), seed=7, p=p)
    assert set(keep.unique().tolist()) <= {0.0, 1.0}
    kept = int(keep.sum())
    assert abs(kept - n * (1 - p)) <= 5 * math.sqrt(n * p * (1 - p))
    assert torch.equal(keep, dropout_keep((1, 1, 64, 1000), seed=7, p=p))
    assert not torch.equal(keep, dropout_keep((1, 1, 64, 1000), seed=8, p=p))


def autograd_reference(q, k, v, do, attrs, keep):
    """float64 autograd through softmax(scale Q K^T + mask) * keep / (1 - p) V, by itself."""
    from bundlegen.mask import keep_mask
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    H_q = q.shape[1]
    kk = k.repeat_interleave(H_q // k.shape[1], 1)
    vv = v.repeat_interleave(H_q // v.shape[1], 1)
    s = q @ kk.transpose(-1, -2) * attrs.attn_scale
    allowed = keep_mask(q.shape[2], k.shape[2], attrs)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(s, -1) * keep.double() / (1 - attrs.dropout_probability)
    out = probs @ vv
    return torch.autograd.grad(out, (q, k, v), do.double()), out


@pytest.mark.parametrize("p, mask", [(0.1, "full"), (0.5, "head"), (0.9, "both")])
def test_oracle_matches_float64_autograd(p, mask):
    g = dropped(p, mask, right=0, alignment="BOTTOM_RIGHT")
    m = M.materialize(dataclasses.replace(make_case(g, seed=3), tolerance_class="bf16-r256"), "cpu")
    t = m.tensors
    (dq, dk, dv), out = autograd_reference(t["q"], t["k"], t["v"], t["do"], g.attributes, t["dropout_mask"])
    torch.testing.assert_close(m.forward.o, out.detach(), rtol=1e-10, atol=1e-12)
    ref = m.reference
    for got, want, mag in ((ref.dq, dq, ref.mag_dq), (ref.dk, dk, ref.mag_dk), (ref.dv, dv, ref.mag_dv)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        assert bool((mag + 1e-12 >= got.abs()).all())


def _judged(engine, graph):
    case = dataclasses.replace(make_case(graph, seed=4), tolerance_class=P.tolerance_class_for(graph))
    tc = P.TOLERANCE_CLASSES[case.tolerance_class]
    m = M.materialize(case, "cpu")
    engine.run(graph, m.tensors)
    return judge_outputs({p: m.tensors[p] for p in ("dq", "dk", "dv")}, m.reference,
                         Tolerance(tc.rtol, tc.atol, "test"))


ENGINE_GRAPHS = [dropped(0.5, "full", dtype="fp32"), dropped(0.9, "head", left=7, right=0),
                 dropped(0.1, "both", H_k=1, S_q=65, S_kv=20)]


@pytest.mark.parametrize("graph", ENGINE_GRAPHS)
def test_torch_math_serves_the_mask_port(graph):
    from bundlegen.engines.torch_math.engine import TorchMathEngine
    engine = TorchMathEngine("cpu")
    assert engine.is_applicable(graph) is None
    assert _judged(engine, graph).verdict == "pass"


@pytest.mark.parametrize("graph", ENGINE_GRAPHS)
def test_triton_interpreter_serves_the_mask_port(graph):
    from bundlegen.engines.triton.engine import TritonEngine
    engine = TritonEngine("cpu")
    assert engine.is_applicable(graph) is None
    assert _judged(engine, graph).verdict == "pass"


def test_triton_declines_dropout_it_cannot_serve():
    from bundlegen.engines.triton.capabilities import ROWS
    g = dropped()
    assert ROWS["cpu"].mismatch(g) is None
    for arch in ("sm90", "sm120", "gfx942"):   # where the dropout variants are resource-checked
        served = ROWS[arch].dropout and ROWS[arch].dropout_spill(g) is None
        reason = ROWS[arch].mismatch(g)
        assert (reason and R.code_of(reason)) == (None if served else R.DROPOUT_NOT_SERVED), (arch, reason)
    with_dbias = with_modifiers(dense_graph(dtype="bf16", S_q=17, S_kv=33), bias="full", dbias=True,
                                dropout=0.5)
    assert R.code_of(ROWS["cpu"].mismatch(with_dbias)) == R.MODIFIER_COMBINATION_NOT_SERVED
