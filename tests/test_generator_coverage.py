"""Coverage, levels, traceability and ids of the generated plan."""
from __future__ import annotations

import dataclasses
import glob
from collections import Counter

import pytest

from bundlegen.graph import load_bundle
from bundlegen import cost, ids
from bundlegen.generator import PlanError, build, build_default, levels, pairs
from bundlegen.generator.generate import _proofs
from bundlegen.generator.legality import Legality
from bundlegen.workspace import builtin_bundle_root
from bundlegen.plans import sdpa_bwd
from bundlegen.plans.records import Axis, Level, Rule, Space


@pytest.fixture(scope="module")
def generated():
    return build_default()


@pytest.fixture(scope="module")
def legality(generated):
    return Legality(generated.plan.padded)


# ----------------------------------------------------------------------------- the numbers
def test_at_least_500_cases_over_four_non_empty_levels(generated):
    assert len(generated.cases) >= 500
    counts = Counter(c.level for c in generated.cases)
    assert [lv.name for lv in generated.plan.levels] == list(counts) and all(counts.values())


def test_pair_proof_is_complete_at_every_level(generated):
    scopes = {p.level: (p.scope, p.complete, p.total) for p in generated.proofs}
    assert scopes["quick"][:2] == ("values", True)
    assert scopes["pr"][:2] == ("core", True)
    assert scopes["nightly"][:2] == ("all", True) and scopes["full"][:2] == ("all", True)
    assert scopes["nightly"][2] > scopes["pr"][2] > scopes["quick"][2]


# ----------------------------------------------------------------------------- the pair proof
def _pair_counts(generated, legality, scope: str, upto: str) -> Counter:
    counts: Counter = Counter()
    for case in generated.at_level(upto):
        units = pairs.covered_units(legality, generated.combos.get(case.id, ()), scope)
        counts.update(units)
    return counts


@pytest.mark.parametrize("level,scope", [("pr", "core"), ("nightly", "all")])
def test_pair_proof_fails_when_a_case_is_removed(generated, legality, level, scope):
    counts = _pair_counts(generated, legality, scope, level)
    lonely = min(u for u, n in counts.items() if n == 1)
    victim = next(c for c in generated.at_level(level)
                  if lonely in pairs.covered_units(legality, generated.combos.get(c.id, ()), scope))
    remaining = tuple(c for c in generated.cases if c.id != victim.id)
    proof = next(p for p in _proofs(generated.plan, legality, remaining, generated.combos) if p.level == level)
    assert not proof.complete and lonely in proof.missing
    assert proof.covered < proof.total


def test_repair_rows_cover_every_missing_pair(generated, legality):
    suite = generated.plan.padded.pair_suites[0]
    rows = pairs.suite_rows(legality, suite)
    thinned = rows[::2]                      # as if allpairspy had dropped half its rows
    missing = pairs.prove(legality, suite.level, suite.scope, thinned).missing
    assert missing
    repaired = pairs.repair_rows(legality, missing, suite.scope)
    assert all(legality.is_legal(r) for r in repaired)
    assert pairs.prove(legality, suite.level, suite.scope, thinned + repaired).complete


def test_proposed_rows_are_reused_only_for_the_same_space():
    """propose() remembers its rows (a build with other levels or costs reuses them): a space
    with a rule more, or another value, is proposed afresh and its rows follow it."""
    axes = tuple(Axis(n, n, ("a", "b", "c"), "a", core=True) for n in ("x", "y", "z"))
    free = Space("padded", axes, (), "AXIS-VALUES", ())
    ruled = dataclasses.replace(free, rules=(Rule("no-bb", "x b needs y a or c", when={"x": ("b",)},
                                                  require={"y": ("a", "c")}),))
    allowed = {p: [0, 1, 2] for p in range(3)}
    first = pairs.propose(Legality(free), "t", allowed)
    assert ("b", "b") in {r[:2] for r in first}
    assert pairs.propose(Legality(free), "t", allowed) == first
    kept = pairs.propose(Legality(ruled), "t", allowed)
    assert kept and ("b", "b") not in {r[:2] for r in kept}
    renamed = dataclasses.replace(free, axes=(dataclasses.replace(axes[0], values=("a", "b", "e")),) + axes[1:])
    assert {r[0] for r in pairs.propose(Legality(renamed), "t", allowed)} == {"a", "b", "e"}


def test_the_universe_is_exactly_the_pairs_some_legal_combination_holds(legality):
    legal, illegal = pairs.universe(legality, "all"), pairs.illegal_units(legality, "all")
    n_values = [len(v) for v in legality.values]
    assert len(legal) + len(illegal) == sum(a * b for i, a in enumerate(n_values) for b in n_values[i + 1:])
    for unit in sorted(illegal):
        assert legality.complete(dict(unit)) is None


# ----------------------------------------------------------------------------- levels and budgets
def test_every_level_fits_its_ceilings_and_budgets(generated):
    cumulative = 0.0
    for level in generated.plan.levels:
        for case in generated.only_level(level.name):
            # the per-case ceilings bound one engine run (a deterministic case's re-runs
            # count in the budgets)
            once = dataclasses.replace(case.graph, attributes=dataclasses.replace(
                case.graph.attributes, deterministic_algorithm=False))
            probe = case.purpose == "probe" and case.expected_rejection.by != "device"
            one = {k: cost.predict(once, k, generated.plan.cost_model, probe=probe).predicted_s for k in ("h200", "cpu")}
            assert one["h200"] <= level.per_case_seconds, case.id
            assert case.cost.bytes <= level.per_case_bytes, case.id
            if level.per_case_cpu_seconds is not None:
                assert one["cpu"] <= level.per_case_cpu_seconds, case.id
        cumulative += sum(c.cost.predicted_s for c in generated.only_level(level.name))
        assert cumulative <= level.budget_seconds * (1 - level.reserve), level.name
    quick = sum(c.cost.predicted_s for c in generated.at_level("quick"))
    pr = sum(c.cost.predicted_s for c in generated.at_level("pr"))
    assert quick < 30 and pr < 120


def test_costs_are_the_cost_models_predictions(generated):
    from bundlegen.cost import predict
    model = generated.plan.cost_model
    for case in generated.cases[::17]:
        if case.purpose != "probe":
            assert case.cost == predict(case.graph, "h200", model)
            assert generated.cpu_seconds[case.id] == predict(case.graph, "cpu", model).predicted_s


def _costed(key, seconds, min_level="quick", nbytes=1):
    return levels.Costed(key, f"entry {key}", min_level, seconds, nbytes, seconds)


LEVELS = (Level("quick", 1.0, 100, 3.0, pair_scope="values"), Level("pr", 2.0, 100, 6.0, pair_scope="core"),
          Level("nightly", 10.0, 1000, 100.0), Level("full", 100.0, 10000, 1000.0))


def test_assignment_takes_the_lowest_level_that_fits():
    got = levels.assign([_costed("a", 0.5), _costed("b", 1.5), _costed("c", 0.5, "nightly"),
                         _costed("d", 0.5, nbytes=500)], LEVELS)
    assert got == {"a": "quick", "b": "pr", "c": "nightly", "d": "nightly"}


def test_trim_rule_moves_the_most_expensive_cases_up():
    # quick usable budget 2.85 s: 0.9 + 0.8 + 0.7 + 0.6 = 3.0 s is over, so 0.9 moves to pr
    cases = [_costed("a", 0.9), _costed("b", 0.8), _costed("c", 0.7), _costed("d", 0.6)]
    got = levels.assign(cases, LEVELS)
    assert got == {"a": "pr", "b": "quick", "c": "quick", "d": "quick"}
    # ties move the smaller id first
    got = levels.assign([_costed("y", 1.0), _costed("x", 1.0), _costed("z", 1.0)], LEVELS)
    assert got == {"x": "pr", "y": "quick", "z": "quick"}


def test_trim_rule_keeps_the_only_cover_of_a_unit():
    cases = [_costed("a", 0.9), _costed("b", 0.8), _costed("c", 0.7), _costed("d", 0.6)]
    units = {"quick": {"a": frozenset({"v1"}), "b": frozenset({"v2"}), "c": frozenset({"v2"})}}
    got = levels.assign(cases, LEVELS, lambda level: units.get(level, {}))
    assert got == {"a": "quick", "b": "pr", "c": "quick", "d": "quick"}


def test_a_cpu_run_spreads_its_cases_over_the_levels_workers():
    two = dataclasses.replace(sdpa_bwd.LEVELS[0], cpu_workers=2)
    assert levels.cpu_run_wall([1.0, 1.0, 1.0, 1.0], two, 0.5) == 2.5            # 4 s over 2 workers
    assert levels.cpu_run_wall([3.0, 0.5, 0.5], two, 0.5) == 3.5                  # its longest case bounds it
    assert levels.cpu_run_wall([1.0, 1.0], dataclasses.replace(two, cpu_workers=1), 0.0) == 2.0
    assert levels.cpu_run_wall([], two, 0.5) == 0.5


def test_a_case_that_fits_no_level_names_its_entry():
    with pytest.raises(PlanError, match="entry huge: fits no level"):
        levels.assign([_costed("huge", 1000.0)], LEVELS)


def test_an_overfull_plan_is_trimmed_without_losing_coverage():
    # pr only a little tighter: its deterministic pair rows (each priced at 50 runs) are
    # the only cover of their pairs and cannot move; full, the top, is where the others go
    tight = tuple(dataclasses.replace(lv, budget_seconds=lv.budget_seconds / f)
                  for lv, f in zip(sdpa_bwd.LEVELS, (4, 1.7, 6, 1)))
    g = build(dataclasses.replace(sdpa_bwd.PLAN, levels=tight))
    assert sum(c.cost.predicted_s for c in g.at_level("quick")) <= tight[0].budget_seconds * 0.95
    assert any(c.group == "regressions" and c.level != "quick" for c in g.cases)
    assert all(p.complete for p in g.proofs)
    assert all(p.complete for p in g.risk_proofs)     # the only cover of a risky triple stays too


# ----------------------------------------------------------------------------- traceability
def test_two_way_traceability(generated):
    assert generated.untraced_items == ()
    assert generated.cases_without_items == ()
    assert generated.unknown_items == ()


def test_checked_in_bundles_trace_both_ways(generated):
    on_disk = []
    for path in sorted(glob.glob(str(builtin_bundle_root() / "*/sdpa_bwd/*.json"))):
        bundle, errors = load_bundle(path)
        assert errors == []
        on_disk += bundle.cases
    used = {i for c in on_disk for i in c.items}
    assert all(c.items for c in on_disk)
    assert set(generated.items) == used


# ----------------------------------------------------------------------------- ids and seeds
def test_ids_are_stable_handles_of_the_case_content(generated):
    seen = set()
    for case in generated.cases:
        assert case.id == ids.case_id(case.purpose, case.graph, case.data.distribution, case.expected_rejection,
                                      bias_values=case.data.bias_values)
        assert case.data.seed == ids.seed_of(case.id)
        assert case.id not in seen
        seen.add(case.id)


def test_recalibrating_costs_and_tolerances_renames_no_case(generated):
    slower = {k: dataclasses.replace(v, overhead_s=v.overhead_s * 2, engine_flops_per_s=v.engine_flops_per_s / 3)
              for k, v in sdpa_bwd.COST_MODEL.items()}
    classes = {k: dataclasses.replace(v, rtol=v.rtol * 1.25) for k, v in sdpa_bwd.TOLERANCE_CLASSES.items()}
    roomy = tuple(dataclasses.replace(lv, cpu_budget_seconds=lv.cpu_budget_seconds and lv.cpu_budget_seconds * 2,
                                      budget_seconds=lv.budget_seconds * 3)
                  for lv in sdpa_bwd.LEVELS)      # the slower classes would not fit the budgets (no trimming)
    other = build(dataclasses.replace(sdpa_bwd.PLAN, cost_model=slower, tolerance_classes=classes, levels=roomy))
    assert {c.id for c in other.cases} == {c.id for c in generated.cases}
    assert {c.id: c.data.seed for c in other.cases} == {c.id: c.data.seed for c in generated.cases}


def test_identical_content_from_two_entries_is_one_case(generated):
    merged = [c for c in generated.cases if len(generated.entries[c.id]) > 1]
    assert merged
    for case in merged:
        assert len(generated.entries[case.id]) == len(set(generated.entries[case.id]))
    regression = next(c for c in merged if c.purpose == "regression"
                      and any(e.startswith("axis value") for e in generated.entries[c.id]))
    assert "AXIS-VALUES" in regression.items and any(i.startswith("REG-") for i in regression.items)


def test_a_quick_level_over_its_cpu_budget_is_a_plan_error_not_a_coverage_cut():
    first, *rest = sdpa_bwd.LEVELS
    predicted = build_default()
    from bundlegen.generator.generate import cpu_run_seconds
    need = cpu_run_seconds(sdpa_bwd.PLAN, first.name, predicted.cases, predicted.cpu_seconds)
    tight = (dataclasses.replace(first, cpu_budget_seconds=need * 0.9), *rest)
    with pytest.raises(PlanError, match=r"level 'quick': a run on the cpu class is predicted at .* over its cpu budget"):
        build(dataclasses.replace(sdpa_bwd.PLAN, levels=tight))
    roomy = (dataclasses.replace(first, cpu_budget_seconds=need * 1.1), *rest)
    assert len(build(dataclasses.replace(sdpa_bwd.PLAN, levels=roomy)).cases) == len(predicted.cases)
