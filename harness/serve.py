"""`bundlegen serve`: a pool of warm workers that later `bundlegen run`s use instead of
starting their own (the worker start, a few seconds on a GPU host, is paid once).

The server owns one `IsolatedRunner` per worker slot (the same worker processes, protocol
and crash handling as a fresh run) and listens on a Unix socket named by its `ServeKey`.
A run says hello on one connection (its session: one run at a time; a second is told the
server is busy), then attaches one connection per slot, sends that slot the run's
configuration, and relays prepare and case messages; the runner's outcome goes back as is,
so a crashed or hung case is recorded exactly as in a fresh run and the runner restarts
its worker. The server exits after `idle_timeout_s` without a run, or on a stop message
(after the run in progress)."""
from __future__ import annotations

import os
import select
import socket
import threading
import time
import uuid
from multiprocessing.connection import Connection

from bundlegen.harness.serve_key import ServeKey, socket_path

DEFAULT_IDLE_TIMEOUT_S = 900.0
#: seconds between the accept loop's looks at the idle clock and the stop flag
TICK_S = 0.5


class ServeError(RuntimeError):
    """The server cannot start (another one answers on its socket)."""


class Server:
    def __init__(self, key: ServeKey, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S):
        self.key, self.idle_timeout_s = key, idle_timeout_s
        self.path = socket_path(key)
        self.executors: list = []
        self.slot_locks: list[threading.Lock] = []
        self.session: str | None = None   # the token of the run being served
        self.state = threading.Lock()
        self.stopping = threading.Event()
        self.last_active = time.monotonic()
        self.started_unix = time.time()
        self.runs = 0
        self._listener: socket.socket | None = None
        self.daemon = None   # the MPS daemon of key.mps (harness.mps)

    # -- start and stop
    def start_workers(self) -> None:
        """Start every slot's worker (engine built and warmed up), all at once; raises
        WorkerStartError like a run would."""
        from bundlegen.harness.run import CaseExecutor, _close_all, _cpu_share, default_timeout, worker_devices

        workers = worker_devices(list(self.key.devices), self.key.workers_per_device)
        if self.key.mps:
            from bundlegen.harness.mps import start_mps

            self.daemon = start_mps(workers)
        try:
            for dev in workers:
                self.executors.append(CaseExecutor(
                    self.key.engine, dev, timeout_s=default_timeout(dev), wait=False,
                    cpu_threads=_cpu_share(len(workers)),
                    env=self.daemon.env if self.daemon else None))
            for ex in self.executors:
                ex.wait_ready()
        except BaseException:
            self.close()
            raise
        self.slot_locks = [threading.Lock() for _ in self.executors]
        self.started_unix = time.time()

    def close(self) -> None:
        from bundlegen.harness.run import _close_all

        _close_all(self.executors)
        if self.daemon:
            self.daemon.stop()
            self.daemon = None

    def listen(self) -> None:
        """Bind the socket (after the workers are ready: a run that finds it is served at once)."""
        self._listener = self._bind()
        self.last_active = time.monotonic()   # the idle clock starts now, not at the workers' start

    def serve_forever(self) -> None:
        """Answer runs until stopped or idle; the socket file is removed on the way out."""
        listener = self._listener
        try:
            while True:
                ready, _, _ = select.select([listener], [], [], TICK_S)
                if ready:
                    sock, _ = listener.accept()
                    threading.Thread(target=self._handle, args=(Connection(sock.detach()),),
                                     daemon=True, name="bundlegen-serve-conn").start()
                with self.state:
                    idle = self.session is None and not any(lock.locked() for lock in self.slot_locks)
                    if idle and (self.stopping.is_set()
                                 or time.monotonic() - self.last_active > self.idle_timeout_s):
                        return
        finally:
            listener.close()
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def _bind(self) -> socket.socket:
        from bundlegen.harness.serve_client import ask

        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.path.exists():
            if ask(self.path, ("status", None)) is not None:
                raise ServeError(f"a server already answers on {self.path} (bundlegen serve --stop ends it)")
            self.path.unlink()   # left by a server that did not exit cleanly
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)   # the socket is this user's only: messages are pickles
        try:
            listener.bind(str(self.path))
        finally:
            os.umask(old)
        listener.listen(16)
        return listener

    # -- one connection
    def info(self) -> dict:
        return {"pid": os.getpid(), "started_unix": self.started_unix, "runs": self.runs,
                "busy": self.session is not None, "socket": str(self.path),
                "slots": [{"device": ex.device, "engine": ex.engine_name, "arch": ex.arch,
                           "versions": ex.versions, "restarts": getattr(ex.runner, "restarts", 0),
                           "pid": getattr(ex.runner, "pid", None)}
                          for ex in self.executors]}

    def _handle(self, conn: Connection) -> None:
        try:
            kind, payload = conn.recv()
            if kind == "status":
                conn.send(("status", self.info()))
            elif kind == "stop":
                self.stopping.set()
                conn.send(("stopping", self.info()))
            elif kind == "hello":
                self._session(conn, payload)
            elif kind == "attach":
                self._slot(conn, *payload)
        except (EOFError, OSError):
            pass
        finally:
            conn.close()

    def _session(self, conn: Connection, key: ServeKey) -> None:
        why = self.key.difference(key) if isinstance(key, ServeKey) else "it sent no key"
        if why:
            conn.send(("refused", f"the server's key is not this run's ({why})"))
            return
        with self.state:
            if self.stopping.is_set():
                conn.send(("refused", "the server is stopping"))
                return
            if self.session is not None:
                conn.send(("busy", "it is busy serving another run (one run at a time)"))
                return
            token = self.session = uuid.uuid4().hex
            info = self.info()
            self.runs += 1
        try:
            conn.send(("granted", {**info, "token": token}))
            while True:   # the run holds the server until it closes this connection
                conn.recv()
        finally:
            with self.state:
                self.session = None
                self.last_active = time.monotonic()

    def _slot(self, conn: Connection, token: str, slot: int) -> None:
        if token != self.session or not 0 <= slot < len(self.executors):
            conn.send(("refused", "no such run or slot"))
            return
        runner = self.executors[slot].runner
        with self.slot_locks[slot]:   # a case left running by a run that went away ends first
            conn.send(("attached", None))
            while True:
                kind, payload = conn.recv()
                self.last_active = time.monotonic()
                if kind == "configure":
                    runner.reconfigure(*payload)
                    conn.send(("configured", None))
                elif kind == "prepare":
                    conn.send(("prepared", runner.prepare(payload)))
                elif kind == "case":
                    conn.send(("outcome", runner.run(payload)))
                elif kind == "release":
                    runner.release()
                    conn.send(("released", None))
