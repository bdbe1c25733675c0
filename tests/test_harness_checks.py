"""Each check of a run catches the defect it exists for (bad engines from harness_support),
and a sound run passes them all."""
from __future__ import annotations

import math

import pytest
import torch

from bundlegen.harness import checks
from bundlegen.harness import verdicts as V
from bundlegen.harness.config import Tolerance
from bundlegen.harness.case import run_case
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
    numbers = dict(result.tolerance)
    assert numbers.pop("k") >= 1 and numbers.pop("floor") >= 0    # the row keeps its class's k and floor
    assert numbers == {"rtol": 0.05, "atol": 1e-3, "source": "(none) tolerance_overrides[0]"}
    assert result.statistical_margin >= 1
    assert result.oracle_s > 0 and result.engine_s > 0
    assert result.materialize_s > 0 and result.check_s > 0


def test_a_failed_check_still_records_every_phase():
    bad = outcome(S.WritesPastEnd, S.bad_case())
    assert bad.verdict == V.FAIL_GUARD
    assert all(x is not None and x >= 0 for x in (bad.oracle_s, bad.materialize_s, bad.engine_s, bad.check_s))


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


def _output_error_on_the_cpu(out, ref, mag, tol):
    """The rule as first written (every tensor on the CPU, boolean indexing): the device-side
    output_error must give the same record, bit for bit."""
    got = out.detach().to(device="cpu", dtype=torch.float64)
    ref = ref.to(device="cpu", dtype=torch.float64)
    nonfinite = int((~torch.isfinite(got) & torch.isfinite(ref)).sum())
    err = (got - ref).abs()
    bound = tol.atol + tol.rtol * mag.to(device="cpu", dtype=torch.float64)
    if nonfinite or torch.isnan(err).any():
        return checks.OutputError(max_abs_err=math.inf if nonfinite else float(err.nan_to_num(math.inf).max()),
                                  normalized_error=math.inf, margin=0.0, within=False, nonfinite=nonfinite)
    within = bool((err <= bound).all())
    wrong = err > 0
    if not bool(wrong.any()):
        return checks.OutputError(max_abs_err=0.0, normalized_error=0.0, margin=checks.MARGIN_CAP,
                                  within=True, nonfinite=0)
    margin = min(float((bound[wrong] / err[wrong]).min()), checks.MARGIN_CAP)
    return checks.OutputError(max_abs_err=float(err.max()),
                              normalized_error=1.0 / margin if margin > 0 else math.inf,
                              margin=margin, within=within, nonfinite=0)


def _same(a: checks.OutputError, b: checks.OutputError) -> bool:
    def key(e):
        return tuple(repr(float(x)) for x in (e.max_abs_err, e.normalized_error, e.margin)) + (e.within, e.nonfinite)
    return key(a) == key(b)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(40))
def test_output_error_matches_the_plain_cpu_rule(seed, device):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 300, (1,), generator=g))
    ref = torch.randn(n, dtype=torch.float64, generator=g) * 10 ** float(torch.randint(-3, 3, (1,), generator=g))
    mag = ref.abs() * (1 + torch.rand(n, dtype=torch.float64, generator=g))
    dtype = (torch.bfloat16, torch.float16, torch.float32)[seed % 3]
    out = ref.to(dtype)
    kind = seed % 8
    if kind == 1:  # a few large errors
        out[torch.randint(0, n, (3,), generator=g)] += 5
    elif kind == 2:
        out[n // 2] = math.nan
    elif kind == 3:
        out[0] = math.inf
    elif kind == 4:
        out = ref.to(torch.float32)  # nearly exact
    elif kind == 5:
        out = ref.clone()  # exact
    elif kind == 6:
        mag[: n // 2] = 0.0  # bound atol there
    elif kind == 7:
        ref = ref.clone()
        ref[-1] = math.inf  # a non-finite oracle value (never produced; still the same rule)
    tol = Tolerance(float(torch.rand(1, generator=g)) * 0.05, (0.0, 1e-5, 1e-3)[seed % 3], "t")
    want = _output_error_on_the_cpu(out, ref, mag, tol)
    got = checks.output_error(out.to(device), ref.to(device), mag.to(device), tol)
    assert _same(got, want), (got, want)


def test_output_error_of_an_empty_output_is_exact():
    empty = torch.zeros(0, dtype=torch.float64)
    e = checks.output_error(empty.to(torch.bfloat16), empty, empty, tol())
    assert _same(e, _output_error_on_the_cpu(empty.to(torch.bfloat16), empty, empty, tol()))


def test_judge_outputs_reads_every_port_like_output_error():
    g = torch.Generator().manual_seed(3)
    ref = {p: torch.randn(4, 5, dtype=torch.float64, generator=g) for p in ("dq", "dk", "dv")}
    reference = type("R", (), {**ref, **{f"mag_{p}": r.abs() + 0.1 for p, r in ref.items()}})
    outputs = {p: (r + 0.01 * torch.randn(4, 5, dtype=torch.float64, generator=g)).to(torch.bfloat16)
               for p, r in ref.items()}
    j = checks.judge_outputs(outputs, reference, tol(0.2, 1e-3))
    for p in ("dq", "dk", "dv"):
        assert _same(j.outputs[p], _output_error_on_the_cpu(outputs[p], ref[p], ref[p].abs() + 0.1,
                                                            tol(0.2, 1e-3)))


def test_differing_ports_compares_bits_shapes_and_dtypes():
    a = {"dq": torch.tensor([1.0, -0.0]), "dk": torch.tensor([float("nan")]), "dv": torch.zeros(3)}
    same = {p: t.clone() for p, t in a.items()}
    assert checks.differing_ports(a, same) == []
    b = dict(same, dq=torch.tensor([1.0, 0.0]), dv=torch.zeros(4))
    assert checks.differing_ports(a, b) == ["dq", "dv"]
    assert checks.differing_ports(a, dict(same, dk=torch.tensor([float("nan")], dtype=torch.float64))) == ["dk"]


def test_bitwise_equal_compares_bits():
    nan = torch.tensor([float("nan"), 1.0], dtype=torch.bfloat16)
    assert checks.bitwise_equal(nan, nan.clone())
    assert not checks.bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))


def test_memory_checks_come_in_order():
    assert checks.judge_memory(["dv"], ["k"])[0] == V.FAIL_GUARD
    assert checks.judge_memory([], ["k"])[0] == V.FAIL_INPUT_MODIFIED
    assert checks.judge_memory([], []) is None


def test_read_back_gives_each_tensor_its_values_in_order():
    groups = [torch.tensor([True, False]), torch.zeros(0), torch.tensor([3, 2**40], dtype=torch.int64),
              torch.tensor([[0.5]], dtype=torch.float64)]
    assert checks.read_back(groups) == [[1.0, 0.0], [], [3.0, float(2**40)], [0.5]]
    flags = {"q": torch.tensor(False), "k": torch.tensor(True)}
    assert checks.set_ports(flags, checks.read_back([checks.stacked(flags)])[0]) == ["k"]


def test_a_case_waits_for_its_device_once_and_reads_its_checks_back_once(monkeypatch):
    """Each device wait or read-back is a round trip that, on a GPU shared by several worker
    processes, also waits for the others' work: materialize waits once (the oracle is timed
    with events, not waits), and the first run's guard, input and tolerance checks are read
    back together."""
    from bundlegen.harness import materialize as M

    calls = {"wait": 0, "read_back": 0, "equal": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(M, "_sync", counted("wait", M._sync))
    monkeypatch.setattr(checks, "read_back", counted("read_back", checks.read_back))
    monkeypatch.setattr(torch, "equal", counted("equal", torch.equal))
    result = outcome(S.WritesNaN, S.case_of(), repeat=1)
    assert result.verdict == V.PASS, result
    assert calls == {"wait": 1, "read_back": 1, "equal": 0}
