"""Score modifiers on ragged graphs and ALiBi as slopes (docs/CONTRACTS.md, "Score
modifiers"): the frontend rules, the float64 oracle per sequence against a padded batch of
one sequence, torch-math through the harness, and what the other engines decline."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bundlegen import ids
from bundlegen import reasons as R
from bundlegen.graph import Case, DataSpec, TensorSpec, dense_graph, ragged_graph, with_modifiers
from bundlegen.harness import oracle, oracle_ragged
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.validate import frontend_reason
from bundlegen.plans.sdpa_bwd import tolerance_class_for
from tests.harness_support import PLAIN

F64 = torch.float64
CU_Q, CU_KV = (0, 5, 5, 14), (0, 9, 12, 16)   # sequence 1 has no query rows
RAGGED = ragged_graph(CU_Q, CU_KV, H_q=4, H_k=2, D_qk=16, dtype="fp16")
RAGGED_BR = ragged_graph(CU_Q, CU_KV, H_q=4, H_k=1, D_qk=16, dtype="fp16", alignment="BOTTOM_RIGHT",
                         right=0)


def _case(graph) -> Case:
    cid = ids.case_id("claim", graph, "randn", None)
    return Case(id=cid, purpose="claim", items=("T",), graph=graph,
                data=DataSpec(seed=ids.seed_of(cid)), tolerance_class=tolerance_class_for(graph))


def _with_port(graph, port, **changes):
    return dataclasses.replace(graph, tensors={**graph.tensors, port: dataclasses.replace(
        graph.tensors[port], **changes)})


# ----------------------------------------------------------------------------- frontend
def test_a_ragged_graph_takes_every_score_modifier():
    for extras in (dict(softcap=5.0), dict(sinks=True, dsinks=True), dict(bias="full", dbias=True),
                   dict(bias="both", dbias=True), dict(alibi_slopes="head"), dict(alibi_slopes="batch")):
        assert frontend_reason(with_modifiers(RAGGED, **extras)) is None, extras


def test_the_ragged_bias_is_the_padded_max_seqlen_layout():
    graph = with_modifiers(RAGGED, bias="full", dbias=True)
    assert graph.tensors["bias"].dims == (3, 4, 9, 9)
    short = _with_port(graph, "bias", dims=(3, 4, 8, 9))
    assert frontend_reason(short) == R.BIAS_DIMS_MISMATCH
    long_axis = _with_port(graph, "bias", strides=(324, 81, 0, 1))
    assert frontend_reason(long_axis) == R.BIAS_BROADCAST_AXIS


@pytest.mark.parametrize("base", [dense_graph(B=2, H_q=4, S_q=8), RAGGED], ids=["padded", "ragged"])
def test_alibi_slopes_rules(base):
    graph = with_modifiers(base, alibi_slopes="head")
    assert frontend_reason(_with_port(graph, "alibi_slopes", dtype="fp16")) == R.ALIBI_SLOPES_DTYPE
    assert frontend_reason(_with_port(graph, "alibi_slopes", dims=(2,))) == R.ALIBI_SLOPES_DIMS_MISMATCH
    assert frontend_reason(_with_port(graph, "alibi_slopes", dims=(base.B + 1, 4), strides=(4, 1))) \
        == R.ALIBI_SLOPES_DIMS_MISMATCH
    assert frontend_reason(_with_port(graph, "alibi_slopes", dims=(1, base.B, 4),
                                      strides=(4, 4, 1))) == R.BAD_RANK


# ----------------------------------------------------------------------------- oracle
def _ragged_inputs(graph, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=F64)
    T_q, T_kv, H_q, H_k, D = graph.T_q, graph.T_kv, graph.H_q, graph.H_k, graph.D_qk
    return rnd(T_q, H_q, D), rnd(T_kv, H_k, D), rnd(T_kv, H_k, D), rnd(T_q, H_q, D)


@pytest.mark.parametrize("graph", [RAGGED, RAGGED_BR], ids=["top-left", "bottom-right-causal"])
def test_the_ragged_oracle_is_the_padded_oracle_per_sequence(graph):
    """Every sequence's gradients, dBias block and dSinks share equal the padded oracle of
    that sequence alone, with ALiBi's shift from the sequence's own lengths."""
    q, k, v, do = _ragged_inputs(graph)
    B, H_q, Mq, Mkv = graph.B, graph.H_q, graph.S_q, graph.S_kv
    g = torch.Generator().manual_seed(1)
    bias = torch.randn(1, H_q, Mq, Mkv, generator=g, dtype=F64).expand(B, H_q, Mq, Mkv)
    slopes = torch.rand(B, H_q, generator=g, dtype=F64)
    sinks = torch.randn(H_q, generator=g, dtype=F64)
    mods = oracle.Modifiers(bias=bias, sinks=sinks, dbias_dims=(1, H_q, Mq, Mkv), dsinks=True,
                            alibi_slopes=slopes)
    attrs = dataclasses.replace(graph.attributes, softcap=3.0)
    seqs = oracle_ragged.sequences(graph, (0, 1, 2))
    fwd = oracle_ragged.forward(q, k, v, attrs, seqs, modifiers=mods)
    bwd = oracle_ragged.backward(q, k, v, do, attrs, fwd, seqs, modifiers=mods)
    dsinks = torch.zeros(H_q, dtype=F64)
    dbias = torch.zeros(1, H_q, Mq, Mkv, dtype=F64)
    for s in seqs:
        if s.q1 == s.q0:
            continue
        cut = lambda t, a, z: t[a:z].permute(1, 0, 2).unsqueeze(0)
        one = oracle.Modifiers(bias=bias[s.b:s.b + 1, :, :s.q1 - s.q0, :s.k1 - s.k0], sinks=sinks,
                               dbias_dims=(1, H_q, s.q1 - s.q0, s.k1 - s.k0), dsinks=True,
                               alibi_slopes=slopes[s.b])
        f = oracle.forward(cut(q, s.q0, s.q1), cut(k, s.k0, s.k1), cut(v, s.k0, s.k1), attrs, modifiers=one)
        b = oracle.backward(cut(q, s.q0, s.q1), cut(k, s.k0, s.k1), cut(v, s.k0, s.k1),
                            cut(do, s.q0, s.q1), attrs, f, modifiers=one)
        torch.testing.assert_close(cut(bwd.dq, s.q0, s.q1), b.dq)
        torch.testing.assert_close(cut(bwd.dk, s.k0, s.k1), b.dk)
        dsinks += b.dsinks
        dbias[:, :, :s.q1 - s.q0, :s.k1 - s.k0] += b.dbias
    torch.testing.assert_close(bwd.dsinks, dsinks)
    torch.testing.assert_close(bwd.dbias, dbias)


def test_alibi_slopes_are_the_materialised_alibi_bias():
    """The slopes port and the bias port holding -slope * |i - j + shift| give one answer."""
    B, H, S_q, S_kv = 2, 4, 6, 9
    g = torch.Generator().manual_seed(2)
    q, do = (torch.randn(B, H, S_q, 8, generator=g, dtype=F64) for _ in range(2))
    k, v = (torch.randn(B, H, S_kv, 8, generator=g, dtype=F64) for _ in range(2))
    slopes = torch.rand(B, H, generator=g, dtype=F64)
    graph = dense_graph(B=B, H_q=H, S_q=S_q, S_kv=S_kv, D_qk=8, alignment="BOTTOM_RIGHT")
    i = torch.arange(S_q, dtype=F64).view(-1, 1)
    j = torch.arange(S_kv, dtype=F64).view(1, -1)
    bias = -slopes[:, :, None, None] * (i - j + (S_kv - S_q)).abs()
    ways = []
    for mods in (oracle.Modifiers(alibi_slopes=slopes), oracle.Modifiers(bias=bias)):
        fwd = oracle.forward(q, k, v, graph.attributes, modifiers=mods)
        ways.append(oracle.backward(q, k, v, do, graph.attributes, fwd, modifiers=mods))
    torch.testing.assert_close(ways[0].dq, ways[1].dq)
    torch.testing.assert_close(ways[0].dk, ways[1].dk)


# ----------------------------------------------------------------------------- engines
@pytest.mark.parametrize("extras", [dict(softcap=5.0), dict(sinks=True, dsinks=True),
                                    dict(bias="full", dbias=True), dict(bias="head", dbias=True),
                                    dict(bias="batch", dbias=True, sinks=True, dsinks=True, softcap=4.0),
                                    dict(alibi_slopes="head"), dict(alibi_slopes="batch")],
                         ids=lambda e: "-".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("base", [RAGGED, RAGGED_BR], ids=["top-left", "bottom-right-causal"])
def test_torch_math_passes_ragged_modifiers(base, extras):
    outcome = run_case(_case(with_modifiers(base, **extras)), TorchMathEngine("cpu"), PLAIN)
    assert outcome.verdict == V.PASS, outcome.detail


@pytest.mark.parametrize("form", ["head", "batch"])
def test_torch_math_passes_padded_alibi_slopes_under_gqa(form):
    base = dense_graph(B=2, H_q=4, H_k=1, S_q=12, S_kv=20, D_qk=16, alignment="BOTTOM_RIGHT", right=0)
    outcome = run_case(_case(with_modifiers(base, alibi_slopes=form, bias="head", dbias=True)),
                       TorchMathEngine("cpu"), PLAIN)
    assert outcome.verdict == V.PASS, outcome.detail


@pytest.mark.parametrize("name", ["torch-flash", "torch-efficient", "torch-cudnn"])
@pytest.mark.parametrize("extras, code", [
    (dict(alibi_slopes="head"), R.MODIFIER_NOT_SERVED),
    (dict(bias="full"), None),   # listed by efficient and cudnn, but not on a varlen op
])
def test_the_pytorch_backends_decline_slopes_and_ragged_modifiers(name, extras, code):
    from bundlegen.engines.registry import engine_class
    from bundlegen.engines.torch_sdpa_common import cuda_facts
    engine = engine_class(name)("cpu", facts=cuda_facts(9, 0, cudnn_version=91002))
    for base in (RAGGED, dense_graph(B=2, H_q=4, S_q=16, D_qk=64, dtype="bf16")):
        graph = with_modifiers(base, **extras)
        outcome = run_case(_case(graph), engine, PLAIN)
        assert outcome.verdict == V.DECLINED or base is not RAGGED and code is None, outcome
        if base is RAGGED or code is not None:
            want = code or (R.MODIFIER_NOT_SERVED if "bias" not in engine.score_modifiers
                            else R.MODIFIER_COMBINATION_NOT_SERVED)
            assert R.code_of(outcome.reason) == want, outcome.reason


#: each mutant of mutants/slopes_sinks.py, a graph it shows on, and one its condition spares
SLOPES_SINKS_MUTANTS = {
    "alibi-slope-of-kv-head": (with_modifiers(dense_graph(B=2, H_q=4, H_k=1, S_q=12, S_kv=20, D_qk=16),
                                              alibi_slopes="head"),
                               with_modifiers(dense_graph(B=2, H_q=4, S_q=12, S_kv=20, D_qk=16),
                                              alibi_slopes="head")),
    "alibi-shift-not-per-sequence": (with_modifiers(RAGGED_BR, alibi_slopes="batch"),
                                     with_modifiers(RAGGED, alibi_slopes="batch")),
    "dsinks-over-padding-rows": (with_modifiers(RAGGED, sinks=True, dsinks=True),
                                 with_modifiers(dense_graph(B=2, H_q=4, S_q=12, D_qk=16), sinks=True,
                                                dsinks=True)),
}


@pytest.mark.parametrize("name", sorted(SLOPES_SINKS_MUTANTS))
def test_the_slopes_and_sinks_mutants_fail_on_their_condition_only(name):
    from bundlegen.mutants import catalog
    shows, spared = SLOPES_SINKS_MUTANTS[name]
    mutant = catalog.by_name(name).wrap(TorchMathEngine("cpu"))
    assert run_case(_case(shows), mutant, PLAIN).verdict.startswith("fail")
    assert run_case(_case(spared), mutant, PLAIN).verdict == V.PASS
