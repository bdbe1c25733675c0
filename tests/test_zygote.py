"""Workers forked from the zygote (workers.zygote): a runner's first worker starts plainly,
its restarts are forked from the zygote (torch imported once), each worker in its own
session, exit statuses reported by the zygote, and the plain start where there is none."""
from __future__ import annotations

import os
import signal
import time

import pytest

from bundlegen.harness.workers import zygote
from bundlegen.harness.config import EngineConfig
from bundlegen.harness.workers.worker import IsolatedRunner, WorkerSpec, describe_exit

SPEC = WorkerSpec("torch-math", "cpu", EngineConfig())


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def session_of(pid: int) -> int:
    return os.getsid(pid)


@pytest.fixture
def fresh_zygote():
    zygote.stop_shared()
    yield
    zygote.stop_shared()


def restarted(spec=SPEC) -> IsolatedRunner:
    """A runner whose worker has been restarted once (its second start)."""
    r = IsolatedRunner(spec)
    r._restart()
    return r


def test_first_start_plain_restarts_forked_by_the_zygote(fresh_zygote):
    runners = [IsolatedRunner(SPEC) for _ in range(2)]
    try:
        forks = zygote.shared()   # started once a worker was ready
        assert forks is not None
        for r in runners:
            assert not isinstance(r._proc, zygote.ForkedWorker)
            assert parent_of(r.pid) == os.getpid()
        for r in runners:
            r._restart()
            assert isinstance(r._proc, zygote.ForkedWorker)
            assert parent_of(r.pid) == forks.proc.pid
            assert session_of(r.pid) == r.pid            # its own session, for killpg
            assert r.engine_name == "torch-math"
        assert runners[0].pid != runners[1].pid
        runners[0].release()                             # after a release, forked too
        runners[0].wait_ready()
        assert parent_of(runners[0].pid) == forks.proc.pid
    finally:
        for r in runners:
            r.close()


def test_exit_status_comes_from_the_zygote(fresh_zygote):
    r = restarted()
    pid = r.pid
    os.kill(pid, signal.SIGKILL)
    assert r._proc.wait(10) == -signal.SIGKILL
    assert describe_exit(r._proc.returncode) == "killed by SIGKILL"
    r.close()


def test_a_dead_zygote_is_replaced_and_its_orphans_say_so(fresh_zygote):
    r = restarted()
    first = zygote.shared()
    first.proc.kill()
    first.proc.wait(10)
    deadline = time.monotonic() + 10
    while not first.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.lost
    os.kill(r.pid, signal.SIGKILL)   # reparented: nobody reports its exit now
    assert r._proc.wait(10) == zygote.EXIT_UNKNOWN
    assert "zygote" in describe_exit(r._proc.returncode)
    r.close()
    again = restarted()
    try:
        assert zygote.shared() is not first
        assert parent_of(again.pid) == zygote.shared().proc.pid
        assert again.engine_name == "torch-math"
    finally:
        again.close()


def test_the_zygote_ends_with_its_harness_socket(fresh_zygote):
    forks = zygote.shared()
    forks.close()
    assert forks.proc.returncode == 0


def test_without_the_zygote_workers_start_plainly(fresh_zygote, monkeypatch):
    monkeypatch.setenv("BUNDLEGEN_ZYGOTE", "0")
    assert zygote.shared() is None
    r = restarted()
    try:
        assert not isinstance(r._proc, zygote.ForkedWorker)
        assert parent_of(r.pid) == os.getpid()
        assert r.engine_name == "torch-math"
    finally:
        r.close()


def test_an_mps_client_restarts_plainly(fresh_zygote, tmp_path):
    """After a fault an MPS server takes no new client until its old clients have gone: a
    forked restart would reach it too soon (worker.restarts_fork)."""
    spec = WorkerSpec("torch-math", "cpu", EngineConfig(),
                      env=(("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path)),))
    r = restarted(spec)
    try:
        assert not isinstance(r._proc, zygote.ForkedWorker)
        assert parent_of(r.pid) == os.getpid()
    finally:
        r.close()


def test_an_mps_client_starts_no_zygote(fresh_zygote, tmp_path):
    """Its restarts are plain, so its runs have no use for a zygote's background import."""
    spec = WorkerSpec("torch-math", "cpu", EngineConfig(),
                      env=(("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path)),))
    r = IsolatedRunner(spec)
    try:
        assert zygote._SHARED is None
    finally:
        r.close()
