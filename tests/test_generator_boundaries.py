"""Boundary values (issue 17): each class's values just below, at and just above its tiles,
proved per level from what the cases' graphs hold."""
from __future__ import annotations

import dataclasses
import math

import pytest

from bundlegen.generator import PlanError, build, build_default, report
from bundlegen.generator import boundaries as BND
from bundlegen.plans import sdpa_bwd
from bundlegen.plans.records import BoundaryClass, BoundarySet, Spec

#: the class ids a mutant author works from (issue 17): the plan must declare exactly these
ISSUE_CLASSES = {"BND-SQ-TAIL", "BND-SKV-TAIL", "BND-BR-OFFSET", "BND-WINDOW-LEFT", "BND-WINDOW-RIGHT",
                 "BND-HEAD-DIM", "BND-GROUP", "BND-GRID"}


@pytest.fixture(scope="module")
def generated():
    return build_default()


def _read(quantity: str, g) -> set:
    """The issue's own words for each quantity, written apart from generator/boundaries.py."""
    a = g.attributes
    return {
        "S_q": {g.S_q}, "S_kv": {g.S_kv},
        "br-offset": {g.S_kv - g.S_q} if a.diagonal_alignment == "BOTTOM_RIGHT"
        and (a.left_bound, a.right_bound) != (None, None) else set(),
        "left-bound": set() if a.left_bound is None else {a.left_bound},
        "right-bound": {a.right_bound} if a.left_bound is None and (a.right_bound or 0) > 0 else set(),
        "head-dim": {g.D_qk, g.D_v},
        "group": {g.H_q // g.H_k, g.H_q // g.H_v},
        "grid": {g.B * g.H_q * math.ceil(g.S_q / sdpa_bwd.GRID_ROWS)},
    }[quantity]


def _expected_units(c: BoundaryClass) -> set:
    least = None if c.quantity == "br-offset" else 1
    out = {(t, side, t + d) for t in c.tiles for side, d in (("below", -1), ("at", 0), ("above", 1))
           if (least is None or t + d >= least) and (c.cap is None or t + d <= c.cap)}
    return out | {("extra", v, v) for v in c.extras}


def _covered(generated, c: BoundaryClass, level: str, drop=()) -> set:
    values = set()
    for case in generated.at_level(level):
        if case.purpose != "probe" and c.item in case.items and case.id not in drop:
            values |= _read(c.quantity, case.graph)
    return {u for u in _expected_units(c) if u[2] in values}


def test_the_classes_are_the_issue_list_with_their_tiles():
    classes = {c.item: c for c in sdpa_bwd.BOUNDARY_CLASSES}
    assert set(classes) == ISSUE_CLASSES
    for item in ("BND-SQ-TAIL", "BND-SKV-TAIL", "BND-BR-OFFSET", "BND-WINDOW-LEFT", "BND-WINDOW-RIGHT"):
        assert {16, 32, 64, 128} <= set(classes[item].tiles)
    assert {16, 32, 64, 128, 256} <= set(classes["BND-HEAD-DIM"].tiles)
    ratios = {u[2] for u in BND.units(classes["BND-GROUP"])}
    assert {3, 5, 6, 7} <= ratios and max(ratios) > 8
    grids = {u[2] for u in BND.units(classes["BND-GRID"])}
    assert {63, 65, 127, 129} <= grids and max(grids) > 1024
    assert any(v < 0 for v in classes["BND-BR-OFFSET"].extras)     # S_q > S_kv
    # the engine's block sizes are declared (copied), each a tile of the sequence classes
    assert set(sdpa_bwd.TILES["triton-blocks"]) <= set(sdpa_bwd.SEQ_TILES)


def test_units_are_each_tile_minus_one_at_and_plus_one(generated):
    for c in sdpa_bwd.BOUNDARY_CLASSES:
        assert set(BND.units(c)) == _expected_units(c), c.item


def test_every_boundary_case_is_a_valid_claim_that_realises_its_class(generated):
    classes = {c.item: c for c in sdpa_bwd.BOUNDARY_CLASSES}
    traced = [c for c in generated.cases if set(c.items) & set(classes)]
    assert traced and all(c.purpose == "claim" for c in traced)
    for case in traced:
        for item in set(case.items) & set(classes):
            values = {u[2] for u in _expected_units(classes[item])}
            assert _read(classes[item].quantity, case.graph) & values, (case.id, item)


def test_boundary_proof_is_complete_at_every_level(generated):
    names = [lv.name for lv in generated.plan.levels]
    bp = generated.plan.boundaries
    proofs = {(p.item, p.level): p for p in generated.boundary_proofs}
    assert set(proofs) == {(c.item, lv) for c in bp.classes for lv in names}
    for c in bp.classes:
        for level in names:
            p = proofs[(c.item, level)]
            assert p.complete, (c.item, level)
            covered = _covered(generated, c, level)
            assert set(p.covered) == covered, (c.item, level)
            if names.index(level) >= names.index(bp.each_class_by):
                assert covered, (c.item, level)
            if names.index(level) >= names.index(bp.every_value_by):
                assert covered == _expected_units(c), (c.item, level)


@pytest.mark.parametrize("item", sorted(ISSUE_CLASSES))
def test_the_proof_fails_when_a_class_loses_its_values_at_a_level(generated, item):
    """Dropping a class's cases from quick leaves quick without it; dropping the only pr
    cover of one unit leaves pr short of that unit."""
    c = next(c for c in sdpa_bwd.BOUNDARY_CLASSES if c.item == item)
    quick = {case.id for case in generated.only_level("quick") if item in case.items}
    kept = tuple(case for case in generated.cases if case.id not in quick)
    p = next(p for p in BND.prove(generated.plan, kept) if (p.item, p.level) == (item, "quick"))
    assert not p.complete and not p.covered
    # pr: the unit with the fewest covers loses them all
    cover: dict = {}
    for case in generated.at_level("pr"):
        if item in case.items:
            for _i, unit in BND.case_units(generated.plan.boundaries, case.items, case.graph):
                cover.setdefault(unit, set()).add(case.id)
    unit = min(cover, key=lambda u: (len(cover[u]), u[2]))
    kept = tuple(case for case in generated.cases if case.id not in cover[unit])
    p = next(p for p in BND.prove(generated.plan, kept) if (p.item, p.level) == (item, "pr"))
    assert not p.complete and unit in p.missing


def test_a_plan_without_a_class_quick_values_reports_the_gap(capsys):
    """Built again with BND-GRID's quick set removed: the report and the command show it."""
    plan = sdpa_bwd.PLAN
    classes = tuple(dataclasses.replace(c, sets=tuple(s for s in c.sets if s.level != "quick"))
                    if c.item == "BND-GRID" else c for c in plan.boundaries.classes)
    g = build(dataclasses.replace(plan, boundaries=dataclasses.replace(plan.boundaries, classes=classes)))
    bad = [p for p in g.boundary_proofs if not p.complete]
    assert [(p.item, p.level) for p in bad] == [("BND-GRID", "quick")]
    text = report.render(g)
    assert any(line.strip().startswith("BND-GRID:") and line.endswith("MISSING") for line in text.splitlines())


def test_report_shows_every_class_per_level(generated):
    text = report.render(generated)
    assert "Boundary proof" in text
    for c in generated.plan.boundaries.classes:
        row = next(line for line in text.splitlines() if line.strip().startswith(c.item + " "))
        total = len(_expected_units(c))
        assert row.rstrip().endswith(f"{total} of {total}"), row


def _with_class(**changes):
    plan = sdpa_bwd.PLAN
    c = dataclasses.replace(plan.boundaries.classes[0], **changes)
    return dataclasses.replace(plan, boundaries=dataclasses.replace(plan.boundaries, classes=(c,)))


def test_bad_boundary_declarations_name_the_class():
    with pytest.raises(PlanError, match=r"boundary class 'BND-SQ-TAIL': unknown quantity 'S_x'"):
        build(_with_class(quantity="S_x"))
    base = sdpa_bwd.BOUNDARY_CLASSES[0].sets[0].base
    with pytest.raises(PlanError, match=r"boundary class 'BND-SQ-TAIL'\[0\]: values \[18\] are not the class's"):
        build(_with_class(sets=(BoundarySet(base, (18,)),)))
    with pytest.raises(PlanError, match=r"boundary BND-SQ-TAIL\[0\] br-offset=15: the graph built does not "
                                        r"realise it"):
        build(_with_class(quantity="br-offset", sets=(BoundarySet(base, (15,)),)))   # no BOTTOM_RIGHT mask
    with pytest.raises(PlanError, match=r"boundary BND-SQ-TAIL\[0\] grid=65: grid 65: not a whole number of batches"):
        build(_with_class(quantity="grid", tiles=(64,), sets=(BoundarySet(Spec(dataclasses.replace(base.shape, H_q=2, H_k=2, H_v=2)), (65,)),)))
