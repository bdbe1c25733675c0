"""Ragged breadth (the padded plan's head-dim tiers and group ratios on packed batches,
joined in a later pass so earlier case ids stay) and packed varlen layouts (Q, K, V or K, V
as the slots of one [T, n, H, D] buffer, gradients likewise): how the generator places them,
the rules that make them legal, the validator on them, and the harness catching a slot mix-up."""
from __future__ import annotations

import dataclasses

import pytest

from bundlegen import reasons as R
from bundlegen.graph import ragged_graph
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from bundlegen.validate import frontend_reason, output_layout_reason
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.generator import PlanError, build, build_default, ragged
from bundlegen.generator.legality import Legality
from bundlegen.mutants import catalog as C
from bundlegen.plans import sdpa_bwd
from bundlegen.plans.records import HeadConfig, HeadDims, Lengths, RaggedShape, Spec
from tests.graph_factory import make_case
from tests.harness_support import LOOSE


@pytest.fixture(scope="module")
def generated():
    return build_default()


def _spec(layout, H=2, H_k=2, H_v=2, D=16, D_v=16, lengths=Lengths((5, 9), (5, 9))):
    return Spec(RaggedShape(HeadConfig(H, H_k, H_v), HeadDims(D, D_v), lengths), dtype="fp16", layout=layout)


# ----------------------------------------------------------------------------- breadth
def _rules_of(axes) -> tuple:
    """The ragged rules an earlier plan of these axes had: every axis they read is there and
    their condition names a value it has."""
    values = {a.name: set(a.values) for a in axes}
    return tuple(r for r in sdpa_bwd.RAGGED_RULES if set(r.axes) <= set(values)
                 and all(set(vals) & values[ax] for ax, vals in r.when.items()))


def test_later_ragged_values_keep_every_earlier_case_id(generated):
    """The breadth values join the ragged suites in a later pass: the plan without them
    gives case ids that all stay in the plan with them."""
    # the plan before the breadth pass: the axes and values of the passes before it
    # (the seqused and modifiers axes joined with the breadth values; fp32, the dropout forms
    # and the rest of the port forms a pass later)
    breadth = sdpa_bwd.RAGGED_BREADTH_PASS
    axes = tuple(dataclasses.replace(a, values=tuple(v for v in a.values if a.value_pass(v) < breadth),
                                     values_joined={k: p for k, p in a.values_joined.items() if p < breadth})
                 for a in sdpa_bwd.RAGGED_AXES if a.pass_joined < breadth)
    storages = {k: s for k, s in sdpa_bwd.RAGGED_STORAGES.items() if not s.packed}
    space = dataclasses.replace(sdpa_bwd.RAGGED, axes=axes, storages=storages, rules=_rules_of(axes),
                                # the entries of the packed storages came with them
                                catalog=tuple(e for e in sdpa_bwd.RAGGED.catalog
                                              if all(spec.layout in storages for spec in e.specs)))
    before = build(dataclasses.replace(sdpa_bwd.PLAN, ragged=space, focus=()))   # focus rows came later
    old = {c.id for c in before.cases if c.graph.ragged is not None and c.group.startswith("ragged-pairs-")
           and "repair" not in c.group}
    assert old and old <= {c.id for c in generated.cases}


def test_ragged_cases_reach_every_padded_head_dim_tier_and_group_ratio_by_pr(generated):
    cases = [c for c in generated.at_level("pr") if c.graph.ragged is not None and c.purpose == "claim"]
    dims = {(c.graph.D_qk, c.graph.D_v) for c in cases}
    tiers = {(d.D_qk, d.D_v) for n, d in sdpa_bwd.HEAD_DIMS.items()
             if n in ("d32", "d64", "d96", "d128", "d160", "d192", "d256", "d192-128", "d128-64", "d64-128")}
    assert tiers <= dims, tiers - dims
    ratios = {(c.graph.H_q // c.graph.H_k, c.graph.H_q // c.graph.H_v) for c in cases}
    assert {(1, 1), (2, 2), (3, 3), (4, 4), (6, 6), (8, 8), (9, 9), (4, 2), (2, 4), (1, 2)} <= ratios
    quick = {i for c in generated.at_level("quick") for i in c.items}
    for v in sdpa_bwd.RAGGED_LATER_HEAD_DIMS + sdpa_bwd.RAGGED_LATER_HEADS:
        assert any(i.endswith("-" + v.upper()) and i.startswith("AX-RAGGED-HEAD") for i in quick), v


# ----------------------------------------------------------------------------- packed layouts
@pytest.mark.parametrize("layout, slots", [("qkv-packed", {"q": 0, "k": 1, "v": 2, "dq": 0, "dk": 1, "dv": 2}),
                                           ("kv-packed", {"k": 0, "v": 1, "dk": 0, "dv": 1})])
def test_packed_storages_place_each_port_in_its_slot(layout, slots):
    g = ragged.graph_of(sdpa_bwd.PLAN, _spec(layout))
    n = len(set(slots.values()))
    for port, spec in g.tensors.items():
        if port in slots:
            assert spec.strides == (n * 2 * 16, 16, 1) and spec.offset == slots[port] * 2 * 16, port
        elif port != "stats":
            assert spec.strides == (2 * 16, 16, 1) and spec.offset == 0, port
    assert frontend_reason(g) is None and output_layout_reason(g) is None


def test_a_packed_storage_of_unequal_shapes_is_a_plan_error():
    with pytest.raises(PlanError, match="one shape"):
        ragged.graph_of(sdpa_bwd.PLAN, _spec("kv-packed", H=4, H_k=2, H_v=1))
    with pytest.raises(PlanError, match="one shape"):
        ragged.graph_of(sdpa_bwd.PLAN, _spec("qkv-packed", lengths=Lengths((5, 9), (6, 9))))


def test_packed_rules_keep_only_shapes_one_buffer_can_hold():
    legality = Legality(sdpa_bwd.RAGGED)
    complete = lambda **v: legality.complete(v)
    assert complete(storage="qkv-packed", heads="gqa2") is None
    assert complete(storage="qkv-packed", head_dims="d192-128") is None
    assert complete(storage="qkv-packed", lengths="mixed") is None
    assert complete(storage="kv-packed", heads="hk2-hv1") is None
    assert complete(storage="kv-packed", heads="gqa2") is not None
    assert complete(storage="kv-packed", lengths="mixed") is not None


def test_the_validator_accepts_the_slots_and_still_refuses_a_real_overlap():
    g = ragged.graph_of(sdpa_bwd.PLAN, _spec("kv-packed"))
    assert output_layout_reason(g) is None
    dk = g.tensors["dk"]
    # heads one slot apart but tokens only one head apart: two tokens share elements
    squeezed = dataclasses.replace(g, tensors={**g.tensors, "dk": dataclasses.replace(dk, strides=(16, 16, 1))})
    assert output_layout_reason(squeezed) == R.OVERLAPPING_OUTPUT


@pytest.mark.parametrize("layout", ["qkv-packed", "kv-packed"])
def test_torch_math_passes_packed_and_the_slot_mutant_fails_on_the_guard(layout):
    case = dataclasses.replace(make_case(ragged.graph_of(sdpa_bwd.PLAN, _spec(layout)), seed=5),
                               tolerance_class="fp16-r256")
    assert run_case(case, TorchMathEngine("cpu"), LOOSE).verdict == V.PASS
    mutant = C.by_name("packed-dk-in-v-slot").wrap(TorchMathEngine("cpu"))
    bad = run_case(case, mutant, LOOSE)
    assert bad.verdict == V.FAIL_GUARD and "dk" in bad.detail
    # unpacked, the mutant is the engine itself
    plain = dataclasses.replace(make_case(ragged_graph((0, 5, 14), H_q=2, D_qk=16), seed=5),
                                tolerance_class="fp16-r256")
    assert run_case(plain, mutant, LOOSE).verdict == V.PASS


def test_the_report_shows_each_later_value_with_its_pair_proof(generated):
    import re
    from bundlegen.generator.pass_report import later_value_lines
    ragged_part = lambda g: "\n".join(later_value_lines(g)).split("Ragged values of later passes")[1]
    text = ragged_part(generated)
    for axis in sdpa_bwd.RAGGED_AXES:
        for value in axis.values:
            if axis.value_pass(value) == sdpa_bwd.RAGGED_BREADTH_PASS and value != axis.default:
                cell = re.search(rf"{axis.name}={re.escape(value)} \(([^)]*)\)", text)
                assert cell, (axis.name, value)
                counts = re.findall(r"(?:pr|nightly) (\d+) of (\d+)", cell.group(1))
                assert counts and all(a == b and int(b) > 0 for a, b in counts), cell.group(0)
    # a value's pairs not covered show as such: the plan without its pr and nightly pair cases
    thin = dataclasses.replace(generated, cases=tuple(c for c in generated.cases if c.level == "quick"))
    pr_count = r"heads=gqa3 \(quick \d+ of \d+, pr (\d+) of (\d+)"
    assert re.search(pr_count, ragged_part(thin)).group(1) != re.search(pr_count, text).group(1)
