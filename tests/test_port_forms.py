"""Issue 58: every port form the contract accepts is an axis value that meets the other
axes' risky values by pr (generator/port_forms.py, Plan.focus), the newest values are
crossed at quick, and the GPU levels use their budgets."""
from __future__ import annotations

import dataclasses

import pytest

from bundlegen.generator import build_default, focus, port_forms
from bundlegen.plans import sdpa_bwd


@pytest.fixture(scope="module")
def generated():
    return build_default()


def test_every_contract_form_is_drawn_or_left_out_with_why():
    missing, stale = port_forms.gaps(sdpa_bwd.PLAN)
    assert missing == () and stale == ()
    assert all(why.strip() for why in sdpa_bwd.PORT_FORMS_LEFT_OUT.values())


def test_a_form_the_plan_stops_drawing_is_a_gap():
    # the batch-only dropout mask broadcast: drop it from the axis and from the focus subjects
    forms = {k: v for k, v in sdpa_bwd.DROPOUT_FORMS.items() if v.dropout_mask != "batch"}
    plan = dataclasses.replace(sdpa_bwd.PLAN, dropout_forms=forms)
    missing, _stale = port_forms.gaps(plan)
    assert "padded dropout_mask: batch" in missing and "ragged dropout_mask: batch" in missing


def test_a_left_out_form_that_is_drawn_is_stale():
    left = {**sdpa_bwd.PORT_FORMS_LEFT_OUT, "padded dropout_mask: batch": "no reason"}
    _missing, stale = port_forms.gaps(dataclasses.replace(sdpa_bwd.PLAN, port_forms_left_out=left))
    assert stale == ("padded dropout_mask: batch",)


def test_the_contract_vocabulary_follows_the_graph_tables(monkeypatch):
    monkeypatch.setattr(port_forms, "BIAS_BROADCASTS", {**port_forms.BIAS_BROADCASTS, "rows": (2,)})
    missing, _stale = port_forms.gaps(sdpa_bwd.PLAN)
    assert "padded bias: rows" in missing and "padded dropout_mask: rows" in missing


def test_focused_pairs_hold_by_their_levels(generated):
    assert generated.focus_proofs
    for p in generated.focus_proofs:
        assert p.complete, (p.item, p.level, p.missing[:5])
    by = {(p.item, p.level): p for p in generated.focus_proofs}
    for f in sdpa_bwd.FOCUS:
        assert by[(f.item, f.level)].required and by[(f.item, f.level)].total > 0


def test_focus_universe_pairs_subjects_with_partners_only():
    from bundlegen.generator.legality import Legality
    f = sdpa_bwd.NEWEST_QUICK_FOCUS
    units = focus.universe(Legality(sdpa_bwd.PADDED), f)
    for (a, u), (b, w) in units:
        assert u in f.subjects.get(a, ()) or w in f.subjects.get(b, ())
    # the batch-only dropout mask meets fp32 and a GQA ratio of 3 at quick
    assert (("dtype", "fp32"), ("dropout_form", "p0.5-batch")) in units
    assert (("heads", "gqa3"), ("alibi_slopes", "batch")) in units


def test_gpu_levels_use_70_percent_of_their_h200_budgets(generated):
    for level in ("nightly", "full"):
        budget = next(lv.budget_seconds for lv in sdpa_bwd.LEVELS if lv.name == level)
        used = sum(c.cost.predicted_s for c in generated.at_level(level))
        assert used >= 0.7 * budget, (level, used, budget)
