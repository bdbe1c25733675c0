"""The gradient distributions (harness/distributions.py): dO correlated with O (l2-grad),
|dO| of order 1e3 (large-do) and dP past fp16's range with the gradients inside it
(overflow-dp); dO from O written after the oracle's forward (harness/materialize.py)."""
from __future__ import annotations

import pytest
import torch

from bundlegen.graph import DISTRIBUTIONS
from bundlegen.harness import distributions as DIST
from bundlegen.harness import materialize as M
from bundlegen.harness.checks import bit_pattern
from tests.graph_factory import make_case, make_graph

FP16_MAX = 65504.0


def _materialized(distribution, dtype="fp16", **sizes):
    graph = make_graph(**{"B": 2, "H_q": 2, "H_k": 2, "H_v": 2, "S_q": 64, "S_kv": 64, "D_qk": 64,
                          "D_v": 64, "dtype": dtype, **sizes})
    return M.materialize(make_case(graph, seed=7, distribution=distribution), "cpu")


def test_the_new_distributions_are_known_values():
    assert {"l2-grad", "large-do", "overflow-dp"} <= set(DISTRIBUTIONS)


def test_l2_grad_do_is_o_minus_a_target_and_delta_is_far_from_zero():
    m = _materialized("l2-grad")
    x = M.logical_inputs(m)
    o, do = x["o"].double(), x["do"].double()
    delta = (do * o).sum(-1)
    # Delta = |O|^2 - T.O: positive in (nearly) every row; drawn apart from O, a coin toss
    assert float((delta > 0).double().mean()) > 0.95
    randn = M.logical_inputs(_materialized("randn"))
    plain = (randn["do"].double() * randn["o"].double()).sum(-1)
    assert 0.3 < float((plain > 0).double().mean()) < 0.7
    # dO is do_from_o of O as the engine reads it, bit for bit
    noise = DIST.draw_inputs(m.case.graph, "l2-grad", 7)["do"].clone()
    want = DIST.do_from_o(x["o"], noise).to(torch.float16)
    assert torch.equal(bit_pattern(x["do"]), bit_pattern(want))
    # the oracle's reference is the gradient of that dO
    assert M.guard_violations(m) == []


def test_l2_grad_row_without_keys_gets_zero_do():
    o = torch.zeros(1, 1, 3, 4, dtype=torch.bfloat16)
    o[0, 0, 1] = torch.tensor([1.0, -2.0, 0.5, 0.25])
    do = DIST.do_from_o(o, torch.ones(1, 1, 3, 4))
    assert torch.equal(do[0, 0, 0], torch.zeros(4)) and torch.equal(do[0, 0, 2], torch.zeros(4))
    assert torch.equal(do[0, 0, 1], o[0, 0, 1].float() - 1.0)   # spread 0.5 * max|O| = 1


def test_large_do_drives_dp_towards_fp16_range():
    x = M.logical_inputs(_materialized("large-do"))
    dp = x["do"].double() @ x["v"].double().transpose(-1, -2)
    assert float(x["do"].double().abs().max()) > 1e3
    assert 1e4 < float(dp.abs().max()) < 8e4


def test_overflow_dp_passes_fp16_range_with_every_gradient_inside_it():
    m = _materialized("overflow-dp")
    x = M.logical_inputs(m)
    dp = x["do"].double() @ x["v"].double().transpose(-1, -2)
    assert float(dp.abs().max()) > 4 * FP16_MAX
    for name in ("dq", "dk", "dv"):
        assert float(m.reference.gradient(name).abs().max()) < FP16_MAX / 8, name
    assert torch.isfinite(x["do"].float()).all()


@pytest.mark.parametrize("distribution", ["l2-grad", "large-do", "overflow-dp"])
def test_new_distributions_do_not_depend_on_the_thread_count(distribution, monkeypatch):
    monkeypatch.setattr(DIST, "THREADED_MIN_ELEMS", 0)
    monkeypatch.setattr(DIST, "default_threads", lambda: 4)
    graph = make_graph(B=2, H_q=2, S_q=37, S_kv=29, D_qk=24, D_v=8, dtype="fp16")
    one, pool = (DIST.generate_inputs(graph, distribution, 11, threads=t, chunk_elems=100) for t in (1, 4))
    for port in DIST.GENERATED_PORTS:
        assert torch.equal(bit_pattern(one[port]), bit_pattern(pool[port])), port
