"""Engine.warm_up: one tiny backward before case 1 (so no case is billed for one-time
set-up), called once when a worker builds its engine; a failing warm-up never stops the
build (the first case meets the fault and records it)."""
from bundlegen.validate import frontend_reason
from bundlegen.engines.base import tiny_graph
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.harness.workers.worker import WorkerSpec, build_engine
from tests import harness_support as S


class CountsRuns(TorchMathEngine):
    name = "counts-runs"
    runs = 0

    def run(self, graph, tensors):
        type(self).runs += 1
        super().run(graph, tensors)


class DeclinesTiny(CountsRuns):
    name = "declines-tiny"

    def is_applicable(self, graph):
        return "head-dim-not-served: test engine"


class WarmUpRaises(TorchMathEngine):
    name = "warm-up-raises"

    def warm_up(self):
        raise RuntimeError("injected warm-up fault")


def _build(cls):
    return build_engine(WorkerSpec(engine=S.engine_ref(cls), device="cpu", config=S.LOOSE))


def test_tiny_graph_is_valid():
    assert frontend_reason(tiny_graph()) is None


def test_build_runs_one_tiny_backward():
    CountsRuns.runs = 0
    engine = _build(CountsRuns)
    assert isinstance(engine, CountsRuns) and CountsRuns.runs == 1


def test_declined_tiny_graph_is_not_run():
    DeclinesTiny.runs = 0
    _build(DeclinesTiny)
    assert DeclinesTiny.runs == 0


def test_failing_warm_up_does_not_stop_the_build():
    assert isinstance(_build(WarmUpRaises), WarmUpRaises)
