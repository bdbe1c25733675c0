"""The run's side of `bundlegen serve` (workers.serve): find the server of this run's
`ServeKey`, hold its session for the run, and give each worker slot a `RemoteRunner`,
which stands where a run's `IsolatedRunner` would. A server that goes away mid-run costs
nothing: the slot's cases go on in a fresh local worker (the case in flight included).

Every read and write on a server's socket has a deadline, so a server that stops answering
(stopped with SIGSTOP, hung, swapped out) is abandoned like one that went away, with one
line: an answer must begin within its message's deadline (a case: the per-case timeout
plus ANSWER_SLACK_S; prepare: its limit plus the slack; anything else ANSWER_TIMEOUT_S), and
no single read or write may stall for longer than IO_STALL_S once begun (a reply cut off
mid-message, a server that no longer reads what it is sent)."""
from __future__ import annotations

import logging
import socket
import struct
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from bundlegen.harness.case import CaseOutcome
from bundlegen.harness.workers import serve_wire as wire
from bundlegen.harness.workers.serve_key import ServeKey, serve_dir, socket_path
from bundlegen.harness.workers.serve_trust import untrusted_peer, untrusted_socket
from bundlegen.harness.workers.worker import PREPARE_TIMEOUT_S, IsolatedRunner

#: seconds to wait for a server's answer to hello, status, stop, attach, configure or release
ANSWER_TIMEOUT_S = 10.0
#: what a served case or prepare may take past its own limit before its answer begins (the
#: server answers a case that overran the limit itself, after killing its worker)
ANSWER_SLACK_S = 30.0
#: the longest one read or write on the socket may make no progress
IO_STALL_S = 20.0

LOG = logging.getLogger(__name__)


class Unanswered(OSError):
    """The server did not begin its answer within the message's deadline."""


def _with_deadlines(sock: socket.socket) -> None:
    """Any single read or write on `sock` that waits IO_STALL_S fails (SO_RCVTIMEO,
    SO_SNDTIMEO: the socket stays blocking, so Connection's framing is unchanged)."""
    whole = int(IO_STALL_S)
    value = struct.pack("ll", whole, int((IO_STALL_S - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def connect(path: Path) -> tuple[Connection | None, str]:
    """A connection to the server at `path` once the socket and the process answering on it
    pass every check of workers.serve_trust; else None and why ('' when none answers)."""
    why = untrusted_socket(path)
    if why:
        return None, why
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        _with_deadlines(sock)
        why = untrusted_peer(sock)
    except OSError:
        sock.close()
        return None, ""
    if why:
        sock.close()
        return None, why
    return Connection(sock.detach()), ""


def ask(path: Path, kind: str, payload=None) -> tuple | None:
    """One question to the server at `path`; its answer, or None when none answers (or the
    socket fails a check)."""
    conn, _ = connect(path)
    if conn is None:
        return None
    try:
        wire.send(conn, kind, payload)
        return wire.recv(conn) if conn.poll(ANSWER_TIMEOUT_S) else None
    except (EOFError, OSError, wire.WireError):
        return None
    finally:
        conn.close()


@dataclass
class Session:
    """A run's hold on a server: while it is open no other run is served."""
    path: Path
    conn: Connection
    info: dict
    connected_unix: float

    def runner_factory(self, slot: int):
        return lambda spec: RemoteRunner(self, slot, spec)

    def record(self) -> dict:
        """What run.json says about the server (`served_by`)."""
        return {"pid": self.info["pid"], "socket": str(self.path),
                "workers_started_s_ago": round(self.connected_unix - self.info["started_unix"], 1),
                "runs_served_before": self.info["runs"],
                "worker_restarts_before": [s["restarts"] for s in self.info["slots"]]}

    def close(self) -> None:
        self.conn.close()


def open_session(key: ServeKey) -> tuple[Session | None, str]:
    """The session of the server matching `key`, or None and a line saying why none is
    used ('' when there is no server to speak of)."""
    path = socket_path(key)
    if not path.exists() and not path.is_symlink():
        return None, ""
    conn, why = connect(path)
    if conn is None:
        return None, (f"bundlegen serve at {path} refused: {why}; starting fresh workers" if why else "")
    try:
        wire.send(conn, "hello", key)
        answer = wire.recv(conn) if conn.poll(ANSWER_TIMEOUT_S) else ("busy", "it did not answer")
    except (EOFError, OSError):
        answer = ("refused", "it closed the connection")
    except wire.WireError as exc:
        answer = ("refused", f"its answer is not a bundlegen serve message ({exc})")
    kind, payload = answer
    if kind == "granted" and not _session_info(payload):
        kind, payload = "refused", "its answer does not describe its workers"
    if kind != "granted":
        conn.close()
        return None, f"bundlegen serve at {path} not used: {payload}; starting fresh workers"
    return Session(path, conn, payload, time.time()), ""


def _session_info(info) -> bool:
    """Whether a server's grant holds what a run reads from it."""
    try:
        return (isinstance(info["token"], str) and isinstance(info["pid"], int)
                and isinstance(info["started_unix"], (int, float)) and isinstance(info["runs"], int)
                and isinstance(info["slots"], list) and bool(info["slots"])
                and all(isinstance(s["device"], str) and isinstance(s["versions"], dict)
                        and isinstance(s["engine"], str) and isinstance(s["arch"], str)
                        and isinstance(s["restarts"], int) for s in info["slots"]))
    except (KeyError, TypeError):
        return False


class RemoteRunner:
    """A served worker slot, with IsolatedRunner's interface."""

    def __init__(self, session: Session, slot: int, spec):
        self.spec = spec
        self.restarts = 0
        self._local = None
        if slot >= len(session.info["slots"]):
            raise ValueError(f"served slot {slot}: the server has {len(session.info['slots'])} slots")
        slot_info = session.info["slots"][slot]
        self.engine_name, self.arch = slot_info["engine"], slot_info["arch"]
        self.versions = slot_info["versions"]
        if slot_info["device"] != spec.device:
            raise ValueError(f"served slot {slot} is on {slot_info['device']}, not {spec.device}")
        self._path = session.path
        self._conn, _ = connect(session.path)
        if self._conn is None or self._ask(("attach", (session.info["token"], slot)), "attached") is None \
                or self._ask(("configure", (spec.config, spec.repeat, spec.timeout_s)), "configured") is None:
            self._go_local()

    def _ask(self, message, expect: str, deadline_s: float = ANSWER_TIMEOUT_S, payload_types: tuple = (object,)):
        """The server's answer, or None when it is gone or does not answer within
        `deadline_s` (this slot then runs locally; a server that stopped answering is
        named in one line). An answer of another kind, or whose payload is not one of
        `payload_types`, counts as none."""
        if self._conn is None:
            return None
        try:
            wire.send(self._conn, *message)
            if not self._conn.poll(deadline_s):
                raise Unanswered(f"no answer to {message[0]!r} within {deadline_s:g} s")
            kind, payload = wire.recv(self._conn)
        except (Unanswered, BlockingIOError, TimeoutError) as exc:
            LOG.warning("bundlegen serve at %s stopped answering (%s): abandoned; its cases go on in "
                        "fresh workers", self._path, exc)
            return None
        except (EOFError, OSError, wire.WireError):
            return None
        return (kind, payload) if kind == expect and isinstance(payload, payload_types) else None

    def _limit(self, fallback: float) -> float:
        """A served case's or prepare's deadline: its own limit plus ANSWER_SLACK_S."""
        own = self.spec.timeout_s if self.spec.timeout_s is not None else fallback
        return own + ANSWER_SLACK_S

    def _go_local(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._local = IsolatedRunner(self.spec)

    def wait_ready(self) -> None:
        pass

    def prepare(self, graphs) -> str | None:
        if self._local is None:
            answer = self._ask(("prepare", list(graphs)), "prepared", self._limit(PREPARE_TIMEOUT_S),
                               (str, type(None)))
            if answer is not None:
                return answer[1]
            self._go_local()
        return self._local.prepare(graphs)

    def run(self, case):
        if self._local is None:
            answer = self._ask(("case", case), "outcome", self._limit(PREPARE_TIMEOUT_S), (CaseOutcome,))
            if answer is not None:
                return answer[1]
            self._go_local()   # the server went away: this case and the rest run here
        return self._local.run(case)

    def release(self, wait: bool = True) -> None:
        if self._local is not None:
            self._local.release(wait)
        else:   # a server gone away has no worker left to stop
            self._ask(("release", None), "released")

    def close(self, wait: bool = True) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._local is not None:
            self._local.close(wait)


def stop_servers(folder: Path | None = None) -> list[dict]:
    """Ask every server of this workspace to stop (each finishes the run it is serving
    first); what each said about itself."""
    folder = serve_dir() if folder is None else folder
    stopped = []
    for path in sorted(folder.glob("serve-*.sock")) if folder.is_dir() else ():
        answer = ask(path, "stop")
        if answer is not None:
            stopped.append(answer[1])
    return stopped
