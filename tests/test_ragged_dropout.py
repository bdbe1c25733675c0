"""Dropout on ragged (THD / varlen) graphs: the dropout_mask port is padded [B, H_q,
max_seqlen_q, max_seqlen_kv] and sequence b uses its corner [b, :, :S_q_b, :S_kv_b]
(docs/CONTRACTS.md, "Dropout"); the ragged oracle applies it per sequence (checked against
float64 autograd), torch-math and the Triton interpreter serve it, and the Triton kernels
draw a mask of their own in sequence-local coordinates."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.engines.triton.capabilities import ROWS
from bundlegen.engines.triton.engine import TritonEngine
from bundlegen.graph import ragged_graph, with_modifiers
from bundlegen.harness import materialize as M
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from bundlegen.plans import sdpa_bwd as P
from bundlegen.validate import frontend_reason
from tests import harness_support as S
from tests.test_dropout import autograd_reference
from tests.graph_factory import make_case

CU_Q, CU_KV = (0, 9, 16, 40), (0, 12, 20, 51)   # three sequences, S_q < S_kv and S_q > S_kv


def ragged(mask="full", p=0.5, **kw):
    base = dict(H_q=4, H_k=2, D_qk=16, D_v=16, dtype="bf16", right=0, alignment="BOTTOM_RIGHT")
    return with_modifiers(ragged_graph(CU_Q, CU_KV, **{**base, **kw}), dropout=p, dropout_mask=mask)


def case_of(graph):
    return dataclasses.replace(make_case(graph, seed=5), tolerance_class=P.tolerance_class_for(graph))


def _with_port(graph, **fields):
    t = graph.tensors["dropout_mask"]
    return dataclasses.replace(graph, tensors={**graph.tensors, "dropout_mask": dataclasses.replace(t, **fields)})


def test_frontend_takes_the_padded_mask_on_a_ragged_graph():
    g = ragged()
    assert g.tensors["dropout_mask"].dims == (3, 4, 24, 31)     # [B, H_q, max_seqlen_q, max_seqlen_kv]
    assert frontend_reason(g) is None
    assert frontend_reason(ragged("both")) is None
    tokens = _with_port(g, dims=(40, 4, 51, 1), strides=(4 * 51, 51, 1, 1))
    assert frontend_reason(tokens) == R.DROPOUT_MASK_DIMS_MISMATCH
    assert frontend_reason(dataclasses.replace(g, attributes=dataclasses.replace(
        g.attributes, dropout_probability=None))) == R.DROPOUT_MASK_WITHOUT_PROBABILITY
    assert frontend_reason(_with_port(g, dtype="fp16")) == R.DTYPE_MISMATCH


@pytest.mark.parametrize("mask", ["full", "head"])
def test_the_ragged_oracle_applies_each_sequences_corner_of_the_mask(mask):
    g = ragged(mask)
    m = M.materialize(case_of(g), "cpu")
    t, ref = m.tensors, m.reference
    for b in range(g.B):
        q0, q1, k0, k1 = CU_Q[b], CU_Q[b + 1], CU_KV[b], CU_KV[b + 1]
        cut = lambda x, r0, r1: x[r0:r1].permute(1, 0, 2).unsqueeze(0)
        keep = t["dropout_mask"][b:b + 1, :, :q1 - q0, :k1 - k0]
        grads = autograd_reference(cut(t["q"], q0, q1), cut(t["k"], k0, k1), cut(t["v"], k0, k1),
                                   cut(t["do"], q0, q1), g.attributes, keep)[0]
        for got, want in zip((cut(ref.dq, q0, q1), cut(ref.dk, k0, k1), cut(ref.dv, k0, k1)), grads):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("engine_cls", [TorchMathEngine, TritonEngine])
@pytest.mark.parametrize("mask", ["full", "head"])
def test_the_engines_serve_the_port_on_ragged_graphs(engine_cls, mask):
    out = run_case(case_of(ragged(mask)), engine_cls("cpu"), S.PLAIN)
    assert out.verdict == V.PASS, out


def test_triton_draws_a_sequence_local_mask_on_ragged_graphs():
    g = ragged(None, p=0.1, H_k=1, H_v=4, D_v=8)
    engine = TritonEngine("cpu")
    keep = engine.drawn_dropout_mask(g)
    assert keep.shape == (3, 4, 24, 31)
    # sequence-local: the mask of a ragged graph is the padded graph's of its max lengths
    from bundlegen.graph import dense_graph
    padded = dense_graph(B=3, H_q=4, S_q=24, S_kv=31, dropout=0.1)
    assert torch.equal(keep, engine.drawn_dropout_mask(padded))
    assert run_case(case_of(g), engine, S.PLAIN, repeat=2).verdict == V.PASS


def test_rows_without_ragged_dropout_decline_it_with_a_reason():
    for arch, row in ROWS.items():
        reason = row.mismatch(ragged())
        assert (reason is None) == row.ragged_dropout, (arch, reason)
        if reason is not None:
            assert R.code_of(reason) == R.DROPOUT_NOT_SERVED, (arch, reason)
        serving = dataclasses.replace(row, dropout=True, drawn_dropout=True)   # the ragged arm alone
        if not row.ragged_dropout:
            assert "ragged" in serving.mismatch(ragged()) and serving.mismatch(ragged(None)) is not None
    assert ROWS["cpu"].ragged_dropout
