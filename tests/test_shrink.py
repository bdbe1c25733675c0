"""`bundlegen shrink`: graph -> Spec recovery, the Regression text, the shrink loop with
plain judges (legality, order, fixpoint), and the command on a built-in mutant."""
from __future__ import annotations

import dataclasses
import re

import pytest

from bundlegen import ids
from bundlegen.cli import main
from bundlegen.harness.repro import find_case
from bundlegen.mutants.catalog import engine_target
from bundlegen.plans import sdpa_bwd
from bundlegen.plans.records import Spec, attr, stride
from bundlegen.workspace import default_bundle_root
from bundlegen.generator import shrink as S
from bundlegen.generator.declaration import evaluate, regression_text, spec_text
from bundlegen.generator.expand import graph_of
from bundlegen.generator.spec_recover import SpecNotFound, spec_of_graph

PLAN = sdpa_bwd.PLAN
_shape = sdpa_bwd._shape
#: built-in quick case of REG-ODD-ROW-PITCH: dO rows D + 1 apart, O packed (B=2, H=2, S=128)
DO_PAD1_CASE = "ff44e46ace3d"
DO_AS_O = engine_target("torch-math", "do-strides-as-o")


# ----------------------------------------------------------------------------- graph -> Spec
def test_every_built_in_case_that_runs_has_a_spec_that_builds_its_graph():
    from bundlegen.harness.bundles import load_level

    cases = [c for c in load_level(default_bundle_root(), "full").cases if c.expected_rejection is None]
    ragged = [c for c in cases if c.graph.ragged is not None]
    cases = [c for c in cases if c.graph.ragged is None]
    assert len(cases) > 700 and ragged
    with pytest.raises(SpecNotFound, match=f"case {ragged[0].id}: a ragged graph"):   # not shrunk yet
        spec_of_graph(PLAN, ragged[0].graph, ragged[0].data.distribution, ragged[0].id)
    for c in cases:
        spec = spec_of_graph(PLAN, c.graph, c.data.distribution, c.id, bias_values=c.data.bias_values)
        assert graph_of(PLAN, spec) == c.graph, c.id


def test_recovery_names_layouts_and_falls_back_to_mutations():
    spec = Spec(_shape(B=2, H=2, S=64), layout="bshd", mask="window-br", scale="custom",
                port_kinds={"do": "pad1"}, mutations=(stride("dq", 2, 200), attr("attn_scale", 0.07)))
    got = spec_of_graph(PLAN, graph_of(PLAN, spec), "randn")
    assert (got.layout, got.mask, got.port_kinds) == ("bshd", "window-br", {"do": "pad1"})
    assert (got.scale, got.mutations) == ("default", (stride("dq", 2, 200), attr("attn_scale", 0.07)))


@pytest.mark.parametrize("spec, names", [
    (Spec(_shape(B=2, H=2, S=24, D=16), dropout="p0.5", dropout_mask="head", deterministic="on"),
     ("p0.5", "head", "on", ())),
    (Spec(_shape(B=2, H=4, S=16, D=16), dropout="p0.9", dropout_mask="both"), ("p0.9", "both", "off", ())),
    (Spec(_shape(B=1, H=2, S=16, D=16), dropout="p0.1", dropout_mask="batch"), ("p0.1", "batch", "off", ())),
    (Spec(_shape(H=1, S=32, D=16), dropout="p0.1", dropout_mask="drawn"), ("p0.1", "drawn", "off", ())),
    (Spec(_shape(H=1, S=32, D=16), mutations=(attr("dropout_probability", 0.0),)),
     ("off", "full", "off", (attr("dropout_probability", 0.0),))),
    (Spec(_shape(B=2, H=2, S=16, D=16), dropout="p0.5", dropout_mask="both",
          mutations=(attr("dropout_probability", 0.3),)),
     ("p0.1", "both", "off", (attr("dropout_probability", 0.3),))),
])
def test_recovery_names_dropout_its_mask_kind_and_the_deterministic_flag(spec, names):
    got = spec_of_graph(PLAN, graph_of(PLAN, spec), "randn")
    assert (got.dropout, got.dropout_mask, got.deterministic, got.mutations) == names
    assert graph_of(PLAN, got) == graph_of(PLAN, spec)


def test_a_graph_no_spec_builds_is_refused_naming_the_case():
    graph = graph_of(PLAN, Spec(_shape()))
    odd = dataclasses.replace(graph, tensors={**graph.tensors,
                                              "q": dataclasses.replace(graph.tensors["q"], offset=3)})
    with pytest.raises(SpecNotFound, match=r"case c0ffee: port q: offset 3"):
        spec_of_graph(PLAN, odd, "randn", "c0ffee")


# ----------------------------------------------------------------------------- Spec -> text
@pytest.mark.parametrize("spec", [
    Spec(_shape(B=1, H=1, S=17, D=8)),
    Spec(_shape(B=2, H=4, H_k=2, H_v=1, S=65, S_kv=16, D=96, D_v=8), dtype="fp16", mask="causal-br",
         stats_layout="s-major", distribution="shifted-logits"),
    Spec(_shape(H=2, S=1, S_kv=64), port_kinds={"q": "bshd", "dq": "pad1"},
         mutations=(stride("q", 2, 1), attr("attn_scale", 1e-10))),
    Spec(_shape(B=2, H=2, S=24, D=16), dtype="fp32", dropout="p0.5", dropout_mask="head", deterministic="on"),
])
def test_the_regression_text_declares_the_same_graph(spec):
    text = regression_text("REG-X", "defect", "source", spec)
    regression = evaluate(text, sdpa_bwd)
    assert regression.item == "REG-X" and len(regression.specs) == 1
    assert graph_of(PLAN, regression.specs[0]) == graph_of(PLAN, spec)
    assert regression.specs[0].distribution == spec.distribution


def test_spec_text_writes_only_what_differs_from_defaults():
    assert spec_text(Spec(_shape(B=1, H=1, S=16, D=8, S_kv=1), port_kinds={"do": "pad1"})) == \
        'Spec(_shape(B=1, H=1, S=16, D=8, S_kv=1), port_kinds={"do": "pad1"})'


# ----------------------------------------------------------------------------- the loop
def _judge(fails):
    """A judge from a predicate on the candidate's graph: 'fail:numeric' or 'pass'."""
    seen = []

    def judge(case):
        seen.append(case)
        return "fail:numeric" if fails(case.graph) else "pass"
    judge.seen = seen
    return judge


def test_shrink_reaches_the_least_graph_that_still_fails_and_stops_there():
    start = Spec(_shape(B=3, H=8, H_k=2, S=200, D=128), layout="pad8", mask="window-br",
                 scale="custom", distribution="small-int")
    judge = _judge(lambda g: g.S_q >= 33 and g.H_q > g.H_k)   # a query tail past 32 and GQA
    result = S.shrink(PLAN, start, "fail:numeric", judge, item="REG-T")
    m = result.minimal
    assert (m.shape.B, m.shape.H_q, m.shape.H_k, m.shape.H_v) == (1, 2, 1, 1)
    assert (m.shape.S_q, m.shape.S_kv, m.shape.D_qk, m.shape.D_v) == (33, 1, 8, 8)
    assert (m.layout, m.mask, m.scale, m.distribution) == ("bhsd", "none", "default", "randn")
    assert result.runs == len(judge.seen)
    # every candidate was judged as the regression case the generator would write
    last = judge.seen[-1]
    assert last.purpose == "regression" and last.id == ids.case_id("regression", last.graph, "randn", None)
    assert last.data.seed == ids.seed_of(last.id)
    assert result.case.id == ids.case_id("regression", result.graph, "randn", None)
    again = S.shrink(PLAN, start, "fail:numeric", _judge(lambda g: g.S_q >= 33 and g.H_q > g.H_k), item="REG-T")
    assert [s.move for s in again.steps] == [s.move for s in result.steps]   # deterministic


def test_shrink_keeps_what_the_failure_needs_and_stays_legal():
    # a zero batch stride on K and V: the plan's rule wants B >= 2 with that layout
    start = Spec(_shape(B=3, H=2, S=64), layout="bcast-kv-batch")
    judge = _judge(lambda g: g.tensors["k"].strides[0] == 0)
    result = S.shrink(PLAN, start, "fail:numeric", judge, item="REG-T")
    assert result.minimal.layout == "bcast-kv-batch" and result.minimal.shape.B == 2
    assert all(S.legality_problem(PLAN, s.spec) is None for s in result.steps)
    assert all(c.graph.B >= 2 for c in judge.seen)      # B = 1 was never even run


def test_a_candidate_with_another_verdict_class_is_not_taken():
    def judge(case):     # small sequences fail too, but another way
        return "fail:nan" if case.graph.S_q < 33 else "fail:numeric"
    result = S.shrink(PLAN, Spec(_shape(S=128)), "fail:numeric", judge, item="REG-T")
    assert result.minimal.shape.S_q == 33 and result.verdict == "fail:numeric"
    assert all(step.graph.S_q >= 33 for step in result.steps)


def test_legality_problem_names_the_rule_and_the_frontend_reason():
    assert S.legality_problem(PLAN, Spec(_shape(B=1), layout="bcast-kv-batch")) == \
        "breaks rule batch-broadcast-needs-batch"
    assert S.legality_problem(PLAN, Spec(_shape(), mutations=(stride("dq", 2, 1),))) == "overlapping-output"
    assert S.legality_problem(PLAN, Spec(_shape(S=17), layout="qkv-interleaved")) is None


def test_a_start_that_does_not_fail_under_its_regression_seed_is_reported():
    with pytest.raises(S.NotReproduced, match="does not give fail:numeric"):
        S.shrink(PLAN, Spec(_shape()), "fail:numeric", _judge(lambda g: False), item="REG-T")


@pytest.mark.parametrize("s, want", [(200, [1, 8, 16, 17, 32, 33, 64, 65, 72, 100, 101, 199]),
                                     (17, [1, 8, 9, 16]), (1, [])])
def test_sequence_candidates_keep_tails(s, want):
    assert S.smaller_seqs(s) == want


# ----------------------------------------------------------------------------- the command
def test_shrink_of_a_mutant_ends_at_b1_h1_s64_with_the_same_verdict(capsys):
    assert main(["shrink", DO_PAD1_CASE, "--engine", DO_AS_O]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    verdict = first.rsplit(": ", 1)[1]
    assert verdict.startswith("fail:")
    minimal = re.search(r"^minimal: (.*)$", out, re.M).group(1)
    sizes = dict(re.findall(r"\b(B|H_q|H_k|H_v|S_q|S_kv|D)=(\d+)", minimal))
    assert sizes["B"] == "1" and sizes["H_q"] == "1" and "H_k" not in sizes
    assert int(sizes["S_q"]) <= 64 and int(sizes.get("S_kv", sizes["S_q"])) <= 64
    assert "do=[" in minimal       # dO's padded rows are what the mutant misreads: kept
    steps = [line for line in out.splitlines() if line.startswith("  ")]
    assert steps and all(line.split()[-4] == verdict for line in steps if "(engine runs" in line)
    runs = int(re.search(r"steps accepted, (\d+) engine runs", out).group(1))
    assert runs > len(steps)
    # the printed declaration builds the minimal graph, whose case id is the one printed,
    # and that case still fails the mutant the same way
    text = out.split("REGRESSIONS:\n")[1]
    regression = evaluate(text, sdpa_bwd)
    (spec,) = regression.specs
    case_id = re.search(r"^case id: (\w+)", out, re.M).group(1)
    assert ids.case_id("regression", graph_of(PLAN, spec), spec.distribution, None) == case_id
    from bundlegen.harness.repro import open_runner
    runner = open_runner(DO_AS_O, claims=False)
    assert runner.verdict(S.regression_case(PLAN, spec, regression.item)).verdict == verdict


@pytest.mark.parametrize("argv, message", [
    (["shrink", "zzzz", "--engine", "torch-math"], "error: case zzzz: no case with this id"),
    (["shrink", DO_PAD1_CASE, "--engine", "no-such-engine"], "error: unknown engine 'no-such-engine'"),
    (["shrink", DO_PAD1_CASE, "--engine", "torch-math"], f"error: case {DO_PAD1_CASE}: pass on torch-math"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_probes_are_not_shrunk(capsys):
    probe = next(c for c in _quick_cases() if c.expected_rejection is not None)
    assert main(["shrink", probe.id, "--engine", "torch-math"]) == 2
    assert "a probe is never run" in capsys.readouterr().err


def _quick_cases():
    from bundlegen.harness.bundles import load_level
    return load_level(default_bundle_root(), "quick").cases


def test_find_case_sees_every_level():
    from bundlegen.harness.bundles import load_level
    full_only = next(c for c in load_level(default_bundle_root(), "full").cases if c.level == "full")
    assert find_case(full_only.id).level == "full"


def test_shrink_keeps_the_mask_and_the_key_count_a_triton_mask_defect_needs(capsys):
    # REG-BR-SQ-GT-SKV (S_q = 200, S_kv = 64, window-br) against the diagonal aligned top-left:
    # one query row and two keys under causal-br is the least graph where the two differ
    case = "7e236aa154af"
    assert main(["shrink", case, "--engine", engine_target("triton", "top-left-for-bottom-right")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(": fail:numeric")
    assert "mask window-br -> causal-br" in out
    assert ("minimal: bf16 B=1 H_q=1 S_q=1 S_kv=2 D=8 scale=0.353553 (default) "
            "mask=BOTTOM_RIGHT left=None right=0 |") in out
    assert '(Spec(_shape(B=1, H=1, S=1, D=8, S_kv=2), mask="causal-br"),)),' in out
