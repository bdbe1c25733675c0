"""bundlegen tolerance-power: generic defect models applied to the oracle's own outputs,
judged by each case's bound (harness/tolerance_power.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bundlegen.graph import TensorSpec, dense_graph, with_modifiers
from bundlegen.harness import tolerance_power as TP
from bundlegen.harness.bundles import load_level
from bundlegen.tolerance import Tolerance
from bundlegen.workspace import default_bundle_root
from tests.graph_factory import make_case

#: bf16-r256's numbers, written out so a change of the plan's class shows here too
BF16_R256 = Tolerance(8 * 2.0 ** -8, 1e-5, "test")
CONTRIBUTION_MODELS = ("batch-dropped", "head-dropped", "key-tile-dropped", "row-shifted")


def _with_sinks(graph, H_q):
    tensors = dict(graph.tensors)
    tensors["sinks"] = TensorSpec((H_q,), (1,), "fp32")
    tensors["dsinks"] = TensorSpec((H_q,), (1,), "fp32")
    return dataclasses.replace(graph, tensors=tensors)


def _seen(power: TP.CasePower) -> dict[tuple[str, str], bool]:
    return {(r.output, r.model): r.seen for r in power.results}


def test_every_lost_contribution_is_outside_the_bound_of_a_small_case():
    graph = _with_sinks(dense_graph(B=2, H_q=4, H_k=2, S_q=40, S_kv=80, D_qk=32, dtype="bf16"), 4)
    seen = _seen(TP.case_power(make_case(graph, seed=3), BF16_R256))
    for output in ("dq", "dk", "dv", "dsinks"):
        for model in ("batch-dropped", "head-dropped"):
            assert seen[(output, model)], (output, model)
    for output in ("dq", "dk", "dv"):
        assert seen[(output, "key-tile-dropped")] and seen[(output, "row-shifted")], output


def test_a_loosened_bound_hides_every_model():
    """The check can fail: a bound 1000 times wider sees none of the models."""
    graph = _with_sinks(dense_graph(B=2, H_q=2, S_q=40, D_qk=32, dtype="bf16"), 2)
    loose = Tolerance(BF16_R256.rtol * 1000, BF16_R256.atol, "loosened")
    power = TP.case_power(make_case(graph, seed=3), loose)
    assert power.results and not any(r.seen for r in power.results)
    level = TP.level_power("test", [make_case(graph, seed=3)], lambda case: loose)
    assert set(level.invisible()) == {(r.output, r.model) for r in power.results}


def test_dsinks_bound_sees_a_missing_batch_with_random_gradients():
    """dSinks sums every row of every batch: a bound summed over those rows grew with them
    and hid one batch's share; the rows' quadrature does not."""
    graph = _with_sinks(dense_graph(B=2, H_q=2, S_q=64, D_qk=64, dtype="bf16"), 2)
    seen = _seen(TP.case_power(make_case(graph, seed=1), BF16_R256))
    assert seen[("dsinks", "batch-dropped")] and seen[("dsinks", "head-dropped")]


def test_a_bf16_sum_of_correlated_terms_is_seen_in_dv_and_dsinks():
    graph = _with_sinks(dense_graph(B=2, H_q=2, S_q=256, D_qk=64, dtype="bf16"), 2)
    seen = _seen(TP.case_power(make_case(graph, seed=1, distribution="l2-grad"),
                               Tolerance(10 * 2.0 ** -8, 1e-5, "bf16-r1k")))
    assert seen[("dv", "bf16-sum")] and seen[("dsinks", "bf16-sum")]


def test_models_act_on_what_the_oracle_computes(monkeypatch):
    """The recomputed terms must sum to the oracle's gradients: a wrong term is an error."""
    graph = dense_graph(B=1, H_q=2, S_q=24, D_qk=16, dtype="bf16")
    real = TP.terms_of

    def off_by_scale(case):
        terms, ref = real(case)
        return dataclasses.replace(terms, scale=terms.scale * 1.01), ref

    monkeypatch.setattr(TP, "terms_of", off_by_scale)
    with pytest.raises(AssertionError, match="do not sum to the oracle"):
        TP.case_power(make_case(graph), BF16_R256)


def test_a_bf16_running_sum_stagnates():
    """The bf16 accumulator (8 significant bits) stagnates: 128 + 0.5 rounds back to 128."""
    terms = torch.full((1024,), 0.5, dtype=torch.float64)
    assert float(TP.running_sum(terms.view(-1, 1), 0)) == 128.0


def test_quick_level_sample_sees_every_lost_contribution():
    """Over a sample of the checked-in quick cases, every contribution model that applies to
    an output is seen by some case."""
    loaded = load_level(default_bundle_root(), "quick")
    classes = loaded.manifest.tolerance_classes

    def tolerance_for(case):
        n = classes[case.tolerance_class]
        return Tolerance(n.rtol, n.atol, case.tolerance_class)

    power = TP.level_power("quick", TP.sample(loaded.cases, 12), tolerance_for)
    assert power.cases >= 10
    blind = [key for key in power.invisible() if key[1] in CONTRIBUTION_MODELS]
    assert blind == []
    lines = list(TP.report_lines([power]))
    assert lines[0].startswith("level quick:")


def test_sample_takes_reduced_outputs_first():
    loaded = load_level(default_bundle_root(), "quick")
    chosen = TP.sample(loaded.cases, 40)
    reduced = [c for c in loaded.cases if TP.eligible(c) and "dsinks" in c.graph.tensors]
    assert len(chosen) == 40 and all(TP.eligible(c) for c in chosen)
    assert reduced and set(c.id for c in reduced) <= set(c.id for c in chosen)
    assert len(TP.sample(loaded.cases, 8)) == 8


def test_a_bf16_sum_over_many_dbias_copies_is_seen_and_over_few_is_not():
    """dBias of a bias broadcast over batch and heads sums B x H copies; the bound adds them
    in quadrature, a bf16 running sum errs with the total: 4 copies hide it, 128 do not."""
    def seen(B, H):
        graph = with_modifiers(dense_graph(B=B, H_q=H, S_q=16, D_qk=16, dtype="bf16"),
                               bias="both", dbias=True)
        return _seen(TP.case_power(make_case(graph, seed=1, distribution="l2-grad"), BF16_R256))
    assert not seen(2, 2)[("dbias", "bf16-sum")]
    assert seen(8, 16)[("dbias", "bf16-sum")]


def test_sample_takes_each_outputs_longest_sum_and_correlated_gradients():
    loaded = load_level(default_bundle_root(), "quick")
    chosen = {c.id for c in TP.sample(loaded.cases, 40)}
    pool = [c for c in loaded.cases if TP.eligible(c)]
    for output in TP.OUTPUTS:
        longest = max(TP.longest_sum(c, output) for c in pool)
        assert any(TP.longest_sum(c, output) == longest for c in pool if c.id in chosen), output
    correlated = {c.id for c in pool if c.data.distribution in TP.CORRELATED_DISTRIBUTIONS}
    assert correlated and correlated <= chosen


def test_command_sees_every_model_of_every_output_at_quick_and_pr(capsys):
    """The default sample of quick and pr: every model some case applies, some case sees."""
    from bundlegen.cli import main

    rc = main(["tolerance-power", "--levels", "quick,pr"])
    out = capsys.readouterr().out
    assert "level quick: " in out and "level pr: " in out
    assert "no sampled case sees" not in out, out
    assert rc == 0
