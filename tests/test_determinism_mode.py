"""Cases that ask for a deterministic backward (issue 17): engines without such a mode
decline, the others run as often as the engine declares for its device
(Engine.determinism_runs: a GPU's 50, a CPU engine's few, the Triton interpreter's 2) and
every element that ever differs from run 1 is counted."""
from __future__ import annotations

import dataclasses
import json

import torch

from bundlegen import reasons as R
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.engines.torch_sdpa_common import deterministic_algorithms
from bundlegen.graph import Attributes, canonical_json, graph_from_json, FieldReader
from bundlegen.harness import verdicts as V
from bundlegen.cost import CPU_RUNS, GPU_RUNS, SERIAL_RUNS
from bundlegen.harness.case import repeat_count, run_case
from tests.graph_factory import make_case, make_graph
from tests.harness_support import PLAIN, _with_class


def _deterministic(graph):
    return dataclasses.replace(graph, attributes=dataclasses.replace(graph.attributes,
                                                                     deterministic_algorithm=True))


GRAPH = _deterministic(make_graph(S_q=17, S_kv=33))


DETERMINISTIC_MODE_RUNS = GPU_RUNS.requested


class Counting(TorchMathEngine):
    """torch-math that counts its runs and declares a GPU's runs (50 for the mode)."""

    def determinism_runs(self):
        return GPU_RUNS

    def __init__(self, device="cpu", flip_on=()):
        super().__init__(device)
        self.runs, self.flip_on = 0, set(flip_on)

    def run(self, graph, tensors):
        super().run(graph, tensors)
        self.runs += 1
        if self.runs in self.flip_on:   # one element rounds the other way on these runs
            x = tensors["dq"].view(-1)[5:6]
            x.copy_(torch.nextafter(x.float(), torch.tensor(float("inf"))).to(x.dtype) + 2 ** -7)


class NoDeterministicMode(Counting):
    deterministic = False


def test_a_deterministic_engine_is_run_the_full_count_and_passes():
    engine = Counting()
    outcome = run_case(_with_class(make_case(GRAPH)), engine, PLAIN)
    assert outcome.verdict == V.PASS and engine.runs == DETERMINISTIC_MODE_RUNS >= 50


def test_every_differing_element_is_counted_over_all_runs():
    engine = Counting(flip_on={7, 31})
    outcome = run_case(_with_class(make_case(GRAPH)), engine, PLAIN)
    assert outcome.verdict == V.FAIL_NONDETERMINISTIC and engine.runs == DETERMINISTIC_MODE_RUNS
    assert f"runs 7, 31 of {DETERMINISTIC_MODE_RUNS}" in outcome.detail
    assert "dq in 1 of" in outcome.detail and "dk" not in outcome.detail


def test_an_ordinary_case_stops_at_its_first_differing_rerun():
    engine = Counting(flip_on={2})
    outcome = run_case(_with_class(make_case(make_graph(S_q=17, S_kv=33))), engine, PLAIN)
    assert outcome.verdict == V.FAIL_NONDETERMINISTIC and engine.runs == 2
    assert "run 2 of 2" in outcome.detail


def test_the_runs_are_the_engine_and_device_s():
    graph, plain = GRAPH, make_graph()
    assert CPU_RUNS.requested < GPU_RUNS.requested and SERIAL_RUNS.ordinary == 1
    cpu_math = TorchMathEngine("cpu")
    assert repeat_count(cpu_math, None, graph) == CPU_RUNS.requested
    assert repeat_count(cpu_math, None, plain) == CPU_RUNS.ordinary
    engine = Counting()
    outcome = run_case(_with_class(make_case(graph)), engine, PLAIN)
    assert engine.runs == outcome.runs == GPU_RUNS.requested
    from bundlegen.engines.triton.engine import TritonEngine
    interpreted = TritonEngine("cpu")
    assert interpreted.determinism_runs() == SERIAL_RUNS
    assert repeat_count(interpreted, None, graph) == SERIAL_RUNS.requested
    assert repeat_count(interpreted, None, plain) == SERIAL_RUNS.ordinary == 1
    assert repeat_count(interpreted, 5, plain) == 5


def test_an_engine_without_a_deterministic_mode_declines():
    engine = NoDeterministicMode()
    outcome = run_case(_with_class(make_case(GRAPH)), engine, PLAIN)
    assert outcome.verdict == V.DECLINED and outcome.reason.startswith(R.DETERMINISM_NOT_SERVED)
    assert engine.runs == 0
    NoDeterministicMode.deterministic_mode = True
    try:
        assert run_case(_with_class(make_case(GRAPH)), NoDeterministicMode(), PLAIN).verdict == V.PASS
    finally:
        NoDeterministicMode.deterministic_mode = False


def test_the_attribute_is_in_the_bundle_only_when_asked_for():
    plain = make_graph()
    assert "deterministic_algorithm" not in canonical_json(plain.to_json())
    text = json.loads(canonical_json(GRAPH.to_json()))
    assert text["attributes"]["deterministic_algorithm"] is True
    assert graph_from_json(text, FieldReader("t.json")) == GRAPH
    assert Attributes(attn_scale=1.0).deterministic_algorithm is False


def test_pytorch_deterministic_switch_is_put_back():
    before = torch.are_deterministic_algorithms_enabled()
    with deterministic_algorithms(True):
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.are_deterministic_algorithms_enabled() == before
    with deterministic_algorithms(False):
        assert torch.are_deterministic_algorithms_enabled() == before
