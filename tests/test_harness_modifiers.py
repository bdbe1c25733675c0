"""The harness with score modifiers (issue 19): torch-math passes bias/dBias, sinks/dSinks
and softcap cases; an engine that does not list a modifier is declined before it is
asked; an engine that skips dBias, writes past it, or writes into the bias is caught."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bundlegen import ids
from bundlegen import reasons as R
from bundlegen.graph import Case, DataSpec, dense_graph, with_modifiers
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from bundlegen.engines.torch_math.engine import TorchMathEngine
from tests.harness_support import PLAIN, _with_class

BASE = dense_graph(B=2, H_q=4, H_k=2, S_q=9, S_kv=13, D_qk=16, dtype="bf16",
                   alignment="BOTTOM_RIGHT", right=0)


def _case(graph, bias_values="randn") -> Case:
    cid = ids.case_id("claim", graph, "randn", None, bias_values=bias_values)
    return _with_class(Case(id=cid, purpose="claim", items=("T",), graph=graph,
                            data=DataSpec(seed=ids.seed_of(cid), bias_values=bias_values)))


@pytest.mark.parametrize("kind, values", [("full", "randn"), ("batch", "alibi"), ("head", "randn"),
                                          ("both", "randn")])
@pytest.mark.parametrize("cap", [None, 5.0])
def test_torch_math_passes_every_modifier(kind, values, cap):
    graph = with_modifiers(BASE, bias=kind, dbias=True, sinks=True, dsinks=True, softcap=cap)
    outcome = run_case(_case(graph, values), TorchMathEngine("cpu"), PLAIN)
    assert outcome.verdict == V.PASS, outcome.detail
    assert {"dbias", "dsinks"} <= set(outcome.outputs)


class _Plain(TorchMathEngine):
    score_modifiers = frozenset({"bias"})

    def is_applicable(self, graph):
        raise AssertionError("asked about a graph with a modifier it does not list")


@pytest.mark.parametrize("extras, unlisted", [
    (dict(bias="full", dbias=True), "dbias"), (dict(sinks=True), "sinks"), (dict(softcap=5.0), "softcap"),
])
def test_an_unlisted_modifier_is_declined_before_is_applicable(extras, unlisted):
    outcome = run_case(_case(with_modifiers(BASE, **extras)), _Plain("cpu"), PLAIN)
    assert outcome.verdict == V.DECLINED
    assert R.code_of(outcome.reason) == R.MODIFIER_NOT_SERVED and unlisted in outcome.reason


class _Defect(TorchMathEngine):
    """torch-math with one defect in its modifier ports."""
    defect = ""

    def run(self, graph, tensors):
        if self.defect == "no-dbias":
            tensors = {p: (torch.empty_like(t) if p == "dbias" else t) for p, t in tensors.items()}
        super().run(graph, tensors)
        if self.defect == "dbias-past-end":
            t = tensors["dbias"]
            t.as_strided((1,), (1,), t.storage_offset() + t.numel()).fill_(0)
        elif self.defect == "writes-bias":
            tensors["bias"].as_strided((1,), (1,), tensors["bias"].storage_offset()).add_(1)
        elif self.defect == "wrong-dsinks":
            tensors["dsinks"].mul_(1.5)


@pytest.mark.parametrize("defect, verdict", [
    ("no-dbias", V.FAIL_NAN), ("dbias-past-end", V.FAIL_GUARD),
    ("writes-bias", V.FAIL_INPUT_MODIFIED), ("wrong-dsinks", V.FAIL_NUMERIC),
])
def test_modifier_port_defects_are_caught(defect, verdict):
    engine = _Defect("cpu")
    engine.defect = defect
    graph = with_modifiers(BASE, bias="batch", dbias=True, sinks=True, dsinks=True)
    outcome = run_case(_case(graph), engine, PLAIN)
    assert outcome.verdict == verdict, outcome.detail


def test_ignoring_the_softcap_fails():
    class NoCap(TorchMathEngine):
        def run(self, graph, tensors):
            plain = dataclasses.replace(graph, attributes=dataclasses.replace(graph.attributes, softcap=None))
            super().run(plain, tensors)
    graph = with_modifiers(BASE, softcap=2.0)
    assert run_case(_case(graph), NoCap("cpu"), PLAIN).verdict == V.FAIL_NUMERIC


@pytest.mark.parametrize("extras", [dict(sinks=True, dsinks=True), dict(sinks=True),
                                    dict(bias="both"), dict(sinks=True, dsinks=True, softcap=30.0)])
def test_torch_math_passes_each_modifier_alone(extras):
    outcome = run_case(_case(with_modifiers(BASE, **extras)), TorchMathEngine("cpu"), PLAIN)
    assert outcome.verdict == V.PASS, outcome.detail
