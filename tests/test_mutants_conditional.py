"""Conditional mutants (mutants/conditional.py): each is the engine itself off its condition
and fails its case on it, judged by the harness's own checks over torch-math on the CPU."""
from __future__ import annotations

import dataclasses

import pytest

from bundlegen.graph import LAYOUT_ORDERS, TensorSpec, dense_graph, packed_strides
from bundlegen.harness.case import run_case
from bundlegen.harness.bundles import manifest_of
from bundlegen.harness.config import EngineConfig
from bundlegen.engines.registry import engine_class
from bundlegen.mutants import catalog
from bundlegen.mutants import conditional as C
from tests.graph_factory import make_case

CONFIG = EngineConfig(manifest=manifest_of())


def _verdict(wrapper, graph, distribution="randn", runs=1):
    """The harness's whole flow (its decline rules included) with the plan's r256 class."""
    engine = wrapper(engine_class("torch-math")("cpu"))
    case = dataclasses.replace(make_case(graph, seed=5, distribution=distribution),
                               tolerance_class=f"{graph.dtype}-r256")
    return run_case(case, engine, CONFIG, repeat=runs).verdict


def _sinks(graph):
    t = dict(graph.tensors)
    t["sinks"] = TensorSpec((graph.H_q,), (1,), "fp32")
    t["dsinks"] = TensorSpec((graph.H_q,), (1,), "fp32")
    return dataclasses.replace(graph, tensors=t)


def _attrs(graph, **changes):
    return dataclasses.replace(graph, attributes=dataclasses.replace(graph.attributes, **changes))


def _bshd_dk(graph):
    spec = graph.tensors["dk"]
    strides = packed_strides(spec.dims, LAYOUT_ORDERS["bshd"])
    return dataclasses.replace(graph, tensors={**graph.tensors, "dk": dataclasses.replace(spec, strides=strides)})


# (wrapper, graph under its condition, graph off it, distribution on, distribution off, runs)
CASES = {
    "interleaved-batch": (C.InterleavedBatchOffsetLost,
                          dense_graph(B=2, H_q=2, S_q=24, D_qk=16, dtype="bf16", layout="bshd"),
                          dense_graph(B=1, H_q=2, S_q=24, D_qk=16, dtype="bf16", layout="bshd"), "randn", "randn", 1),
    "interleaved-d-tail": (C.InterleavedHeadDimTailDropped,
                           _bshd_dk(dense_graph(B=1, H_q=2, S_q=24, D_qk=40, dtype="bf16")),
                           dense_graph(B=1, H_q=2, S_q=24, D_qk=40, dtype="bf16"), "randn", "randn", 1),
    "delta-fp8": (C.DeltaKeptInFp8, _sinks(dense_graph(B=2, H_q=2, S_q=128, D_qk=64, dtype="bf16")),
                  _attrs(_sinks(dense_graph(B=2, H_q=2, S_q=128, D_qk=64, dtype="bf16")), softcap=30.0),
                  "l2-grad", "randn", 1),
    "dp-fp16": (C.DpSaturatesFp16, dense_graph(B=1, H_q=2, S_q=64, D_qk=64, dtype="fp16"),
                dense_graph(B=1, H_q=2, S_q=64, D_qk=64, dtype="fp16"), "overflow-dp", "randn", 1),
    "dsinks-batch": (C.DsinksLastBatchLost, _sinks(dense_graph(B=2, H_q=2, S_q=32, D_qk=32, dtype="bf16")),
                     _sinks(dense_graph(B=1, H_q=2, S_q=32, D_qk=32, dtype="bf16")), "randn", "randn", 1),
    "determinism": (C.NondeterministicWithoutGqa,
                    _attrs(dense_graph(B=1, H_q=2, S_q=24, D_qk=16, dtype="bf16"), deterministic_algorithm=True),
                    _attrs(dense_graph(B=1, H_q=4, H_k=2, S_q=24, D_qk=16, dtype="bf16"),
                           deterministic_algorithm=True), "randn", "randn", 3),
    "fp16-tail": (C.Fp16QueryTailStale, dense_graph(B=1, H_q=2, S_q=17, D_qk=16, dtype="fp16"),
                  dense_graph(B=1, H_q=2, S_q=17, D_qk=16, dtype="bf16"), "randn", "randn", 1),
    "extreme-lse-window": (C.ExtremeLseWindowHalfTile,
                           dense_graph(B=1, H_q=2, S_q=48, S_kv=96, D_qk=32, dtype="bf16", left=16,
                                       alignment="BOTTOM_RIGHT"),
                           dense_graph(B=1, H_q=2, S_q=48, S_kv=96, D_qk=32, dtype="bf16", left=16,
                                       alignment="BOTTOM_RIGHT"), "shifted-logits", "randn", 1),
    "sinks-decode": (C.SinksDecodeBatchMixed, _sinks(dense_graph(B=2, H_q=2, S_q=4, S_kv=64, D_qk=32, dtype="bf16")),
                     _sinks(dense_graph(B=2, H_q=2, S_q=32, S_kv=64, D_qk=32, dtype="bf16")), "randn", "randn", 1),
    "rectangle-128": (C.TiledRectangleLastRowLost, dense_graph(B=1, H_q=1, S_q=256, S_kv=128, D_qk=16, dtype="bf16"),
                      dense_graph(B=1, H_q=1, S_q=256, S_kv=256, D_qk=16, dtype="bf16"), "randn", "randn", 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_misbehaves_only_under_its_condition(name):
    wrapper, on, off, dist_on, dist_off, runs = CASES[name]
    assert _verdict(wrapper, off, dist_off, runs) == "pass"
    assert _verdict(wrapper, on, dist_on, runs) not in ("pass", "declined", "skipped")


def test_delta_in_fp8_is_seen_by_the_statistical_judge_where_do_is_drawn_apart_from_o():
    """The gap it modelled: with dO independent of O the fp8 Delta stays inside the bound;
    the statistical judge sees it there (dQ and dK many times an honest bf16 error)."""
    wrapper, on, _off, _d_on, _d_off, _runs = CASES["delta-fp8"]
    assert _verdict(wrapper, on, "randn") == "fail:statistical"


def test_every_gap_class_has_a_registered_conditional_mutant():
    classes = {m.defect_class for m in catalog.CATALOG if m.kind == catalog.WRAPPER}
    assert {"degenerate layouts", "gradients range/correlation", "tolerance cannot see a lost contribution",
            "determinism", "fp16", "risky values meeting late"} <= classes


@pytest.mark.parametrize("name", sorted(CASES))
def test_presents_what_the_harness_reads_before_offering_a_graph(name):
    """Without the engine's score modifiers, ragged flag and deterministic mode the harness
    would decline every sinks, bias or ragged case for the mutant, which then never runs."""
    inner = engine_class("torch-math")("cpu")
    mutant = CASES[name][0](inner)
    assert mutant.score_modifiers == inner.score_modifiers and mutant.ragged == inner.ragged
    assert mutant.deterministic == inner.deterministic
    assert mutant.deterministic_mode == inner.deterministic_mode
