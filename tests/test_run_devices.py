"""`bundlegen run --devices`: one worker per device, cases handed out longest predicted
first, one results.jsonl / junit.xml / run.json. Tested with two CPU workers
(`cpu,cpu`); the same code drives `cuda:0,cuda:1`."""
from __future__ import annotations

import os
import time
import types
import xml.etree.ElementTree as ET

import pytest
import torch

from bundlegen.cli import main
from bundlegen.harness import verdicts as V
from bundlegen.harness.results import read_results, read_run_times
from bundlegen.harness.command import device_split
from bundlegen.harness.case import predicted_seconds
from bundlegen.harness.executor import longest_first
from bundlegen.harness.level import run_level
from bundlegen.harness.workers.devices import resolve_devices, worker_devices
from tests import harness_support as S


class Paced(S.TorchMathEngine):
    """torch-math that takes a while per case, so that two workers both get cases."""
    name = "paced"

    def run(self, graph, tensors):
        time.sleep(0.3)
        super().run(graph, tensors)


class PacedFaulty(S.Faulty):
    name = "paced-faulty"

    def run(self, graph, tensors):
        time.sleep(0.3)
        super().run(graph, tensors)


def _run(tmp_path, engine, **kwargs):
    return run_level("quick", S.engine_ref(engine), devices=["cpu", "cpu"], bundles=tmp_path / "bundles",
                     out=tmp_path / "out", config=S.LOOSE, repeat=1, timeout_s=60, **kwargs)


def test_two_workers_record_every_case_once_and_report_the_split(tmp_path):
    cases = [S.case_of(n) for n in range(1, 9)]
    S.write_bundle(tmp_path / "bundles", "quick", "a", cases)
    summary = _run(tmp_path, Paced)
    records = read_results(summary.results_path)
    assert sorted(r["case_id"] for r in records) == sorted(c.id for c in cases)
    assert all(r["verdict"] == V.PASS for r in records) and summary.exit_code == V.EXIT_OK
    assert len({r["run_id"] for r in records}) == 1
    times = read_run_times(tmp_path / "out")
    assert times.device == "cpu,cpu" and times.cases == 8 and times.complete
    split = [d["cases"] for d in times.per_device]
    assert [d["device"] for d in times.per_device] == ["cpu", "cpu"]
    assert sum(split) == 8 and min(split) >= 1, times.per_device
    assert all(d["seconds"] > 0 for d in times.per_device)
    suite = ET.parse(summary.junit_path).getroot().find("testsuite[@name='quick']")
    assert suite.get("tests") == "8" and suite.get("failures") == "0"


def test_a_crash_on_one_worker_costs_only_its_case(tmp_path):
    killed = S.case_of(5, S_q=5)   # the worker SIGKILLs itself on this one
    cases = [S.case_of(n) for n in range(10, 16)] + [killed]
    S.write_bundle(tmp_path / "bundles", "quick", "a", cases)
    summary = _run(tmp_path, PacedFaulty)
    got = {r["case_id"]: r for r in read_results(summary.results_path)}
    assert len(read_results(summary.results_path)) == len(cases) == len(got)
    assert got[killed.id]["verdict"] == V.CRASHED and "SIGKILL" in got[killed.id]["detail"]
    assert all(r["verdict"] == V.PASS for cid, r in got.items() if cid != killed.id)
    assert summary.exit_code == V.EXIT_FAILED


def test_resume_shard_and_k_work_across_workers(tmp_path):
    cases = [S.case_of(n) for n in range(1, 7)]
    S.write_bundle(tmp_path / "bundles", "quick", "a", cases)
    first = _run(tmp_path, S.TorchMathEngine)
    lines = first.results_path.read_text().splitlines(keepends=True)
    first.results_path.write_text("".join(lines[:3]))
    again = _run(tmp_path, S.TorchMathEngine, resume=True)
    assert (again.ran, again.resumed) == (3, 3)
    assert sorted(r["case_id"] for r in read_results(again.results_path)) == sorted(c.id for c in cases)
    seen = []
    for index in (1, 2):
        seen += [r["case_id"] for r in read_results(_run(tmp_path, S.TorchMathEngine, shard=(index, 2)).results_path)]
    assert sorted(seen) == sorted(c.id for c in cases)
    picked = _run(tmp_path, S.TorchMathEngine, pattern=cases[2].id)
    assert [r["case_id"] for r in read_results(picked.results_path)] == [cases[2].id]


def test_cases_are_handed_out_longest_predicted_first():
    small, mid, big = S.case_of(1, S_q=4), S.case_of(2, S_q=64, S_kv=64), S.case_of(3, S_q=256, S_kv=256)
    order = longest_first([small, big, mid], "cpu", S.MANIFEST)
    assert order == [big, mid, small]
    costs = [predicted_seconds(c, "cpu", S.MANIFEST) for c in order]
    assert costs == sorted(costs, reverse=True) and costs[0] > costs[-1]


def test_several_workers_share_one_device(tmp_path):
    """--workers-per-device 3 on one CPU: three worker processes, every case once, the
    split per worker in run.json, each worker with a third of the cores."""
    cases = [S.case_of(n) for n in range(1, 10)]
    S.write_bundle(tmp_path / "bundles", "quick", "a", cases)
    summary = run_level("quick", S.engine_ref(Paced), device="cpu", workers_per_device=3,
                        bundles=tmp_path / "bundles", out=tmp_path / "out", config=S.LOOSE,
                        repeat=1, timeout_s=60)
    records = read_results(summary.results_path)
    assert sorted(r["case_id"] for r in records) == sorted(c.id for c in cases)
    assert all(r["verdict"] == V.PASS for r in records) and summary.exit_code == V.EXIT_OK
    times = read_run_times(tmp_path / "out")
    assert times.device == "cpu" and times.workers_per_device == 3
    assert [(d["device"], d["worker"]) for d in times.per_device] == [("cpu", 0), ("cpu", 1), ("cpu", 2)]
    assert sum(d["cases"] for d in times.per_device) == 9
    assert all(d["cases"] >= 1 for d in times.per_device), times.per_device


def test_workers_interleave_over_devices():
    assert worker_devices(["cuda:0", "cuda:1"], 2) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert worker_devices(["cpu"], 1) == ["cpu"]


def test_the_split_is_summed_per_device():
    rows = [{"device": "cuda:0", "worker": 0, "cases": 3, "seconds": 1.0},
            {"device": "cuda:1", "worker": 0, "cases": 2, "seconds": 2.0},
            {"device": "cuda:0", "worker": 1, "cases": 4, "seconds": 1.5}]
    assert device_split(rows) == "cuda:0 (2 workers) 7 cases 2.5 s, cuda:1 2 cases 2.0 s"


def test_the_command_takes_workers_per_device(tmp_path, capsys):
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(n) for n in range(1, 5)])
    code = main(["run", "--level", "quick", "--engine", S.engine_ref(Paced), "--device", "cpu",
                 "--workers-per-device", "2", "--bundles", str(tmp_path / "bundles"),
                 "--out", str(tmp_path / "o"), "--quiet"])
    out = capsys.readouterr().out
    assert code == V.EXIT_OK and "devices: cpu (2 workers) 4 cases" in out, out
    assert main(["run", "--level", "quick", "--engine", "torch-math", "--device", "cpu",
                 "--workers-per-device", "0", "--bundles", str(tmp_path / "bundles")]) == V.EXIT_USAGE
    assert "--workers-per-device 0: expected 1 or more" in capsys.readouterr().err


def test_resolve_devices():
    assert resolve_devices("cpu,cpu") == ["cpu", "cpu"]
    assert resolve_devices("cuda:0, cuda:1") == ["cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match="expected all, or devices"):
        resolve_devices("cpu,,cpu")


@pytest.mark.parametrize("extra, message", [
    (["--device", "cpu", "--devices", "cpu,cpu"], "give --device or --devices, not both"),
    (["--devices", "cpu,gpu"], "--devices cpu,gpu: expected"),
    pytest.param(["--devices", "all"], "--devices all: no GPU is visible",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")),
])
def test_bad_devices_are_usage_errors(tmp_path, capsys, extra, message):
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(1)])
    code = main(["run", "--level", "quick", "--engine", "torch-math", *extra,
                 "--bundles", str(tmp_path / "bundles"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == V.EXIT_USAGE and len(err) == 1 and message in err[0], err


def test_the_command_prints_the_split(tmp_path, capsys):
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(n) for n in range(1, 5)])
    code = main(["run", "--level", "quick", "--engine", S.engine_ref(Paced), "--devices", "cpu,cpu",
                 "--bundles", str(tmp_path / "bundles"), "--out", str(tmp_path / "o"), "--quiet"])
    out = capsys.readouterr().out
    assert code == V.EXIT_OK
    assert "devices: cpu" in out and out.count(" cases ") >= 2, out


def test_ctrl_c_with_two_workers_ends_cleanly_and_resumes(tmp_path):
    import signal
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(n) for n in range(1, 31)])
    out = tmp_path / "out"
    args = ["run", "--level", "quick", "--engine", S.engine_ref(Paced), "--devices", "cpu,cpu",
            "--bundles", str(tmp_path / "bundles"), "--out", str(out), "--quiet", "--repeat", "1"]
    proc = S.start_cli(args, cwd=repo)
    deadline = time.monotonic() + 120
    while len(read_results(out)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == V.EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    ET.parse(out / "junit.xml")
    recorded = read_results(out)
    times = read_run_times(out)
    assert not times.complete and times.cases == len(recorded) >= 3
    assert len({r["case_id"] for r in recorded}) == len(recorded)
    assert main([*args, "--resume"]) == V.EXIT_OK
    assert len(read_results(out)) == 30


class ReportsItsThreads(S.TorchMathEngine):
    name = "reports-its-threads"

    def warm_up(self):
        pass

    def run(self, graph, tensors):
        import torch
        raise RuntimeError(f"threads={torch.get_num_threads()} omp={os.environ.get('OMP_NUM_THREADS')}")


def test_workers_side_by_side_share_the_cores(tmp_path, monkeypatch):
    """Two workers on one host each get half the cores (oversubscribed OpenMP threads spin
    against each other: the float64 oracle ran 30x slower). The session's OMP_NUM_THREADS
    (conftest) is left out, so a worker given no share would report torch's default."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(n) for n in range(1, 5)])
    summary = run_level("quick", S.engine_ref(ReportsItsThreads), devices=["cpu", "cpu"],
                        bundles=tmp_path / "bundles", out=tmp_path / "out", config=S.LOOSE, repeat=1)
    share = max(1, (os.cpu_count() or 1) // 2)
    details = {r["detail"].split(" raised RuntimeError: ")[1].split(" at ")[0]
               for r in read_results(summary.results_path)}
    assert details == {f"threads={share} omp={share}"}


def test_the_parent_of_an_isolated_run_never_imports_torch(tmp_path):
    """The worker's answers unpickle in the parent without torch (a TorchVersion in the
    software versions made the parent import torch, seconds on a GPU host, after the
    workers were ready)."""
    import subprocess
    import sys
    from pathlib import Path

    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(n) for n in range(1, 3)])
    code = ("import sys; from bundlegen.harness.level import run_level; "
            f"s = run_level('quick', 'torch-math', device='cpu', bundles={str(tmp_path / 'bundles')!r}, "
            f"out={str(tmp_path / 'out')!r}, repeat=1); "
            "print(s.exit_code, 'torch' in sys.modules)")
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == [str(V.EXIT_OK), "False"], out.stderr[-2000:]


START_MARK_ENV = "BUNDLEGEN_TEST_START_MARK"


class SlowToStartButFirst(Paced):
    """Paced torch-math whose warm-up takes 5 s in every worker but the first to get there."""
    name = "slow-to-start-but-first"

    def warm_up(self):
        try:
            os.close(os.open(os.environ[START_MARK_ENV], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            time.sleep(5)
        super().warm_up()


def test_cases_begin_as_soon_as_the_first_worker_is_ready(tmp_path, monkeypatch):
    monkeypatch.setenv(START_MARK_ENV, str(tmp_path / "started"))
    cases = [S.case_of(n) for n in range(1, 9)]
    S.write_bundle(tmp_path / "bundles", "quick", "a", cases)
    summary = _run(tmp_path, SlowToStartButFirst)
    assert {r["verdict"] for r in read_results(summary.results_path)} == {V.PASS}
    times = read_run_times(tmp_path / "out")
    split = sorted(d["cases"] for d in times.per_device)
    # 8 cases of 0.3 s: the worker that started at once runs most of them while the other
    # is still in its 5 s warm-up (waiting for both would split them about evenly)
    assert split[-1] >= 6 and sum(split) == 8, times.per_device


class _SpreadExecutor:
    """A CaseExecutor stand-in for run_spread: runs `seconds` per case, logs its release."""

    def __init__(self, name: str, seconds: float, log: list):
        self.device, self.name, self.seconds, self.log = "cuda:0", name, seconds, log

    def execute(self, case):
        time.sleep(self.seconds)
        self.log.append((self.name, "done", case.id))
        return types.SimpleNamespace(verdict=V.PASS)

    def release(self, wait=True):
        self.log.append((self.name, "released", wait))


@pytest.mark.parametrize("release_idle", [True, False])
def test_a_worker_with_no_case_left_is_stopped_while_the_others_finish(release_idle):
    from bundlegen.harness.executor import DeviceTally, run_spread

    log = []
    slow, quick = _SpreadExecutor("slow", 1.5, log), _SpreadExecutor("quick", 0.05, log)
    cases = [types.SimpleNamespace(id=c, level="quick", group="a") for c in "abc"]
    run_spread([slow, quick], [DeviceTally("cuda:0", i) for i in range(2)], cases,
                lambda result: None, lambda label: None, release_idle=release_idle)
    if not release_idle:
        assert all(event != "released" for _, event, _ in log)
        return
    # the quick worker runs the other cases and is stopped, without waiting for its exit,
    # before the slow one's only case is done (whichever case each took first)
    slow_done = [i for i, (name, event, _) in enumerate(log) if (name, event) == ("slow", "done")]
    assert len(slow_done) == 1 and log.index(("quick", "released", False)) < slow_done[0], log
    assert log[-1] == ("slow", "released", False)


@pytest.mark.parametrize("switch", [None, "0"])
def test_a_run_stops_its_idle_workers_before_the_end_unless_turned_off(tmp_path, monkeypatch, switch):
    from bundlegen.harness import level as run_module

    if switch is None:
        monkeypatch.delenv(run_module.RELEASE_SWITCH, raising=False)
    else:
        monkeypatch.setenv(run_module.RELEASE_SWITCH, switch)
    alive_at_close, waits = [], []
    close_all = run_module.close_all

    def note_then_close(executors, wait=True):
        alive_at_close.extend(ex.runner.pid is not None for ex in executors)
        waits.append(wait)
        close_all(executors, wait)

    monkeypatch.setattr(run_module, "close_all", note_then_close)
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(n) for n in range(1, 4)])
    summary = _run(tmp_path, Paced)
    assert summary.exit_code == V.EXIT_OK and len(read_results(summary.results_path)) == 3
    assert alive_at_close == ([False, False] if switch is None else [True, True])
    # idle at the end: left to exit while the files are written (with the switch, waited for)
    assert waits == ([False] if switch is None else [True])
    times = read_run_times(tmp_path / "out")
    assert times.cases_s > 0 and times.finish_s >= 0
