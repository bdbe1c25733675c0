"""`--mps`: a private CUDA MPS control daemon for a run's GPU workers (workers.mps), and the
re-run alone of each case that crashed beside other workers (executor.rerun_alone).

No GPU here: the daemon is a stand-in program named nvidia-cuda-mps-control on PATH that
logs what it was asked, and the run's workers are two CPU workers with the device rule
lifted (an MPS server only serves GPUs); the rest of the path is the real one."""
from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bundlegen.cli import main
from bundlegen.harness.workers import mps
from bundlegen.harness import verdicts as V
from bundlegen.harness.results import read_results, read_run_times
from bundlegen.harness.executor import DeviceTally, crashed, rerun_alone, run_spread
from bundlegen.harness.level import crash_hold, run_level
from tests import harness_support as S

#: where CrashesOnce keeps its state (the workers inherit the test's environment)
MARK_ENV = "BUNDLEGEN_TEST_CRASH_MARK"
CRASH_ONCE_S_Q, CRASH_ALWAYS_S_Q = 5, 6


class CrashesOnce(S.TorchMathEngine):
    """torch-math that raises the first time it meets S_q 5 (as a neighbour's GPU fault ends
    a case under MPS) and every time it meets S_q 6; each run notes the MPS pipe folder its
    process was given."""
    name = "crashes-once"

    def run(self, graph, tensors):
        mark = Path(os.environ[MARK_ENV])
        with open(mark.with_suffix(".env"), "a") as f:
            f.write(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "-") + "\n")
        if graph.S_q == CRASH_ONCE_S_Q and not mark.exists():
            mark.touch()
            raise RuntimeError("injected: a neighbour's fault")
        if graph.S_q == CRASH_ALWAYS_S_Q:
            raise RuntimeError("injected: this case's own fault")
        super().run(graph, tensors)


class CannotBeBuilt(S.TorchMathEngine):
    """An engine whose worker cannot build it (as when the MPS server refuses its client)."""
    name = "cannot-be-built"

    def __init__(self, device):
        raise RuntimeError("injected: no CUDA context")


@pytest.fixture
def control(tmp_path, monkeypatch):
    """A stand-in nvidia-cuda-mps-control on PATH; returns the file it logs to (one JSON
    line per call: its arguments, stdin and MPS folders)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "control.log"
    bin_dir.mkdir()
    program = bin_dir / mps.CONTROL
    program.write_text(f"""#!/usr/bin/env python3
import json, os, sys, time
stdin = "" if sys.argv[1:] == ["-d"] else sys.stdin.read()
if stdin:   # a quit returns once every client has gone
    time.sleep(float(os.environ.get("FAKE_MPS_QUIT_S", "0")))
with open({str(log)!r}, "a") as f:
    f.write(json.dumps({{"args": sys.argv[1:], "stdin": stdin,
                        "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                        "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\\n")
sys.exit(int(os.environ.get("FAKE_MPS_EXIT", "0")))
""")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def calls_once_stopped(log: Path, within_s: float = 20.0) -> list[dict]:
    """calls(log) once the daemon was told to quit and its folder is gone (a run that ends
    as it should leaves both to a process of their own: MpsDaemon.stop(wait=False))."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        got = calls(log)
        if got and got[-1]["stdin"] == "quit\n" and not Path(got[0]["pipe"]).parent.exists():
            return got
        time.sleep(0.05)
    raise AssertionError(f"the daemon was not stopped within {within_s} s: {calls(log)}")


def test_the_daemon_gets_private_folders_and_is_told_to_quit(control):
    daemon = mps.start_mps(["cuda:0", "cuda:0"])
    pipe, logs = Path(daemon.env["CUDA_MPS_PIPE_DIRECTORY"]), Path(daemon.env["CUDA_MPS_LOG_DIRECTORY"])
    assert pipe.is_dir() and logs.is_dir() and pipe.parent == logs.parent == daemon.root
    assert calls(control) == [{"args": ["-d"], "stdin": "", "pipe": str(pipe), "log": str(logs)}]
    daemon.stop()
    assert calls(control)[1] == {"args": [], "stdin": "quit\n", "pipe": str(pipe), "log": str(logs)}
    assert not daemon.root.exists()
    other = mps.start_mps(["cuda:1"])
    assert other.root != daemon.root   # each run its own daemon
    other.stop()


def test_a_daemon_stopped_without_waiting_quits_after_this_returns(control, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_QUIT_S", "2")   # the clients take that long to go
    daemon = mps.start_mps(["cuda:0"])
    start = time.monotonic()
    daemon.stop(wait=False)
    assert time.monotonic() - start < 1.5 and daemon.root.exists()
    assert calls_once_stopped(control)[1]["stdin"] == "quit\n"
    assert not daemon.root.exists()


def test_without_the_control_program_the_error_says_where_it_comes_from(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(mps.MpsError, match="nvidia-cuda-mps-control is not on PATH .*NVIDIA driver"):
        mps.start_mps(["cuda"])


def test_a_daemon_that_does_not_start_is_an_error_and_leaves_nothing(control, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_EXIT", "3")
    with pytest.raises(mps.MpsError, match=r"-d exited 3"):
        mps.start_mps(["cuda"])
    pipe = Path(calls(control)[0]["pipe"])
    assert not pipe.parent.exists()


@pytest.mark.parametrize("devices", [["cpu"], ["cuda:0", "cpu"]])
def test_mps_serves_gpus_only(devices):
    with pytest.raises(ValueError, match="MPS shares a GPU between processes; cpu is not a GPU"):
        mps.start_mps(devices)


def test_run_mps_on_the_cpu_is_a_usage_error(capsys):
    assert main(["run", "--level", "quick", "--engine", "torch-math", "--device", "cpu", "--mps"]) == V.EXIT_USAGE
    assert "--mps: MPS shares a GPU between processes; cpu is not a GPU" in capsys.readouterr().err


def test_mps_needs_isolated_workers(monkeypatch, tmp_path):
    monkeypatch.setattr(mps, "mps_devices_problem", lambda devices: None)
    with pytest.raises(ValueError, match="--mps: MPS serves worker processes; --no-isolation"):
        run_level("quick", "torch-math", device="cuda", isolation=False, mps=True, out=tmp_path)


def _mps_run(tmp_path, monkeypatch, cases, mps_on=True):
    monkeypatch.setattr(mps, "mps_devices_problem", lambda devices: None)   # CPU workers stand in
    monkeypatch.setenv(MARK_ENV, str(tmp_path / "crash.mark"))
    S.write_bundle(tmp_path / "bundles", "quick", "a", cases)
    summary = run_level("quick", S.engine_ref(CrashesOnce), devices=["cpu", "cpu"],
                        bundles=tmp_path / "bundles", out=tmp_path / "out", config=S.LOOSE, repeat=1,
                        timeout_s=60, mps=mps_on, server=False)
    return summary, {r["case_id"]: r for r in read_results(summary.results_path)}


def test_a_case_that_crashed_beside_others_is_run_again_alone(tmp_path, monkeypatch, control):
    victim, culprit = S.case_of(1, S_q=CRASH_ONCE_S_Q), S.case_of(2, S_q=CRASH_ALWAYS_S_Q)
    cases = [S.case_of(n) for n in range(10, 16)] + [victim, culprit]
    summary, got = _mps_run(tmp_path, monkeypatch, cases)
    assert len(got) == len(cases) == len(read_results(summary.results_path))   # each recorded once
    assert got[victim.id]["verdict"] == V.PASS                  # only a neighbour's victim
    assert got[culprit.id]["verdict"] == V.CRASHED and "own fault" in got[culprit.id]["detail"]
    assert all(got[c.id]["verdict"] == V.PASS for c in cases[:6])
    times = read_run_times(tmp_path / "out")
    assert times.mps and times.mps_reruns == 2 and times.cases == len(cases)
    assert sum(d["cases"] for d in times.per_device) == len(cases)
    # every worker was a client of the run's daemon, which was told to quit at the end
    started, stopped = calls_once_stopped(control)
    assert started["args"] == ["-d"] and stopped["stdin"] == "quit\n"
    seen = set((tmp_path / "crash.env").read_text().split())
    assert seen == {started["pipe"]}
    assert not Path(started["pipe"]).exists()


def test_without_mps_a_crash_is_recorded_as_it_came(tmp_path, monkeypatch, control):
    victim = S.case_of(1, S_q=CRASH_ONCE_S_Q)
    summary, got = _mps_run(tmp_path, monkeypatch, [S.case_of(n) for n in range(10, 13)] + [victim],
                            mps_on=False)
    assert got[victim.id]["verdict"] == V.CRASHED
    assert not read_run_times(tmp_path / "out").mps and calls(control) == []
    assert set((tmp_path / "crash.env").read_text().split()) == {"-"}


class _Executor:
    """A CaseExecutor stand-in: its results by case id, what it was asked, in order."""

    def __init__(self, name: str, verdicts: dict, log: list):
        self.device, self.name, self.verdicts, self.log = "cuda:0", name, verdicts, log

    def execute(self, case):
        self.log.append((self.name, "execute", case.id))
        return SimpleNamespace(case=case.id, verdict=self.verdicts.get(case.id, V.PASS), by=self.name)

    def release(self):
        self.log.append((self.name, "release", None))


def _case(cid: str):
    return SimpleNamespace(id=cid, level="quick", group="a")


def test_a_held_crash_runs_again_in_the_first_worker_once_the_others_are_stopped():

    log, recorded = [], []
    first = _Executor("first", {}, log)
    executors = [first, _Executor("second", {}, log), _Executor("third", {}, log)]
    tallies = [DeviceTally("cuda:0", i) for i in range(3)]
    rerun_alone(executors, tallies, [_case("x"), _case("y")], recorded.append, lambda label: None)
    assert log == [("second", "release", None), ("third", "release", None),
                   ("first", "execute", "x"), ("first", "execute", "y")]
    assert [(r.case, r.by) for r in recorded] == [("x", "first"), ("y", "first")]
    assert tallies[0].cases == 2 and tallies[1].cases == tallies[2].cases == 0


@pytest.mark.parametrize("hold", [crashed, None])
def test_the_spread_holds_back_crashes_only_when_asked(hold):
    log, recorded = [], []
    crashes = {"b": V.CRASHED}
    executors = [_Executor("one", crashes, log), _Executor("two", crashes, log)]

    held = run_spread(executors, [DeviceTally("cuda:0", i) for i in range(2)],
                       [_case(c) for c in "abc"], recorded.append, lambda label: None, hold_crashes=hold)
    assert sorted(r.case for r in recorded) == (["a", "c"] if hold else ["a", "b", "c"])
    assert [c.id for c in held] == (["b"] if hold else [])


def test_workers_sharing_a_device_hold_back_only_the_crashes_out_of_device_memory():
    oom = SimpleNamespace(verdict=V.CRASHED, detail="materialize raised OutOfMemoryError: CUDA out of memory.")
    other = SimpleNamespace(verdict=V.CRASHED, detail="engine.run raised ValueError: bad stride")
    assert crash_hold(False, ["cuda:0", "cuda:0"])(oom) and not crash_hold(False, ["cuda:0", "cuda:0"])(other)
    assert crash_hold(False, ["cuda:0", "cuda:1"]) is None and crash_hold(False, ["cuda:0"]) is None
    assert crash_hold(True, ["cuda:0", "cuda:0"])(other)


def test_a_worker_that_cannot_start_under_mps_says_what_the_daemon_logged(tmp_path, monkeypatch, control):
    from bundlegen.harness.workers.worker import WorkerStartError

    monkeypatch.setattr(mps, "mps_devices_problem", lambda devices: None)
    real = mps.start_mps

    def start_and_log(devices):
        daemon = real(devices)
        (daemon.root / "log" / "server.log").write_text("Server failed: injected\n")
        return daemon

    monkeypatch.setattr(mps, "start_mps", start_and_log)
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(1)])
    with pytest.raises(WorkerStartError, match=r"MPS server; its logs end: server.log: Server failed: injected"):
        run_level("quick", S.engine_ref(CannotBeBuilt), devices=["cpu", "cpu"], bundles=tmp_path / "bundles",
                  out=tmp_path / "out", config=S.LOOSE, mps=True, server=False)
    assert calls(control)[-1]["stdin"] == "quit\n"   # the daemon is stopped all the same
