"""The SDPA backward plan: its declarations, its rules, and its errors on bad input."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from bundlegen.graph import Graph, dense_graph
from bundlegen.harness.distributions import SHIFTED_LOGIT
from bundlegen.validate import frontend_reason, has_zero_stride_on_long_axis, output_layout_reason, overlaps_itself
from bundlegen.generator import PlanError, build, build_default
from bundlegen.generator import pairs
from bundlegen.generator.expand import axis_item
from bundlegen.generator.legality import Legality
from bundlegen.plans import sdpa_bwd
from bundlegen.plans.records import Regression, Rule, Shape, Space, Spec, stride


@pytest.fixture(scope="module")
def generated():
    return build_default()


@pytest.fixture(scope="module")
def legality():
    return Legality(sdpa_bwd.PLAN.padded)


# ----------------------------------------------------------------------------- probes and claims
def test_every_probe_is_an_invalid_graph_for_its_layer(generated):
    probes = [c for c in generated.cases if c.purpose == "probe"]
    assert len(probes) == len(sdpa_bwd.PLAN.padded.probes) + len(sdpa_bwd.PLAN.ragged.probes)
    for case in probes:
        r = case.expected_rejection
        if r.by == "frontend":
            assert frontend_reason(case.graph) == r.reason, case.items
        elif r.by == "device":     # valid but for its offsets (tests/test_generator_ragged.py)
            assert frontend_reason(case.graph) == r.reason and case.graph.ragged is not None, case.items
        else:
            assert frontend_reason(case.graph) is None, case.items
            assert output_layout_reason(case.graph) == r.reason, case.items


def test_probes_cover_the_issue_list():
    reasons = {p.reason for p in sdpa_bwd.PLAN.padded.probes}
    assert {"o-dims-mismatch", "kv-dims-mismatch", "batch-mismatch", "zero-stride-output",
            "overlapping-output", "dtype-mismatch", "right-bound-below-minus-one",
            "left-bound-nonpositive", "scale-nonpositive"} <= reasons
    mutated_ports = {m.target for p in sdpa_bwd.PROBES for m in p.spec.mutations if m.kind == "dims"}
    assert {"o", "do", "dq", "v", "dk", "dv", "k"} <= mutated_ports


def test_every_claim_and_regression_is_a_valid_graph(generated):
    for case in generated.cases:
        if case.purpose == "probe":
            continue
        assert frontend_reason(case.graph) is None, case.id
        for port in ("dq", "dk", "dv"):
            spec = case.graph.tensors[port]
            assert not has_zero_stride_on_long_axis(spec), (case.id, port)
            assert not overlaps_itself(spec), (case.id, port)
        assert case.tolerance_class in sdpa_bwd.TOLERANCE_CLASSES


def test_regressions_cover_every_defect_class():
    items = {r.item for r in sdpa_bwd.REGRESSIONS}
    assert {"REG-HV-LT-HK", "REG-ODD-ROW-PITCH", "REG-STATS-PADDED-HEAD", "REG-STATS-NONPACKED",
            "REG-BR-SQ-GT-SKV", "REG-ZERO-STRIDE-OUTPUT-LEN1", "REG-TAIL-S-MOD-128-64",
            "REG-EXTREME-LSE"} <= items


def test_gated_items_name_their_gate_and_are_not_written(generated):
    assert {"GATE-PAGED-KV"} <= {g.item for g in sdpa_bwd.GATED}
    lifted = {"GATE-RAGGED-THD", "GATE-RAGGED-BAD-OFFSET", "GATE-INT64-OFFSETS",   # issue 15
              "GATE-BIAS", "GATE-DBIAS", "GATE-SINKS",                             # issue 19
              "GATE-FP32", "GATE-DROPOUT", "GATE-DROPOUT-ZERO"}                    # issue 43
    assert not lifted & {g.item for g in sdpa_bwd.GATED}
    written = {i for c in generated.cases for i in c.items}
    for g in sdpa_bwd.GATED:
        assert g.gate.startswith("waiting on") and g.item not in written


# ----------------------------------------------------------------------------- axes
def test_every_value_of_every_axis_appears_at_quick(generated):
    quick_items = {i for c in generated.at_level("quick") for i in c.items}
    for axis in sdpa_bwd.AXES:
        for value in axis.values:
            assert axis_item(axis.name, value) in quick_items, (axis.name, value)


def test_axes_cover_the_issue_values():
    axes = {a.name: a for a in sdpa_bwd.AXES}
    # fp32 io joined with the port forms (issue 58), after the pair suites' first rows
    assert set(axes["dtype"].values) == {"bf16", "fp16", "fp32"}
    assert {v for v in axes["dtype"].values if axes["dtype"].value_pass(v) == 0} == {"bf16", "fp16"}
    seqs = [sdpa_bwd.SEQS[v] for v in axes["seq"].values]
    lengths = {s.S_q for s in seqs} | {s.S_kv for s in seqs}
    assert {1, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256} <= lengths
    assert any(s.S_q < s.S_kv for s in seqs) and any(s.S_q > s.S_kv for s in seqs)
    dims = [sdpa_bwd.HEAD_DIMS[v] for v in axes["head_dims"].values]
    assert {32, 40, 64, 72, 80, 96, 128, 160, 192, 256} <= {d.D_qk for d in dims if d.D_qk == d.D_v}
    assert {(192, 128), (96, 8), (128, 64)} <= {(d.D_qk, d.D_v) for d in dims}
    heads = [sdpa_bwd.HEADS[v] for v in axes["heads"].values]
    assert {h.H_q // h.H_k for h in heads if h.H_k == h.H_v} >= {1, 2, 4, 8}
    assert any(h.H_k != h.H_v for h in heads)
    masks = [sdpa_bwd.MASKS[v] for v in axes["mask"].values]
    for lb, rb in ((None, 0), (sdpa_bwd.WINDOW, 0), (sdpa_bwd.WINDOW, sdpa_bwd.BAND_RIGHT)):
        assert {m.alignment for m in masks if (m.left_bound, m.right_bound) == (lb, rb)} == {
            "TOP_LEFT", "BOTTOM_RIGHT"}


# ----------------------------------------------------------------------------- legality
def _excludes(rule: Rule, assignment: dict) -> bool:
    """The rule's own words: values matching every `when` must match every `require`."""
    return (all(assignment[a] in v for a, v in rule.when.items())
            and not all(assignment[a] in v for a, v in rule.require.items()))


def test_legality_rules_each_exclude_what_they_say(legality, generated):
    plan = sdpa_bwd.PLAN.padded
    values = {a.name: a.values for a in plan.axes}
    illegal = pairs.illegal_units(legality, "all")
    written_combos = [combo for combos in generated.combos.values() for combo in combos]
    for rule in plan.rules:
        axes = rule.axes
        # the written combinations' values on the rule's axes (one set, not a scan per assignment)
        written = {tuple(combo[legality.position[a]] for a in axes) for combo in written_combos}
        others = [r for r in plan.rules if r is not rule and set(r.axes) <= set(axes)]
        excluded = 0
        for chosen in itertools.product(*(values[a] for a in axes)):
            assignment = dict(zip(axes, chosen))
            says = _excludes(rule, assignment)
            completion = legality.complete(assignment)
            if says:
                excluded += 1
                assert completion is None, (rule.name, assignment)
                if len(axes) == 2:
                    pair = tuple(sorted(assignment.items(), key=lambda kv: legality.position[kv[0]]))
                    assert pair in illegal, (rule.name, pair)
                assert chosen not in written, (rule.name, assignment)
            else:   # legal unless another rule on the same axes excludes it
                assert completion is not None or any(_excludes(r, assignment) for r in others), \
                    (rule.name, assignment)
        assert excluded > 0, f"rule {rule.name} excludes nothing"
    report = {e.rule: e for e in generated.exclusions}
    assert all(report[r.name].excluded > 0 for r in plan.rules)


def test_no_written_combination_breaks_a_rule(generated, legality):
    assert generated.legality_violations == ()
    for combos in generated.combos.values():
        for combo in combos:
            assert legality.is_legal(combo)


# ----------------------------------------------------------------------------- tolerance
def _graph(**sizes) -> Graph:
    return dense_graph(**{"dtype": "bf16", "H_q": 2, "S_q": 64, "D_qk": 64, "scale": 0.125, **sizes})


def test_tolerance_class_rule_uses_dtype_and_the_longest_reduction():
    rule = sdpa_bwd.tolerance_class_for
    assert rule(_graph()) == "bf16-r256"
    assert rule(_graph(dtype="fp16")) == "fp16-r256"
    assert rule(_graph(S_kv=257)) == "bf16-r1k"
    assert rule(_graph(D_qk=256, D_v=256)) == "bf16-r256"
    # dK/dV sum over the query rows of a whole GQA group
    assert rule(_graph(H_q=8, H_k=2, H_v=2, S_q=128, S_kv=128)) == "bf16-r1k"
    assert rule(_graph(H_q=8, H_k=8, H_v=1, S_q=600, S_kv=16)) == "bf16-r16k"
    assert rule(_graph(S_q=16384, S_kv=16384)) == "bf16-r16k"
    assert rule(_graph(dtype="fp32")) == "fp32-r256"


def test_tolerance_classes_grow_with_reduction_length():
    for dtype, u in sdpa_bwd.UNIT_ROUNDOFF.items():
        classes = [c for c in sdpa_bwd.TOLERANCE_CLASSES.values() if c.dtype == dtype]
        assert [c.max_reduction for c in classes] == sorted(c.max_reduction for c in classes)
        rtols = [c.rtol for c in classes]
        assert rtols == sorted(rtols) and rtols[0] >= 4 * u
        assert all(c.atol == sdpa_bwd.ATOL for c in classes)
    assert sdpa_bwd.MIN_CLAIM_MARGIN == 1.5


def test_levels_are_declared_in_order_with_a_reserve():
    assert [lv.name for lv in sdpa_bwd.LEVELS] == ["quick", "pr", "nightly", "full"]
    assert all(lv.reserve == 0.05 for lv in sdpa_bwd.LEVELS)
    assert sdpa_bwd.LEVELS[0].budget_seconds <= 30 and sdpa_bwd.LEVELS[1].budget_seconds <= 120
    assert {"h200", "cpu"} <= set(sdpa_bwd.COST_MODEL) and sdpa_bwd.CPU_CASE_LIMIT_S > 0
    # every other class is one engine's on a device class; each measured class is one of them
    assert all(name.split("/")[0] in ("h200", "cpu") for name in sdpa_bwd.COST_MODEL)
    assert set(sdpa_bwd.COST_MEASURED) <= set(sdpa_bwd.COST_MODEL)


# ----------------------------------------------------------------------------- bad plan input
def _with(**changes):
    """The plan with `changes`: fields of its padded space go to Plan.padded, the rest to Plan."""
    space_fields = {f.name for f in dataclasses.fields(Space)}
    padded = {k: v for k, v in changes.items() if k in space_fields}
    rest = {k: v for k, v in changes.items() if k not in space_fields}
    return dataclasses.replace(sdpa_bwd.PLAN, padded=dataclasses.replace(sdpa_bwd.PLAN.padded, **padded), **rest)


def test_unknown_axis_value_in_a_rule_names_the_rule():
    bad = Rule("broken-rule", "because", when={"layout": ("bshdd",)}, require={"heads": ("mha",)})
    with pytest.raises(PlanError, match=r"rule 'broken-rule': unknown value 'bshdd' for axis 'layout'"):
        build(_with(rules=sdpa_bwd.RULES + (bad,)))


def test_unknown_axis_in_a_rule_names_the_rule():
    bad = Rule("broken-rule", "because", when={"layot": ("bshd",)}, require={"heads": ("mha",)})
    with pytest.raises(PlanError, match=r"rule 'broken-rule': unknown axis 'layot'"):
        build(_with(rules=sdpa_bwd.RULES + (bad,)))


def test_duplicate_item_id_names_the_entry():
    dup = dataclasses.replace(sdpa_bwd.REGRESSIONS[1], item=sdpa_bwd.REGRESSIONS[0].item)
    with pytest.raises(PlanError, match=r"regression 'REG-HV-LT-HK': duplicate item id 'REG-HV-LT-HK'"):
        build(_with(regressions=sdpa_bwd.REGRESSIONS + (dup,)))


def test_a_regression_that_fails_validation_names_the_entry():
    shape = Shape(1, 2, 2, 2, 64, 64, 64, 64)
    bad = Regression("REG-BROKEN", "a zero-stride output is not a regression", "test",
                     (Spec(shape, mutations=(stride("dq", 1, 0),)),))
    with pytest.raises(PlanError, match=r"regression REG-BROKEN\[0\]: outputs not addressable"):
        build(_with(regressions=sdpa_bwd.REGRESSIONS + (bad,)))


def test_a_probe_the_frontend_accepts_names_the_entry():
    probe = dataclasses.replace(sdpa_bwd.PROBES[0], item="PRB-NOT-REJECTED",
                                spec=Spec(Shape(1, 2, 2, 2, 64, 64, 64, 64)))
    with pytest.raises(PlanError, match=r"probe PRB-NOT-REJECTED: the frontend gives None"):
        build(_with(probes=sdpa_bwd.PROBES + (probe,)))


def test_unknown_names_in_a_spec_name_the_entry():
    bad = dataclasses.replace(sdpa_bwd.CATALOG[0], specs=(Spec(Shape(1, 1, 1, 1, 1, 1, 64, 64), mask="causl"),))
    with pytest.raises(PlanError, match=r"shape 'SHP-S1'\[0\]: unknown mask 'causl'"):
        build(_with(catalog=(bad,) + sdpa_bwd.CATALOG[1:]))


# ----------------------------------------------------------------------------- issue 17: review gaps and probe arms
def _masked_br_offsets(cases):
    return [c for c in cases if c.purpose != "probe" and c.graph.ragged is None
            and c.graph.attributes.diagonal_alignment == "BOTTOM_RIGHT"
            and (c.graph.attributes.left_bound, c.graph.attributes.right_bound) != (None, None)
            and (c.graph.S_kv - c.graph.S_q) % 64]


def test_review_gaps_have_cases_at_the_levels_asked(generated):
    quick = [c for c in generated.at_level("quick") if c.purpose != "probe" and c.graph.ragged is None]
    bounds = [(c.graph.attributes.left_bound, c.graph.attributes.right_bound) for c in quick]
    assert any(lb is not None and rb is None for lb, rb in bounds)          # a left bound alone
    assert any(lb is None and rb is not None and rb > 0 for lb, rb in bounds)  # lookahead
    # fp16 with Q/K magnitudes near fp16's range (the shifted-logits offset alpha)
    alphas = [math.sqrt(SHIFTED_LOGIT / (c.graph.attributes.attn_scale * c.graph.D_qk)) for c in quick
              if c.graph.dtype == "fp16" and c.data.distribution == "shifted-logits"]
    assert alphas and max(alphas) > 1e4 and max(alphas) < 65504 / 2
    d256 = [c for c in generated.cases if c.purpose != "probe" and c.graph.ragged is None and c.graph.D_qk >= 256
            and c.graph.B >= 2 and c.graph.attributes.right_bound == 0]
    assert len(d256) >= 2 and any(c.level == "quick" for c in d256)
    assert len(_masked_br_offsets(generated.at_level("quick"))) >= 2


def test_entries_declared_for_quick_or_pr_land_there(generated):
    """SHP-MANY-PROGRAMS among them: the cost model may move a quick entry's larger shape to
    pr, never a quick or pr entry past pr."""
    declared = {e.item: e.level for e in (*sdpa_bwd.PLAN.padded.catalog, *sdpa_bwd.PLAN.padded.regressions)
                if e.level in ("quick", "pr")}
    for case in generated.cases:
        for item in set(case.items) & set(declared):
            assert case.level in ("quick", "pr"), (item, case.id, case.level)
    many = [c for c in generated.cases if "SHP-MANY-PROGRAMS" in c.items]
    assert many and all(c.level == "pr" for c in many)
    assert all(c.graph.B * c.graph.H_q * math.ceil(c.graph.S_q / 64) > 64 for c in many)


def test_probe_arms_of_issue_17(generated):
    probes = [c for c in generated.cases if c.purpose == "probe" and c.graph.ragged is None]
    def zero_axes(c, port):
        return {i for i, (d, s) in enumerate(zip(c.graph.tensors[port].dims, c.graph.tensors[port].strides))
                if s == 0 and d > 1}
    engine = [c for c in probes if c.expected_rejection.by == "engine"]
    assert any(zero_axes(c, "dq") == {1} for c in engine)      # dQ head only
    assert any(zero_axes(c, "dk") == {0} for c in engine)      # dK batch only
    assert any(len(c.graph.tensors["stats"].dims) == 3 and c.expected_rejection.reason == "bad-rank" for c in probes)
    claims = [c for c in generated.cases if c.purpose != "probe" and c.graph.ragged is None]
    for port in ("q", "k", "v", "o", "do", "dq", "dk", "dv"):
        assert any(c.graph.tensors[port].strides[3] != 1 for c in claims), port
    for port in ("q", "o", "do"):
        assert any(zero_axes(c, port) == {1} for c in claims), port
    for port in ("q", "k", "v", "do"):    # overlapping rows read: valid, a claim
        assert any(c.graph.S_q > 1 and c.graph.tensors[port].strides[2] < c.graph.tensors[port].dims[3]
                   and overlaps_itself(c.graph.tensors[port]) for c in claims), port
