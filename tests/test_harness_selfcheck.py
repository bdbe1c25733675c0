"""The engines' smoke-check library (harness/selfcheck.py) and its two smoke scripts
(bench/triton_selfcheck.py, bench/torch_sdpa_selfcheck.py): a correct engine comes out
clean, and each kind of defect is reported where it is (an error, a canary written, an
input modified, an output left unwritten, bits that change between runs)."""
import pytest
import torch

from bench import torch_sdpa_selfcheck as TS
from bench import triton_selfcheck as TC
from bundlegen.graph import dense_graph
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.harness import selfcheck
from bundlegen.harness.config import Tolerance
from bundlegen.mutants import wrappers as W

TOL = Tolerance(2.0 ** -8, 1e-5, "test")
GRAPH = dict(B=2, H_q=2, S_q=24, S_kv=40, D_qk=16)


class Scaled(W.EngineWrapper):
    """dQ scaled by 1.1 after a correct run."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        tensors["dq"].mul_(1.1)


class WritesGuard(W.EngineWrapper):
    """A correct run, then one element of dK's storage before its view (a guard) written."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        tensors["dk"].as_strided((1,), (1,), 0).zero_()


class WritesInput(W.EngineWrapper):
    """A correct run that then zeroes one element of Q."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        tensors["q"][0, 0, 0, 0] = 0


class LeavesDkUnwritten(W.EngineWrapper):
    """dK left as the harness handed it (the NaN canary)."""

    def run(self, graph, tensors):
        dk = torch.empty_like(tensors["dk"])
        self.inner.run(graph, {**tensors, "dk": dk})


def _judge(engine, **graph):
    m = selfcheck.prepare(dense_graph(**{**GRAPH, **graph}), 3, "cpu")
    return selfcheck.run_and_judge(engine, m, TOL), m


def test_a_correct_engine_is_clean():
    finding, m = _judge(TorchMathEngine("cpu"))
    assert set(finding.errors) == {"dq", "dk", "dv"}
    assert finding.memory_intact and not finding.nonfinite
    assert finding.worst_normalized_error <= 1.0
    assert all(0 <= finding.relative_error(p) < 1e-2 for p in finding.errors)
    assert all(finding.ref_max[p] > 0 for p in finding.errors)


def test_a_score_modifier_output_is_judged_too():
    from bundlegen.graph import with_modifiers
    m = selfcheck.prepare(with_modifiers(dense_graph(**GRAPH), bias="full", dbias=True), 3, "cpu")
    finding = selfcheck.run_and_judge(TorchMathEngine("cpu"), m, TOL)
    assert set(finding.errors) == {"dq", "dk", "dv", "dbias"} and finding.worst_normalized_error <= 1.0


@pytest.mark.parametrize("wrapper, field, port", [
    (WritesGuard, "wrote_outside", "dk"),
    (WritesInput, "modified_inputs", "q"),
    (LeavesDkUnwritten, "nonfinite", "dk"),
])
def test_each_defect_is_reported_on_its_port(wrapper, field, port):
    finding, _ = _judge(wrapper(TorchMathEngine("cpu")))
    assert getattr(finding, field) == (port,)


def test_an_error_is_reported_on_its_output():
    finding, _ = _judge(Scaled(TorchMathEngine("cpu")))
    assert not finding.errors["dq"].within and finding.errors["dk"].within
    assert finding.worst_normalized_error > 1.0 and finding.relative_error("dq") > 0.05


def test_same_bits_sees_a_changed_output():
    engine = TorchMathEngine("cpu")
    _, m = _judge(engine)
    before = selfcheck.output_copies(m)
    engine.run(m.case.graph, m.tensors)
    assert selfcheck.same_bits(m, before)
    m.tensors["dv"][0, 0, 0, 0] += 1
    assert not selfcheck.same_bits(m, before)


# ----------------------------------------------------------------------------- the scripts
@pytest.mark.parametrize("wrapper, words", [
    (None, None), (Scaled, "SUSPECT"), (WritesGuard, "WROTE OUTSIDE dk"),
    (WritesInput, "MODIFIED INPUTS q"), (LeavesDkUnwritten, "SUSPECT")])
def test_the_torch_sdpa_smoke_flags_each_defect(wrapper, words):
    case = TS.SelfCase("small", TS.graph(S_q=24, S_kv=40, D_qk=16, D_v=16))
    engine = TorchMathEngine("cpu") if wrapper is None else wrapper(TorchMathEngine("cpu"))
    status, text = TS.check("torch-flash", engine, case, torch.device("cpu"))
    if words is None:
        assert status == "ok", text
    else:
        assert status == "SUSPECT" and words in f"{status} {text}", text


def test_the_triton_smoke_rule_flags_a_wrong_gradient_and_a_guard():
    from bundlegen.engines.triton.engine import TritonEngine
    from bundlegen.mutants import catalog
    graph = dense_graph(H_q=2, S_q=16, S_kv=24, D_qk=16)
    found = {}
    for label, engine in (("correct", TritonEngine("cpu")),
                          ("no-scale", catalog.by_name("scale-ignored-in-dk").wrap(TritonEngine("cpu"))),
                          ("extra-row", W.DvExtraRow(TritonEngine("cpu")))):
        m = selfcheck.prepare(graph, TC.SEED, "cpu", label=label)
        found[label] = TC.failures(selfcheck.run_and_judge(engine, m, TC.TOLERANCE))
    assert found["correct"] == []
    assert [f.split(":")[0] for f in found["no-scale"]] == ["dk"] and "max err" in found["no-scale"][0]
    # the row past head 0's end is head 1's first row (a wrong value); past the last head's, a guard
    assert found["extra-row"][0] == "dv: guard or gap written" and "dv: max err" in found["extra-row"][1]
