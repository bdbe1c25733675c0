"""Crash isolation: an engine that raises, hangs past the per-case timeout, or kills its
process costs only that case.

`IsolatedRunner` keeps one long-lived worker process (`python -m
bundlegen.harness.workers.worker`, talking over a socket pair in pickled messages) that builds
the engine once and runs whole cases (materialize, run, checks) with
`bundlegen.harness.case.run_case`; only the case record goes in and the small `CaseOutcome`
comes back, so large tensors never cross processes. A timeout or a dead worker gives
`crashed`, and a fresh worker takes the next case. `InProcessRunner` is the same without
the process (debugging and fast tests; it cannot survive a hang or a process kill)."""
from __future__ import annotations

import dataclasses
import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

from bundlegen.engines.registry import engine_class
from bundlegen.graph import Case
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import CaseOutcome, run_case
from bundlegen.harness.config import EngineConfig
from bundlegen.harness.portable_traceback import portable_traceback
from bundlegen.harness.workers import gpu_early, mps, pycache, warm_path, zygote
from bundlegen.harness.workers.devices import DeviceUnavailable, check_device

# torch (and importlib.metadata) are imported inside the functions that use them: the
# harness's process imports this module and must not pay for them before its workers start.

#: seconds a fresh worker may take to import torch and build the engine
STARTUP_TIMEOUT_S = 180.0
#: seconds an engine may take to prepare a run (compile its variants in parallel)
PREPARE_TIMEOUT_S = 1800.0
#: seconds a worker told to stop gets to exit before its process group is killed
STOP_GRACE_S = 5.0


class WorkerStartError(RuntimeError):
    """The engine cannot be built at all: the run cannot go on. str() is one line; the
    worker's traceback, when there is one, is in `details`."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


@dataclass(frozen=True)
class WorkerSpec:
    engine: str                  # registry name, entry point name or package.module:Class
    device: str
    config: EngineConfig
    repeat: int | None = None
    timeout_s: float | None = None   # per case; None: no limit (in-process ignores it)
    cpu_threads: int | None = None   # the worker's CPU threads (several workers share the host's cores)
    env: tuple[tuple[str, str], ...] = ()   # set in the worker's environment (an MPS server's folders)


def software_versions(device, driver: "subprocess.Popen | None" = None) -> dict[str, str]:
    """What the results were measured with: torch, Triton, cuDNN and the GPU driver (the
    keys present are the ones this machine has). `driver`: ask_driver's query, started
    earlier (default: asked now)."""
    import torch

    versions = {"torch": str(torch.__version__)}   # a plain str: a TorchVersion would import torch where it is unpickled
    try:
        from importlib import metadata
        versions["triton"] = metadata.version("triton")
    except metadata.PackageNotFoundError:
        pass
    if torch.backends.cudnn.is_available():
        versions["cudnn"] = str(torch.backends.cudnn.version())
    if getattr(device, "type", str(device)) == "cuda":
        versions["cuda"] = str(torch.version.cuda or torch.version.hip)
        answer = driver_version(driver if driver is not None else ask_driver())
        if answer:
            versions["driver"] = answer
    return versions


def ask_driver() -> subprocess.Popen | None:
    """nvidia-smi asked for the driver version, in the background: a worker asks before it
    imports torch, so the answer (slower where the driver is not kept loaded) is there when
    its start is done. None where there is no nvidia-smi."""
    try:
        return subprocess.Popen(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def driver_version(query: subprocess.Popen | None) -> str | None:
    """The answer to ask_driver's query: its first line, or None."""
    if query is None:
        return None
    try:
        out, _ = query.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        query.kill()
        query.communicate()
        return None
    lines = out.split()
    return lines[0] if query.returncode == 0 and lines else None


def worker_environment(spec: WorkerSpec) -> dict[str, str]:
    """The worker's environment: this one, with its CPU thread count when the spec sets one
    (OpenMP reads it at start; workers that oversubscribe the cores spin against each other
    and run the float64 oracle many times slower), and bytecode kept
    where this one writes none (workers.pycache)."""
    env = pycache.with_bytecode({**os.environ, **dict(spec.env)})
    if spec.cpu_threads is not None:
        env["OMP_NUM_THREADS"] = str(spec.cpu_threads)
    return env


def build_engine(spec: WorkerSpec):
    """The engine, warmed up (Engine.warm_up) so that case 1 is not billed for start-up."""
    engine = construct_engine(spec)
    warm_up(engine)
    return engine


def construct_engine(spec: WorkerSpec):
    if spec.cpu_threads is not None:
        import torch
        torch.set_num_threads(spec.cpu_threads)

    check_device(spec.device)
    return engine_class(spec.engine)(spec.device)


def warm_up(engine) -> None:
    try:
        engine.warm_up()
    except Exception:  # noqa: BLE001 - the first case meets the same fault and records it
        pass
    return engine


def restart_after_crash(outcome, device: str) -> bool:
    """A raise on a GPU may leave the device context poisoned (a device-side assert makes
    every later call fail), so a crashed case there costs a fresh worker; on the CPU a
    raise leaves the process sound."""
    return outcome.verdict == V.CRASHED and not device.startswith("cpu")


def prepare_engine(engine, graphs) -> str | None:
    """Engine.prepare; None, or what went wrong (a run goes on without it: the cases then
    build on use what prepare would have built ahead). Graphs with a score modifier the
    engine does not list are left out: the harness declines them, and an engine written
    before them never meets a modifier port."""
    served = frozenset(getattr(engine, "score_modifiers", ()))
    graphs = [g for g in graphs if g.modifiers <= served]
    try:
        engine.prepare(graphs)
    except Exception:  # noqa: BLE001 - engine code; reported, never fatal
        return portable_traceback()
    return None


class InProcessRunner:
    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.engine = build_engine(spec)
        self.engine_name, self.arch = self.engine.name, self.engine.arch
        self.versions = software_versions(self.engine.device)

    def prepare(self, graphs) -> str | None:
        return prepare_engine(self.engine, graphs)

    def run(self, case: Case):
        return run_case(case, self.engine, self.spec.config, self.spec.repeat)

    def close(self, wait: bool = True) -> None:
        pass


class IsolatedRunner:
    """`wait=False` starts the worker and returns at once: the caller does other work while
    the worker imports and builds its engine, and `wait_ready()` (or the first case) waits
    for it and raises WorkerStartError if it failed."""

    def __init__(self, spec: WorkerSpec, wait: bool = True):
        self.spec = spec
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._ready = False
        self._engine_name: str | None = None
        self._arch: str | None = None
        #: the engine's Engine.prepare_shared (known once the worker is ready)
        self.prepare_shared = False
        self._versions: dict[str, str] | None = None
        self.restarts = 0
        self._spawns = 0
        self._spawn()
        if wait:
            self.wait_ready()

    @property
    def engine_name(self) -> str:
        if self._engine_name is None:   # known from the first worker on, whatever came after
            self.wait_ready()
        return self._engine_name

    @property
    def arch(self) -> str:
        if self._arch is None:
            self.wait_ready()
        return self._arch

    @property
    def versions(self) -> dict[str, str]:
        if self._versions is None:
            self.wait_ready()
        return self._versions

    @property
    def pid(self) -> int | None:
        """The worker process's pid; None while there is none (released, or not restarted yet)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    # -- lifecycle
    def _start(self) -> None:
        self._spawn()
        self.wait_ready()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            env = worker_environment(self.spec)
            # the first start plainly, every later one (a restart, after a release) forked
            self._proc = start_worker(theirs.fileno(), env,
                                      fork=self._spawns > 0 and restarts_fork(env))
        finally:
            theirs.close()
        self._spawns += 1
        self._conn = Connection(ours.detach())
        self._ready = self._released = False
        self._conn.send((list(sys.path), self.spec))

    def wait_ready(self) -> None:
        """Wait for the worker's engine; WorkerStartError when it cannot be built."""
        if self._ready:
            return
        if self._conn is None and self._released:
            self._spawn()
        if self._conn is None:
            raise WorkerStartError(f"engine {self.spec.engine!r}: no worker")
        # two steps: import and build within STARTUP_TIMEOUT_S, then the engine's warm-up
        # within the per-case timeout, like any engine code
        for step, limit in (("built", STARTUP_TIMEOUT_S), ("ready", self.spec.timeout_s)):
            if not self._conn.poll(limit):
                self._kill()
                what = "start" if step == "built" else "finish its warm-up"
                raise WorkerStartError(f"engine {self.spec.engine!r}: worker did not {what} "
                                       f"within {limit:.0f} s")
            try:
                kind, payload = self._conn.recv()
            except (EOFError, OSError):
                code = self._proc.wait(10)
                self._kill()
                raise WorkerStartError(f"engine {self.spec.engine!r}: worker died while starting "
                                       f"({describe_exit(code)})") from None
            if kind == "error":
                self._kill()
                summary, details = payload
                raise WorkerStartError(f"engine {self.spec.engine!r} cannot be built: {summary}", details)
        self._engine_name, self._arch, self._versions, self.prepare_shared = payload
        self._ready = True
        if restarts_fork(worker_environment(self.spec)):
            zygote.shared()   # started now, in the background, for the restarts

    def _kill(self) -> None:
        if self._proc is not None:
            try:
                _kill_group(self._proc)
            except subprocess.TimeoutExpired:   # killed, its exit not yet seen (a loaded host):
                _reap_in_background(self._proc)  # reaped by a thread wait_exits joins
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def _restart(self) -> None:
        self._kill()
        self.restarts += 1
        self._start()

    def _try_restart(self) -> str:
        """Restart the worker; '' or, when the engine can no longer be built, why (each
        case then gets `crashed` with that reason, and the run goes on)."""
        try:
            self._restart()
        except WorkerStartError as exc:
            return f"; the engine could not be rebuilt: {exc}"
        return ""

    def release(self, wait: bool = True) -> None:
        """Stop the worker process now; the next case starts a fresh one (an MPS server takes
        no new client while a client it served before a fault is still alive)."""
        self.close(wait)
        self._ready, self._released = False, True

    def close(self, wait: bool = True) -> None:
        """Tell the worker to stop; one still busy with a case gets STOP_GRACE_S to answer
        before its process group is killed. `wait` False, for an idle worker: the caller goes
        on while the worker exits (a GPU worker's exit tears its context down, which takes a
        while), and a thread of its own reaps it (wait_exits)."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._conn.send(("stop", None))
                if wait:
                    self._proc.wait(STOP_GRACE_S)
            except (OSError, subprocess.TimeoutExpired):
                pass
            if not wait:
                _reap_in_background(self._proc)
                self._conn.close()
                self._proc = self._conn = None
                return
        self._kill()

    # -- the run's set-up
    def reconfigure(self, config: EngineConfig, repeat: int | None, timeout_s: float | None) -> None:
        """Take another run's configuration, repeat count and per-case timeout (a worker
        kept warm by `bundlegen serve`); a worker that does not answer is replaced."""
        self.spec = dataclasses.replace(self.spec, config=config, repeat=repeat, timeout_s=timeout_s)
        self.wait_ready()
        try:
            self._conn.send(("configure", (config, repeat)))
            if self._conn.poll(STARTUP_TIMEOUT_S) and self._conn.recv()[0] == "configured":
                return
        except (EOFError, OSError):
            pass
        self._restart()   # the fresh worker is spawned with the new spec

    def prepare(self, graphs) -> str | None:
        """Engine.prepare in the worker; None, or why it did not finish (a worker that dies
        or overruns the per-case timeout, or PREPARE_TIMEOUT_S without one, is replaced, and
        the run goes on)."""
        self.wait_ready()
        limit = self.spec.timeout_s if self.spec.timeout_s is not None else PREPARE_TIMEOUT_S
        try:
            self._conn.send_bytes(prepare_message(graphs))
            if self._conn.poll(limit):
                return self._conn.recv()[1]
            problem = f"engine prepare did not finish within {limit:g} s"
        except (EOFError, OSError):
            problem = f"worker died in engine prepare ({describe_exit(self._proc.wait(10))})"
        return problem + self._try_restart()

    # -- one case
    def run(self, case: Case):
        if self._proc is not None and not self._ready:
            self.wait_ready()
        if self._proc is None or self._proc.poll() is not None:
            broken = self._try_restart()
            if broken:
                return CaseOutcome(V.CRASHED, detail=f"no worker for this case{broken}")
        try:
            self._conn.send(("case", case))
        except OSError:
            broken = self._try_restart()
            if broken:
                return CaseOutcome(V.CRASHED, detail=f"no worker for this case{broken}")
            self._conn.send(("case", case))
        timeout = self.spec.timeout_s
        if not self._conn.poll(timeout):
            broken = self._try_restart()
            return CaseOutcome(V.CRASHED, detail=f"timed out after {timeout:g} s (worker and its "
                                                 f"process group killed){broken}")
        try:
            kind, outcome = self._conn.recv()
        except (EOFError, OSError):
            code = self._proc.wait(10)
            broken = self._try_restart()
            return CaseOutcome(V.CRASHED, detail=f"worker process died ({describe_exit(code)}){broken}")
        if restart_after_crash(outcome, self.spec.device):
            broken = self._try_restart()
            if broken:
                outcome = dataclasses.replace(outcome, detail=outcome.detail + broken)
        return outcome


_exiting: set[threading.Thread] = set()
_exiting_lock = threading.Lock()


def _kill_group(proc) -> None:
    """Kill a worker's whole process group (helpers the engine started die with it) and
    reap the worker."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:   # gone already, or never forked (zygote.ForkedWorker.pid)
        pass
    proc.wait(10)


def _reap_in_background(proc) -> None:
    """Wait for a stopped worker in a daemon thread: STOP_GRACE_S, then _kill_group."""
    def reap() -> None:
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            _kill_group(proc)
        except subprocess.TimeoutExpired:
            pass
        with _exiting_lock:
            _exiting.discard(thread)

    thread = threading.Thread(target=reap, name="bundlegen-reap", daemon=True)
    with _exiting_lock:
        _exiting.add(thread)
    thread.start()


def wait_exits() -> None:
    """Wait until every worker stopped without waiting (close(wait=False)) has exited."""
    with _exiting_lock:
        threads = list(_exiting)
    for thread in threads:
        thread.join()


#: the graphs list last sent to prepare, and its pickled message
_prepare_sent: tuple[list | None, bytes] = (None, b"")


def prepare_message(graphs: list) -> bytes:
    """("prepare", graphs) pickled, once for all of a run's workers: all four levels' graphs
    are megabytes, whose pickling would hold the harness's interpreter lock once per worker.
    The list itself is the key (kept alive here, so its id cannot be reused)."""
    global _prepare_sent
    sent, message = _prepare_sent
    if sent is not graphs:
        message = ForkingPickler.dumps(("prepare", list(graphs)))
        _prepare_sent = (graphs, message)
    return message


def restarts_fork(env: dict[str, str]) -> bool:
    """Whether a worker with this environment is restarted from the zygote: where there is
    one (zygote.enabled), unless it may be an MPS client. After a fault the MPS server takes
    no new client until every client it served before has gone, and a forked worker reaches
    the GPU at once, while the other workers (idle, or not yet past their own failed case)
    are still alive; it then waits in CUDA's start until its case times out
    (bench/mps_fault_check.py measures it). A plain start reaches the GPU later, once the
    others are gone."""
    return zygote.enabled() and not mps.may_be_client(env)


def start_worker(fd: int, env: dict[str, str], fork: bool = False):
    """A worker process talking over `fd`, in a session of its own (a timeout's killpg ends
    the engine's helper processes with it). `fork`: forked from this process's zygote
    (workers.zygote: torch already imported, so a restart skips most of a worker's start)
    where there is one; else a plain subprocess (not multiprocessing: spawn would re-run the
    caller's __main__). A run's first workers start plainly: side by side, their own imports
    are ready as soon as forks from a zygote that imports first."""
    forks = zygote.shared() if fork else None
    if forks is not None:
        try:
            return forks.spawn(fd, env)
        except OSError:
            pass
    return subprocess.Popen([sys.executable, "-m", "bundlegen.harness.workers.worker", str(fd)],
                            pass_fds=(fd,), stdin=subprocess.DEVNULL, start_new_session=True,
                            env=env)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code == zygote.EXIT_UNKNOWN:
        return "no exit status: the zygote that forked it is gone"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


#: numpy's wording of a floating-point error warning (np.errstate's "warn")
NUMPY_FLOAT_WARNING = r"(overflow|underflow|invalid value|divide by zero) encountered"


def quiet_numpy_float_warnings() -> None:
    """numpy's floating-point RuntimeWarnings (the Triton interpreter casts and divides in
    numpy as it runs a kernel on the CPU) are not printed: a worker's stderr is the run's
    terminal, so they would land inside the progress bar, and the case's verdict already
    judges the numbers. Other warnings still print."""
    warnings.filterwarnings("ignore", message=NUMPY_FLOAT_WARNING, category=RuntimeWarning)


def worker_main(fd: int) -> None:
    """The worker process: build the engine once, then run cases until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    quiet_numpy_float_warnings()
    gc.disable()   # until the engine is built: see collector_on
    conn = Connection(fd)
    try:
        parent_path, spec = conn.recv()
        driver = ask_driver() if spec.device.split(":")[0] == "cuda" else None
        gpu_early.open_in_background(spec.device)   # beside import torch (workers.gpu_early)
        sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]
        check_device(spec.device)   # (again in construct_engine) before the warm-up uses it
        warming = warm_path.start(spec.device)   # beside the engine's build and prepare
        engine = construct_engine(spec)
    except BaseException as exc:
        summary = f"--device {exc}" if isinstance(exc, DeviceUnavailable) else f"{type(exc).__name__}: {exc}"
        _send(conn, ("error", (summary, traceback.format_exc())))
        return
    _send(conn, ("built", None))
    collector_on()
    warm_up(engine)
    _send(conn, ("ready", (engine.name, engine.arch, software_versions(engine.device, driver),
                          bool(getattr(engine, "prepare_shared", False)))))
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            _exit_now(conn)
        if kind == "stop":
            _exit_now(conn)
        if kind == "prepare":
            _send(conn, ("prepared", prepare_engine(engine, payload)))
            continue
        if kind == "configure":   # a served worker takes each run's configuration (workers.serve)
            config, repeat = payload
            spec = dataclasses.replace(spec, config=config, repeat=repeat)
            _send(conn, ("configured", None))
            continue
        if warming is not None:   # the first case waits for the warm-up
            warming.join()
            warming = None
        try:
            outcome = run_case(payload, engine, spec.config, spec.repeat)
        except Exception:  # a harness fault: record it on the case, keep the worker
            outcome = CaseOutcome(V.CRASHED, detail=f"harness error: {portable_traceback()}")
        _send(conn, ("outcome", outcome))


def collector_on() -> None:
    """The cyclic garbage collector back on, with what the worker's imports and the engine
    built frozen out of its sight (they live as long as the worker): a full collection walks
    every object it tracks, and torch alone leaves hundreds of thousands, so each of a
    worker's start would cost a noticeable pause. The imports leave little garbage (no
    tensors), so they run without it (gc.disable in worker_main)."""
    gc.freeze()
    gc.enable()


def _send(conn: Connection, message) -> None:
    """Send to the parent; a parent that is gone (killed, or ended by SIGTERM) ends the worker
    quietly: a BrokenPipeError traceback in the run's stderr would tell the user nothing."""
    try:
        conn.send(message)
    except OSError:          # BrokenPipeError, ConnectionResetError: no one is left to read it
        _exit_now(conn)


def _exit_now(conn: Connection) -> None:
    """End the worker at once (the parent waits for the exit): nothing is left to write but
    the standard streams."""
    conn.close()
    zygote.exit_process(0)


if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
