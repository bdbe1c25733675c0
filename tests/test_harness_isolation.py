"""Crash isolation: a raise, a process exit, a SIGKILL and a hang each cost only their
case, which is recorded crashed; the worker is restarted and the run goes on."""
from __future__ import annotations

import pytest

from bundlegen.harness import verdicts as V
from bundlegen.harness.results import read_results
from bundlegen.harness.executor import CaseExecutor
from bundlegen.harness.level import run_level
from bundlegen.harness.workers.worker import WorkerStartError
from tests import harness_support as S


def test_faults_are_crashes_and_the_run_goes_on(tmp_path):
    faults = {3: "raised RuntimeError: injected fault", 4: "worker process died (exit code 1)",
              5: "worker process died (killed by SIGKILL)", 6: "timed out after 6 s"}
    cases = [S.case_of(1)]
    for s_q in faults:
        cases += [S.case_of(s_q, S_q=s_q), S.case_of(100 + s_q)]  # each fault, then a sound case
    S.write_bundle(tmp_path / "bundles", "quick", "faults", cases)
    summary = run_level("quick", S.engine_ref(S.Faulty), device="cpu", bundles=tmp_path / "bundles",
                        out=tmp_path / "out", config=S.LOOSE, timeout_s=6, repeat=1)
    records = read_results(summary.results_path)
    assert [r["case_id"] for r in records] == [c.id for c in cases]
    assert records[0]["verdict"] == V.PASS
    for fault, sound in zip(records[1::2], records[2::2]):
        s_q = next(c.graph.S_q for c in cases if c.id == fault["case_id"])
        assert fault["verdict"] == V.CRASHED and faults[s_q] in fault["detail"], fault
        assert sound["verdict"] == V.PASS, sound
    assert summary.counts() == {V.CRASHED: 4, V.PASS: 5} and summary.exit_code == 1


def test_a_raise_in_process_is_a_crash_too(tmp_path):
    cases = [S.case_of(3, S_q=3), S.case_of(1)]
    S.write_bundle(tmp_path / "bundles", "quick", "faults", cases)
    summary = run_level("quick", S.engine_ref(S.Faulty), device="cpu", bundles=tmp_path / "bundles",
                        out=tmp_path / "out", config=S.LOOSE, isolation=False)
    assert [r["verdict"] for r in read_results(summary.results_path)] == [V.CRASHED, V.PASS]


def test_a_worker_runs_its_cases_with_the_collector_on_and_its_start_frozen():
    """The worker starts without the cyclic garbage collector and freezes what its start
    built (worker.collector_on); its cases run with the collector back on."""
    import re

    with CaseExecutor(S.engine_ref(S.ReportsCollector), "cpu", config=S.LOOSE) as ex:
        reason = ex.execute(S.case_of(1)).reason
    on, frozen = re.search(r"collector on (\w+), frozen (\d+)", reason).groups()
    assert on == "True" and int(frozen) > 10_000, reason   # torch alone is some 150,000


class CannotBuild(S.TorchMathEngine):
    name = "cannot-build"

    def __init__(self, device):
        raise RuntimeError("no such device support")


def test_an_engine_that_cannot_be_built_stops_the_run_with_its_error():
    with pytest.raises(WorkerStartError, match="no such device support"):
        CaseExecutor(S.engine_ref(CannotBuild), "cpu", config=S.LOOSE)


def test_prepare_graphs_are_pickled_once_for_every_worker():
    """A run hands one graphs list to each worker's prepare: one pickling serves them all,
    and another list gets its own."""
    import pickle

    from bundlegen.graph import dense_graph
    from bundlegen.harness.workers.worker import prepare_message
    graphs, others = [dense_graph(), dense_graph(D_qk=32)], [dense_graph(S_q=64)]
    first = prepare_message(graphs)
    assert prepare_message(graphs) is first
    assert pickle.loads(first) == ("prepare", graphs)
    assert pickle.loads(prepare_message(others)) == ("prepare", others)


def test_a_worker_stopped_without_waiting_is_reaped_in_the_background():
    from bundlegen.harness.workers.worker import IsolatedRunner, WorkerSpec, wait_exits

    runner = IsolatedRunner(WorkerSpec(engine=S.engine_ref(S.TorchMathEngine), device="cpu",
                                       config=S.LOOSE))
    pid = runner.pid
    runner.close(wait=False)
    assert runner.pid is None
    wait_exits()
    assert not S.pid_exists(pid)   # exited and reaped: not even a zombie is left


def test_a_stopped_worker_that_does_not_exit_has_its_group_killed(monkeypatch):
    import subprocess

    from bundlegen.harness.workers import worker

    class Stuck:
        pid, waits = 4242, []

        def wait(self, timeout=None):
            self.waits.append(timeout)
            if len(self.waits) == 1:   # deaf to the stop until its group is killed
                raise subprocess.TimeoutExpired("worker", timeout)
            return -9

    killed = []
    monkeypatch.setattr(worker.os, "killpg", lambda pgid, sig: killed.append((pgid, sig)))
    proc = Stuck()
    worker._reap_in_background(proc)
    worker.wait_exits()
    assert killed == [(4242, worker.signal.SIGKILL)]
    assert proc.waits[0] == worker.STOP_GRACE_S and len(proc.waits) == 2
    assert not worker._exiting


def test_a_killed_worker_whose_exit_is_slow_to_show_is_reaped_in_the_background(monkeypatch):
    """A worker killed while the host is loaded may not be seen to exit within the kill's
    wait: the run goes on (an interrupted run still ends with its own exit status) and a
    thread reaps the worker, killing its group again."""
    import subprocess

    from bundlegen.harness.workers import worker

    class SlowToShow:
        pid, waits = 4243, []

        def wait(self, timeout=None):
            self.waits.append(timeout)
            if len(self.waits) <= 2:   # the kill's wait and the reaper's grace both time out
                raise subprocess.TimeoutExpired("worker", timeout)
            return -9

    killed = []
    monkeypatch.setattr(worker.os, "killpg", lambda pgid, sig: killed.append((pgid, sig)))
    runner = object.__new__(worker.IsolatedRunner)
    runner._proc, runner._conn = SlowToShow(), None
    runner._kill()                      # raises nothing
    assert runner._proc is None
    worker.wait_exits()
    assert killed == [(4243, worker.signal.SIGKILL)] * 2
    assert SlowToShow.waits[1] == worker.STOP_GRACE_S and len(SlowToShow.waits) == 3
    assert not worker._exiting
