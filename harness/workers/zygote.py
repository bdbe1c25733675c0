"""Restarted workers forked from a zygote that has imported torch once.

A worker's start is mostly importing torch (bench/worker_start.py times each step). A
run's first workers start plainly, side by side (one zygote importing first and then forking
is no faster there: bench/zygote_start.py). Every later start of a worker (a restart after a
crash or a timeout, a start after a release) is forked from the zygote instead, which skips
the import (worker.start_worker). Not an MPS client's (worker.restarts_fork says why).

The zygote (`python -m bundlegen.harness.workers.zygote`, one per harness process, started in the
background once a worker is ready) imports torch, never touches a GPU, and forks one child
per request; a child sets its own environment, takes its own session (so a timeout's killpg
ends the engine's helper processes with it) and runs `worker.worker_main`, exactly as a
worker started by `python -m bundlegen.harness.workers.worker` does. A GPU is first touched after
the fork, in the child, which is what makes forking safe with CUDA.

The zygote is the children's parent, so it reaps them and reports each exit status to the
harness (`ForkedWorker` stands in for a subprocess.Popen). When the zygote cannot be
started, or has died, a worker is started the plain way.

Messages travel over a SOCK_SEQPACKET socket pair, one pickled tuple per packet; a spawn
request carries the worker's end of its socket pair as an SCM_RIGHTS file descriptor.
"""
from __future__ import annotations

import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

from bundlegen.harness.workers import pycache, switches

#: the most bytes of one message (a spawn request holds the worker's whole environment)
PACKET_BYTES = 1 << 20
#: seconds a spawn request may wait for the zygote's answer (its imports come first)
SPAWN_TIMEOUT_S = 180.0
#: ForkedWorker.returncode of a worker whose zygote died before saying how it ended
EXIT_UNKNOWN = -(1 << 16)


def enabled() -> bool:
    """Whether workers are forked from a zygote: where fork and fd passing exist, unless
    BUNDLEGEN_ZYGOTE=0 (the plain start, e.g. to compare the two: bench/worker_start.py)."""
    return (not switches.turned_off("BUNDLEGEN_ZYGOTE") and hasattr(os, "fork")
            and hasattr(socket, "send_fds") and sys.platform == "linux")


class ForkedWorker:
    """A worker forked by the zygote, with the parts of subprocess.Popen the harness uses:
    pid, poll(), wait(timeout)."""

    def __init__(self, zygote: "Zygote"):
        self._zygote = zygote
        self._spawned = threading.Event()
        self._exited = threading.Event()
        self._pid: int | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        """The worker's pid (waits for the zygote's answer to the spawn request)."""
        if not self._spawned.wait(SPAWN_TIMEOUT_S) or self._pid is None:
            raise OSError("the zygote did not fork the worker")
        return self._pid

    def poll(self) -> int | None:
        if not self._exited.is_set() and self._zygote.lost and not self._alive():
            self._ended(EXIT_UNKNOWN)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("bundlegen worker", timeout)
            self._exited.wait(0.2 if left is None else min(0.2, left))
        return self.returncode

    def _alive(self) -> bool:
        if self._pid is None:
            return False
        try:
            os.kill(self._pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    # -- called by the zygote's reader thread
    def _forked(self, pid: int | None) -> None:
        self._pid = pid
        self._spawned.set()
        if pid is None:
            self._ended(EXIT_UNKNOWN)

    def _ended(self, code: int) -> None:
        self.returncode = code
        self._spawned.set()
        self._exited.set()


class Zygote:
    """The harness's end of a zygote process: spawn() hands it a worker's socket and
    environment and returns at once (the zygote may still be importing torch)."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # its own session: Ctrl-C in the terminal is the harness's to handle; the zygote
            # ends when its socket closes, whatever ended the harness
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bundlegen.harness.workers.zygote", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True,
                env=pycache.with_bytecode(os.environ))
        finally:
            theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self._children: dict[int, ForkedWorker] = {}      # request token -> child
        self._by_pid: dict[int, ForkedWorker] = {}
        self._next = 0
        self.lost = False
        threading.Thread(target=self._read, daemon=True, name="bundlegen-zygote").start()

    def spawn(self, fd: int, env: dict[str, str]) -> ForkedWorker:
        """Fork a worker that talks over `fd` (the caller closes its copy), with `env`."""
        child = ForkedWorker(self)
        with self._lock:
            if self.lost:
                raise OSError("the zygote is gone")
            token, self._next = self._next, self._next + 1
            self._children[token] = child
        try:
            socket.send_fds(self._sock, [pickle.dumps(("spawn", token, sys.path, env))], [fd])
        except OSError:
            with self._lock:
                self._children.pop(token, None)
            raise
        return child

    def close(self) -> None:
        """End the zygote (its workers live on until their own sockets close)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _read(self) -> None:
        while True:
            try:
                packet = self._sock.recv(PACKET_BYTES)
            except OSError:
                packet = b""
            if not packet:
                break
            kind, key, value = pickle.loads(packet)
            # the zygote says "forked" before it can reap that child: "exited" comes after
            with self._lock:
                if kind == "forked":
                    child = self._children.pop(key)
                    if value is not None:
                        self._by_pid[value] = child
                else:   # "exited": key is the pid
                    child = self._by_pid.pop(key, None)
            if child is None:
                continue
            if kind == "forked":
                child._forked(value)
            else:
                child._ended(value)
        with self._lock:
            self.lost = True
            waiting = list(self._children.values())
            self._children.clear()
        for child in waiting:
            child._forked(None)


_SHARED: Zygote | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> Zygote | None:
    """This process's zygote, started on first use (and again if it died); None where
    workers are not forked (enabled()) or it cannot be started."""
    global _SHARED
    if not enabled():
        return None
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED.lost or _SHARED.proc.poll() is not None:
            try:
                _SHARED = Zygote()
            except OSError:
                _SHARED = None
        return _SHARED


def stop_shared() -> None:
    """End this process's zygote (at exit; its workers are closed by their runners)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is not None:
            _SHARED.close()
            _SHARED = None


# ----------------------------------------------------------------------------- the zygote
def _preload() -> None:
    """What every worker imports first: torch. Nothing here may touch a GPU (a CUDA context
    does not survive a fork), and Triton is left to the engines: on a CPU it must be imported
    with TRITON_INTERPRET=1, which the engine sets (engines/triton/engine.py). A failed import
    is left to the workers, whose start reports it."""
    try:
        import torch  # noqa: F401
    except BaseException:  # noqa: BLE001 - each worker meets and reports the same error
        pass


def _zygote_main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    _preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)   # a handler, so the wakeup fd is written
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                os.read(wake_r, 4096)
                _reap(sock)
                continue
            try:
                packet, fds, _, _ = socket.recv_fds(sock, PACKET_BYTES, 1)
            except OSError:
                packet, fds = b"", []
            if not packet:   # the harness is gone: so is the zygote
                os._exit(0)
            _, token, path, env = pickle.loads(packet)
            pid = _fork_worker(fds[0], path, env, sock, (wake_r, wake_w)) if fds else None
            for fd in fds:
                os.close(fd)
            _send(sock, ("forked", token, pid))
        _reap(sock)


def _fork_worker(fd: int, path: list[str], env: dict[str, str], sock: socket.socket,
                 wake: tuple[int, int]) -> int | None:
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid:
        return pid
    # the child: it keeps nothing of the zygote's but the imports
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for held in wake:
            os.close(held)
        os.setsid()
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
        # imported in the child only: the zygote imports torch before it forks, nothing of
        # the harness (worker imports this module)
        from bundlegen.harness.workers.worker import worker_main
        worker_main(fd)
        code = 0
    except SystemExit as exc:   # as a process's exit status, like the interpreter's
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the harness sees the socket close
        traceback.print_exc()
        code = 1
    exit_process(code)   # never the zygote's atexit handlers


def exit_process(code: int) -> None:
    """End this process now, without the interpreter's teardown (torch and a GPU context
    take a second or more to tear down): only the standard streams are flushed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _reap(sock) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, ("exited", pid, os.waitstatus_to_exitcode(status)))


def _send(sock, message) -> None:
    try:
        sock.send(pickle.dumps(message))
    except OSError:
        os._exit(0)


if __name__ == "__main__":
    _zygote_main(int(sys.argv[1]))
