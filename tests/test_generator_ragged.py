"""Ragged (THD / varlen) graphs in the plan and the generator: their own axis space and pair
proof, the seed-001 regressions, frontend and device probes (and the guard-band reach
check), the cost terms and descriptions of ragged graphs, and the 64-bit-offset case."""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from bundlegen import reasons as R
from bundlegen.cost import predict, terms
from bundlegen.describe import graph_line
from bundlegen.graph import dense_graph, ragged_graph
from bundlegen.validate import GUARD_ELEMS, frontend_finding, frontend_reason, good_sequences, \
    ragged_offsets_finding
from bundlegen.generator import PlanError, build, build_default, pairs, ragged, write
from bundlegen.generator.generate import _proofs
from bundlegen.generator.legality import Legality
from bundlegen.manifest import read_manifest
from bundlegen.plans import sdpa_bwd
from bundlegen.plans.records import HeadConfig, HeadDims, Lengths, Offsets, Probe, RaggedShape, Spec

DEVICE_PROBE = sdpa_bwd.RAGGED_PROBES[-1]          # over-max on the kv side


@pytest.fixture(scope="module")
def generated():
    return build_default()


@pytest.fixture(scope="module")
def legality():
    return Legality(sdpa_bwd.RAGGED)


def _ragged_cases(cases):
    return [c for c in cases if c.graph.ragged is not None]


def _with_probes(*probes):
    r = dataclasses.replace(sdpa_bwd.RAGGED, probes=sdpa_bwd.RAGGED_PROBES + probes)
    return dataclasses.replace(sdpa_bwd.PLAN, ragged=r)


def _probe(item, reason, offsets, by="device", **spec) -> Probe:
    return Probe(item, "test probe", by, reason,
                 Spec(RaggedShape(HeadConfig(1, 1, 1), HeadDims(16, 16), offsets), **{"layout": "thd", **spec}))


# ----------------------------------------------------------------------------- levels and the proof
def test_ragged_cases_land_at_quick_pr_and_nightly(generated):
    counts = Counter(c.level for c in _ragged_cases(generated.cases))
    assert counts["quick"] >= 30 and counts["pr"] >= 30 and counts["nightly"] >= 30
    purposes = Counter(c.purpose for c in _ragged_cases(generated.at_level("quick")))
    assert purposes["claim"] and purposes["regression"] and purposes["probe"]


def test_the_ragged_space_is_proved_complete_at_every_level(generated):
    proofs = {p.level: p for p in generated.ragged_proofs}
    assert [p.space for p in generated.ragged_proofs] == ["ragged"] * 4
    assert proofs["quick"].scope == "values" and proofs["pr"].scope == "core" and proofs["nightly"].scope == "all"
    assert all(p.complete for p in proofs.values())
    values = sum(len(a.values) for a in sdpa_bwd.RAGGED_AXES)
    assert proofs["quick"].total == values
    assert proofs["nightly"].total > proofs["pr"].total > values
    quick_items = {i for c in generated.at_level("quick") for i in c.items}
    for axis in sdpa_bwd.RAGGED_AXES:
        for value in axis.values:
            assert ragged.item(axis.name, value) in quick_items


def test_the_ragged_proof_is_over_ragged_cases_only(generated, legality):
    """Ragged combinations never count for the padded axes, and a lonely ragged pair is
    missed when its only case goes."""
    assert not set(generated.combos) & set(generated.ragged_combos)
    by_id = {c.id: c for c in generated.cases}
    assert all(by_id[k].graph.ragged is not None for k in generated.ragged_combos)
    assert all(by_id[k].graph.ragged is None for k in generated.combos)
    counts: Counter = Counter()
    for case in generated.at_level("pr"):
        counts.update(pairs.covered_units(legality, generated.ragged_combos.get(case.id, ()), "core"))
    lonely = min(u for u, n in counts.items() if n == 1)
    victim = next(c for c in generated.at_level("pr")
                  if lonely in pairs.covered_units(legality, generated.ragged_combos.get(c.id, ()), "core"))
    remaining = tuple(c for c in generated.cases if c.id != victim.id)
    proof = next(p for p in _proofs(generated.plan, legality, remaining, generated.ragged_combos) if p.level == "pr")
    assert not proof.complete and lonely in proof.missing


def test_report_and_manifest_show_the_ragged_space(generated):
    from bundlegen.generator import report
    text = report.render(generated)
    for proof in generated.ragged_proofs:
        assert f"{proof.level}: ragged " in text and f"{proof.covered} of {proof.total}" in text
    for rule in sdpa_bwd.RAGGED_RULES:
        assert rule.name in text
    for gate in ("GATE-RAGGED-THD", "GATE-RAGGED-BAD-OFFSET", "GATE-INT64-OFFSETS"):
        assert gate not in text and gate not in {g.item for g in sdpa_bwd.GATED}
    texts = write.planned_texts(generated)
    manifest = read_manifest("sdpa_bwd.manifest.json", text=texts["sdpa_bwd.manifest.json"],
                             tolerances_text=texts["sdpa_bwd.tolerances.toml"])
    lengths = next(a for a in manifest.axes if a.name == "ragged-lengths")
    assert not lengths.core and "AX-RAGGED-LENGTHS-ZERO-KV" in lengths.items
    regressions = {i.id for s in manifest.sections for i in s.items}
    assert {"REG-RAGGED-BASE-AT-END", "SHP-RAGGED-LONG"} <= regressions


# ----------------------------------------------------------------------------- values and rules
def test_the_ragged_values_cover_the_issue_list():
    L = sdpa_bwd.RAGGED_LENGTHS
    assert any(0 in ln.q and 0 not in ln.kv_lengths for ln in L.values())          # zero-length q side
    assert any(0 in ln.kv_lengths and 0 not in ln.q for ln in L.values())          # zero-length kv side
    assert any(set(ln.q) == {1} for ln in L.values())
    assert {63, 65, 127, 129} <= {n for ln in L.values() for n in ln.q}
    assert any(len(set(ln.q)) == 1 and ln.q == ln.kv_lengths for ln in L.values())  # equal lengths
    assert any(all(a > b for a, b in zip(ln.q, ln.kv_lengths)) for ln in L.values())
    assert any(all(a < b for a, b in zip(ln.q, ln.kv_lengths)) for ln in L.values())
    kinds = {(s.kind, s.stats, s.offset > 0, s.lead + s.tail > 0) for s in sdpa_bwd.RAGGED_STORAGES.values()}
    assert {k[0] for k in kinds} == {"thd", "htd", "thd-pad16"} and any(k[2] for k in kinds) and any(k[3] for k in kinds)
    masks = {sdpa_bwd.MASKS[m].alignment for m in sdpa_bwd.RAGGED_MASKS if sdpa_bwd.MASKS[m].right_bound == 0}
    assert masks == {"TOP_LEFT", "BOTTOM_RIGHT"}
    heads = [sdpa_bwd.PLAN.heads[h] for h in next(a for a in sdpa_bwd.RAGGED_AXES if a.name == "heads").values]
    assert any(h.H_k == 1 for h in heads) and any(h.H_k != h.H_v for h in heads)
    dims = [sdpa_bwd.HEAD_DIMS[d] for d in next(a for a in sdpa_bwd.RAGGED_AXES if a.name == "head_dims").values]
    assert any(d.D_qk != d.D_v for d in dims)


def test_ragged_rules_exclude_exactly_what_they_say(legality, generated):
    values = {a.name: a.values for a in sdpa_bwd.RAGGED_AXES}
    for rule in (r for r in sdpa_bwd.RAGGED_RULES if set(r.axes) == {"lengths", "mask"}):   # packed: test_ragged_breadth_packed
        excluded = 0
        for length in values["lengths"]:
            for mask in values["mask"]:
                says = mask in rule.when["mask"] and length not in rule.require["lengths"]
                if says:
                    excluded += 1
                    assert legality.complete({"lengths": length, "mask": mask}) is None
        assert excluded > 0
    assert generated.legality_violations == ()
    for combos in generated.ragged_combos.values():
        assert all(legality.is_legal(c) for c in combos)


def test_every_ragged_claim_and_regression_is_valid_and_small_at_quick(generated):
    for case in _ragged_cases(generated.cases):
        if case.purpose != "probe":
            assert frontend_reason(case.graph) is None, case.id
            assert good_sequences(case.graph) == tuple(range(case.graph.B)), case.id
    quick = _ragged_cases(generated.at_level("quick"))
    # the deterministic value case's 50 runs count apart (their own test bounds them); the
    # ragged space takes at most its declared share of quick's CPU budget
    assert sum(generated.cpu_seconds[c.id] for c in quick if not c.graph.attributes.deterministic_algorithm) \
        < sdpa_bwd.CPU_QUICK_BUDGET_S * sdpa_bwd.RAGGED_QUICK_CPU_SHARE


def test_the_seed_001_regressions(generated):
    """A sequence based at T, a last sequence ending at T, zero-length last sequences."""
    regs = [c for c in generated.at_level("quick") if c.purpose == "regression" and c.graph.ragged is not None]
    cu = [(c.graph.ragged, c.graph.T_q, c.graph.T_kv) for c in regs]
    assert any(r.cu_seqlens_q[-2] == r.cu_seqlens_q[-1] == tq for r, tq, _ in cu)               # base at the end
    assert any(r.cu_seqlens_q[-2] < r.cu_seqlens_q[-1] == tq and r.cu_seqlens_kv[-1] == tkv for r, tq, tkv in cu)
    assert any(r.lengths_q[-1] == 0 and r.lengths_kv[-1] > 0 for r, _, _ in cu)
    assert any(r.lengths_kv[-1] == 0 and r.lengths_q[-1] > 0 for r, _, _ in cu)
    assert {"REG-RAGGED-BASE-AT-END", "REG-RAGGED-LAST-ENDS-AT-T", "REG-RAGGED-ZERO-LAST"} <= {
        i for c in regs for i in c.items}


# ----------------------------------------------------------------------------- probes
def test_frontend_ragged_probes_are_rejected_by_the_named_rule(generated):
    probes = [c for c in _ragged_cases(generated.cases)
              if c.expected_rejection is not None and c.expected_rejection.by == "frontend"]
    assert {c.expected_rejection.reason for c in probes} >= set(R.DEVICE) | {R.RAGGED_OFFSETS_COUNT}
    for case in probes:
        assert frontend_reason(case.graph) == case.expected_rejection.reason


def test_device_probes_one_per_reason_both_sides_within_the_guard(generated):
    probes = [c for c in generated.at_level("quick")
              if c.expected_rejection is not None and c.expected_rejection.by == "device"]
    assert {c.expected_rejection.reason for c in probes} == set(R.DEVICE)
    sides = set()
    for case in probes:
        g = case.graph
        assert frontend_finding(g, offsets_on_device=True) is None
        finding = ragged_offsets_finding(g)
        assert finding.reason == case.expected_rejection.reason
        sides.add(finding.field.split("[")[0].rsplit("_", 1)[1])
        assert good_sequences(g)
        for port, (before, after) in ragged.stray_reach(g).items():
            assert before <= GUARD_ELEMS + g.tensors[port].offset and after <= GUARD_ELEMS, (case.id, port)
        assert case.cost.predicted_s > sdpa_bwd.COST_MODEL["h200"].probe_s      # it runs once
    assert sides == {"q", "kv"}
    reach = {c.expected_rejection.reason: max(max(v) for v in ragged.stray_reach(c.graph).values()) for c in probes}
    assert reach[R.RAGGED_NEGATIVE_OFFSET] > 0 and reach[R.RAGGED_OFFSET_PAST_STORAGE] > 0


def test_stray_reach_counts_rows_outside_storage_times_the_token_stride():
    g = ragged_graph((-3, 10, 25), (0, 10, 20), H_q=2, D_qk=16, T_q=20, offsets={p: 5 for p in ("q", "dq")})
    reach = ragged.stray_reach(g)
    assert reach["q"] == (3 * 32, 5 * 32) and reach["stats"] == (3, 5) and reach["k"] == (0, 0)


def test_a_device_probe_reaching_past_the_guard_is_a_plan_error():
    far = GUARD_ELEMS // 16 + 8          # rows of 16 elements: 8 rows past the band
    bad = _probe("PRB-TEST-FAR", R.RAGGED_OFFSET_PAST_STORAGE, Offsets((0, 20, 40 + far), (0, 20, 40), T_q=40))
    with pytest.raises(PlanError, match=r"PRB-TEST-FAR: its bad sequences reach 0 elements before and "
                                        rf"{far * 16} after port 'do'.*guard band"):
        build(_with_probes(bad))
    near = _probe("PRB-TEST-NEAR", R.RAGGED_OFFSET_PAST_STORAGE, Offsets((0, 20, 40 + far - 8), (0, 20, 40), T_q=40))
    assert any("PRB-TEST-NEAR" in c.items for c in build(_with_probes(near)).cases)


def test_a_device_probe_must_break_its_rule_and_only_its_offsets():
    valid = _probe("PRB-TEST-VALID", R.RAGGED_NEGATIVE_OFFSET, Offsets((0, 20, 40)))
    with pytest.raises(PlanError, match="PRB-TEST-VALID: the offsets break None, the probe names"):
        build(_with_probes(valid))
    other = _probe("PRB-TEST-OTHER", R.RAGGED_NEGATIVE_OFFSET, Offsets((0, 20, 40), max_q=10))
    with pytest.raises(PlanError, match="PRB-TEST-OTHER: the offsets break 'ragged-length-over-max'"):
        build(_with_probes(other))
    scale = _probe("PRB-TEST-SCALE", R.RAGGED_NEGATIVE_OFFSET, Offsets((-2, 20, 40)), scale="custom")
    scale = dataclasses.replace(scale, spec=dataclasses.replace(
        scale.spec, shape=dataclasses.replace(scale.spec.shape, heads=HeadConfig(3, 2, 2))))
    with pytest.raises(PlanError, match="PRB-TEST-SCALE: a device probe must be valid but for its offsets; "
                                        "the frontend gives 'gqa-not-divisible'"):
        build(_with_probes(scale))


def test_a_device_probe_needs_a_good_sequence():
    none_good = _probe("PRB-TEST-NONE-GOOD", R.RAGGED_NEGATIVE_OFFSET, Offsets((-4, 20), (0, 20)))
    with pytest.raises(PlanError, match="PRB-TEST-NONE-GOOD: a device probe needs a good sequence"):
        build(_with_probes(none_good))


def test_a_probe_layer_or_code_of_the_wrong_kind_is_a_plan_error():
    engine = _probe("PRB-TEST-ENGINE", R.RAGGED_NOT_SERVED, Offsets((0, 20, 40)), by="engine")
    with pytest.raises(PlanError, match="PRB-TEST-ENGINE': unknown rejecting layer 'engine'"):
        build(_with_probes(engine))
    code = _probe("PRB-TEST-CODE", R.BATCH_MISMATCH, Offsets((-2, 20, 40)))
    with pytest.raises(PlanError, match="PRB-TEST-CODE': 'batch-mismatch' is not a device reason code"):
        build(_with_probes(code))


def test_explicit_offsets_with_spare_rows_storage_is_a_plan_error():
    bad = _probe("PRB-TEST-SPARE", R.RAGGED_NEGATIVE_OFFSET, Offsets((-2, 20, 40)), layout="spare-rows")
    with pytest.raises(PlanError, match="PRB-TEST-SPARE': explicit offsets place their own rows"):
        build(_with_probes(bad))


# ----------------------------------------------------------------------------- graphs, cost, description
def test_lengths_pack_from_the_storages_lead_rows():
    spec = Spec(RaggedShape(HeadConfig(2, 1, 1), HeadDims(64, 32), Lengths((3, 0, 5), (4, 6, 0))), layout="spare-rows")
    g = ragged.graph_of(sdpa_bwd.PLAN, spec)
    lead, tail = sdpa_bwd.RAGGED_STORAGES["spare-rows"].lead, sdpa_bwd.RAGGED_STORAGES["spare-rows"].tail
    assert g.ragged.cu_seqlens_q == (lead, lead + 3, lead + 3, lead + 8) and g.T_q == lead + 8 + tail
    assert g.ragged.cu_seqlens_kv == (lead, lead + 4, lead + 10, lead + 10) and g.T_kv == lead + 10 + tail
    assert g.tensors["v"].dims == (g.T_kv, 1, 32) and frontend_reason(g) is None
    htd = ragged.graph_of(sdpa_bwd.PLAN, dataclasses.replace(spec, layout="htd"))
    assert htd.tensors["q"].strides == (64, htd.T_q * 64, 1)
    pad = ragged.graph_of(sdpa_bwd.PLAN, dataclasses.replace(spec, layout="thd-pad16"))
    assert pad.tensors["q"].strides == (2 * 64 + 16, 64, 1)


def test_cost_counts_the_sequences_real_work():
    g = ragged_graph((0, 10, 10, 40), (0, 5, 25, 25), H_q=2, D_qk=16)     # lengths (10,0,30) x (5,20,0)
    t = terms(g)
    assert t.engine_flops == 2 * 2 * (10 * 5) * (5 * 16)
    dense = terms(dense_graph(B=3, H_q=2, S_q=30, S_kv=20, D_qk=16))
    assert t.engine_flops < dense.engine_flops / 10
    clipped = terms(ragged_graph((0, 50, 60), (0, 50, 60), H_q=1, D_qk=16, max_seqlen_q=20))
    assert clipped.engine_flops == 2 * (20 * 50 + 10 * 10) * (5 * 16)     # a bounded engine's work


def test_graph_line_describes_a_ragged_graph():
    g = ragged_graph((0, 10, 10, 40), (0, 5, 25, 25), H_q=2, D_qk=16, layout="htd", right=0,
                     alignment="BOTTOM_RIGHT")
    line = graph_line(g)
    assert "B=3" in line and "len_q=(10,0,30)" in line and "len_kv=(5,20,0)" in line
    assert "T_q=40 T_kv=25 max_q=30 max_kv=20" in line and "q=htd" in line and "BOTTOM_RIGHT" in line
    assert "cu_q=hidden" in graph_line(g.as_launched())
    assert "q=thd+24" in graph_line(ragged_graph((0, 4), H_q=2, D_qk=16, offsets={"q": 24}))


# ----------------------------------------------------------------------------- 64-bit offsets
def test_the_int64_offset_case_is_at_full_and_too_large_for_the_cpu(generated):
    from bundlegen.harness import case as run
    cases = [c for c in generated.cases if "SHP-INT64-OFFSETS" in c.items]
    assert len(cases) == 2 and {c.level for c in cases} == {"full"}
    texts = write.planned_texts(generated)
    manifest = read_manifest("sdpa_bwd.manifest.json", text=texts["sdpa_bwd.manifest.json"],
                             tolerances_text=texts["sdpa_bwd.tolerances.toml"])
    full = next(lv for lv in sdpa_bwd.LEVELS if lv.name == "full")
    for case in cases:
        spans = {p: t.storage_elements for p, t in case.graph.tensors.items()}
        assert max(spans.values()) > 2 ** 31 and sorted(spans.values())[-2] < 2 ** 20
        assert case.cost.bytes <= full.per_case_bytes and case.cost.bytes < 5 * 2 ** 30
        assert run.memory_ceiling_breach(case, manifest) is None
        assert run.too_large_for_cpu(case.graph, manifest)
        assert predict(case.graph, "h200", sdpa_bwd.COST_MODEL).predicted_s < full.per_case_seconds


@pytest.mark.parametrize("mend, message", [
    (lambda axes: axes[1:], "ragged axes: missing"),
    (lambda axes: axes + (axes[0],), "declared twice"),
    (lambda axes: (dataclasses.replace(axes[0], default="nope"),) + axes[1:], "is not one of its values"),
    # among the first pass's values (a later pass's values come last)
    (lambda axes: (dataclasses.replace(axes[0], values=axes[0].values[:1] + ("zz",) + axes[0].values[1:]),)
     + axes[1:], "has no entry in the plan's"),
])
def test_the_ragged_axes_meet_the_same_axis_rules(mend, message):
    from bundlegen.generator.checks import check_plan

    r = sdpa_bwd.PLAN.ragged
    with pytest.raises(PlanError, match=message):
        check_plan(dataclasses.replace(sdpa_bwd.PLAN, ragged=dataclasses.replace(r, axes=mend(r.axes))))


# ----------------------------------------------------------------------------- one record, two storages
def test_an_entry_takes_its_storage_and_default_group_from_its_specs():
    padded, ragged_spec = sdpa_bwd.PLAN.padded.catalog[0].specs[0], sdpa_bwd.RAGGED_CATALOG[0].specs[0]
    assert (padded.storage, ragged_spec.storage) == ("padded", "ragged")
    assert sdpa_bwd.RAGGED_CATALOG[0].group == "ragged-shapes" and sdpa_bwd.CATALOG[0].group == "shapes"
    assert {p.group for p in sdpa_bwd.RAGGED_PROBES} == {"ragged-probes"}
    with pytest.raises(ValueError, match="CatalogEntry SHP-MIXED: its specs must all be padded or all ragged"):
        sdpa_bwd.CatalogEntry("SHP-MIXED", "both", (padded, ragged_spec))


def _with_entries(padded=None, ragged_space=None):
    plan = sdpa_bwd.PLAN
    return dataclasses.replace(plan, padded=padded or plan.padded, ragged=ragged_space or plan.ragged)


def test_a_spec_in_the_other_storages_space_is_a_plan_error():
    plan = sdpa_bwd.PLAN
    ragged_entry = sdpa_bwd.RAGGED_CATALOG[0]
    with pytest.raises(PlanError, match=r"shape 'SHP-RAGGED-MAX-ABOVE-LONGEST'\[0\]: a ragged spec among the padded"):
        build(_with_entries(padded=dataclasses.replace(plan.padded, catalog=plan.padded.catalog + (ragged_entry,))))
    padded_entry = sdpa_bwd.CATALOG[0]
    with pytest.raises(PlanError, match=r"ragged shape 'SHP-S1'\[0\]: a padded spec in the ragged space"):
        build(_with_entries(ragged_space=dataclasses.replace(plan.ragged, catalog=plan.ragged.catalog + (padded_entry,))))
    with pytest.raises(PlanError, match="Plan.ragged: a space of storage 'padded', expected 'ragged'"):
        build(_with_entries(ragged_space=dataclasses.replace(plan.ragged, storage="padded")))


def test_a_ragged_spec_with_a_padded_only_field_is_a_plan_error():
    """Score modifiers and dropout are a ragged spec's too (SHP-RAGGED-MODIFIERS-ALL,
    SHP-RAGGED-DROPOUT); a stats layout is not (a ragged graph's stats follow its storage)."""
    spec = dataclasses.replace(sdpa_bwd.RAGGED_CATALOG[0].specs[0], stats_layout="s-major")
    entry = sdpa_bwd.CatalogEntry("SHP-RAGGED-TEST-DROPOUT", "a ragged spec with a stats layout", (spec,))
    space = dataclasses.replace(sdpa_bwd.RAGGED, catalog=sdpa_bwd.RAGGED_CATALOG + (entry,))
    with pytest.raises(PlanError, match=r"SHP-RAGGED-TEST-DROPOUT'\[0\]: a ragged spec has no stats layout"):
        build(_with_entries(ragged_space=space))
