"""Cases through workers, into result records (DESIGN section 5): `CaseExecutor` hands one
case at a time to its runner (an isolated worker process, a served one, or this process)
and makes the `CaseResult`; `run_spread` and `rerun_alone` share a run's cases among
several executors, one thread each, and tally each worker's share (run.json `per_device`)."""
from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from bundlegen import validate
from bundlegen.graph import BundleError, Case, Graph
from bundlegen.manifest import Manifest
from bundlegen.harness import verdicts as V
from bundlegen.harness.bundles import case_file, error_location
from bundlegen.harness.case import predicted_phases, predicted_seconds
from bundlegen.harness.config import EngineConfig
from bundlegen.harness.workers.pool import worker_spec
from bundlegen.harness.workers.worker import InProcessRunner, IsolatedRunner, WorkerSpec, wait_exits

if TYPE_CHECKING:
    import torch

    from bundlegen.harness.results import CaseResult

# the results module is imported where a record is made, not at module level: a run's
# parent imports it after its workers are started (harness.command says why).


def prepared_graphs(cases: list[Case]) -> list[Graph]:
    """The graphs of the cases an engine will execute, as launched: no probes the frontend
    rejects, no frontend rejections (what Engine.prepare is given)."""
    return [c.graph.as_launched() for c in cases
            if (c.expected_rejection is None and validate.frontend_reason(c.graph) is None)
            or (c.expected_rejection is not None and c.expected_rejection.by == "device")]


class CaseExecutor:
    """Runs cases through a runner (in-process or an isolated worker) and makes records."""

    def __init__(self, engine: str, device: "str | torch.device", *, config: EngineConfig | None = None,
                 manifest: Manifest | None = None, repeat: int | None = None,
                 timeout_s: float | None = None, isolation: bool = True, run_id: str | None = None,
                 wait: bool = True, cpu_threads: int | None = None,
                 runner_factory: "Callable[[WorkerSpec], Any] | None" = None,
                 env: Mapping[str, str] | None = None):
        """`manifest`: the bundle manifest of the cases to run (default: the config's, else
        the default bundle root's). `cpu_threads`: the worker's CPU threads (default: torch's).
        `env`: set in the worker's environment (an MPS server's folders).
        `runner_factory`: makes the runner from the worker spec instead (a served worker)."""
        self.device = str(device)
        spec = worker_spec(engine, self.device, config=config, manifest=manifest, repeat=repeat,
                           timeout_s=timeout_s, cpu_threads=cpu_threads, env=env)
        self.config = spec.config
        self.manifest: Manifest = self.config.manifest
        self.run_id = run_id or time.strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:6]
        #: case id -> its bundle file as results name it, set once the cases are loaded (an
        #: extension's built-in cases lie outside the bundle root: harness.bundles.file_name)
        self.case_files: Mapping[str, str] = {}
        # wait=False: the worker starts in the background (see wait_ready)
        if runner_factory is not None:
            self.runner = runner_factory(spec)
        else:
            self.runner = IsolatedRunner(spec, wait=wait) if isolation else InProcessRunner(spec)

    @property
    def engine_name(self) -> str:
        return self.runner.engine_name

    @property
    def arch(self) -> str:
        return self.runner.arch

    @property
    def versions(self) -> dict[str, str]:
        return self.runner.versions

    def wait_ready(self) -> None:
        """Wait for the engine (a worker started with wait=False); WorkerStartError if it
        cannot be built."""
        getattr(self.runner, "wait_ready", lambda: None)()

    def prepare(self, cases: list[Case]) -> str | None:
        """Engine.prepare with the graphs these cases will execute (prepared_graphs); None,
        or what went wrong (the run goes on)."""
        return self.prepare_graphs(prepared_graphs(cases))

    def prepare_graphs(self, graphs: list[Graph]) -> str | None:
        """Engine.prepare with these graphs (prepared_graphs of the run's cases)."""
        return self.runner.prepare(graphs) if graphs else None

    def execute(self, case: Case) -> "CaseResult":
        from bundlegen.harness.results import CaseResult

        start = time.perf_counter()
        outcome = self.runner.run(case)
        wall = time.perf_counter() - start
        file = self.case_files.get(case.id) or case_file(case, self.manifest.plan)
        if outcome.verdict == V.ERROR_BUNDLE:  # name the file and case like a load error
            outcome = dataclasses.replace(outcome, detail=f"{file}: case {case.id}: {outcome.detail}")
        return CaseResult(
            run_id=self.run_id, case_id=case.id, level=case.level, group=case.group,
            purpose=case.purpose, items=case.items, engine=self.engine_name, arch=self.arch,
            device=str(self.device), verdict=outcome.verdict, detail=outcome.detail,
            reason=outcome.reason, tolerance_class=case.tolerance_class,
            tolerance=outcome.tolerance, outputs=dict(outcome.outputs), margin=outcome.margin,
            statistical_margin=outcome.statistical_margin,
            predicted_s=predicted_seconds(case, self.device, self.manifest, self.engine_name), wall_s=wall,
            oracle_s=outcome.oracle_s, materialize_s=outcome.materialize_s,
            engine_s=outcome.engine_s, check_s=outcome.check_s, io_reference_s=outcome.io_reference_s,
            file=file, runs=outcome.runs,
            predicted_phases=predicted_phases(case, self.device, self.manifest, self.engine_name, outcome.runs))

    def bundle_error(self, error: BundleError) -> "CaseResult":
        from bundlegen.harness.results import CaseResult

        level, group = error_location(error)
        return CaseResult(run_id=self.run_id, case_id=error.case_id, level=level, group=group,
                          purpose="", items=(), engine=self.engine_name, arch=self.arch,
                          device=str(self.device), verdict=V.ERROR_BUNDLE, detail=str(error),
                          file=error.file)

    def prepared_by(self, other: "CaseExecutor") -> bool:
        """Whether `other`'s Engine.prepare serves this executor's engine too: the engine
        says its prepare is shared by the host (Engine.prepare_shared), and both run on the
        same arch. Both workers must be ready."""
        return (getattr(self.runner, "prepare_shared", False)
                and getattr(other.runner, "prepare_shared", False) and self.arch == other.arch)

    def release(self, wait: bool = True) -> None:
        """Stop the worker process until the next case (an in-process runner has none);
        `wait` False: without waiting for its exit (worker.IsolatedRunner.close)."""
        getattr(self.runner, "release", lambda wait: None)(wait)

    def close(self, wait: bool = True) -> None:
        self.runner.close(wait)

    def __enter__(self) -> "CaseExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class DeviceTally:
    """One worker's share of a run (run.json `per_device`)."""
    device: str
    worker: int = 0     # which of the device's workers (0 .. workers per device - 1)
    cases: int = 0
    seconds: float = 0.0

    def add(self, seconds: float) -> None:
        self.cases += 1
        self.seconds += seconds

    def to_json(self) -> dict:
        return {"device": self.device, "worker": self.worker, "cases": self.cases,
                "seconds": round(self.seconds, 3)}


def longest_first(cases: list[Case], device: str, manifest: Manifest, engine: str = "") -> list[Case]:
    """Longest predicted first, so no worker is left with a long case at the end (a case
    with no prediction, a frontend probe, costs next to nothing). Stable for equal costs."""
    return sorted(cases, key=lambda c: -(predicted_seconds(c, device, manifest, engine) or 0.0))


def first_ready(executors: list[CaseExecutor]) -> tuple[int, dict]:
    """Wait until one worker is ready: (its index, id(executor) -> the future of that
    executor's wait_ready). The first worker to finish its start raises its start error."""
    if len(executors) == 1:
        executors[0].wait_ready()
        return 0, {}
    pool = ThreadPoolExecutor(len(executors), thread_name_prefix="bundlegen-start")
    futures = [pool.submit(ex.wait_ready) for ex in executors]
    pool.shutdown(wait=False)
    done, _ = wait(futures, return_when=FIRST_COMPLETED)
    first = min(futures.index(f) for f in done)
    futures[first].result()
    return first, {id(ex): f for ex, f in zip(executors, futures)}


class JoiningWorker:
    """How a worker other than the first ready joins the case loop: once it is ready (its
    `started` future), Engine.prepare with the run's graphs (after the first worker's, so they
    share its work where the engine caches it on disk, as Triton does, instead of all
    compiling the same variants side by side); `problem` is the first that went wrong. A
    prepare that failed in the first worker is not repeated in the others (`graphs` empty):
    it would fail there too, each time after its own share of the work (the run goes on
    unprepared). Nor is one the first worker has done for the host (Engine.prepare_shared,
    same arch; `skip_shared`): a Triton joiner's prepare would only find every kernel
    compiled, and hold the joiner back while it looks."""

    def __init__(self, first: CaseExecutor, started: dict, graphs: list[Graph],
                 skip_shared: bool = True):
        self.first, self.started, self.graphs, self.problem = first, started, graphs, None
        self.skip_shared = skip_shared

    def __call__(self, ex: CaseExecutor) -> None:
        if ex is self.first:
            return
        self.started[id(ex)].result()
        if self.skip_shared and ex.prepared_by(self.first):
            return
        problem = ex.prepare_graphs(self.graphs)
        if problem and self.problem is None:
            self.problem = problem



def crashed(result) -> bool:
    """Any crash: under MPS a neighbour's fault ends every client's case."""
    return result.verdict == V.CRASHED


def out_of_device_memory(result) -> bool:
    """A crash for want of device memory: beside other workers on the device, the memory
    they held may be what was missing (a case that fits the device alone)."""
    return result.verdict == V.CRASHED and "out of memory" in (result.detail or "").lower()


def run_spread(executors: list[CaseExecutor], tallies: list[DeviceTally], cases: list[Case],
                record: Callable, advance: Callable, hold_crashes: Callable | None = None,
                join: Callable[[CaseExecutor], None] | None = None,
                release_idle: bool = False) -> list[Case]:
    """One thread per executor (each drives its own worker process) takes the next case
    from the shared queue; results are recorded in the order they finish, under one lock
    (one writer). Ctrl-C: no further case is handed out, the cases in flight are dropped
    (their workers are killed when the executors close). `hold_crashes`: a result it holds
    (`crashed`, `out_of_device_memory`) is not recorded but its case returned, in the order
    they came, to run again alone (rerun_alone). `join`: what each executor does before its
    first case (one may still be starting). `release_idle`: a worker is stopped as soon as no case is left to hand it, so
    that its exit (a GPU context's teardown) overlaps the others' last cases instead of
    following them; a case held for a rerun starts a fresh one."""
    lock = threading.Lock()
    queue = list(reversed(cases))
    held: list[Case] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def drive(ex: CaseExecutor, tally: DeviceTally) -> None:
        try:
            if join is not None:
                join(ex)
            while not stop.is_set():
                with lock:
                    case = queue.pop() if queue else None
                    if case is not None:
                        advance(f"{case.level}/{case.group}/{case.id} [{ex.device}]")
                if case is None:
                    if release_idle:
                        ex.release(wait=False)
                    return
                start = time.perf_counter()
                result = ex.execute(case)
                with lock:
                    if stop.is_set():
                        return
                    if hold_crashes is not None and hold_crashes(result):
                        held.append(case)
                    else:
                        record(result)
                        tally.add(time.perf_counter() - start)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the parent thread
            if not stop.is_set():
                errors.append(exc)
                stop.set()

    threads = [threading.Thread(target=drive, args=(ex, t), daemon=True, name=f"bundlegen-{ex.device}")
               for ex, t in zip(executors, tallies)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)   # short waits: Ctrl-C reaches this thread between them
    except KeyboardInterrupt:
        stop.set()
        raise
    if errors:
        raise errors[0]
    return held


def rerun_alone(executors: list[CaseExecutor], tallies: list[DeviceTally], cases: list[Case],
                 record: Callable, advance: Callable) -> None:
    """Run each of `cases` again in the first worker with every other worker stopped, and
    record that result. Out of device memory beside other workers, a case may fit alone.
    Under MPS a fatal fault in one worker ends the cases of all the workers of that GPU, the server does not say whose fault it was, and it takes no new
    client until every client it served has gone: alone, a case that crashes again crashed
    by itself, and one that passes was only a neighbour's victim."""
    first = executors[0]
    for ex in executors[1:]:
        ex.release()
    wait_exits()   # and every worker stopped without waiting (run_spread's release_idle)
    for case in cases:
        advance(f"{case.level}/{case.group}/{case.id} [{first.device}, alone]")
        start = time.perf_counter()
        record(first.execute(case))
        tallies[0].add(time.perf_counter() - start)
