"""build(plan) -> GeneratedPlan: the whole expansion, with no I/O.

Order: check the plan; draft cases from every entry (axis values, pair suites, catalog,
sweeps, regressions, probes) and check each; add pair repairs (pass by pass); add the risk
suites' rows (generator/risks.py); merge drafts with the same content; give each case its
id, seed, tolerance class and cost; assign levels; prove coverage per level on the assigned
levels (and repair again if the trim rule moved a needed case up); prove the risk triples
and the layouts that differ (generator/layout_distinct.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from bundlegen import cost as cost_model
from bundlegen.graph import Case, DataSpec
from bundlegen import ids
from bundlegen.generator import boundaries, focus, layout_distinct, levels, pairs, ragged, risks
from bundlegen.generator.checks import check_draft, check_plan, declared_items
from bundlegen.generator.errors import PlanError
from bundlegen.generator.expand import (declared_drafts, graph_of, pair_drafts, repair_drafts, spec_of,
                                        value_drafts)
from bundlegen.generator.legality import Legality
from bundlegen.generator.records import Combo, Draft, GeneratedPlan, PairProof
from bundlegen.plans.records import PADDED, Plan

PURPOSE_PRECEDENCE = ("claim", "regression", "probe")   # a merged case takes the last one present
REPAIR_ROUNDS = 3


@dataclass(frozen=True)
class _Merged:
    """Drafts with the same content: one case. It takes the strongest purpose present, the
    group and entry of the first draft with that purpose, and every draft's items."""
    drafts: tuple[Draft, ...]
    purpose: str
    lead: Draft

    @classmethod
    def of(cls, drafts: list[Draft]) -> "_Merged":
        purpose = max((d.purpose for d in drafts), key=PURPOSE_PRECEDENCE.index)
        return cls(tuple(drafts), purpose, next(d for d in drafts if d.purpose == purpose))

    def combos(self, space: str) -> tuple[Combo, ...]:
        return tuple(dict.fromkeys(d.combo for d in self.drafts if d.combo is not None and d.space == space))


@lru_cache(maxsize=1)
def build_default() -> GeneratedPlan:
    """build() of bundlegen.plans.sdpa_bwd.PLAN, once per process (the result is immutable)."""
    return build()


def build(plan: Plan | None = None) -> GeneratedPlan:
    if plan is None:
        from bundlegen.plans.sdpa_bwd import PLAN as plan
    check_plan(plan)
    spaces = {PADDED: Legality(plan.padded)}
    drafts = value_drafts(plan, spaces[PADDED]) + declared_drafts(plan)
    if plan.boundaries is not None:
        drafts += boundaries.drafts(plan)
    if plan.ragged is not None:
        spaces[ragged.SPACE] = Legality(plan.ragged)
        drafts += ragged.value_drafts(plan, spaces[ragged.SPACE]) + ragged.declared_drafts(plan)
    for d in drafts:                 # checked before the (slower) pair suites run
        check_draft(plan, spaces[d.space], d)
    suite_drafts = pair_drafts(plan, spaces[PADDED])
    if plan.ragged is not None:
        suite_drafts += ragged.pair_drafts(plan, spaces[ragged.SPACE])
    for d in suite_drafts:
        check_draft(plan, spaces[d.space], d)
    drafts += suite_drafts
    repaired: list = []              # units allpairspy missed
    level_names = [lv.name for lv in plan.levels]

    # repairs against each suite's target level, before costs are known, pass by pass
    # (Axis.values_joined): a pass's units from the rows of that pass and the earlier ones,
    # so the repairs of the earlier passes stay what they were
    for space, suite in _suites(plan):
        legality = spaces[space]
        upto = level_names.index(suite.level)
        combos = [d.combo for d in drafts if d.space == space and d.combo is not None
                  and level_names.index(d.min_level) <= upto]
        rows: list = []
        for k in pairs.passes(legality, suite.scope):
            seen = [c for c in combos if pairs.combo_pass(legality, c) <= k] + rows
            missing = tuple(u for u in pairs.prove(legality, suite.level, suite.scope, seen).missing
                            if pairs.unit_pass(legality, u) <= k)
            rows += pairs.repair_rows(legality, missing, suite.scope)
            repaired += missing
        drafts += _repair_drafts(plan, space, suite.item, suite.level, rows)

    # the risk suites' rows after the pair repairs, which stay what they were before them
    risk_sets = None
    if plan.risks is not None:
        risk_sets = risk_suites(plan, spaces[PADDED])
        for d in risk_sets[3]:
            check_draft(plan, spaces[PADDED], d)
        drafts += risk_sets[3]

    focus_sets = focus_suites(plan, spaces, drafts)
    drafts += [d for _f, _wanted, ds in focus_sets for d in ds]
    drafts = without_values_focus_holds(plan, spaces, drafts, focus_sets)

    for _round in range(REPAIR_ROUNDS):
        cases, combos_by_space, entries, cpu = _cases(plan, spaces, drafts, risk_sets)
        proofs = {space: _proofs(plan, legality, cases, combos_by_space[space], space)
                  for space, legality in spaces.items()}
        gaps = [p for ps in proofs.values() for p in ps if not p.complete]
        if not gaps:
            break
        drafts += _gap_repairs(plan, spaces, gaps)

    _check_cpu_budgets(plan, cases, cpu)
    illegal = {space: pairs.illegal_units(legality, "all") for space, legality in spaces.items()}
    violations = []
    for space, legality in spaces.items():
        for c in cases:
            for combo in combos_by_space[space].get(c.id, ()):
                if not legality.is_legal(combo):
                    violations.append(f"{c.id}: breaks {', '.join(legality.broken_rules(combo))}")
    items = {k: v for k, v in declared_items(plan).items() if k not in {g.item for g in plan.gated}}
    rag = spaces.get(ragged.SPACE)
    return GeneratedPlan(plan=plan, cases=cases, combos=combos_by_space[PADDED], entries=entries, cpu_seconds=cpu,
                         proofs=proofs[PADDED], exclusions=spaces[PADDED].exclusions(illegal[PADDED]),
                         illegal_pairs=len(illegal[PADDED]),
                         repaired_pairs=tuple(sorted(set(repaired))), legality_violations=tuple(violations),
                         items=items,
                         ragged_combos=combos_by_space.get(ragged.SPACE, {}),
                         ragged_proofs=proofs.get(ragged.SPACE, ()),
                         ragged_exclusions=() if rag is None else rag.exclusions(illegal[ragged.SPACE]),
                         ragged_illegal_pairs=len(illegal.get(ragged.SPACE, ())),
                         boundary_proofs=boundaries.prove(plan, cases),
                         risk_proofs=() if risk_sets is None else risk_proofs(plan, spaces[PADDED], cases,
                                                                              combos_by_space[PADDED], risk_sets),
                         layout_proof=layout_distinct.prove(plan, cases, level_names, plan.distinct_layouts_by),
                         focus_proofs=focus_proofs(plan, spaces, cases, combos_by_space, focus_sets))


def _combo_graph(plan: Plan, space: str, combo: Combo):
    if space == ragged.SPACE:
        return ragged.graph_of(plan, ragged.spec_of(plan, combo))
    return graph_of(plan, spec_of(plan, combo))


def focus_suites(plan: Plan, spaces: dict[str, Legality], drafts: list[Draft]):
    """(focus, its units, the drafts of its rows) per Plan.focus entry: rows for the units no
    draft of the focus's level or below holds yet (their levels as declared: the proof after
    levelling says what the cases hold)."""
    level_names = [lv.name for lv in plan.levels]
    out = []
    for f in plan.focus:
        legality = spaces[f.storage]
        wanted = focus.universe(legality, f)
        upto = level_names.index(f.level)
        have: set = set()
        for d in drafts:    # value-suite drafts aside: the rows may stand in for them
            if (d.space == f.storage and d.combo is not None and level_names.index(d.min_level) <= upto
                    and legality.space.value_suite_item not in d.items):
                have |= focus.held(legality, d.combo)

        def cpu(combo, space=f.storage) -> float:
            return cost_model.predict(_combo_graph(plan, space, combo), "cpu", plan.cost_model).predicted_s
        rows = focus.rows(legality, wanted - have, cpu)
        label = f"focus {f.item} "
        made = (ragged.repair_drafts(plan, f.item, f.level, rows, label=label, group=f"ragged-{f.group}")
                if f.storage == ragged.SPACE else
                repair_drafts(plan, f.item, f.level, rows, label=label, group=f.group))
        for d in made:
            check_draft(plan, legality, d)
        out.append((f, wanted, made))
    return out


def without_values_focus_holds(plan: Plan, spaces, drafts: list[Draft], focus_sets) -> list[Draft]:
    """The drafts less each value-suite draft whose values other than its axes' defaults are
    all subjects of a focused-pair entry of the value suite's level and held by one of its
    rows (that row is the value's case there: the axis-value proof still holds, the CPU budget
    pays for the pairs instead; a partner value, an older risky one, keeps its case and id)."""
    level = plan.levels[0].name
    held: dict[str, set] = {}
    for f, _wanted, made in focus_sets:
        if f.level == level:
            subjects = {(a, v) for a, values in f.subjects.items() for v in values}
            held.setdefault(f.storage, set()).update(
                cell for d in made for cell in zip(spaces[f.storage].axes, d.combo) if cell in subjects)
    suites = {plan.padded.value_suite_item} | ({plan.ragged.value_suite_item} if plan.ragged is not None else set())

    def redundant(d: Draft) -> bool:
        if d.combo is None or d.min_level != level or not suites & set(d.items):
            return False
        axes = spaces[d.space].space.axes
        cells = {(a.name, v) for a, v in zip(axes, d.combo) if v != a.default}
        return bool(cells) and cells <= held.get(d.space, set())
    return [d for d in drafts if not redundant(d)]


def focus_proofs(plan: Plan, spaces, cases, combos_by_space, focus_sets) -> tuple:
    level_names = [lv.name for lv in plan.levels]
    out: list = []
    for f, wanted, _drafts in focus_sets:
        legality, combos = spaces[f.storage], combos_by_space[f.storage]
        per_level = [set() for _ in level_names]
        for c in cases:
            for combo in combos.get(c.id, ()):
                per_level[level_names.index(c.level)] |= focus.held(legality, combo) & wanted

        def held_at(level: str, per_level=per_level) -> set:
            return set().union(*per_level[: level_names.index(level) + 1])
        out += focus.prove(f, level_names, wanted, held_at)
    return tuple(out)


def risk_suites(plan: Plan, legality: Legality):
    """(top universe, every universe, the sample's triples, the drafts) of plan.risks: the
    top suite's rows at top_by, its cheapest rows on the cpu class at sample_at, the whole
    suite's rows at every_by."""
    r = plan.risks
    top = risks.universe(legality, r, r.top_rank)
    every = risks.universe(legality, r, None)
    top_rows = risks.suite_rows(legality, r, r.top_rank, top)
    every_rows = risks.suite_rows(legality, r, None, every)

    def cpu(combo) -> float:
        return cost_model.predict(graph_of(plan, spec_of(plan, combo)), "cpu", plan.cost_model).predicted_s
    sample = risks.sample_rows(top_rows, cpu, r.sample)
    drafts = (repair_drafts(plan, r.item, r.sample_at, sample, label="risk sample ", group=r.group)
              + repair_drafts(plan, r.item, r.top_by, top_rows, label="risk top ", group=r.group)
              + repair_drafts(plan, r.item, r.every_by, every_rows, label="risk every ", group=r.group))
    held = set().union(*(risks.triples(legality, r, c) for c in sample)) if sample else set()
    return top, every, frozenset(held & top), drafts


def risk_proofs(plan: Plan, legality: Legality, cases, combos_by_id, risk_sets):
    """Per level, the risky triples of its cases' combinations; a triple that names a
    layout counts only where the case is not another layout's memory."""
    top, every, sample, _drafts = risk_sets
    level_names = [lv.name for lv in plan.levels]
    per_case = {}
    for c in cases:
        held = set()
        for combo in combos_by_id.get(c.id, ()):
            held |= risks.triples(legality, plan.risks, combo)
        if held and any(a == "layout" for t in held for a, _v in t):
            layout = layout_distinct.layout_of(plan, c)
            if layout is not None and layout_distinct.same_memory_as(plan, c.graph, layout) is not None:
                held = {t for t in held if all(a != "layout" for a, _v in t)}
        per_case[c.id] = (level_names.index(c.level), held)

    def held_at(level: str) -> set:
        i = level_names.index(level)
        return set().union(*(h for lv, h in per_case.values() if lv <= i))
    return risks.prove(plan.risks, level_names, held_at, top, every, sample)


def _suites(plan: Plan):
    """(space, pair suite) of every pair suite of the plan, padded first."""
    out = [(PADDED, s) for s in plan.padded.pair_suites]
    if plan.ragged is not None:
        out += [(ragged.SPACE, s) for s in plan.ragged.pair_suites]
    return out


def _gap_repairs(plan: Plan, spaces: dict, gaps: list) -> list[Draft]:
    """The trim rule had to move a needed case up: repair each gap at its level. The gaps come
    in level order; a unit a lower level's repair row holds is no gap above it (a level
    includes every lower one), so no two repairs draft the same row."""
    out: list[Draft] = []
    rows_of: dict[str, list] = {}       # this round's repair rows per space
    for proof in gaps:
        legality, earlier = spaces[proof.space], rows_of.setdefault(proof.space, [])
        held = pairs.covered_units(legality, earlier, proof.scope)
        rows = pairs.repair_rows(legality, [u for u in proof.missing if u not in held], proof.scope)
        earlier += rows
        out += _repair_drafts(plan, proof.space, _coverage_item(plan, proof.scope, proof.space), proof.level, rows)
    return out


def _repair_drafts(plan: Plan, space: str, suite_item: str, level: str, rows: list) -> list[Draft]:
    if space == ragged.SPACE:
        return ragged.repair_drafts(plan, suite_item, level, rows)
    return repair_drafts(plan, suite_item, level, rows)


def cpu_run_seconds(plan: Plan, level: str, cases, cpu: dict[str, float]) -> float:
    """A whole `bundlegen run --level` on the cpu class: the level's cases and lower ones over
    its workers, and the run's start (levels.cpu_run_wall)."""
    names = [lv.name for lv in plan.levels]
    upto = set(names[: names.index(level) + 1])
    return levels.cpu_run_wall([cpu[c.id] for c in cases if c.level in upto], plan.levels[names.index(level)],
                               plan.cost_model["cpu"].run_start_s)


def _check_cpu_budgets(plan: Plan, cases, cpu: dict[str, float]) -> None:
    """A level with a CPU budget must fit it whole: no case is moved out (that would cut the
    coverage CI gets on a CPU); the plan must shape its cases instead."""
    for level in plan.levels:
        if level.cpu_budget_seconds is None:
            continue
        total = cpu_run_seconds(plan, level.name, cases, cpu)
        if total > level.cpu_budget_seconds:
            raise PlanError(f"level '{level.name}': a run on the cpu class is predicted at {total:.1f} s, "
                            f"over its cpu budget of {level.cpu_budget_seconds:g} s: make its cases smaller")


def _coverage_item(plan: Plan, scope: str, space: str = PADDED) -> str:
    """The item a repair case of `scope` in `space` traces to."""
    owner = plan.space(space)
    if scope == "values":
        return owner.value_suite_item
    return next(s.item for s in owner.pair_suites if s.scope == scope)


def _merge(drafts: list[Draft]) -> list[_Merged]:
    groups: dict[str, list[Draft]] = {}
    for d in drafts:
        groups.setdefault(ids.content_key(d.graph, d.distribution, d.rejection, d.bias_values), []).append(d)
    return [_Merged.of(g) for g in groups.values()]


def _cases(plan: Plan, spaces: dict[str, Legality], drafts: list[Draft], risk_sets=None):
    merged = _merge(drafts)
    level_names = [lv.name for lv in plan.levels]
    built, costed, entries, cpu = {}, [], {}, {}
    combos: dict[str, dict[str, tuple]] = {space: {} for space in spaces}
    for m in merged:
        lead = m.lead
        case_id = ids.case_id(m.purpose, lead.graph, lead.distribution, lead.rejection,
                              bias_values=lead.bias_values)
        if case_id in built:
            raise PlanError(f"{lead.entry}: case id {case_id} collides with {built[case_id][0].entry}")
        # a probe is validated and offered to engines, never run; a device probe runs once
        probe = m.purpose == "probe" and lead.rejection.by != "device"
        min_level = min((d.min_level for d in m.drafts), key=level_names.index)
        cost, h200 = levels.costed(case_id, lead.entry, min_level, lead.graph, probe, plan.cost_model)
        built[case_id] = (lead, m, h200)
        costed.append(cost)
        for space in spaces:
            if m.combos(space):
                combos[space][case_id] = m.combos(space)
        entries[case_id] = tuple(d.entry for d in m.drafts)
        cpu[case_id] = cost.cpu_seconds
    scopes = {lv.name: lv.pair_scope for lv in plan.levels}
    bounds: dict[str, set] = {}      # case id -> the boundary units it gives (never probes)
    if plan.boundaries is not None:
        for case_id, (lead, m, _h200) in built.items():
            if m.purpose != "probe":
                bounds[case_id] = boundaries.case_units(plan.boundaries, {i for d in m.drafts for i in d.items},
                                                        lead.graph)

    def units_for(level: str) -> dict[str, frozenset]:
        out: dict[str, set] = {}
        for space, legality in spaces.items():
            for k, v in combos[space].items():
                out.setdefault(k, set()).update((space, u) for u in pairs.covered_units(legality, v, scopes[level]))
        if risk_sets is not None:   # the trim rule keeps the only cover of a triple the level must hold
            wanted = {"top": risk_sets[0], "every": risk_sets[1]}.get(risks.required(plan.risks, level))
            for k, v in (combos[PADDED].items() if wanted else ()):
                held = set().union(*(risks.triples(spaces[PADDED], plan.risks, c) for c in v)) & wanted
                out.setdefault(k, set()).update(("risk", t) for t in held)
        need = "none" if plan.boundaries is None else boundaries.requirement(plan.boundaries, level_names, level)
        for k, units in bounds.items():   # the trim rule keeps the only cover of a boundary unit
            if need == "every":
                out.setdefault(k, set()).update(("boundary", u) for u in units)
            elif need == "one":
                out.setdefault(k, set()).update(("boundary", item) for item, _u in units)
        return {k: frozenset(v) for k, v in out.items()}
    assigned = levels.assign(costed, plan.levels, units_for)
    cases = []
    for case_id, (lead, m, h200) in built.items():
        cases.append(Case(
            id=case_id, purpose=m.purpose,
            items=tuple(sorted({i for d in m.drafts for i in d.items})),
            graph=lead.graph, data=DataSpec(seed=ids.seed_of(case_id), distribution=lead.distribution,
                          bias_values=lead.bias_values),
            tolerance_class=plan.tolerance_rule(lead.graph),
            expected_rejection=lead.rejection, cost=h200, level=assigned[case_id], group=lead.group))
    cases.sort(key=lambda c: (level_names.index(c.level), c.group, c.id))
    return tuple(cases), combos, entries, cpu


def _proofs(plan: Plan, legality: Legality, cases, combos_by_id, space: str = PADDED) -> tuple[PairProof, ...]:
    out = []
    seen: list = []
    for level in plan.levels:
        seen += [combo for c in cases if c.level == level.name for combo in combos_by_id.get(c.id, ())]
        proof = pairs.prove(legality, level.name, level.pair_scope, seen)
        out.append(dataclasses.replace(proof, space=space))
    return tuple(out)
