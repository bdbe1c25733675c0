"""bench/harness_throughput.py: the CPU smoke mode runs its whole plan (one worker, N
workers on one device, several devices) and writes its JSON; the target lines judge the
runs that answer each target."""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "bench"))

import harness_throughput as HT  # noqa: E402

#: eight of quick's cases: the smoke runs show the code path, which more cases show no better
A_FEW = "shapes and AX-DTYPE-FP16"


def _run(label, level, elapsed, devices="cuda:0", workers=1, oracle_s=0.0, cases=10, prepare_s=None, code=0):
    stats = (HT.LevelStats(level=level, cases=cases, executed=cases, wall_s=elapsed, oracle_s=oracle_s,
                           engine_s=0.0, predicted_s=0.0),)
    return HT.RunStats(label, level, elapsed, code, stats, "x/results.jsonl", devices=devices,
                       workers=workers, prepare_s=prepare_s)


def test_the_plan_runs_cold_first_then_the_target_runs_then_one_worker():
    args = HT.parse_args(["--device", "cuda:0", "--devices", "cuda:0,cuda:1", "--workers", "4"])
    assert HT.plan_runs(args) == [
        ("cold", "full", ["cuda:0"], 4),
        ("warm", "quick", ["cuda:0"], 4), ("warm", "quick", ["cuda:0", "cuda:1"], 4),
        ("warm", "quick", ["cuda:0"], 1),
        ("warm", "full", ["cuda:0"], 4), ("warm", "full", ["cuda:0", "cuda:1"], 4),
        ("warm", "full", ["cuda:0"], 1)]
    no_reference = HT.parse_args(["--workers", "4", "--no-cold", "--no-one-worker", "--levels", "pr"])
    assert HT.plan_runs(no_reference) == [("warm", "pr", ["cuda"], 4)]
    no_cold = HT.parse_args(["--workers", "1", "--no-cold", "--levels", "pr"])
    assert HT.plan_runs(no_cold) == [("warm", "pr", ["cuda"], 1)]
    # --no-cold on an empty cache: an untimed fill run first, so the warm runs are warm
    assert HT.plan_runs(no_cold, cache_filled=False) == [("fill", "pr", ["cuda"], 1),
                                                          ("warm", "pr", ["cuda"], 1)]


def test_targets_are_judged_on_the_best_run_that_answers_each():
    runs = [_run("cold", "full", 50.0, workers=4, prepare_s=30.0),
            _run("warm", "quick", 4.0), _run("warm", "quick", 2.5, workers=4),
            _run("warm", "full", 30.0, oracle_s=6.0), _run("warm", "full", 11.0, workers=4),
            _run("warm", "full", 9.0, devices="cuda:0,cuda:1", workers=4)]
    lines = "\n".join(HT.target_lines(runs))
    assert "one GPU, warm, all four levels: 11.0 s (cuda:0, 4 worker(s) each) -- target < 12 s: met" in lines
    assert "one GPU, warm, quick alone: 2.5 s" in lines and "< 3 s: met" in lines
    assert "several GPUs, warm, all four levels: 9.0 s" in lines and "< 8 s: NOT met" in lines
    assert "oracle share, one worker, all four levels: 20.0% -- target < 30%: met" in lines
    assert "cold cache, all four levels: 50.0 s" in lines and "< 45 s: NOT met" in lines
    unjudged = "\n".join(HT.target_lines(runs, judged=False))
    assert " met" not in unjudged.replace("not judged", "")


def test_a_failed_run_is_not_a_timing():
    lines = HT.target_lines([_run("warm", "full", 5.0, code=2)])
    assert not any("-- target" in line for line in lines) and "WARNING" in lines[-1]


def test_the_cpu_smoke_mode_runs_its_whole_plan(tmp_path):
    out = tmp_path / "t.json"
    code = HT.main(["--device", "cpu", "--engine", "torch-math", "--levels", "quick", "-k", A_FEW,
                    "--workers", "2", "--devices", "cpu,cpu", "--no-cold", "--runs-dir", str(tmp_path / "runs"),
                    "--out", str(out)])
    data = json.loads(out.read_text())
    assert code == 0
    got = [(r["devices"], r["workers"], r["exit_code"]) for r in data["runs"]]
    assert got == [("cpu", 2, 0), ("cpu,cpu", 2, 0), ("cpu", 1, 0)]
    executed = {r["executed"] for r in data["runs"]}
    assert len(executed) == 1 and executed.pop() > 0
    assert [sum(v["cases"] for v in r["split"].values()) for r in data["runs"]] == [r["cases"] for r in data["runs"]]
    assert data["runs"][0]["split"]["cpu"]["workers"] == 2
    assert any("quick alone" in line and "not judged" in line for line in data["targets"])


def test_the_server_mode_times_the_warm_runs_through_pre_started_workers(tmp_path, capsys):
    out = tmp_path / "t.json"
    code = HT.main(["--device", "cpu", "--engine", "torch-math", "--levels", "quick", "-k", A_FEW,
                    "--workers", "1", "--no-cold", "--server", "--runs-dir", str(tmp_path / "runs"),
                    "--out", str(out)])
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["label"], r["exit_code"]) for r in runs] == [("warm", 0), ("served", 0)]
    assert runs[0]["served_by"] is None and runs[1]["served_by"]["pid"] > 0
    assert runs[0]["executed"] == runs[1]["executed"] > 0
    printed = capsys.readouterr().out
    assert "workers pre-started by `bundlegen serve`" in printed and "NOT SERVED" not in printed
    assert "quick alone, workers pre-started by bundlegen serve" in printed


def test_an_mps_run_is_named_as_one_and_can_answer_a_target():
    from dataclasses import replace

    plain, shared = _run("warm", "full", 16.0, workers=4), replace(_run("warm", "full", 11.0, workers=8), mps=True)
    assert (plain.where, shared.where) == ("cuda:0 x4", "cuda:0 x8 mps")
    lines = "\n".join(HT.target_lines([plain, shared]))
    assert "all four levels: 11.0 s (cuda:0, 8 worker(s) each, MPS) -- target < 12 s: met" in lines
    lines = "\n".join(HT.target_lines([plain, replace(shared, elapsed_s=20.0)]))
    assert "all four levels: 16.0 s (cuda:0, 4 worker(s) each) -- target < 12 s: NOT met" in lines
