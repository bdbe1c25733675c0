"""Each check of a run catches the defect it exists for (bad engines from harness_support),
and a sound run passes them all."""
from __future__ import annotations

import math

import pytest
import torch

from harness import checks
from harness import verdicts as V
from harness.config import Tolerance
from harness.run import run_case
from tests import harness_support as S

PADDED_DV = {"dv": (12 * 11, 12 * 11, 11, 1)}  # [1, 1, 12, 8] with a row pitch of 11


def outcome(engine_cls, case, repeat=None):
    return run_case(case, engine_cls("cpu"), S.LOOSE, repeat)


@pytest.mark.parametrize("engine_cls, graph, verdict, port", [
    (S.WritesPastEnd, {}, V.FAIL_GUARD, "dv"),
    (S.WritesBeforeStart, {}, V.FAIL_GUARD, "dv"),
    (S.WritesIntoGap, {"out_strides": PADDED_DV}, V.FAIL_GUARD, "dv"),
    (S.ModifiesInput, {}, V.FAIL_INPUT_MODIFIED, "k"),
    (S.WritesNaN, {}, V.FAIL_NAN, "dq"),
    (S.WritesWrongValue, {}, V.FAIL_NUMERIC, "dk"),
    (S.Noisy, {}, V.FAIL_NONDETERMINISTIC, "dv"),
])
def test_each_defect_gets_its_verdict(engine_cls, graph, verdict, port):
    bad = outcome(engine_cls, S.bad_case(**graph))
    assert bad.verdict == verdict, bad
    assert port in bad.detail
    good = outcome(engine_cls, S.case_of(**graph))  # the same engine on a graph it gets right
    assert good.verdict == V.PASS, good


def test_padded_output_passes_when_only_rows_are_written():
    result = outcome(S.WritesIntoGap, S.case_of(out_strides=PADDED_DV))
    assert result.verdict == V.PASS and result.margin > 1


def test_nondeterminism_needs_a_repeat():
    assert outcome(S.Noisy, S.bad_case(), repeat=1).verdict == V.PASS


def test_nondeterministic_engine_is_not_held_to_bitwise_equality():
    class DeclaredNondeterministic(S.Noisy):
        deterministic = False
    assert outcome(DeclaredNondeterministic, S.bad_case()).verdict == V.PASS


def test_pass_records_errors_margins_and_timings():
    result = outcome(S.WritesNaN, S.case_of())
    assert set(result.outputs) == {"dq", "dk", "dv"}
    margins = [o["margin"] for o in result.outputs.values()]
    assert result.margin == min(margins) and result.margin > 1
    for o in result.outputs.values():
        assert math.isclose(o["normalized_error"], 1 / o["margin"])
    assert result.tolerance == {"rtol": 0.05, "atol": 1e-3, "source": "(none) tolerance_overrides[0]"}
    assert result.oracle_s > 0 and result.engine_s > 0


# ----------------------------------------------------------------------------- units
def tol(rtol=0.1, atol=0.0):
    return Tolerance(rtol, atol, "test")


def test_output_error_bound_is_atol_plus_rtol_times_magnitude():
    ref = torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
    mag = torch.tensor([10.0, 2.0, 0.0], dtype=torch.float64)
    # bounds: 1.0, 0.2, 0.0 -> errors 0.5, 0.1, 0 -> margins 2, 2, (exact)
    ok = checks.output_error(torch.tensor([1.5, -2.1, 0.0]), ref, mag, tol())
    assert ok.within and math.isclose(ok.margin, 2.0, rel_tol=1e-5)
    bad = checks.output_error(torch.tensor([1.0, -2.0, 1e-3]), ref, mag, tol())  # bound 0 there
    assert not bad.within and bad.margin == 0.0
    exact = checks.output_error(ref.clone(), ref, mag, tol())
    assert exact.margin == checks.MARGIN_CAP and exact.normalized_error == 0.0


def test_output_error_nonfinite_only_where_reference_is_finite():
    ref = torch.zeros(4, dtype=torch.float64)
    got = torch.tensor([0.0, float("nan"), float("inf"), 0.0])
    e = checks.output_error(got, ref, ref.abs(), tol(atol=1.0))
    assert e.nonfinite == 2 and not e.within
    assert e.to_json() == {"max_abs_err": None, "normalized_error": None, "margin": 0.0}


def test_bitwise_equal_compares_bits():
    nan = torch.tensor([float("nan"), 1.0], dtype=torch.bfloat16)
    assert checks.bitwise_equal(nan, nan.clone())
    assert not checks.bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))


def test_memory_checks_come_in_order():
    assert checks.judge_memory(["dv"], ["k"])[0] == V.FAIL_GUARD
    assert checks.judge_memory([], ["k"])[0] == V.FAIL_INPUT_MODIFIED
    assert checks.judge_memory([], []) is None
