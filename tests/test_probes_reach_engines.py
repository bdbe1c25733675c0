"""Frontend probes are offered to the engine after the frontend's verdict (issue 17): an
engine whose own checks accept an invalid graph is charged for it."""
from __future__ import annotations

import dataclasses

from bundlegen import reasons as R
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.graph import Rejection, ragged_graph, with_modifiers
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from tests.graph_factory import make_case, make_graph
from tests.harness_support import PLAIN


class AcceptsAnything(TorchMathEngine):
    def __init__(self, device="cpu"):
        super().__init__(device)
        self.asked = 0

    def is_applicable(self, graph):
        self.asked += 1
        return None


def _probe(graph, reason):
    return make_case(graph, purpose="probe", rejection=Rejection("frontend", reason))


NEGATIVE_SCALE = make_graph(scale=-1.0)


def test_an_engine_that_accepts_an_invalid_graph_is_charged():
    engine = AcceptsAnything()
    outcome = run_case(_probe(NEGATIVE_SCALE, R.SCALE_NONPOSITIVE), engine, PLAIN)
    assert outcome.verdict == V.REJECTION_ACCEPTED and engine.asked == 1
    assert "engine accepted" in outcome.detail and V.REJECTION_ACCEPTED in V.FAILING


def test_an_engine_that_declines_it_too_passes_the_probe():
    outcome = run_case(_probe(NEGATIVE_SCALE, R.SCALE_NONPOSITIVE), TorchMathEngine("cpu"), PLAIN)
    assert outcome.verdict == V.REJECTED and outcome.reason == R.SCALE_NONPOSITIVE
    assert R.SCALE_NONPOSITIVE in outcome.detail


def test_bad_ragged_offsets_are_not_offered():
    """An engine gets ragged offsets only as device tensors: the device probes judge it."""
    engine = AcceptsAnything()
    engine.ragged = True
    outcome = run_case(_probe(ragged_graph((0, 9, 4, 12)), R.RAGGED_OFFSETS_DECREASE), engine, PLAIN)
    assert outcome.verdict == V.REJECTED and engine.asked == 0


def test_the_frontend_verdict_comes_first():
    engine = AcceptsAnything()
    wrong = run_case(_probe(NEGATIVE_SCALE, R.SCALE_NONFINITE), engine, PLAIN)
    assert wrong.verdict == V.REJECTION_ACCEPTED and engine.asked == 0


class ServesNoModifier(AcceptsAnything):
    score_modifiers = frozenset()


def _without(graph, port):
    return dataclasses.replace(graph, tensors={p: t for p, t in graph.tensors.items() if p != port})


def test_a_modifier_probe_is_not_offered_to_an_engine_that_does_not_list_the_modifier():
    """A dSinks port without sinks (issue 45): an engine that serves no score modifier is
    never handed a graph holding a modifier's ports, so it is not charged for accepting it."""
    graph = _without(with_modifiers(make_graph(), sinks=True, dsinks=True), "sinks")
    engine = ServesNoModifier()
    outcome = run_case(_probe(graph, R.DSINKS_WITHOUT_SINKS), engine, PLAIN)
    assert outcome.verdict == V.REJECTED and engine.asked == 0, outcome
    assert R.DSINKS_WITHOUT_SINKS == outcome.reason and "sinks" in outcome.detail


def test_an_engine_that_lists_the_modifier_is_still_offered_the_probe():
    graph = _without(with_modifiers(make_graph(), sinks=True, dsinks=True), "sinks")
    engine = AcceptsAnything()   # lists sinks, accepts everything: charged
    outcome = run_case(_probe(graph, R.DSINKS_WITHOUT_SINKS), engine, PLAIN)
    assert outcome.verdict == V.REJECTION_ACCEPTED and engine.asked == 1, outcome
