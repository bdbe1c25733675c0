"""`bundlegen serve` (issue 16): a run through a server's warm workers records what a run
with fresh workers records; a server whose code or environment differs from the run's is
not used; --stop and the idle timeout end it; a crashed served worker costs only its case
and is restarted; a second run while one is served is told the server is busy."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bundlegen.cli import main
from bundlegen.harness import verdicts as V
from bundlegen.harness.results import read_results, read_run_times
from bundlegen.harness.level import run_level
from bundlegen.harness.workers.serve_client import ask, open_session
from bundlegen.harness.workers.serve_key import may_be_served, serve_key, socket_path
from tests import harness_support as S

REPO = Path(__file__).resolve().parents[1]
#: what a served run must record exactly as a fresh one does
SAME = ("case_id", "verdict", "detail", "reason", "tolerance_class", "tolerance", "outputs", "margin",
        "engine", "arch", "device")
ENGINE_MODULE = '''from bundlegen.engines.torch_math.engine import TorchMathEngine


class Mine(TorchMathEngine):
    name = "mine"
'''


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A workspace folder (this test's cwd) with its own bundle root; the servers started
    here and the runs made here see the same PYTHONPATH, so their keys can match."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "bundlegen.toml").write_text('bundles = "bundles"\n', encoding="utf-8")
    monkeypatch.chdir(root)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(root)]))
    servers: list[subprocess.Popen] = []
    yield root, servers
    for proc in servers:   # Ctrl-C first: the server then removes its socket file
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def start_server(ws, engine: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    root, servers = ws
    proc = S.popen_hearing_sigint([sys.executable, "-m", "bundlegen", "serve", "--engine", engine,
                                   "--device", "cpu", *extra], cwd=root, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
    servers.append(proc)
    line = proc.stdout.readline()   # printed once the workers are ready and the socket listens
    assert "listening on " in line, line + proc.stdout.read()
    path = Path(line.split("listening on ", 1)[1].split(" (pid", 1)[0])
    assert path.exists()
    return proc, path


def bundle(root: Path, cases) -> Path:
    S.write_bundle(root / "bundles", "quick", "served", cases)
    return root / "bundles"


def run(root: Path, engine: str, out: str, server: bool, **kwargs):
    summary = run_level("quick", engine, device="cpu", bundles=root / "bundles", out=root / out,
                        config=S.LOOSE, server=server, **kwargs)
    return summary, read_results(summary.results_path), read_run_times(root / out)


def same_records(a, b) -> None:
    assert [{k: r[k] for k in SAME} for r in a] == [{k: r[k] for k in SAME} for r in b]


@pytest.mark.parametrize("engine", ["torch-math", "triton"])
def test_a_served_run_records_what_a_fresh_run_records(ws, monkeypatch, engine):
    root, _ = ws
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    bundle(root, [S.case_of(i, S_q=4 + i, S_kv=8, D_qk=16, D_v=16) for i in range(4)])
    proc, _ = start_server(ws, engine, "--workers-per-device", "2")
    _, fresh, fresh_times = run(root, engine, "fresh", server=False, workers_per_device=2)
    summary, served, served_times = run(root, engine, "served", server=True, workers_per_device=2)
    assert fresh_times.served_by is None
    assert served_times.served_by["pid"] == proc.pid and served_times.served_by["workers_started_s_ago"] >= 0
    assert {r["verdict"] for r in served} == {V.PASS} and len(served) == 4
    same_records(sorted(fresh, key=lambda r: r["case_id"]), sorted(served, key=lambda r: r["case_id"]))
    assert served_times.per_device == tuple({**d, "seconds": d["seconds"]} for d in served_times.per_device)
    assert sum(d["cases"] for d in served_times.per_device) == 4


def test_a_server_of_other_code_or_environment_is_not_used(ws, monkeypatch):
    root, _ = ws
    (root / "servepkg").mkdir()
    (root / "servepkg" / "__init__.py").write_text("", encoding="utf-8")
    module = root / "servepkg" / "engine.py"
    module.write_text(ENGINE_MODULE, encoding="utf-8")
    bundle(root, [S.case_of(1), S.case_of(2)])
    proc, path = start_server(ws, "servepkg.engine:Mine")
    _, first, times = run(root, "servepkg.engine:Mine", "first", server=True)
    assert times.served_by["pid"] == proc.pid
    module.write_text(ENGINE_MODULE + "# changed\n", encoding="utf-8")   # the engine's code changed
    assert socket_path(serve_key("servepkg.engine:Mine", ["cpu"], 1)) != path
    _, changed, times = run(root, "servepkg.engine:Mine", "changed", server=True)
    assert times.served_by is None
    same_records(first, changed)
    module.write_text(ENGINE_MODULE, encoding="utf-8")
    monkeypatch.setenv("TRITON_INTERPRET", "0" if os.environ.get("TRITON_INTERPRET") == "1" else "1")
    _, _, times = run(root, "servepkg.engine:Mine", "env", server=True)
    assert times.served_by is None
    monkeypatch.undo()   # the same code and environment again: served
    monkeypatch.chdir(root)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(root)]))
    _, _, times = run(root, "servepkg.engine:Mine", "again", server=True)
    assert times.served_by["pid"] == proc.pid


@pytest.mark.parametrize("engine", ["torch-math", "servepkg.engine:Mine", "Some Engine!"])
def test_a_run_makes_its_key_only_where_a_server_of_its_engine_may_listen(ws, engine):
    """may_be_served is True wherever the key's socket exists (so skipping the key never
    skips a server), False without a socket of the engine's name."""
    assert not may_be_served(engine)
    path = socket_path(serve_key(engine, ["cpu"], 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "serve-other-0123456789abcdef.sock").touch()
    assert not may_be_served(engine)
    path.touch()
    assert may_be_served(engine)


def test_a_crashed_served_worker_costs_only_its_case_and_is_restarted(ws):
    root, _ = ws
    faults = {3: "raised RuntimeError", 4: "exit code 1", 5: "killed by SIGKILL", 6: "timed out"}
    cases = [S.case_of(1)]
    for s_q in faults:
        cases += [S.case_of(s_q, S_q=s_q), S.case_of(100 + s_q)]
    bundle(root, cases)
    engine = S.engine_ref(S.Faulty)
    start_server(ws, engine)
    _, fresh, _ = run(root, engine, "fresh", server=False, timeout_s=3, repeat=1)
    _, served, times = run(root, engine, "served", server=True, timeout_s=3, repeat=1)
    assert times.served_by is not None
    assert [r["case_id"] for r in served] == [c.id for c in cases]
    for fault, sound in zip(served[1::2], served[2::2]):
        s_q = next(c.graph.S_q for c in cases if c.id == fault["case_id"])
        assert fault["verdict"] == V.CRASHED and faults[s_q] in fault["detail"], fault
        assert sound["verdict"] == V.PASS, sound
    same_records(fresh, served)
    _, again, times = run(root, engine, "again", server=True, timeout_s=3, repeat=1)
    assert sum(times.served_by["worker_restarts_before"]) == 3   # exit, kill and timeout restarted it
    same_records(fresh, again)


def test_one_run_at_a_time_then_stop_from_the_command_line(ws, capsys):
    root, _ = ws
    bundle(root, [S.case_of(1)])
    proc, path = start_server(ws, "torch-math")
    key = serve_key("torch-math", ["cpu"], 1)
    first, note = open_session(key)
    assert first is not None and note == ""
    second, note = open_session(key)
    assert second is None and "busy" in note and "starting fresh workers" in note
    first.close()
    deadline = time.monotonic() + 10
    while ask(path, "status")[1]["busy"] and time.monotonic() < deadline:
        time.sleep(0.05)   # the server notices the closed session a moment later
    assert main(["run", "--level", "quick", "--engine", "torch-math", "--device", "cpu",
                 "--bundles", str(root / "bundles"), "--out", str(root / "cli"), "--quiet"]) == 0
    assert f"workers: pre-started by bundlegen serve (pid {proc.pid}" in capsys.readouterr().err
    assert main(["run", "--level", "quick", "--engine", "torch-math", "--device", "cpu", "--no-server",
                 "--bundles", str(root / "bundles"), "--out", str(root / "cli2"), "--quiet"]) == 0
    assert "pre-started" not in capsys.readouterr().err
    assert json.loads((root / "cli2" / "run.json").read_text())["served_by"] is None
    assert main(["serve", "--stop"]) == 0
    assert f"stopping bundlegen serve pid {proc.pid}" in capsys.readouterr().out
    assert proc.wait(20) == 0 and not path.exists()


def test_an_idle_server_exits_by_itself(ws):
    proc, path = start_server(ws, "torch-math", "--idle-timeout", "1")
    started = time.monotonic()
    assert proc.wait(30) == 0 and not path.exists()
    assert time.monotonic() - started >= 1.0
    assert "stopped after 0 run(s)" in proc.stdout.read()


def test_a_server_of_mps_workers_serves_only_runs_that_ask_for_mps(ws, capsys):
    plain, shared = serve_key("torch-math", ["cuda"], 4), serve_key("torch-math", ["cuda"], 4, mps=True)
    assert shared.difference(plain) == "its mps differs" and socket_path(shared) != socket_path(plain)
    assert main(["serve", "--engine", "torch-math", "--device", "cpu", "--mps"]) == V.EXIT_USAGE
    assert "--mps: MPS shares a GPU between processes; cpu is not a GPU" in capsys.readouterr().err


def test_a_released_served_worker_is_stopped_and_starts_again_for_its_next_case(ws):
    """What a run under --mps does to the server's other workers before it runs its crashed
    cases again alone: `release` stops the slot's worker process; the next case starts one."""
    from bundlegen.harness.workers.worker import WorkerSpec

    root, _ = ws
    bundle(root, [S.case_of(1)])
    proc, path = start_server(ws, "torch-math", "--workers-per-device", "2")
    slots = lambda: ask(path, "status")[1]["slots"]
    first_pids = [s["pid"] for s in slots()]
    assert all(first_pids)
    session, note = open_session(serve_key("torch-math", ["cpu"], 2))
    assert session is not None, note
    try:
        runner = session.runner_factory(1)(WorkerSpec(engine="torch-math", device="cpu", config=S.LOOSE,
                                                      repeat=1, timeout_s=60))
        runner.release()
        assert [s["pid"] for s in slots()] == [first_pids[0], None]
        assert runner.run(S.case_of(1)).verdict == V.PASS
        now = slots()
        assert now[0]["pid"] == first_pids[0] and now[1]["pid"] not in (None, first_pids[1])
        assert [s["restarts"] for s in now] == [0, 1]
        runner.close()
    finally:
        session.close()


class FreezesItsServer(S.TorchMathEngine):
    """At its case of S_q 7, once, stops the process whose pid `freeze.pid` (in the current
    folder) names with SIGSTOP: the served run's server freezes mid-run."""
    name = "freezes-its-server"

    def run(self, graph, tensors):
        pid, done = Path("freeze.pid"), Path("frozen")
        if graph.S_q == 7 and pid.is_file() and not done.exists():
            done.write_text("1")
            os.kill(int(pid.read_text()), signal.SIGSTOP)
        super().run(graph, tensors)


def test_a_server_that_stops_answering_is_abandoned_and_nothing_is_lost(ws, monkeypatch, caplog):
    """A real server stopped (SIGSTOP) while a case is in flight: the run waits the case's
    deadline, says so in one line, and runs that case and the rest in a fresh worker."""
    from bundlegen.harness.workers import serve_client
    root, _ = ws
    cases = [S.case_of(1), S.case_of(2, S_q=7), S.case_of(3), S.case_of(4)]
    bundle(root, cases)
    engine = f"{__name__}:{FreezesItsServer.__qualname__}"
    proc, _ = start_server(ws, engine)
    (root / "freeze.pid").write_text(str(proc.pid))
    monkeypatch.setattr(serve_client, "ANSWER_SLACK_S", 2.0, raising=False)
    import threading
    thaw = threading.Timer(75, proc.send_signal, (signal.SIGCONT,))   # bounds the test without deadlines
    thaw.start()
    started = time.monotonic()
    try:
        _, served, times = run(root, engine, "served", server=True, timeout_s=3, repeat=1)
    finally:
        thaw.cancel()
        proc.send_signal(signal.SIGCONT)
    assert time.monotonic() - started < 70, "the run waited for the frozen server"
    assert (root / "frozen").exists() and times.served_by is not None
    assert [r["case_id"] for r in served] == [c.id for c in cases]
    assert all(r["verdict"] == V.PASS for r in served), [r["detail"] for r in served]
    lines = [r.getMessage() for r in caplog.records if "stopped answering" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and "fresh workers" in lines[0]
