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

from bundlegen.harness.workers import mps
from bundlegen.harness.workers.devices import default_timeout, worker_devices
from bundlegen.harness.workers.pool import close_all, cpu_share, worker_spec
from bundlegen.graph import Case, Graph
from bundlegen.harness.config import EngineConfig
from bundlegen.harness.workers import serve_wire as wire
from bundlegen.harness.workers.serve_client import ask
from bundlegen.harness.workers.serve_key import ServeKey, socket_path
from bundlegen.harness.workers.serve_trust import make_private_folder, untrusted_peer
from bundlegen.harness.workers.worker import IsolatedRunner

DEFAULT_IDLE_TIMEOUT_S = 900.0
#: seconds between the accept loop's looks at the idle clock and the stop flag
TICK_S = 0.5


class ServeError(RuntimeError):
    """The server cannot start (another one answers on its socket)."""


class Server:
    def __init__(self, key: ServeKey, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S):
        self.key, self.idle_timeout_s = key, idle_timeout_s
        self.path = socket_path(key)
        self.runners: list[IsolatedRunner] = []
        self.slot_locks: list[threading.Lock] = []
        self.session: str | None = None   # the token of the run being served
        self.state = threading.Lock()
        self.stopping = threading.Event()
        self.last_active = time.monotonic()
        self.started_unix = time.time()
        self.runs = 0
        self._listener: socket.socket | None = None
        self.daemon = None   # the MPS daemon of key.mps (workers.mps)

    # -- start and stop
    def start_workers(self) -> None:
        """Start every slot's worker (engine built and warmed up), all at once; raises
        WorkerStartError like a run would."""
        workers = worker_devices(list(self.key.devices), self.key.workers_per_device)
        if self.key.mps:
            self.daemon = mps.start_mps(workers)
        try:
            for dev in workers:
                spec = worker_spec(self.key.engine, dev, timeout_s=default_timeout(dev),
                                   cpu_threads=cpu_share(len(workers)),
                                   env=self.daemon.env if self.daemon else None)
                self.runners.append(IsolatedRunner(spec, wait=False))
            for runner in self.runners:
                runner.wait_ready()
        except BaseException:
            self.close()
            raise
        self.slot_locks = [threading.Lock() for _ in self.runners]
        self.started_unix = time.time()

    def close(self) -> None:
        close_all(self.runners)
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
                    threading.Thread(target=self._handle, args=(sock,),
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
        why = make_private_folder(self.path)
        if why:
            raise ServeError(f"will not listen in {self.path.parent}: {why}")
        if self.path.exists() or self.path.is_symlink():
            if ask(self.path, "status") is not None:
                raise ServeError(f"a server already answers on {self.path} (bundlegen serve --stop ends it)")
            self.path.unlink()   # left by a server that did not exit cleanly
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)   # the socket is this user's only
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
                "slots": [{"device": runner.spec.device, "engine": runner.engine_name,
                           "arch": runner.arch, "versions": runner.versions,
                           "restarts": runner.restarts, "pid": runner.pid}
                          for runner in self.runners]}

    def _handle(self, sock: socket.socket) -> None:
        """One connection, from a process of this user's only (workers.serve_trust); a
        message not of workers.serve_wire's form ends it."""
        try:
            if untrusted_peer(sock):
                sock.close()
                return
        except OSError:
            sock.close()
            return
        conn = Connection(sock.detach())
        try:
            kind, payload = wire.recv(conn)
            if kind == "status":
                wire.send(conn, "status", self.info())
            elif kind == "stop":
                self.stopping.set()
                wire.send(conn, "stopping", self.info())
            elif kind == "hello":
                self._session(conn, payload)
            elif kind == "attach" and _is_attach(payload):
                self._slot(conn, *payload)
        except (EOFError, OSError, wire.WireError):
            pass
        finally:
            conn.close()

    def _session(self, conn: Connection, key: ServeKey) -> None:
        why = self.key.difference(key) if isinstance(key, ServeKey) else "it sent no key"
        if why:
            wire.send(conn, "refused", f"the server's key is not this run's ({why})")
            return
        with self.state:
            if self.stopping.is_set():
                wire.send(conn, "refused", "the server is stopping")
                return
            if self.session is not None:
                wire.send(conn, "busy", "it is busy serving another run (one run at a time)")
                return
            token = self.session = uuid.uuid4().hex
            info = self.info()
            self.runs += 1
        try:
            wire.send(conn, "granted", {**info, "token": token})
            while True:   # the run holds the server until it closes this connection
                conn.recv_bytes()
        finally:
            with self.state:
                self.session = None
                self.last_active = time.monotonic()

    def _slot(self, conn: Connection, token: str, slot: int) -> None:
        if token != self.session or not 0 <= slot < len(self.runners):
            wire.send(conn, "refused", "no such run or slot")
            return
        runner = self.runners[slot]
        with self.slot_locks[slot]:   # a case left running by a run that went away ends first
            wire.send(conn, "attached")
            while True:
                kind, payload = wire.recv(conn)
                self.last_active = time.monotonic()
                if kind == "configure" and _is_configure(payload):
                    runner.reconfigure(*payload)
                    wire.send(conn, "configured")
                elif kind == "prepare" and isinstance(payload, list) \
                        and all(isinstance(g, Graph) for g in payload):
                    wire.send(conn, "prepared", runner.prepare(payload))
                elif kind == "case" and isinstance(payload, Case):
                    wire.send(conn, "outcome", runner.run(payload))
                elif kind == "release":
                    runner.release()
                    wire.send(conn, "released")
                else:
                    return   # not a message of this protocol: the connection ends


def _is_attach(payload) -> bool:
    return (isinstance(payload, tuple) and len(payload) == 2 and isinstance(payload[0], str)
            and isinstance(payload[1], int))


def _is_configure(payload) -> bool:
    """(EngineConfig, repeat or None, timeout seconds or None)."""
    return (isinstance(payload, tuple) and len(payload) == 3 and isinstance(payload[0], EngineConfig)
            and (payload[1] is None or isinstance(payload[1], int))
            and (payload[2] is None or isinstance(payload[2], (int, float))))
