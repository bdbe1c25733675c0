"""Issue 42's proofs: the risk triples (generator/risks.py), the layout-distinct proof
(generator/layout_distinct.py), the pair-suite passes that keep earlier case ids, and the
deterministic flag in the pair suites and at the CPU gate."""
from __future__ import annotations

import dataclasses
import itertools
import subprocess
import json

import pytest

from bundlegen import cost
from bundlegen.graph import dense_graph
from bundlegen.generator import build, build_default, layout_distinct, pairs, risks
from bundlegen.generator.expand import axis_item
from bundlegen.generator.generate import risk_proofs, risk_suites
from bundlegen.generator.legality import Legality
from bundlegen.plans import sdpa_bwd


@pytest.fixture(scope="module")
def generated():
    return build_default()


@pytest.fixture(scope="module")
def legality(generated):
    return Legality(generated.plan.padded)


@pytest.fixture(scope="module")
def suites(generated, legality):
    return risk_suites(generated.plan, legality)


# ----------------------------------------------------------------------------- risk triples
def test_risk_proof_holds_what_each_level_must(generated):
    by = {p.level: p for p in generated.risk_proofs}
    assert [by[lv].required for lv in ("quick", "pr", "nightly", "full")] == ["sample", "top", "every", "every"]
    assert all(p.complete for p in generated.risk_proofs)
    assert by["pr"].top_covered == by["pr"].top_total > 100
    assert by["nightly"].covered == by["nightly"].total > by["pr"].top_total
    assert 0 < by["quick"].top_covered < by["quick"].top_total


def test_risk_proof_fails_when_the_risk_cases_are_gone(generated, legality, suites):
    """Without the risk suites' cases the pair suites alone leave riskiest triples out."""
    kept = tuple(c for c in generated.cases if sdpa_bwd.RISKS.item not in c.items)
    proofs = risk_proofs(generated.plan, legality, kept, generated.combos, suites)
    by = {p.level: p for p in proofs}
    assert not by["pr"].complete and not by["nightly"].complete


def test_the_universe_is_exactly_the_legal_triples_of_risky_values(legality, suites):
    top, every = suites[0], suites[1]
    assert top < every
    r = sdpa_bwd.RISKS
    for t in itertools.islice(sorted(every), 0, None, 97):
        assert len({a for a, _v in t}) == 3 and all(v in r.values[a] for a, v in t)
        assert legality.complete(dict(t)) is not None
    # a triple no legal combination holds is not in it: qkv-interleaved shares one H
    illegal = (("heads", "gqa3"), ("layout", "qkv-interleaved"), ("batch", "b2"))
    assert legality.complete(dict(illegal)) is None and illegal not in every


def test_allpairspy_alone_leaves_triples_out_and_the_repairs_cover_them(legality):
    r = sdpa_bwd.RISKS
    every = risks.universe(legality, r, None)
    allowed = {}
    for p in sorted(legality.position[a] for a in r.values):
        axis = legality.space.axes[p]
        allowed[p] = [i for i, v in enumerate(axis.values) if v == axis.default or v in r.values[axis.name]]
    proposed = pairs.propose(legality, "test", allowed, n=3)
    held = set().union(*(risks.triples(legality, r, c) for c in proposed))
    missing = every - held
    assert missing, "allpairspy n=3 covered every triple: the repair step is untested"
    rows = risks.repair_rows(legality, r, missing)
    assert len(rows) < len(missing)            # several triples per repair row
    assert missing <= set().union(*(risks.triples(legality, r, c) for c in rows))


def test_a_triple_naming_a_layout_counts_only_where_the_layout_is_its_own(generated, legality, suites):
    """A case whose layout is another layout's memory does not hold the layout's triples."""
    r = sdpa_bwd.RISKS
    layout_triples = {t for t in suites[1] if any(a == "layout" for a, _v in t)}
    assert layout_triples
    # a second name for the mixed layout: every mixed case is now that layout's memory too
    plan = dataclasses.replace(generated.plan, layouts={**generated.plan.layouts,
                                                        "mixed-again": generated.plan.layouts["mixed"]})
    proofs = risk_proofs(plan, legality, generated.cases, generated.combos, suites)
    nightly = next(p for p in proofs if p.level == "nightly")
    assert nightly.missing and all(("layout", "mixed") in t for t in nightly.missing)


# ----------------------------------------------------------------------------- layouts
def test_storage_orders_at_b1_are_another_layouts_memory(generated):
    plan = generated.plan
    from bundlegen.generator.expand import graph_of
    from bundlegen.plans.records import Shape, Spec
    one = graph_of(plan, Spec(Shape(1, 2, 2, 2, 33, 33, 40, 40), layout="sbhd"))
    two = graph_of(plan, Spec(Shape(2, 2, 2, 2, 33, 33, 40, 40), layout="sbhd"))
    assert layout_distinct.same_memory_as(plan, one, "sbhd") == "bshd"
    assert layout_distinct.same_memory_as(plan, two, "sbhd") is None


def test_every_layout_is_proved_distinct_by_pr(generated):
    proof = generated.layout_proof
    names = [lv.name for lv in generated.plan.levels]
    assert proof.required_by == "pr" and proof.short(names) == []
    rows = {r.layout: r for r in proof.rows}
    assert set(rows) == set(generated.plan.layouts)
    assert rows["sbhd"].same_memory     # the B = 1 cases are there, and not counted


def test_the_layout_proof_fails_without_the_distinct_cases(generated):
    catalog = tuple(c for c in generated.plan.padded.catalog if c.item != "SHP-LAYOUT-DISTINCT")
    proof = layout_distinct.prove(generated.plan, [c for c in generated.cases if "SHP-LAYOUT-DISTINCT" not in c.items],
                                  [lv.name for lv in generated.plan.levels], "pr")
    short = proof.short([lv.name for lv in generated.plan.levels])
    assert any(line.startswith("hbsd:") for line in short) and len(catalog) < len(generated.plan.padded.catalog)


# ----------------------------------------------------------------------------- passes, determinism
def test_issue_42_leaves_every_checked_in_case_id_of_the_commit_before():
    """The pair suites' later pass adds rows only, the repairs are made pass by pass: every
    case of the bundles before issue 42 keeps its id (claims stay attached)."""
    before = subprocess.run(["git", "show", "a6bd9c9:bundles/sdpa_bwd.manifest.json"], capture_output=True,
                            text=True, cwd=sdpa_bwd.__file__.rsplit("/plans/", 1)[0])
    if before.returncode != 0:
        pytest.skip("the commit before issue 42 is not in this checkout")
    ids = set()
    for level in ("quick", "pr", "nightly", "full"):
        listing = subprocess.run(["git", "ls-tree", "--name-only", f"a6bd9c9:bundles/{level}/sdpa_bwd/"],
                                 capture_output=True, text=True, cwd=sdpa_bwd.__file__.rsplit("/plans/", 1)[0])
        for name in listing.stdout.split():
            text = subprocess.run(["git", "show", f"a6bd9c9:bundles/{level}/sdpa_bwd/{name}"], capture_output=True,
                                  text=True, cwd=sdpa_bwd.__file__.rsplit("/plans/", 1)[0]).stdout
            ids |= {c["id"] for c in json.loads(text)["cases"]}
    now = {c.id for c in build_default().cases}
    gone = sorted(ids - now)
    assert len(ids) == 3034 and not gone, f"{len(gone)} earlier cases are gone, e.g. {gone[:3]}"


def test_the_deterministic_flag_is_paired_at_pr(generated):
    at_pr = [c for c in generated.at_level("pr") if c.graph.attributes.deterministic_algorithm]
    items = set().union(*(set(c.items) for c in at_pr))
    plan = generated.plan
    for axis in ("heads", "mask", "bias", "dbias", "sinks", "softcap"):
        values = next(a.values for a in plan.padded.axes if a.name == axis)
        assert {axis_item(axis, v) for v in values} <= items, axis
    tiers = {c.graph.D_qk for c in at_pr}
    assert {64, 128, 192, 256} <= tiers
    assert any(c.graph.ragged is not None for c in at_pr)


def test_the_cpu_gate_runs_deterministic_cases_priced_at_their_runs(generated):
    quick = [c for c in generated.at_level("quick") if c.graph.attributes.deterministic_algorithm]
    assert len(quick) >= 2 and any(c.graph.ragged is None and c.graph.H_q > c.graph.H_k for c in quick)
    for c in quick:
        assert generated.cpu_seconds[c.id] <= generated.plan.cpu_case_limit_s   # the harness runs it on a CPU
        one = dataclasses.replace(c.graph, attributes=dataclasses.replace(c.graph.attributes,
                                                                          deterministic_algorithm=False))
        once = cost.predict(one, "cpu", generated.plan.cost_model).predicted_s
        # the cpu class's runs for the deterministic mode (requested_runs) are in its price
        assert generated.plan.cost_model["cpu"].requested_runs >= 2
        assert generated.cpu_seconds[c.id] > once


def test_more_fp16_at_quick_and_pr(generated):
    fp16 = {lv: sum(1 for c in generated.at_level(lv) if c.graph.dtype == "fp16" and c.purpose != "probe")
            for lv in ("quick", "pr")}
    assert fp16["quick"] >= 10 and fp16["pr"] >= 100, fp16   # 5 and 75 before issue 42


def test_risky_values_meet_before_nightly(generated):
    pr = [c.graph for c in generated.at_level("pr") if c.purpose != "probe" and c.graph.ragged is None]
    assert any(g.S_q == 512 and g.S_kv == 256 for g in pr) and any(g.S_q == 256 and g.S_kv == 512 for g in pr)
    assert any("sinks" in g.tensors and g.B >= 2 and g.S_q <= 4 for g in pr)
    quick = [c for c in generated.at_level("quick") if c.purpose != "probe" and c.graph.ragged is None]
    assert any(c.data.distribution == "shifted-logits" and c.graph.attributes.left_bound is not None
               and c.graph.attributes.right_bound not in (None, 0) and c.graph.S_kv % 64 == 32 for c in quick)


def test_a_later_value_must_come_after_the_earlier_ones():
    from bundlegen.generator import PlanError
    axes = tuple(dataclasses.replace(a, values_joined={a.values[1]: 2}) if a.name == "scale" else a
                 for a in sdpa_bwd.AXES)
    with pytest.raises(PlanError, match="later pass"):
        build(dataclasses.replace(sdpa_bwd.PLAN, padded=dataclasses.replace(sdpa_bwd.PLAN.padded, axes=axes)))
