"""`bundlegen calibrate`: the per-phase fit recovers known coefficients from synthetic
results, recalibrating from a recorded results file reports a fit within its target, and
--write edits only the intended numbers of the plan (adding an entry it lacks)."""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import random
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bundlegen.cost import CostCoefficients, phases, seconds, terms
from bundlegen.generator import calibrate as C
from bundlegen.generator import calibrate_write as W
from bundlegen.generator import calibrate_command
from bundlegen.plans.sdpa_bwd import COST_MODEL, LEVELS, PLAN_NAME
from bundlegen.workspace import builtin_bundle_root
from tests.graph_factory import make_case, make_graph

PLAN_FILE = Path(__file__).resolve().parents[1] / "plans" / "sdpa_bwd.py"
# three significant digits, so the rounded fit can equal them exactly
TRUE_H200 = CostCoefficients(engine_flops_per_s=187e12, oracle_flops_per_s=41.5e12,
                             bytes_per_s=20e9, overhead_s=0.0125, tile_s=2.5e-6, launch_s=0.001,
                             oracle_s=0.002, materialize_s=0.003, check_bytes_per_s=8e9,
                             rerun_s=0.0, check_s=0.004, drawn_bytes_per_s=3.2e9)
PRIOR = CostCoefficients(engine_flops_per_s=200e12, oracle_flops_per_s=50e12,
                         bytes_per_s=2e9, overhead_s=0.03, check_bytes_per_s=1e10)
#: a recorded results file (all four levels against torch-flash on an H200)
RECORDED = Path(__file__).resolve().parents[1] / "evidence" / "h200" / "torch-flash-full-2.results.jsonl.gz"


def synthetic_cases():
    """Graphs whose engine FLOPs, oracle FLOPs and io bytes vary independently:
    D_qk != D_v separates the two FLOP counts, padded row pitch adds bytes without FLOPs."""
    cases = []
    for i, (S, D_qk, D_v, pad) in enumerate([
            (128, 64, 64, 0), (256, 128, 64, 0), (512, 64, 128, 64), (1024, 128, 128, 0),
            (2048, 64, 32, 0), (384, 96, 192, 128), (4096, 128, 64, 32), (1536, 32, 128, 0),
            (64, 256, 16, 512), (768, 192, 192, 0)]):
        out_strides = {}
        if pad:
            out_strides = {"q": (2 * S * (D_qk + pad), S * (D_qk + pad), D_qk + pad, 1)}
        graph = make_graph(B=1, H_q=2, H_k=2, H_v=2, S_q=S, S_kv=S, D_qk=D_qk, D_v=D_v,
                           out_strides=out_strides)
        cases.append(make_case(graph, seed=i))
    return {c.id: c for c in cases}


def record(case_id, level, wall, *, arch="sm90", purpose="claim", engine_s=0.001, verdict="pass",
           split=None, runs=None):
    """A results record; `split`: its phases (bundlegen.cost.Phases), wall_s their total."""
    r = {"run_id": "r", "case_id": case_id, "level": level, "group": "g", "purpose": purpose,
         "items": [], "engine": "triton", "arch": arch, "device": "cuda", "verdict": verdict,
         "detail": "", "reason": None, "wall_s": wall, "oracle_s": 0.0 if engine_s else None,
         "engine_s": engine_s, "predicted_s": None, "runs": runs}
    if split is not None:
        r.update(wall_s=split.total, materialize_s=split.materialize_s, oracle_s=split.oracle_s,
                 engine_s=split.engine_s, check_s=split.check_s)
    return r


def timed(cid, level, graph, coeffs, scale=1.0):
    """A record of a case whose phases are the model's with `coeffs`, each times `scale`."""
    p = phases(terms(graph), coeffs)
    p = replace(p, **{f: getattr(p, f) * scale for f in ("materialize_s", "oracle_s", "engine_s",
                                                         "check_s", "overhead_s")})
    return record(cid, level, p.total, split=p)


def test_nnls_clamps_a_negative_least_squares_solution():
    A = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = torch.tensor([2.0, -1.0, 1.0])  # unconstrained solution (2, -1)
    assert torch.allclose(C.nnls(A, b), torch.tensor([1.5, 0.0], dtype=torch.float64))


def test_fit_recovers_known_coefficients():
    cases = synthetic_cases()
    records = [timed(cid, "pr", c.graph, TRUE_H200) for cid, c in cases.items()]
    records.append(record("other", "pr", 99.0, arch="cpu"))  # another device class: ignored
    samples = C.collect(records, cases, "h200")
    assert len(samples.executed) == len(cases) and samples.other_device == 1

    got = C.fit(samples.executed, PRIOR).coefficients
    for f in ("engine_flops_per_s", "oracle_flops_per_s", "bytes_per_s", "tile_s", "launch_s",
              "oracle_s", "materialize_s", "overhead_s"):
        assert getattr(got, f) == pytest.approx(getattr(TRUE_H200, f), rel=0.01), f
    (row,) = [r for r in C.level_errors(samples, PRIOR, got, ["pr"]) if r.level == "pr"]
    assert abs(row.after_error) < 0.01 < abs(row.before_error)


def test_fit_under_noise_predicts_the_measured_sums():
    """Engine and oracle FLOPs are nearly proportional (both scale with S_q S_kv D), but
    each phase is fitted to its own measured seconds, so under noise the rates hold too."""
    cases = synthetic_cases()
    rng = random.Random(7)
    records = [timed(cid, "pr", c.graph, TRUE_H200, rng.uniform(0.95, 1.05)) for cid, c in cases.items()]
    samples = C.collect(records, cases, "h200")
    got = C.fit(samples.executed, PRIOR).coefficients
    assert all(0 < getattr(got, f) < float("inf") for f in C.RATES)
    assert got.oracle_flops_per_s == pytest.approx(TRUE_H200.oracle_flops_per_s, rel=0.2)
    (row,) = [r for r in C.level_errors(samples, PRIOR, got, ["pr"]) if r.level == "pr"]
    assert abs(row.after_error) < 0.05 < abs(row.before_error)


def test_a_rate_the_data_does_not_resolve_keeps_the_plan_value():
    cases = synthetic_cases()
    no_engine_term = replace(TRUE_H200, engine_flops_per_s=float("inf"))
    records = [timed(cid, "pr", c.graph, no_engine_term) for cid, c in cases.items()]
    result = C.fit(C.collect(records, cases, "h200").executed, PRIOR)
    assert "engine_flops_per_s" in result.kept
    assert result.coefficients.engine_flops_per_s == PRIOR.engine_flops_per_s
    assert all(0 < getattr(result.coefficients, f) < float("inf") for f in C.RATES)


def test_several_runs_of_a_case_count_at_their_least():
    cases = synthetic_cases()
    cid, case = next(iter(cases.items()))
    cold = timed(cid, "pr", case.graph, TRUE_H200, 30.0)   # a cold compile inside the case
    warm = timed(cid, "pr", case.graph, TRUE_H200)
    (sample,) = C.collect([cold, warm], cases, "h200").executed
    assert sample.wall_s == warm["wall_s"] and sample.phases["engine_s"] == warm["engine_s"]


def test_recalibrating_from_a_recorded_results_file_reports_the_fit(capsys):
    """The H200 evidence of torch-flash: its own class fitted from that recorded file, the
    report gives per level the measured and predicted seconds, per phase, the per-case
    spread and the worst cases, and the fit meets its target."""
    assert run_command([str(RECORDED), "--device-class", "h200/torch-flash"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in {lv.name for lv in LEVELS} | {"total"}}
    assert set(rows) == {"quick", "pr", "nightly", "full", "total"}
    for level, row in rows.items():
        measured, fitted, error = float(row[2]), float(row[5]), float(row[6].rstrip("%")) / 100
        # both sums are printed to 0.01 s, the error to 0.1 %
        assert measured > 0 and error == pytest.approx((fitted - measured) / measured,
                                                       abs=0.01 / measured + 0.001)
        assert abs(error) <= C.TARGET_ERROR, row
    assert "target: every level within 25% of measured: met" in out
    spread = next(line for line in out.splitlines() if line.startswith("per executed case"))
    assert int(spread.split()[4].rstrip("%")) >= 90, spread
    assert re.search(r"phases, measured / fitted s: materialize [\d.]+ / [\d.]+, oracle", out)
    worst = out.split("worst:\n", 1)[1].splitlines()[:5]
    assert all(re.match(r"  [0-9a-f]{12} ", line) for line in worst), worst
    assert '"h200/torch-flash": CostCoefficients(' in out


def test_too_few_cases_is_an_error():
    cases = synthetic_cases()
    records = [record(cid, "pr", 1.0) for cid in list(cases)[:3]]
    with pytest.raises(C.CalibrationError, match="at least 4"):
        C.fit(C.collect(records, cases, "h200").executed, PRIOR)


def test_collect_sorts_probes_declines_and_unknown_cases():
    cases = synthetic_cases()
    cid = next(iter(cases))
    records = [record(cid, "quick", 0.5), record("p1", "quick", 0.002, purpose="probe", engine_s=None),
               record("d1", "quick", 0.001, engine_s=None, verdict="declined"),
               record("gone", "quick", 0.4)]
    s = C.collect(records, cases, "h200")
    assert [x.case_id for x in s.executed] == [cid]
    assert [x.case_id for x in s.probes] == ["p1"]
    assert [x.case_id for x in s.not_executed] == ["d1"]
    assert s.unmatched == 1


@pytest.mark.parametrize("value, text", [(187e12, "187e12"), (41.5e12, "41.5e12"), (3.2e9, "3.2e9"),
                                         (0.0125, "0.0125"), (2e9, "2e9"), (999.96, "1e3"),
                                         (0.03, "0.03"), (5.0, "5.0"), (0.0, "0.0"), (1234567.0, "1.23e6")])
def test_format_number(value, text):
    assert C.format_number(value) == text
    assert float(text) == C.round_significant(value)


# ----------------------------------------------------------------------------- the command
def plan_copy(tmp_path: Path) -> Path:
    path = tmp_path / "sdpa_bwd.py"
    shutil.copy(PLAN_FILE, path)
    return path


def workspace_with_plan(tmp_path: Path, monkeypatch) -> Path:
    """A workspace in tmp_path whose only plan is a copy of the built-in one (a module name
    of its own, so no other test's copy is found in sys.modules); cwd is the workspace."""
    module = "plan_" + re.sub(r"\W", "_", tmp_path.name)
    path = tmp_path / f"{module}.py"
    shutil.copy(PLAN_FILE, path)
    (tmp_path / "bundlegen.toml").write_text(f'plans = ["{module}"]\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    return path


def load_cost_model(path: Path):
    spec = importlib.util.spec_from_file_location("plan_copy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.COST_MODEL


def changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.ndiff(before.splitlines(), after.splitlines())
            if line.startswith(("- ", "+ "))]


def test_write_edits_only_the_numbers_of_one_entry(tmp_path):
    device_class, other = "h200", "cpu"
    path = plan_copy(tmp_path)
    before = path.read_text()
    original = load_cost_model(path)

    measured = replace(TRUE_H200, run_start_s=4.25)
    edits = W.write_coefficients(path, device_class, measured)
    after = path.read_text()
    assert [e.field for e in edits] == list(C.WRITTEN)
    assert load_cost_model(path)[device_class] == replace(measured, probe_s=original[device_class].probe_s)
    assert load_cost_model(path)[other] == original[other]

    removed = [line[2:] for line in changed_lines(before, after) if line.startswith("- ")]
    assert removed and f'"{device_class}"' in removed[0]
    # only the literals differ: put the old literals back and the file is what it was
    restored = after
    for e in edits:
        restored = restored.replace(f"{e.field}={e.new}", f"{e.field}={e.old}", 1)
    assert restored == before

    assert all(e.old == e.new for e in W.write_coefficients(path, device_class, measured))
    assert path.read_text() == after


def small_plan(path: Path, engine_rate: str) -> str:
    """A plan file whose COST_MODEL has one h200 entry of the first four fields."""
    text = ("from bundlegen.plans.records import CostCoefficients\nRATE = 1e12\nCOST_MODEL = {\n"
            f'    "h200": CostCoefficients(engine_flops_per_s={engine_rate}, oracle_flops_per_s=1e12,\n'
            "                             bytes_per_s=1e9, overhead_s=0.01),\n}\n")
    path.write_text(text)
    return text


def test_write_adds_an_entry_or_fields_the_plan_lacks(tmp_path):
    path = tmp_path / "plan.py"
    small_plan(path, "1e12")
    edits = W.write_coefficients(path, "h200", TRUE_H200)
    assert {e.field for e in edits if e.old == "absent"} == set(C.WRITTEN) - {
        "engine_flops_per_s", "oracle_flops_per_s", "bytes_per_s", "overhead_s"}
    W.write_coefficients(path, "cpu/torch-math", replace(TRUE_H200, ordinary_runs=2, requested_runs=3))
    model = load_cost_model(path)
    assert model["h200"] == TRUE_H200
    assert model["cpu/torch-math"] == replace(TRUE_H200, ordinary_runs=2, requested_runs=3)
    assert all(len(line) <= 120 for line in path.read_text().splitlines())


def test_write_refuses_an_entry_it_cannot_edit(tmp_path):
    path = tmp_path / "plan.py"
    small_plan(path, "2 * RATE")
    with pytest.raises(C.CalibrationError, match="engine_flops_per_s is not a number literal"):
        W.write_coefficients(path, "h200", TRUE_H200)
    path.write_text("COST_MODEL = dict(h200=None)\n")
    with pytest.raises(C.CalibrationError, match="COST_MODEL is not a dict literal"):
        W.write_coefficients(path, "cpu", TRUE_H200)
    assert path.read_text() == "COST_MODEL = dict(h200=None)\n"


def bundle_results(tmp_path: Path, coeffs: CostCoefficients) -> tuple[Path, dict]:
    """A results file whose executed cases are real bundle cases timed by `coeffs`."""
    cases = C.case_index(builtin_bundle_root(), PLAN_NAME)
    rows = []
    for case in cases.values():
        if case.purpose == "probe":
            rows.append(record(case.id, case.level, coeffs.probe_s, purpose="probe", engine_s=None))
        else:
            rows.append(timed(case.id, case.level, case.graph, coeffs))
    path = tmp_path / "run" / "results.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.parent, cases


def run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    calibrate_command.add_arguments(parser)
    return calibrate_command.main(parser.parse_args(argv))


def test_command_prints_per_level_error_and_writes_the_plan(tmp_path, capsys, monkeypatch):
    run_dir, _ = bundle_results(tmp_path, TRUE_H200)
    path = workspace_with_plan(tmp_path, monkeypatch)
    assert run_command([str(run_dir), "--device-class", "h200", "--write"]) == 0
    out = capsys.readouterr().out
    for level in LEVELS:
        row = next(line for line in out.splitlines() if line.startswith(level.name + " "))
        assert row.split()[-1] == "+0.0%", row     # fitted prediction matches exactly
    assert "target: every level within 25% of measured: met" in out
    # no run.json here: the run start is kept
    assert W.coefficient_block("h200", replace(TRUE_H200, run_start_s=COST_MODEL["h200"].run_start_s)) in out
    assert load_cost_model(path)["h200"].engine_flops_per_s == TRUE_H200.engine_flops_per_s


def run_json(run_dir: Path, outside_s: float, arch: str = "sm90") -> None:
    from bundlegen.harness.results import RUN_NAME, RunTimes, write_run_times

    write_run_times(run_dir / RUN_NAME, RunTimes(
        run_id="r", level="full", engine="triton", arch=arch, device="cuda", cases=3, start_s=outside_s,
        prepare_s=0.0, cases_s=10.0, finish_s=0.0, elapsed_s=10.0 + outside_s))


def test_run_start_is_the_median_time_outside_the_cases(tmp_path):
    runs = []
    for i, (outside, arch) in enumerate([(5.0, "sm90"), (9.0, "sm90"), (6.0, "sm90"), (1.0, "cpu")]):
        runs.append(tmp_path / f"run{i}")
        runs[-1].mkdir()
        run_json(runs[-1], outside, arch)
    runs.append(tmp_path / "no-run-json")
    assert C.run_starts(runs, "h200") == [5.0, 9.0, 6.0]
    assert C.fitted_run_start(C.run_starts(runs, "h200"), PRIOR) == 6.0
    assert C.fitted_run_start(C.run_starts(runs[:2], "h200"), PRIOR) == 7.0
    assert C.fitted_run_start([], replace(PRIOR, run_start_s=2.5)) == 2.5


def test_command_writes_the_measured_run_start(tmp_path, capsys, monkeypatch):
    run_dir, _ = bundle_results(tmp_path, TRUE_H200)
    run_json(run_dir, 4.25)
    path = workspace_with_plan(tmp_path, monkeypatch)
    assert run_command([str(run_dir), "--device-class", "h200", "--write"]) == 0
    assert "median of 1 run.json: 4.25" in capsys.readouterr().out
    assert load_cost_model(path)["h200"].run_start_s == 4.25


def test_write_refuses_a_plan_file_outside_the_workspace(tmp_path, capsys, monkeypatch):
    run_dir, _ = bundle_results(tmp_path, TRUE_H200)
    before = PLAN_FILE.read_bytes()
    (tmp_path / "bundlegen.toml").write_text('plans = ["bundlegen.plans.sdpa_bwd"]\n')
    monkeypatch.chdir(tmp_path)
    assert run_command([str(run_dir), "--device-class", "h200", "--write"]) == 2
    out = capsys.readouterr().out
    assert "lies outside the workspace" in out and len(out.strip().splitlines()) == 1
    assert PLAN_FILE.read_bytes() == before


def test_write_refuses_outside_any_workspace(tmp_path, capsys, monkeypatch):
    run_dir, _ = bundle_results(tmp_path, TRUE_H200)
    monkeypatch.chdir(tmp_path)
    assert run_command([str(run_dir), "--device-class", "h200", "--write"]) == 2
    assert "is not inside one" in capsys.readouterr().out
    assert run_command([str(run_dir), "--device-class", "h200"]) == 0   # fitting alone works anywhere


def test_command_without_results_file_exits_2(tmp_path, capsys):
    assert run_command([str(tmp_path / "missing.jsonl")]) == 2
    assert "no results file" in capsys.readouterr().out



def test_every_level_weighs_the_same():
    """Level 'quick' holds the small cases, measured 1.4x what the model says (a cost the
    model has no term for); 'full' holds the others. Weighted per level the fit shares the
    misfit and neither level is off by 25 %."""
    cases = synthetic_cases()
    by_size = sorted(cases, key=lambda cid: seconds(terms(cases[cid].graph), TRUE_H200))
    small, big = by_size[:5], by_size[5:]
    records = [timed(cid, "quick", cases[cid].graph, TRUE_H200, 1.4) for cid in small] + \
              [timed(cid, "full", cases[cid].graph, TRUE_H200) for cid in big]
    samples = C.collect(records, cases, "h200")
    got = C.fit(samples.executed, PRIOR).coefficients
    rows = {r.level: r for r in C.level_errors(samples, PRIOR, got, ["quick", "full"])}
    assert abs(rows["quick"].after_error) < 0.25
    assert abs(rows["full"].after_error) < 0.25
