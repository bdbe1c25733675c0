"""Running a level's cases against one engine (DESIGN section 5).

`run_case` is one case's whole flow (validation, skips, the engine's answer, materialize,
run, checks) and gives a small `CaseOutcome`; it runs wherever the engine lives (the worker
process under isolation). `CaseExecutor` turns outcomes into result records; `run_level`
drives a whole level and writes results.jsonl, junit.xml and the summary."""
from __future__ import annotations

import dataclasses
import re
import time
import traceback
import uuid
from types import MappingProxyType
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from bundlegen import validate
from bundlegen.cost import DETERMINISTIC_MODE_RUNS, predict, size_text, terms
from bundlegen.graph import BundleError, Case, Graph
from bundlegen.manifest import Manifest, manifest_path
from bundlegen.reasons import (DETERMINISM_NOT_SERVED, MODIFIER_NOT_SERVED, RAGGED_NOT_SERVED,
                               RAGGED_OFFSETS, code_of)
from bundlegen.harness import switches, verdicts as V
from bundlegen.harness.config import EngineConfig, load_engine_config

if TYPE_CHECKING:
    import torch

    from bundlegen.harness.results import RunTimes

# torch is imported where a case runs (the worker), not at module level: the parent of an
# isolated run never needs it, so its worker starts while the parent is still loading.


def device_type(device: "str | torch.device") -> str:
    """'cuda' for 'cuda:1' or torch.device('cuda', 1), without importing torch."""
    return str(device).split(":", 1)[0]


@dataclass(frozen=True)
class CaseOutcome:
    """What one case gave, small enough to send back from a worker process."""
    verdict: str
    detail: str = ""
    reason: str | None = None
    tolerance: Mapping[str, Any] | None = None
    outputs: Mapping[str, Any] = field(default_factory=dict)
    margin: float | None = None
    oracle_s: float | None = None        # float64 oracle forward + backward (synchronised)
    materialize_s: float | None = None   # the rest of materialize: fill, layout, copies
    engine_s: float | None = None        # the engine's first run
    check_s: float | None = None         # guards, inputs, tolerance, determinism re-run


# ----------------------------------------------------------------------------- cost rule
def cpu_prediction(graph: Graph, manifest: Manifest) -> float:
    """Predicted seconds of the case on the CPU, by the manifest's cost model."""
    return float(predict(graph, "cpu", manifest.cost_model).predicted_s)


def too_large_for_cpu(graph: Graph, manifest: Manifest) -> bool:
    return cpu_prediction(graph, manifest) > manifest.cpu_case_limit_s


def memory_ceiling_breach(case: Case, manifest: Manifest) -> str | None:
    """Why the case may not allocate what it needs, or None: its peak footprint (io storages
    and the oracle's float64 tensors, bundlegen.cost) against its level's per-case byte
    ceiling (a case of no known level: the largest level's). Checked before allocating."""
    limits = {lv.name: lv for lv in manifest.levels}
    level = limits.get(case.level) or manifest.levels[-1]
    t = terms(case.graph)
    need = t.io_bytes + t.oracle_bytes
    if need <= level.per_case_bytes:
        return None
    return (f"{V.TOO_LARGE}: needs {size_text(need)} at its peak, the {level.name} level allows "
            f"{size_text(level.per_case_bytes)} per case")


def predicted_seconds(case: Case, device: "str | torch.device", manifest: Manifest | None = None) -> float | None:
    """The bundle's prediction is for an h200; on the CPU ask the cost model with the
    manifest's coefficients (default: the manifest of the default bundle root). None for a
    graph the frontend refuses: it is never executed, and its sizes may not be numbers."""
    if validate.frontend_reason(case.graph) is not None:
        return None
    if device_type(device) == "cpu":
        if manifest is None:
            from bundlegen.harness.bundles import manifest_of
            manifest = manifest_of()
        return cpu_prediction(case.graph, manifest)
    return case.cost.predicted_s


# ----------------------------------------------------------------------------- one case
class _StepRaised(Exception):
    """An exception from one step of a case (engine code, or materialize), as a crash detail."""

    def __init__(self, stage: str, exc: BaseException):
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        super().__init__(f"{stage} raised {type(exc).__name__}: {exc}{where}")


class _ContractBroken(_StepRaised):
    """Engine code answered outside its contract (a crash, charged to the engine)."""

    def __init__(self, stage: str, answer: str):
        Exception.__init__(self, f"{stage} {answer}")


def _guarded(stage: str, fn: Callable, *args):
    try:
        return fn(*args)
    except Exception as exc:  # engine code may raise anything; KeyboardInterrupt passes
        raise _StepRaised(stage, exc) from exc


def _sync(device: "torch.device") -> None:
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)


#: DETERMINISTIC_MODE_RUNS (bundlegen.cost, which prices them): the runs of a case whose
#: graph asks for a deterministic backward
#: the environment variable that turns off stopping each worker as soon as no case is left
#: for it, and leaving the workers to exit while the run writes its files ("0": every worker
#: is stopped after the last case, and the run waits for their exits; see _run_spread)
RELEASE_SWITCH = "BUNDLEGEN_EARLY_RELEASE"
#: the environment variable that makes every worker of a run prepare ("0"), even where the
#: first worker's prepare serves the host (Engine.prepare_shared; see _Joining)
SHARED_PREPARE_SWITCH = "BUNDLEGEN_SHARED_PREPARE"


def repeat_count(engine, repeat: int | None, graph: Graph | None = None) -> int:
    """Runs per case: DETERMINISTIC_MODE_RUNS when the graph asks for a deterministic
    backward; else 2 (one determinism re-run) for a deterministic engine, once for a
    nondeterministic one. `repeat` overrides either."""
    if graph is not None and graph.attributes.deterministic_algorithm:
        return DETERMINISTIC_MODE_RUNS if repeat is None else max(1, repeat)
    if not engine.deterministic:
        return 1
    return 2 if repeat is None else max(1, repeat)


def run_case(case: Case, engine, config: EngineConfig, repeat: int | None = None) -> CaseOutcome:
    """One case's flow, in-process. Never raises for engine faults: they become `crashed`."""
    try:
        outcome = _run_case(case, engine, config, repeat)
    except _StepRaised as exc:
        outcome = CaseOutcome(V.CRASHED, detail=str(exc))
    if outcome.verdict in V.CLAIM_BREAKING and config.is_claimed(case.id, engine.arch):
        was = f"declined ({outcome.reason})" if outcome.verdict == V.DECLINED else outcome.verdict
        detail = f"claimed on {engine.arch} but {was}" + (f": {outcome.detail}" if outcome.detail else "")
        outcome = dataclasses.replace(outcome, verdict=V.CLAIM_BROKEN, detail=detail)
    return outcome


def _run_case(case: Case, engine, config: EngineConfig, repeat: int | None) -> CaseOutcome:
    graph, expected = case.graph, case.expected_rejection
    device_probe = expected is not None and expected.by == "device"
    finding = validate.frontend_finding(graph, offsets_on_device=device_probe)
    frontend = None if finding is None else finding.reason
    if expected is not None and expected.by == "frontend":
        if frontend == expected.reason:
            return _offer_to_engine(engine, graph, frontend)
        said = f"returned {frontend!r}" if frontend else "accepted the graph"
        return CaseOutcome(V.REJECTION_ACCEPTED, reason=frontend,
                           detail=f"frontend {said}; expected {expected.reason!r}")
    if frontend is not None:
        return CaseOutcome(V.ERROR_BUNDLE, reason=frontend,
                           detail=f"field {finding.field}: fails frontend validation ({frontend}) "
                                  "but the case is not a frontend probe")
    if device_probe:
        broken = validate.ragged_offsets_finding(graph) if graph.ragged is not None else None
        if broken is None or broken.reason != expected.reason:
            return CaseOutcome(V.ERROR_BUNDLE, detail=(
                f"field expected_rejection.reason: a device probe's offsets must break "
                f"{expected.reason!r}; they break {broken.reason if broken else 'no rule'}"))
    elif expected is not None:  # an engine probe: asked, never executed
        reason = _decline_reason(engine, graph)
        if not reason:
            return CaseOutcome(V.REJECTION_ACCEPTED,
                               detail=f"engine accepted a graph it must decline ({expected.reason})")
        code = code_of(reason)
        note = "" if code == expected.reason else f"declined with {code!r}, probe names {expected.reason!r}"
        return CaseOutcome(V.REJECTED, reason=reason, detail=note)

    skip = config.skip_reason(case, engine.arch)
    if skip:
        return CaseOutcome(V.SKIPPED, detail=skip)
    if config.manifest is not None:
        breach = memory_ceiling_breach(case, config.manifest)
        if breach:
            return CaseOutcome(V.SKIPPED, detail=breach)
    if engine.device.type == "cpu":
        if config.manifest is None:
            return CaseOutcome(V.ERROR_BUNDLE, detail="field manifest: no bundle manifest loaded, "
                                                      "so no CPU cost prediction")
        if too_large_for_cpu(graph, config.manifest):
            return CaseOutcome(V.SKIPPED, detail=V.TOO_LARGE_FOR_CPU)
    reason = _decline_reason(engine, graph)
    if reason:
        return CaseOutcome(V.REJECTED if device_probe else V.DECLINED, reason=reason)
    try:
        tol = config.tolerance_for(case)
    except KeyError as exc:
        return CaseOutcome(V.ERROR_BUNDLE, detail=f"field tolerance_class: {exc.args[0]}")
    if device_probe:
        return _execute(case, engine, tol, 1, device_probe=True)
    return _execute(case, engine, tol, repeat_count(engine, repeat, graph))


def _offer_to_engine(engine, graph: Graph, frontend: str) -> CaseOutcome:
    """A graph the frontend rejected, offered to the engine as well: an engine whose own
    checks accept an invalid graph is charged (`rejection-accepted`). Bad ragged offsets
    (their values or their count) are the exception: an engine is handed the offsets only
    as device tensors, and the device probes judge what it does with bad ones."""
    if graph.ragged is not None and frontend in RAGGED_OFFSETS:
        return CaseOutcome(V.REJECTED, reason=frontend)
    said = _decline_reason(engine, graph)
    if not said:
        return CaseOutcome(V.REJECTION_ACCEPTED, reason=frontend,
                           detail=f"the frontend rejects the graph ({frontend}) but the engine "
                                  "accepted it")
    return CaseOutcome(V.REJECTED, reason=frontend, detail=f"engine declined it too: {said}")


def _decline_reason(engine, graph: Graph) -> str | None:
    """engine.is_applicable's answer for the graph as launched, held to its contract: None
    or a reason string. A ragged graph is declined for an engine that does not say it
    serves them (Engine.ragged), a score modifier for one that does not list it
    (Engine.score_modifiers)."""
    if graph.ragged is not None and not getattr(engine, "ragged", False):
        return f"{RAGGED_NOT_SERVED}: the engine does not set ragged = True"
    unlisted = graph.modifiers - frozenset(getattr(engine, "score_modifiers", ()))
    if unlisted:
        return (f"{MODIFIER_NOT_SERVED}: {', '.join(sorted(unlisted))} "
                "(not in the engine's score_modifiers)")
    if graph.attributes.deterministic_algorithm and not (
            getattr(engine, "deterministic", False) or getattr(engine, "deterministic_mode", False)):
        return f"{DETERMINISM_NOT_SERVED}: the engine has no deterministic mode (deterministic_mode)"
    reason = _guarded("engine.is_applicable", engine.is_applicable, graph.as_launched())
    if reason is not None and not (isinstance(reason, str) and reason.strip()):
        raise _ContractBroken("engine.is_applicable",
                              f"returned {reason!r}: expected None or a non-empty reason string")
    return reason


def _run_engine(stage: str, engine, graph: Graph, tensors: Mapping[str, "torch.Tensor"]) -> None:
    """engine.run on a read-only copy of the port map: the outputs are judged through the
    harness's own views, so an engine must write into them, not replace them."""
    _guarded(stage, engine.run, graph.as_launched(), MappingProxyType(dict(tensors)))
    _sync(engine.device)


def _execute(case: Case, engine, tol, runs: int, device_probe: bool = False) -> CaseOutcome:
    from bundlegen.harness import checks, materialize as M  # lazy: keeps the plugin and the parent light

    start = time.perf_counter()
    try:
        m = _guarded("materialize", M.materialize, case, engine.device)
    except _StepRaised as exc:
        if isinstance(exc.__cause__, M.MaterializeError):
            return CaseOutcome(V.ERROR_BUNDLE, detail=f"field graph: {exc.__cause__}")
        raise
    materialize_s = max(0.0, time.perf_counter() - start - m.oracle_s)

    start = time.perf_counter()
    _run_engine("engine.run", engine, case.graph, m.tensors)
    engine_s = time.perf_counter() - start

    check_start = time.perf_counter()
    timing = {"tolerance": tol.to_json(), "oracle_s": m.oracle_s, "materialize_s": materialize_s,
              "engine_s": engine_s}

    def outcome(verdict: str, **fields) -> CaseOutcome:
        return CaseOutcome(verdict, check_s=time.perf_counter() - check_start, **timing, **fields)

    # every check of the first run computed on the device, then read back at once
    guard, modified = M.guard_flags(m), M.modified_flags(m)
    errors = checks.PendingErrors(checks.output_pairs(*M.judged_outputs(m)), tol)
    read = checks.read_back([checks.stacked(guard), checks.stacked(modified), *errors.tensors])
    memory = checks.judge_memory(checks.set_ports(guard, read[0]), checks.set_ports(modified, read[1]))
    if memory is not None:
        if device_probe:
            return outcome(V.FAIL_ESCAPED, detail=f"bad offsets ({case.expected_rejection.reason}): "
                                                  f"{memory[1]}")
        return outcome(memory[0], detail=memory[1])
    judgement = checks.judge_errors(errors.resolve(read[2:]), tol)
    result = dict(outputs={p: e.to_json() for p, e in judgement.outputs.items()},
                  margin=judgement.margin)
    if device_probe:
        if judgement.verdict != V.PASS:
            return outcome(V.FAIL_CORRUPTED, detail=f"good sequences wrong under bad offsets "
                                                    f"({case.expected_rejection.reason}): "
                                                    f"{judgement.detail}", **result)
        return outcome(V.CONTAINED, reason=case.expected_rejection.reason, **result)
    if judgement.verdict != V.PASS:
        return outcome(judgement.verdict, detail=judgement.detail, **result)

    if runs > 1:
        first = {p: m.storages[p].clone() for p in case.graph.output_ports}
        differ = checks.DifferingElements(first)
    for again in range(2, runs + 1):
        M.reset_outputs(m)
        _run_engine(f"engine.run (repeat {again})", engine, case.graph, m.tensors)
        differ.add(again, m.storages)
        # an ordinary re-run stops at the first difference; a case that asked for the
        # deterministic mode runs them all and counts every element that ever differed
        if differ.any() and not case.graph.attributes.deterministic_algorithm:
            break
    if runs > 1 and differ.any():
        return outcome(V.FAIL_NONDETERMINISTIC, detail=differ.describe(), **result)
    return outcome(V.PASS, **result)


# ----------------------------------------------------------------------------- records
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
                 runner_factory: "Callable[[worker.WorkerSpec], Any] | None" = None,
                 env: Mapping[str, str] | None = None):
        """`manifest`: the bundle manifest of the cases to run (default: the config's, else
        the default bundle root's). `cpu_threads`: the worker's CPU threads (default: torch's).
        `env`: set in the worker's environment (an MPS server's folders).
        `runner_factory`: makes the runner from the worker spec instead (a served worker)."""
        from bundlegen.engines.registry import registered_name
        from bundlegen.harness import worker
        from bundlegen.workspace import engine_config_dir

        name = registered_name(engine)  # unknown names fail here, before any worker starts
        self.device = str(device)
        if config is None:
            config = load_engine_config(engine_config_dir(name))
        if manifest is None and config.manifest is None:
            from bundlegen.harness.bundles import manifest_of
            manifest = manifest_of()
        self.config = config if manifest is None else config.with_manifest(manifest)
        self.manifest: Manifest = self.config.manifest
        self.run_id = run_id or time.strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:6]
        spec = worker.WorkerSpec(engine=engine, device=str(self.device), config=self.config,
                                 repeat=repeat, timeout_s=timeout_s, cpu_threads=cpu_threads,
                                 env=tuple(sorted((env or {}).items())))
        # wait=False: the worker starts in the background (see wait_ready)
        if runner_factory is not None:
            self.runner = runner_factory(spec)
        else:
            self.runner = worker.IsolatedRunner(spec, wait=wait) if isolation else worker.InProcessRunner(spec)

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
        from bundlegen.harness.bundles import case_file
        from bundlegen.harness.results import CaseResult

        start = time.perf_counter()
        outcome = self.runner.run(case)
        wall = time.perf_counter() - start
        file = case_file(case, self.manifest.plan)
        if outcome.verdict == V.ERROR_BUNDLE:  # name the file and case like a load error
            outcome = dataclasses.replace(outcome, detail=f"{file}: case {case.id}: {outcome.detail}")
        return CaseResult(
            run_id=self.run_id, case_id=case.id, level=case.level, group=case.group,
            purpose=case.purpose, items=case.items, engine=self.engine_name, arch=self.arch,
            device=str(self.device), verdict=outcome.verdict, detail=outcome.detail,
            reason=outcome.reason, tolerance_class=case.tolerance_class,
            tolerance=outcome.tolerance, outputs=dict(outcome.outputs), margin=outcome.margin,
            predicted_s=predicted_seconds(case, self.device, self.manifest), wall_s=wall,
            oracle_s=outcome.oracle_s, materialize_s=outcome.materialize_s,
            engine_s=outcome.engine_s, check_s=outcome.check_s, file=file)

    def bundle_error(self, error: BundleError) -> "CaseResult":
        from bundlegen.harness.bundles import error_location
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


# ----------------------------------------------------------------------------- a level
def default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_timeout(device: "str | torch.device") -> float:
    return 600.0 if device_type(device) == "cpu" else 300.0


class NothingSelected(Exception):
    """run_level(..., allow_empty=False): the selection holds no case (and the bundles no
    error), so nothing would be tested; raised before the out folder is touched, so that a
    mistyped -k does not replace the results of the run before."""


@dataclass(frozen=True)
class RunSummary:
    level: str
    levels: tuple  # LevelSummary per level, lowest first
    results_path: Path
    junit_path: Path
    ran: int       # cases run by this invocation
    resumed: int   # cases found already recorded and skipped
    bundle_errors: tuple[str, ...]
    times: "RunTimes | None" = None
    interrupted: bool = False   # Ctrl-C: the cases finished until then are recorded
    planned: int = 0            # cases this invocation set out to run
    server_note: str = ""       # why a matching `bundlegen serve` was not used, when one answered


    @property
    def failing(self) -> int:
        return sum(s.failing for s in self.levels)

    @property
    def tested(self) -> int:
        """Cases whose verdict tested something (all but declined and skipped)."""
        return sum(n for verdict, n in self.counts().items() if verdict not in V.NOT_RUN)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return V.EXIT_INTERRUPTED
        if self.failing:
            return V.EXIT_FAILED
        return V.EXIT_OK if self.tested else V.EXIT_NOTHING_TESTED

    def counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for s in self.levels:
            for verdict, n in s.counts.items():
                total[verdict] = total.get(verdict, 0) + n
        return total


def run_level(level: str, engine: str, *, device: str | None = None, out: Path | str | None = None,
              bundles: Path | str | None = None, plan: str | None = None,
              pattern: str | Sequence[str] | None = None,
              shard: tuple[int, int] | None = None, resume: bool = False,
              timeout_s: float | None = None, repeat: int | None = None, isolation: bool = True,
              config: EngineConfig | None = None, progress: str | bool | None = None,
              devices: Sequence[str] | None = None, lane: str = "",
              workers_per_device: int = 1, server: bool = False,
              allow_empty: bool = True, mps: bool = False) -> RunSummary:
    """Run every case of `level` and the lower levels of `plan` (default: the bundle root's
    only plan); write results.jsonl (appended per case), junit.xml and run.json; give the
    per-level summary. `devices` (two or more) or `workers_per_device` (more than one): one
    worker process per device and slot, cases handed out longest predicted first to
    whichever worker is free, into the same three files. `server`: use the workers of a
    running `bundlegen serve` whose key matches this run's (harness.serve), when there is
    one and it is free; the results are the same. `allow_empty` False: a selection that holds
    no case raises NothingSelected before `out` is touched. `mps`: the GPU workers are clients
    of a private CUDA MPS server (harness.mps; a matching server's own when served), and each
    case that crashed beside other workers is run again alone (_rerun_alone)."""
    from bundlegen.harness import bundles as B
    from bundlegen.harness.selection import in_shard, selection
    from bundlegen.harness.worker import WorkerStartError

    started = time.perf_counter()
    before = process_age_s()
    if devices is not None and device is not None:
        raise ValueError("give device or devices, not both")
    devices = list(devices) if devices else [device or default_device()]
    device = ",".join(devices)
    if workers_per_device < 1:
        raise ValueError(f"--workers-per-device {workers_per_device}: expected 1 or more")
    workers = worker_devices(devices, workers_per_device)
    if mps:
        from bundlegen.harness.mps import mps_devices_problem

        problem = mps_devices_problem(workers) or (
            None if isolation else "--mps: MPS serves worker processes; --no-isolation runs the "
                                   "engine in this one")
        if problem:
            raise ValueError(problem)
    root = Path(bundles) if bundles else B.default_bundle_root()
    manifest = B.manifest_of(root, plan)
    levels = manifest.levels_upto(level)
    session, server_note = None, ""
    if server and isolation:
        from bundlegen.harness.serve_key import may_be_served, serve_key

        if may_be_served(engine):
            from bundlegen.harness.serve_client import open_session

            session, server_note = open_session(serve_key(engine, devices, workers_per_device, mps=mps))
    daemon = None
    if mps and session is None:
        from bundlegen.harness.mps import start_mps

        daemon = start_mps(workers)
    # the workers import torch and build the engine while this process loads the bundles
    executors: list[CaseExecutor] = []
    try:
        for slot, dev in enumerate(workers):
            executors.append(CaseExecutor(
                engine, dev, config=config, manifest=manifest, repeat=repeat, isolation=isolation,
                timeout_s=timeout_s if timeout_s is not None else default_timeout(dev), wait=False,
                run_id=executors[0].run_id if executors else None,
                cpu_threads=_cpu_share(len(workers)),
                runner_factory=session.runner_factory(slot) if session else None,
                env=daemon.env if daemon else None))
    except BaseException:
        _close_all(executors)
        if session:
            session.close()
        if daemon:
            daemon.stop()
        raise
    from bundlegen.harness import results as R   # after the workers' start: see harness.command

    executor, starting = executors[0], {}
    per_device = [_DeviceTally(dev, workers[:i].count(dev)) for i, dev in enumerate(workers)]
    new_records = []
    interrupted = False
    prepare_problem, todo, ran, reruns = None, [], 0, 0
    ready = prepared = cases_done = writer = last_recorded = None
    early_exits = not switches.turned_off(RELEASE_SWITCH)
    wait_for_exits = True   # False once the run ends as it should (every worker idle)
    try:
        loaded = B.load_level(root, level, manifest.plan)
        selected = selection(pattern)
        cases = [c for c in loaded.cases if selected(c) and in_shard(c.id, shard)]
        if not cases and not loaded.errors and not allow_empty:
            raise NothingSelected(f"no case of level {level} was selected")
        out = Path(out) if out else Path("out") / f"{_engine_label(engine)}-{level}"
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out}: is a file, not a folder")
        results_path, junit_path, run_path = out / R.RESULTS_NAME, out / R.JUNIT_NAME, out / R.RUN_NAME
        # the first worker ready begins the run: the others join the case loop as they
        # become ready (_run_spread), so no worker idles while a slower one imports torch
        try:
            first, starting = _first_ready(executors)
            executor = executors[first]
        except WorkerStartError as exc:
            if daemon is None:
                raise
            raise WorkerStartError(f"{exc} (a client of the run's MPS server; its logs end: "
                                          f"{' | '.join(daemon.log_tail().splitlines()) or 'nothing'})",
                                          exc.details) from None
        ready = time.perf_counter()

        def run_times(complete: bool) -> "RunTimes":
            now = time.perf_counter()
            at = lambda t: now if t is None else t  # noqa: E731 - a phase not reached ends now
            return R.RunTimes(
                run_id=executor.run_id, level=level, engine=executor.engine_name, arch=executor.arch,
                device=device, cases=ran, start_s=ready - started,
                prepare_s=at(prepared) - ready, cases_s=at(cases_done) - at(prepared),
                finish_s=now - at(cases_done), elapsed_s=now - started,
                prepare_problem=prepare_problem, before_s=before, engine_spec=engine,
                selection=_selection_text(pattern, shard),
                bundles_digest=R.bundles_digest([*loaded.files, manifest_path(root, manifest.plan)], root),
                complete=complete, versions=executor.versions,
                per_device=tuple(t.to_json() for t in per_device), lane=lane,
                workers_per_device=workers_per_device,
                served_by=session.record() if session else None, mps=mps, mps_reruns=reruns)

        if resume and results_path.exists():
            why = R.resume_mismatch(R.read_run_times(run_path), run_times(False))
            if why:
                raise ValueError(f"--resume: {out} holds another run ({why}); "
                                 "use another --out, or run without --resume")
        elif results_path.exists():
            results_path.unlink()
        previous = R.read_results(results_path) if resume else []
        done = R.finished_keys(previous)
        todo = [c for c in cases if c.id not in done]
        R.write_run_times(run_path, run_times(False))
        try:
            graphs = prepared_graphs(todo)
            prepare_problem = executor.prepare_graphs(graphs)
            prepared = time.perf_counter()
            with R.ResultsWriter(results_path) as writer, _progress(progress, len(todo)) as advance:
                def record(result) -> None:
                    nonlocal last_recorded
                    writer.write(result)
                    new_records.append(result.to_json())
                    last_recorded = time.perf_counter()

                for error in loaded.errors:
                    result = executor.bundle_error(error)
                    if in_shard(result.key, shard) and result.key not in done:
                        record(result)
                if len(executors) == 1:
                    for case in todo:
                        advance(f"{case.level}/{case.group}/{case.id}")
                        start = time.perf_counter()
                        record(executor.execute(case))
                        per_device[0].add(time.perf_counter() - start)
                        ran += 1
                else:
                    def count(result) -> None:
                        nonlocal ran
                        record(result)
                        ran += 1
                    joining = _Joining(executor, starting, graphs if prepare_problem is None else [],
                                       skip_shared=not switches.turned_off(SHARED_PREPARE_SWITCH))
                    held = _run_spread(executors, per_device, _longest_first(todo, workers[0], manifest),
                                       count, advance, hold_crashes=mps, join=joining,
                                       # a served worker is the server's to keep
                                       release_idle=session is None and early_exits)
                    prepare_problem = prepare_problem or joining.problem
                    if held:
                        reruns = len(held)
                        _rerun_alone(executors, per_device, held, count, advance)
                advance(None)
        except KeyboardInterrupt:
            interrupted = True   # what finished is recorded; junit and run.json still follow
        # the cases end with the last one recorded: the workers' exits after it are the finish
        cases_done = last_recorded if last_recorded is not None else time.perf_counter()
        wait_for_exits = interrupted or not early_exits
    finally:
        # idle workers exit while the files are written, and the MPS server after them
        _close_all(executors, wait=wait_for_exits)
        if session:
            session.close()
        if daemon:
            daemon.stop(wait=wait_for_exits)

    records = previous + new_records
    R.write_junit(junit_path, records, levels, engine_spec=engine)
    if writer is not None:
        writer.wait_synced()   # its last fsync ran beside the workers' exits
    times = run_times(complete=not interrupted)
    R.write_run_times(run_path, times)
    return RunSummary(level=level, levels=tuple(R.summarize(records, levels)),
                      results_path=results_path, junit_path=junit_path, ran=ran,
                      resumed=len(cases) - len(todo), bundle_errors=tuple(str(e) for e in loaded.errors),
                      times=times, interrupted=interrupted, planned=len(todo), server_note=server_note)


# ----------------------------------------------------------------------------- several devices
@dataclass
class _DeviceTally:
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


def worker_devices(devices: Sequence[str], per_device: int) -> list[str]:
    """One entry per worker process: each device `per_device` times, interleaved
    (cuda:0,cuda:1 x2 -> cuda:0,cuda:1,cuda:0,cuda:1), so the longest cases, handed out
    first, spread over the devices before they double up on one."""
    return [dev for _ in range(per_device) for dev in devices]


#: what --device names (and each device of --devices)
DEVICE_RE = re.compile(r"cpu|mps|(cuda|xpu)(:\d+)?")


def device_list(text: str) -> list[str] | None:
    """--devices as written: None for 'all', else the comma-separated devices (a device may
    repeat: 'cpu,cpu' runs two CPU workers); ValueError when malformed."""
    if text.strip() == "all":
        return None
    devices = [d.strip() for d in text.split(",")]
    if not all(DEVICE_RE.fullmatch(d) for d in devices):
        raise ValueError(f"--devices {text}: expected all, or devices such as cuda:0,cuda:1")
    return devices


def resolve_devices(text: str) -> list[str]:
    """--devices: the devices it names; 'all' is every visible CUDA device
    (DeviceUnavailable when there is none)."""
    from bundlegen.harness.worker import DeviceUnavailable

    devices = device_list(text)
    if devices is not None:
        return devices
    import torch
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise DeviceUnavailable(f"--devices all: no GPU is visible to torch (torch {torch.__version__})")
    return [f"cuda:{i}" for i in range(count)]


def _longest_first(cases: list[Case], device: str, manifest: Manifest) -> list[Case]:
    """Longest predicted first, so no worker is left with a long case at the end (a case
    with no prediction, a frontend probe, costs next to nothing). Stable for equal costs."""
    return sorted(cases, key=lambda c: -(predicted_seconds(c, device, manifest) or 0.0))


def _first_ready(executors: list[CaseExecutor]) -> tuple[int, dict]:
    """Wait until one worker is ready: (its index, id(executor) -> the future of that
    executor's wait_ready). The first worker to finish its start raises its start error."""
    if len(executors) == 1:
        executors[0].wait_ready()
        return 0, {}
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(len(executors), thread_name_prefix="bundlegen-start")
    futures = [pool.submit(ex.wait_ready) for ex in executors]
    pool.shutdown(wait=False)
    done, _ = wait(futures, return_when=FIRST_COMPLETED)
    first = min(futures.index(f) for f in done)
    futures[first].result()
    return first, {id(ex): f for ex, f in zip(executors, futures)}


class _Joining:
    """How a worker other than the first ready joins the case loop: once it is ready (its
    `started` future), Engine.prepare with the run's graphs (after the first worker's, so they
    share its work where the engine caches it on disk, as Triton does, instead of all
    compiling the same variants side by side); `problem` is the first that went wrong. A
    prepare that failed in the first worker is not repeated in the others (`graphs` empty):
    it would fail there too, each time after its own share of the work (the run goes on
    unprepared). Nor is one the first worker has done for the host (Engine.prepare_shared,
    same arch; `skip_shared`): a Triton joiner's prepare took 0.4 s of all four levels'
    graphs, all of it finding every kernel compiled."""

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


def _close_all(executors: list[CaseExecutor], wait: bool = True) -> None:
    """Close every worker, all at once (a worker busy with a case gets a few seconds to
    answer the stop before it is killed). `wait` False, when every worker is idle: told to
    stop, and left to exit while the run writes its files (worker.IsolatedRunner.close)."""
    if len(executors) <= 1 or not wait:
        for ex in executors:
            ex.close(wait)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(executors)) as pool:
        list(pool.map(lambda ex: ex.close(), executors))


def _run_spread(executors: list[CaseExecutor], tallies: list[_DeviceTally], cases: list[Case],
                record: Callable, advance: Callable, hold_crashes: bool = False,
                join: Callable[[CaseExecutor], None] | None = None,
                release_idle: bool = False) -> list[Case]:
    """One thread per executor (each drives its own worker process) takes the next case
    from the shared queue; results are recorded in the order they finish, under one lock
    (one writer). Ctrl-C: no further case is handed out, the cases in flight are dropped
    (their workers are killed when the executors close). `hold_crashes`: a crashed case is
    not recorded but returned, in the order the crashes came (under MPS a neighbour's fault
    crashes it too). `join`: what each executor does before its first case (one may still be
    starting). `release_idle`: a worker is stopped as soon as no case is left to hand it, so
    that its exit (0.47 s for eight GPU workers at the end of a run on an H200) overlaps the
    others' last cases instead of following them; a case held for a rerun starts a fresh one."""
    import threading

    lock = threading.Lock()
    queue = list(reversed(cases))
    held: list[Case] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def drive(ex: CaseExecutor, tally: _DeviceTally) -> None:
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
                    if hold_crashes and result.verdict == V.CRASHED:
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


def _rerun_alone(executors: list[CaseExecutor], tallies: list[_DeviceTally], cases: list[Case],
                 record: Callable, advance: Callable) -> None:
    """Run each of `cases` again in the first worker with every other worker stopped, and
    record that result. Under MPS a fatal fault in one worker ends the cases of all the
    workers of that GPU, the server does not say whose fault it was, and it takes no new
    client until every client it served has gone: alone, a case that crashes again crashed
    by itself, and one that passes was only a neighbour's victim."""
    from bundlegen.harness.worker import wait_exits

    first = executors[0]
    for ex in executors[1:]:
        ex.release()
    wait_exits()   # and every worker stopped without waiting (_run_spread's release_idle)
    for case in cases:
        advance(f"{case.level}/{case.group}/{case.id} [{first.device}, alone]")
        start = time.perf_counter()
        record(first.execute(case))
        tallies[0].add(time.perf_counter() - start)


def _cpu_share(workers: int) -> int | None:
    """Each worker's share of this host's cores when several run side by side, else None."""
    import os

    if workers < 2:
        return None
    return max(1, (os.cpu_count() or 1) // workers)


def _selection_text(pattern: str | Sequence[str] | None, shard: tuple[int, int] | None) -> str:
    patterns = [pattern] if isinstance(pattern, str) else list(pattern or [])
    parts = [f"-k {p!r}" for p in patterns] + ([f"--shard {shard[0]}/{shard[1]}"] if shard else [])
    return " ".join(parts) or "all"


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc, 10 ms ticks); None elsewhere."""
    import os

    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            after_name = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - int(after_name[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None


def _engine_label(engine: str) -> str:
    """A directory-safe name for `--engine package.module:Class` too."""
    return engine.rsplit(":", 1)[-1] if ":" in engine else engine


class _progress:
    """Progress on stderr: a rich bar ("bar", for a terminal), a plain line every
    LINE_EVERY_S seconds ("lines", for a log or a pipe), or nothing (None).
    `advance(label)` before each case; `advance(None)` after the last."""
    LINE_EVERY_S = 5.0

    def __init__(self, mode: str | bool | None, total: int):
        self.mode = "bar" if mode is True else (mode or None)
        self.total, self._bar = total, None

    def __enter__(self):
        if self.mode == "lines":
            return self._lines()
        if self.mode != "bar":
            return lambda label: None
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TimeRemainingColumn(),
                             console=Console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task("cases", total=self.total)
        started = [False]

        def advance(label):
            if started[0]:
                self._bar.advance(task)
            started[0] = label is not None
            if label is not None:
                self._bar.update(task, description=label)
        return advance

    def _lines(self):
        import sys

        start = last = time.monotonic()
        done = [-1]

        def advance(label):
            nonlocal last
            done[0] += 1
            now = time.monotonic()
            if label is None or now - last >= self.LINE_EVERY_S:
                last = now
                where = f" {label}" if label else " done"
                print(f"[{done[0]}/{self.total}] {now - start:.0f} s{where}", file=sys.stderr, flush=True)
        return advance

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
