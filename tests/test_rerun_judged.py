"""Every run of a case is judged (issue 45): an engine that writes into an input or past its
outputs only on a determinism re-run, before or after computing, is charged
`fail:input-modified` or `fail:guard` on that run, never passed and never called
nondeterministic."""
from __future__ import annotations

import pytest

from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from tests import harness_support as S


def engine_writing_on_run(n: int, what: str, before: bool):
    """torch-math, which on its n-th run writes into `what` ('input': k; 'guard': one element
    past dv's view), before or after computing."""
    from bundlegen.engines.torch_math.engine import TorchMathEngine

    class WritesOnRun(TorchMathEngine):
        name = "writes-on-run"

        def __init__(self, device):
            super().__init__(device)
            self.runs = 0

        def defect(self, tensors) -> None:
            if what == "input":
                tensors["k"][0, 0, 0, 0].fill_(1234.0)
            else:
                S.element_at(tensors["dv"], S.last_addressed(tensors["dv"]) + 1).fill_(0.0)

        def run(self, graph, tensors):
            self.runs += 1
            if before and self.runs == n:
                self.defect(tensors)
            super().run(graph, tensors)
            if not before and self.runs == n:
                self.defect(tensors)
    return WritesOnRun("cpu")


@pytest.mark.parametrize("before", [False, True], ids=["after-computing", "before-computing"])
@pytest.mark.parametrize("what, verdict, port", [("input", V.FAIL_INPUT_MODIFIED, "k"),
                                                 ("guard", V.FAIL_GUARD, "dv")])
@pytest.mark.parametrize("on_run, repeat", [(2, None), (3, 4)])
def test_a_write_on_a_rerun_gets_its_own_verdict(what, verdict, port, before, on_run, repeat):
    outcome = run_case(S.case_of(), engine_writing_on_run(on_run, what, before), S.LOOSE, repeat)
    assert outcome.verdict == verdict, outcome
    assert port in outcome.detail and f"run {on_run}" in outcome.detail, outcome.detail


def test_the_same_engine_passes_when_it_writes_on_no_run():
    assert run_case(S.case_of(), engine_writing_on_run(99, "input", True), S.LOOSE, None).verdict == V.PASS
