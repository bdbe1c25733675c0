"""Frontend probes are offered to the engine after the frontend's verdict (issue 17): an
engine whose own checks accept an invalid graph is charged for it."""
from __future__ import annotations

import dataclasses

from bundlegen import reasons as R
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.graph import Rejection, ragged_graph
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
