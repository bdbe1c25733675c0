"""Engine-drawn dropout masks (issue 43): an engine that draws its own mask reports it after
the run, and the harness judges the gradients against the oracle run with that mask; the
drawn mask's keep rate, and its dependence on the seed, are checked too."""
from __future__ import annotations

import dataclasses

import torch

from bundlegen import reasons as R
from bundlegen.graph import dense_graph
from bundlegen.engines.torch_math.engine import TorchMathEngine, attention_backward_heads
from bundlegen.harness import verdicts as V
from bundlegen.harness.drawn_dropout import mask_problem
from bundlegen.harness.case import run_case
from tests import harness_support as S
from tests.graph_factory import make_case


class DrawingEngine(TorchMathEngine):
    """torch-math that draws its own keep mask from (SEED, OFFSET), like a Philox kernel."""
    draws_dropout_mask = True
    SEED, OFFSET = 1234, 0

    def is_applicable(self, graph):
        if graph.attributes.dropout_probability and "dropout_mask" not in graph.tensors:
            return None
        return super().is_applicable(graph)

    def draw(self, graph) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.SEED * 1_000_003 + self.OFFSET)
        shape = (graph.B, graph.H_q, graph.S_q, graph.S_kv)
        return (torch.rand(shape, generator=gen) >= graph.attributes.dropout_probability).float()

    def run(self, graph, tensors):
        t = tensors
        grads = attention_backward_heads(graph.attributes, t["q"], t["k"], t["v"], t["do"],
                                         dropout_keep=self.mask_used(graph))
        for port, grad in zip(("dq", "dk", "dv"), grads):
            t[port].copy_(grad)

    def mask_used(self, graph):
        return self.draw(graph)

    def drawn_dropout_mask(self, graph):
        return self.draw(graph)


class StuckEngine(DrawingEngine):
    """A stuck generator: every entry kept."""
    def draw(self, graph):
        return torch.ones(graph.B, graph.H_q, graph.S_q, graph.S_kv)


class MisreportingEngine(DrawingEngine):
    """Uses one mask, tells another (the next offset's) before and after the run."""
    def mask_used(self, graph):
        self.OFFSET += 1
        used = self.draw(graph)
        self.OFFSET -= 1
        return used


class DriftingEngine(DrawingEngine):
    """Its offset advances at every run: the mask after the run is not the one announced."""
    def run(self, graph, tensors):
        super().run(graph, tensors)
        self.OFFSET += 1


def drawn_case(p=0.5):
    g = dense_graph(dtype="bf16", B=2, H_q=4, H_k=2, S_q=24, S_kv=40, D_qk=16, dropout=p)
    return dataclasses.replace(make_case(g, seed=9), tolerance_class="bf16-r256")


def test_a_drawn_mask_is_judged_against_the_oracle_with_that_mask():
    for p in (0.1, 0.5, 0.9):
        out = run_case(drawn_case(p), DrawingEngine("cpu"), S.PLAIN, repeat=3)
        assert out.verdict == V.PASS, out   # repeat 3: the same seed gives bitwise gradients


def test_an_engine_that_draws_no_mask_declines():
    out = run_case(drawn_case(), TorchMathEngine("cpu"), S.PLAIN)
    assert (out.verdict, R.code_of(out.reason)) == (V.DECLINED, R.DROPOUT_NOT_SERVED)


def test_a_stuck_generator_and_a_misreported_mask_fail():
    stuck = run_case(drawn_case(), StuckEngine("cpu"), S.PLAIN)
    assert stuck.verdict == V.FAIL_NUMERIC and "keeps" in stuck.detail
    wrong = run_case(drawn_case(), MisreportingEngine("cpu"), S.PLAIN)
    assert wrong.verdict == V.FAIL_NUMERIC and "outside rtol" in wrong.detail
    drift = run_case(drawn_case(), DriftingEngine("cpu"), S.PLAIN)
    assert drift.verdict == V.FAIL_NUMERIC and "differs from the one announced" in drift.detail


def test_seed_and_offset_decide_the_mask():
    graph = drawn_case().graph
    a, b = DrawingEngine("cpu"), DrawingEngine("cpu")
    assert torch.equal(a.draw(graph), b.draw(graph))
    b.SEED = 99
    assert not torch.equal(a.draw(graph), b.draw(graph))
    assert mask_problem(a.draw(graph), graph) is None
    assert mask_problem(torch.ones(2, 4, 24, 39), graph).startswith("drawn dropout mask of dims")


def test_the_keep_rate_counts_only_the_entries_the_mask_attends():
    """Bits the mask removes scale nothing (a kernel that skips a masked tile never draws
    them): reported as kept, they must not push the keep count out of its bound."""
    g = dense_graph(dtype="bf16", B=2, H_q=4, S_q=64, S_kv=64, D_qk=16, dropout=0.5, right=0)
    attended = torch.ones(64, 64).tril().bool()
    drawn = (torch.rand(2, 4, 64, 64, generator=torch.Generator().manual_seed(3)) >= 0.5).float()
    assert mask_problem(torch.where(attended, drawn, torch.ones_like(drawn)), g) is None
    stuck = torch.where(attended, torch.ones_like(drawn), drawn)   # every attended entry kept
    assert "keeps" in mask_problem(stuck, g)
