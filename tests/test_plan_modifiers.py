"""The plan's score modifiers (issue 19): gates lifted, softcap declared, modifier cases at
quick, pr and nightly (quick's small), the extension axes leave every earlier case's id as
it was, ALiBi data in the case, the tolerance class counts dBias and dSinks sums, and a
modifier case's Spec is recovered from its graph (shrink)."""
from __future__ import annotations

import dataclasses

import pytest

from bundlegen.generator import build, build_default
from bundlegen.generator.expand import graph_of
from bundlegen.generator.ragged import item as ragged_item
from bundlegen.generator.report import render as render_report
from bundlegen.generator.spec_recover import spec_of_graph
from bundlegen.graph import dense_graph, with_modifiers
from bundlegen.plans import sdpa_bwd
from bundlegen.plans.records import Spec

MODIFIER_AXES = ("bias", "dbias", "sinks", "softcap")


@pytest.fixture(scope="module")
def generated():
    return build_default()


def test_gates_are_lifted_and_softcap_items_declared(generated):
    gated = {g.item for g in sdpa_bwd.GATED}
    assert not {"GATE-BIAS", "GATE-DBIAS", "GATE-SINKS"} & gated
    for item in ("AX-SOFTCAP-CAP30", "AX-SOFTCAP-CAP5", "AX-BIAS-ALIBI", "AX-DBIAS-ON", "AX-SINKS-ON",
                 "SHP-SOFTCAP-GEMMA", "PRB-SOFTCAP-ZERO", "PRB-DBIAS-OVERLAP"):
        assert item in generated.items, item
    report = render_report(generated)
    assert "GATE-BIAS" not in report and "GATE-SINKS" not in report and "GATE-DBIAS" not in report


def _uses(case, modifier):
    return modifier in case.graph.modifiers


@pytest.mark.parametrize("level", ["quick", "pr", "nightly"])
@pytest.mark.parametrize("modifier", ["bias", "dbias", "sinks", "softcap"])
def test_each_modifier_has_claim_cases_at_each_level(generated, level, modifier):
    cases = [c for c in generated.cases if c.level == level and c.purpose == "claim" and _uses(c, modifier)]
    assert cases, (level, modifier)


def _longest(focus, axis) -> int:
    """The longest sequence of the lengths a focused-pairs declaration names (or the axis default)."""
    names = {axis.default, *focus.subjects.get(axis.name, ()), *focus.partners.get(axis.name, ())}
    if axis.name == "seq":
        return max(max(sdpa_bwd.SEQS[n].S_q, sdpa_bwd.SEQS[n].S_kv) for n in names)
    return max(max(*sdpa_bwd.RAGGED_LENGTHS[n].q, *sdpa_bwd.RAGGED_LENGTHS[n].kv_lengths) for n in names)


def test_quick_modifier_cases_are_small(generated):
    """Quick's modifier cases of the value suites and shapes are few and small; the focused
    rows at quick (issue 58: the newest values pairwise) are no longer than the lengths their
    declaration names (a rule may complete a row with other, legal lengths), and D stays within 64."""
    quick = [c for c in generated.cases if c.level == "quick" and c.purpose != "probe" and c.graph.modifiers]
    focus = {f.item: f for f in sdpa_bwd.FOCUS if f.level == "quick"}
    rows = [c for c in quick if set(c.items) & set(focus)]
    others = [c for c in quick if c not in rows]
    padded = [c for c in others if c.graph.ragged is None]
    # ragged: one per modifiers value
    assert 5 <= len(padded) <= 20 and len(others) - len(padded) <= len(sdpa_bwd.RAGGED_MODIFIER_SETS)
    for c in others:
        assert c.graph.S_q <= 128 and c.graph.S_kv <= 128, c.id
    assert rows
    lengths = {False: next(a for a in sdpa_bwd.AXES if a.name == "seq"),
               True: next(a for a in sdpa_bwd.RAGGED_AXES if a.name == "lengths")}
    for c in rows:
        f, = (focus[i] for i in c.items if i in focus)
        assert max(c.graph.S_q, c.graph.S_kv) <= _longest(f, lengths[c.graph.ragged is not None]), c.id
    for c in quick:
        assert c.graph.D_qk <= 64, c.id


def test_alibi_cases_carry_their_bias_values(generated):
    alibi = [c for c in generated.cases if "AX-BIAS-ALIBI" in c.items]
    assert alibi and all(c.data.bias_values == "alibi" for c in alibi)
    assert all(c.graph.tensors["bias"].strides[0] == 0 for c in alibi)
    assert all(c.data.bias_values == "randn" for c in generated.cases if "bias" not in c.graph.tensors)


def test_the_extension_axes_leave_earlier_cases_as_they_were(generated):
    """The plan without the modifier axes builds a subset of today's cases: every earlier
    case (pair rows included) keeps its id, so claims stay attached to them."""
    # the plan before the modifiers and before what later passes added (Axis.values_joined,
    # the deterministic axis): those only add rows
    first = tuple(dataclasses.replace(a, values=tuple(v for v in a.values if a.value_pass(v) == 0), values_joined={})
                  for a in sdpa_bwd.AXES if a.name not in MODIFIER_AXES and a.pass_joined == 0)
    axes = first + tuple(dataclasses.replace(a, values=(a.default,)) for a in sdpa_bwd.AXES if a.name in MODIFIER_AXES)
    known = {a.name: set(a.values) for a in axes}
    rules = tuple(dataclasses.replace(r, require={ax: tuple(v for v in vals if v in known[ax])
                                                  for ax, vals in r.require.items()})
                  for r in sdpa_bwd.RULES if not set(r.axes) & set(MODIFIER_AXES) and set(r.axes) <= set(known)
                  and all(set(vals) <= known[ax] for ax, vals in r.when.items()))
    catalog = tuple(c for c in sdpa_bwd.PLAN.padded.catalog if c not in sdpa_bwd.MODIFIER_CATALOG)
    probes = tuple(p for p in sdpa_bwd.PLAN.padded.probes if p not in sdpa_bwd.MODIFIER_PROBES)
    before = build(dataclasses.replace(sdpa_bwd.PLAN, padded=dataclasses.replace(
        sdpa_bwd.PLAN.padded, axes=axes, rules=rules, catalog=catalog, probes=probes), risks=None, focus=(),
        ragged=None))     # the padded space's earlier cases (a quick focus row stands in for a ragged value's case)
    now = {c.id for c in generated.cases}
    missing = [c.id for c in before.cases if c.id not in now]
    assert not missing, f"{len(missing)} earlier cases changed id, e.g. {missing[:3]}"
    assert len(now) > len(before.cases)


def test_tolerance_class_counts_the_dbias_and_dsinks_sums():
    base = dense_graph(B=3, H_q=32, S_q=60, D_qk=16, dtype="bf16")
    assert sdpa_bwd.longest_reduction(base) == 60
    assert sdpa_bwd.longest_reduction(with_modifiers(base, bias="both", dbias=True)) == 96
    assert sdpa_bwd.longest_reduction(with_modifiers(base, bias="head", dbias=True)) == 60
    assert sdpa_bwd.longest_reduction(with_modifiers(base, bias="full", dbias=True)) == 60
    assert sdpa_bwd.longest_reduction(with_modifiers(base, sinks=True, dsinks=True)) == 180
    assert sdpa_bwd.longest_reduction(with_modifiers(base, sinks=True)) == 60


def test_a_modifier_case_spec_is_recovered_from_its_graph(generated):
    cases = [c for c in generated.cases if c.graph.modifiers and c.purpose == "claim" and c.graph.ragged is None][:40]
    cases += [c for c in generated.cases if "alibi_slopes" in c.graph.tensors and c.graph.ragged is None
              and c.purpose == "claim"]
    assert any(c.data.bias_values == "alibi" for c in generated.cases if c.graph.modifiers)
    for c in cases + [c for c in generated.cases if c.data.bias_values == "alibi"][:3]:
        spec = spec_of_graph(sdpa_bwd.PLAN, c.graph, c.data.distribution, c.id, bias_values=c.data.bias_values)
        assert graph_of(sdpa_bwd.PLAN, spec) == c.graph


def test_the_report_names_the_values_later_passes_added(generated):
    """The ragged modifiers axis joined a later pass, two of its values a pass after it: the
    dry-run report lists each value under the pass it joined, below the pair proofs that hold them."""
    lines = render_report(generated).splitlines()
    axis = next(a for a in sdpa_bwd.RAGGED_AXES if a.name == "modifiers")
    passes = sorted({axis.value_pass(v) for v in axis.values})
    assert len(passes) > 1
    for joined in passes:
        later = [ln for ln in lines if ln.startswith(f"  ragged pass {joined} added: ")]
        at = lines.index(later[0]) if later else 0
        folded = [later[0], *(ln for ln in lines[at + 1:at + 6] if ln.startswith("      "))] if later else []
        named = [part.strip() for part in " ".join(" ".join(folded).split()).split(";")]
        values = ", ".join(v for v in axis.values if axis.value_pass(v) == joined)
        assert later and "modifiers=" + values in [p.split(": ", 1)[-1] for p in named], (joined, named)
    proof = [ln for ln in lines if ln.startswith("  pr: ragged all-pairs (core axes): ")]
    assert proof and "MISSING" not in proof[0]


def test_ragged_modifier_cases_pair_with_every_core_value(generated):
    """By pr, every ragged modifiers value meets every value of the other core ragged axes."""
    core = [a for a in sdpa_bwd.RAGGED_AXES if a.core and a.name != "modifiers"]
    pr = [c for c in generated.cases if c.level in ("quick", "pr") and c.graph.ragged is not None]
    for value in sdpa_bwd.RAGGED_MODIFIER_SETS:
        item = ragged_item("modifiers", value)
        held = {i for c in pr if item in c.items for i in c.items}
        for axis in core:
            for v in axis.values:
                other = ragged_item(axis.name, v)
                assert other in held, (item, other)
