"""A `bundlegen serve` socket is used only when nobody but the run's user could have put it
there and only the run's user answers on it (issue 45): a fake server in a folder another
uid owns, in a folder others may use, behind a symbolic link, or answering as another uid
is refused in one line and the run goes on with fresh workers; messages are JSON, so a
pickle sent as an answer runs nothing."""
from __future__ import annotations

import os
import pickle
import shutil
import socket
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from bundlegen.harness import verdicts as V
from bundlegen.harness.level import run_level
from bundlegen.harness.results import read_results, read_run_times
from bundlegen.harness.workers import serve_wire as wire
from bundlegen.harness.workers.serve_client import open_session
from bundlegen.harness.workers.serve_key import serve_key, socket_path
from tests import harness_support as S

OTHER_UID = 65534   # nobody
ENGINE = "torch-math"


@pytest.fixture
def ws(tmp_path, monkeypatch):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "bundlegen.toml").write_text('bundles = "bundles"\n', encoding="utf-8")
    monkeypatch.chdir(root)
    return root


def grant(key_path: Path) -> dict:
    """What a server that grants a session says about itself."""
    return {"pid": os.getpid(), "started_unix": 0.0, "runs": 0, "busy": False, "socket": str(key_path),
            "token": "t", "slots": [{"device": "cpu", "engine": ENGINE, "arch": "cpu", "versions": {},
                                     "restarts": 0, "pid": os.getpid()}]}


class FakeServer:
    """A listener at `path` that grants every hello (and would answer every case 'pass');
    `reply` replaces the grant's bytes."""

    def __init__(self, path: Path, reply: bytes | None = None):
        self.path, self.reply, self.hellos = path, reply, 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                client, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._answer, args=(Connection(client.detach()),), daemon=True).start()

    def _answer(self, conn: Connection) -> None:
        try:
            conn.recv_bytes()
            self.hellos += 1
            if self.reply is None:
                wire.send(conn, "granted", grant(self.path))
            else:
                conn.send_bytes(self.reply)
            conn.recv_bytes()   # held until the run closes it
        except (EOFError, OSError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def fake(ws):
    servers: list[FakeServer] = []

    def start(path: Path, reply: bytes | None = None) -> FakeServer:
        servers.append(FakeServer(path, reply))
        return servers[-1]
    yield start
    for server in servers:
        server.close()


def key_and_path():
    key = serve_key(ENGINE, ["cpu"], 1)
    path = socket_path(key)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    return key, path


def refused(key, why: str) -> None:
    session, note = open_session(key)
    assert session is None, "an untrusted server was used"
    assert "refused" in note and why in note and "starting fresh workers" in note, note
    assert "\n" not in note


def test_a_private_fake_server_is_used_so_the_refusals_below_are_the_checks(ws, fake):
    key, path = key_and_path()
    fake(path)
    session, note = open_session(key)
    assert session is not None and note == ""
    session.close()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


@needs_root
def test_a_socket_in_a_folder_of_another_uid_is_refused(ws, fake):
    key, path = key_and_path()
    server = fake(path)
    os.chown(path.parent, OTHER_UID, OTHER_UID)
    refused(key, f"belongs to uid {OTHER_UID}")
    assert server.hellos == 0


@needs_root
def test_a_socket_of_another_uid_is_refused(ws, fake):
    key, path = key_and_path()
    server = fake(path)
    os.chown(path, OTHER_UID, OTHER_UID)
    refused(key, f"{path} belongs to uid {OTHER_UID}")
    assert server.hellos == 0


def test_a_socket_in_a_folder_others_may_use_is_refused(ws, fake):
    key, path = key_and_path()
    server = fake(path)
    os.chmod(path.parent, 0o777)
    refused(key, "has mode 0777")
    assert server.hellos == 0


def test_a_socket_folder_that_is_a_symbolic_link_is_refused(ws, fake, tmp_path):
    key, path = key_and_path()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    shutil.rmtree(path.parent)
    path.parent.symlink_to(elsewhere)
    server = fake(path)
    refused(key, "is a symbolic link")
    assert server.hellos == 0


def test_a_per_user_folder_that_is_a_link_gets_nothing_made_through_it(tmp_path):
    from bundlegen.harness.workers.serve_trust import make_private_folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / f"bundlegen-{os.getuid()}").symlink_to(elsewhere)
    why = make_private_folder(tmp_path / f"bundlegen-{os.getuid()}" / "0123abcd" / "serve-x.sock")
    assert why and "symbolic link" in why
    assert list(elsewhere.iterdir()) == []


def test_a_socket_that_is_a_symbolic_link_is_refused(ws, fake, tmp_path):
    key, path = key_and_path()
    real = path.parent / "real.sock"
    server = fake(real)
    path.symlink_to(real)
    refused(key, "is a symbolic link")
    assert server.hellos == 0


@needs_root
def test_a_server_answering_as_another_uid_is_refused(ws):
    """The socket file and its folder are the run's, but the process listening on it runs
    as another uid (SO_PEERCRED gives the uid of the process that called listen)."""
    if not hasattr(socket, "SO_PEERCRED"):
        pytest.skip("no SO_PEERCRED on this system")
    key, path = key_and_path()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the fake server: gives up root, then listens and grants every hello
        try:
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            sock.listen(4)
            os.write(ready_w, b"up")
            while True:
                conn = Connection(sock.accept()[0].detach())
                conn.recv_bytes()
                wire.send(conn, "granted", grant(path))
        finally:
            os._exit(0)
    try:
        os.close(ready_w)
        assert os.read(ready_r, 2) == b"up"
        refused(key, f"runs as uid {OTHER_UID}")
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(ready_r)
        sock.close()


class Boom:
    def __reduce__(self):
        return (os.system, (f"touch {Path.cwd() / 'ran'}",))


def test_a_pickled_answer_runs_nothing_and_the_server_is_refused(ws, fake):
    key, path = key_and_path()
    fake(path, reply=pickle.dumps(("granted", Boom())))
    session, note = open_session(key)
    assert session is None and "not a bundlegen serve message" in note, note
    assert not (ws / "ran").exists()


def test_a_message_naming_a_record_outside_the_list_is_refused():
    with pytest.raises(wire.WireError, match="unknown record"):
        wire.decode({"~r": "Popen", "f": {"args": ["true"]}})
    with pytest.raises(wire.WireError, match="cannot cross"):
        wire.encode(object())


def test_configs_cases_and_outcomes_cross_the_socket_as_they_are():
    """Every engine config of the repository (skip rows with version scopes, overrides,
    claims, the manifest) and a case and its outcome read back equal to what was sent."""
    import json

    from bundlegen.harness import bundles as B
    from bundlegen.harness.case import CaseOutcome
    from bundlegen.harness.config import load_engine_config

    manifest = B.manifest_of(B.default_bundle_root(), None)
    repo = Path(__file__).resolve().parents[1]
    configs = [load_engine_config(d, manifest) for d in sorted((repo / "engines").iterdir())
               if (d / "engine.toml").is_file()]
    assert any(row.seen_with for c in configs for row in c.skips), "no version-scoped skip row to send"
    case = S.case_of(3)
    outcome = CaseOutcome(V.PASS, tolerance={"rtol": 0.1, "atol": 0.01},
                          outputs={"dq": {"max_abs": float("nan")}}, margin=0.5)
    for value in (*configs, case, [case.graph], outcome, (configs[0], 2, 3.5)):
        back = wire.decode(json.loads(json.dumps(wire.encode(value))))
        if value is outcome:
            assert back.tolerance == outcome.tolerance and back.margin == outcome.margin
        else:
            assert back == value


def test_a_run_refuses_an_untrusted_server_and_goes_on_with_fresh_workers(ws, fake):
    key, path = key_and_path()
    server = fake(path)
    os.chmod(path.parent, 0o755)
    S.write_bundle(ws / "bundles", "quick", "served", [S.case_of(1), S.case_of(2)])
    summary = run_level("quick", ENGINE, device="cpu", bundles=ws / "bundles", out=ws / "out",
                        config=S.LOOSE, server=True)
    assert "refused" in summary.server_note and "has mode 0755" in summary.server_note
    assert read_run_times(ws / "out").served_by is None and server.hellos == 0
    assert [r["verdict"] for r in read_results(summary.results_path)] == [V.PASS, V.PASS]


class Scripted:
    """A listener answering each message of a connection with the next reply of `replies`
    (raw bytes), then holding the connection."""

    def __init__(self, path: Path, replies: list[bytes]):
        self.replies = list(replies)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn = Connection(self.sock.accept()[0].detach())
        try:
            for reply in self.replies:
                conn.recv_bytes()
                conn.send_bytes(reply)
            conn.recv_bytes()
        except (EOFError, OSError):
            pass


@pytest.mark.parametrize("case_reply", [
    b'["outcome", "not an outcome"]',
    b'["outcome", {"~r": "Tolerance", "f": {"rtol": 1, "atol": 1}}]',
    b'["error", null]',
])
def test_a_served_slot_answering_badly_goes_local_without_a_traceback(ws, monkeypatch, case_reply):
    """A same-user server that grants a session and then answers a case with something that
    is not an outcome: the case, and the slot's later ones, run in a fresh local worker."""
    from bundlegen.harness.workers import serve_client
    from bundlegen.harness.workers.pool import worker_spec

    class Local:
        def __init__(self, spec):
            self.ran = []

        def run(self, case):
            self.ran.append(case)
            return "local outcome"
    monkeypatch.setattr(serve_client, "IsolatedRunner", Local)
    key, path = key_and_path()
    Scripted(path, [b'["attached", null]', b'["configured", null]', case_reply])
    session = serve_client.Session(path, None, grant(path), 0.0)
    runner = serve_client.RemoteRunner(session, 0, worker_spec(ENGINE, "cpu"))
    assert runner.run("a case") == "local outcome" and runner._local.ran == ["a case"]
