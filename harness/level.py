"""A level's cases against one engine (DESIGN section 5): `run_level` loads the level's
bundles, starts the workers (fresh ones, a matching `bundlegen serve`'s, under MPS when
asked), hands the cases out through the executors and writes results.jsonl (appended per
case), junit.xml and run.json."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from bundlegen.harness import bundles as B
from bundlegen.results_file import DEFAULT_OUT
from bundlegen.harness import verdicts as V
from bundlegen.harness.config import EngineConfig, checked_for_run
from bundlegen.harness.config import EngineConfig
from bundlegen.harness.case import predicted_seconds
from bundlegen.harness.executor import (CaseExecutor, DeviceTally, JoiningWorker, first_ready,
                                        crashed, longest_first, out_of_device_memory, prepared_graphs, rerun_alone,
                                        run_spread)
from bundlegen.harness.progress import Progress
from bundlegen.harness.selection import in_shard, selection, shuffled
from bundlegen.harness.stale_skips import stale_skips, without_skips
from bundlegen.harness.workers import mps as mps_control, switches
from bundlegen.harness.workers.devices import default_device, default_timeout, worker_devices
from bundlegen.harness.workers.pool import close_all, cpu_share
from bundlegen.harness.workers.serve_client import open_session
from bundlegen.harness.workers.serve_key import may_be_served, serve_key
from bundlegen.harness.workers.worker import WorkerStartError

if TYPE_CHECKING:
    from bundlegen.harness.results import RunTimes

# the results module (and what it imports) is imported once the workers are started: each
# millisecond before that delays them (harness.command).

#: the environment variable that turns off stopping each worker as soon as no case is left
#: for it, and leaving the workers to exit while the run writes its files ("0": every worker
#: is stopped after the last case, and the run waits for their exits; see run_spread)
RELEASE_SWITCH = "BUNDLEGEN_EARLY_RELEASE"
#: the environment variable that makes every worker of a run prepare ("0"), even where the
#: first worker's prepare serves the host (Engine.prepare_shared; see JoiningWorker)
SHARED_PREPARE_SWITCH = "BUNDLEGEN_SHARED_PREPARE"


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
    stale_skips: tuple[str, ...] = ()   # --run-skipped: a line per skip row whose cases all pass
    dead_rows: tuple[str, ...] = ()     # a line per engine-config row that selects no case of the plan


    @property
    def failing(self) -> int:
        return sum(s.failing for s in self.levels)

    @property
    def tested(self) -> int:
        """Cases judged on their gradients and found right: exit 0 needs one. A run of
        probes alone (rejected, contained), its other cases declined or skipped, checked
        nothing an engine computes (and any failing verdict exits 1 before this counts)."""
        return self.counts().get(V.PASS, 0)

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


def crash_hold(mps: bool, workers: list[str]):
    """Which crashed cases a spread run holds back to run again alone: under MPS every crash
    (a neighbour's fault ends them all); where workers share a device, those out of device
    memory (what the neighbours held may be what was missing); else none."""
    if mps:
        return crashed
    return out_of_device_memory if len(set(workers)) < len(workers) else None


def run_level(level: str, engine: str, *, device: str | None = None, out: Path | str | None = None,
              bundles: Path | str | None = None, plan: str | None = None,
              pattern: str | Sequence[str] | None = None,
              shard: tuple[int, int] | None = None, resume: bool = False,
              timeout_s: float | None = None, repeat: int | None = None, isolation: bool = True,
              config: EngineConfig | None = None, progress: str | bool | None = None,
              devices: Sequence[str] | None = None, lane: str = "",
              workers_per_device: int = 1, server: bool = False,
              allow_empty: bool = True, mps: bool = False, shuffle: int | None = None,
              run_skipped: bool = False, allow_stale_tolerances: bool = False) -> RunSummary:
    """Run every case of `level` and the lower levels of `plan` (default: the bundle root's
    only plan); write results.jsonl (appended per case), junit.xml and run.json; give the
    per-level summary. `devices` (two or more) or `workers_per_device` (more than one): one
    worker process per device and slot, cases handed out longest predicted first to
    whichever worker is free, into the same three files. `server`: use the workers of a
    running `bundlegen serve` whose key matches this run's (workers.serve), when there is
    one and it is free; the results are the same. `allow_empty` False: a selection that holds
    no case raises NothingSelected before `out` is touched. `mps`: the GPU workers are clients
    of a private CUDA MPS server (workers.mps; a matching server's own when served), and each
    case that crashed beside other workers is run again alone (rerun_alone). `shuffle`: the
    cases run in the order this seed shuffles them to (selection.shuffled; run.json records
    the seed and the order), not in the bundles' order nor longest first. `run_skipped`: the
    cases the engine config's skip rows select are run too, and each row whose cases all
    pass is reported stale (harness.stale_skips). Before any worker starts, the numbers that
    will judge the run are checked (config.checked_for_run; EngineConfigError): a stale
    generated tolerance block passes only with `allow_stale_tolerances`, recorded then."""
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
        problem = mps_control.mps_devices_problem(workers) or (
            None if isolation else "--mps: MPS serves worker processes; --no-isolation runs the "
                                   "engine in this one")
        if problem:
            raise ValueError(problem)
    root = Path(bundles) if bundles else B.default_bundle_root()
    manifest = B.manifest_of(root, plan)
    skip_config = None   # --run-skipped: the config whose skip rows are re-examined
    if run_skipped:
        if config is None:
            from bundlegen.engines.registry import registered_name
            from bundlegen.harness.config import load_engine_config
            from bundlegen.workspace import engine_config_dir

            config = load_engine_config(engine_config_dir(registered_name(engine)))
        skip_config, config = config.with_manifest(manifest), without_skips(config)
    if config is None:
        from bundlegen.engines.registry import registered_name
        from bundlegen.harness.config import load_engine_config
        from bundlegen.workspace import engine_config_dir

        config = load_engine_config(engine_config_dir(registered_name(engine)))
    config = checked_for_run(config, manifest, allow_stale_tolerances)
    levels = manifest.levels_upto(level)
    session, server_note = None, ""
    if server and isolation:
        if may_be_served(engine):
            session, server_note = open_session(serve_key(engine, devices, workers_per_device, mps=mps))
    daemon = None
    if mps and session is None:
        daemon = mps_control.start_mps(workers)
    # the workers import torch and build the engine while this process loads the bundles
    executors: list[CaseExecutor] = []
    try:
        for slot, dev in enumerate(workers):
            executors.append(CaseExecutor(
                engine, dev, config=config, manifest=manifest, repeat=repeat, isolation=isolation,
                timeout_s=timeout_s if timeout_s is not None else default_timeout(dev), wait=False,
                run_id=executors[0].run_id if executors else None,
                cpu_threads=cpu_share(len(workers)),
                runner_factory=session.runner_factory(slot) if session else None,
                env=daemon.env if daemon else None))
    except BaseException:
        close_all(executors)
        if session:
            session.close()
        if daemon:
            daemon.stop()
        raise
    from bundlegen.harness import results as R   # after the workers' start: see the top of this module

    executor, starting = executors[0], {}
    per_device = [DeviceTally(dev, workers[:i].count(dev)) for i, dev in enumerate(workers)]
    new_records = []
    interrupted = False
    prepare_problem, todo, ran, reruns = None, [], 0, 0
    ready = prepared = cases_done = writer = last_recorded = None
    early_exits = not switches.turned_off(RELEASE_SWITCH)
    wait_for_exits = True   # False once the run ends as it should (every worker idle)
    try:
        loaded = B.load_level(root, level, manifest.plan)
        for each in executors:
            each.case_files = {case_id: B.file_name(path, root) for case_id, path in loaded.file_of.items()}
        selected = selection(pattern)
        cases = [c for c in loaded.cases if selected(c) and in_shard(c.id, shard)]
        if not cases and not loaded.errors and not allow_empty:
            raise NothingSelected(f"no case of level {level} was selected")
        out = Path(out) if out else DEFAULT_OUT / f"{engine_label(engine)}-{level}"
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out}: is a file, not a folder")
        results_path, junit_path, run_path = out / R.RESULTS_NAME, out / R.JUNIT_NAME, out / R.RUN_NAME
        # while the workers start: the config's rows that select no case of the plan
        dead = _dead_rows(skip_config or executors[0].config, root, manifest, level, loaded)
        # the first worker ready begins the run: the others join the case loop as they
        # become ready (run_spread), so no worker idles while a slower one imports torch
        try:
            first, starting = first_ready(executors)
            executor = executors[first]
        except WorkerStartError as exc:
            if daemon is None:
                raise
            raise WorkerStartError(f"{exc} (a client of the run's MPS server; its logs end: "
                                          f"{' | '.join(daemon.log_tail().splitlines()) or 'nothing'})",
                                          exc.details) from None
        ready = time.perf_counter()
        config_digest = R.engine_config_digest(executor.config)

        def run_times(complete: bool) -> "RunTimes":
            now = time.perf_counter()
            at = lambda t: now if t is None else t  # noqa: E731 - a phase not reached ends now
            return R.RunTimes(
                run_id=executor.run_id, level=level, engine=executor.engine_name, arch=executor.arch,
                device=device, cases=ran, start_s=ready - started,
                prepare_s=at(prepared) - ready, cases_s=at(cases_done) - at(prepared),
                finish_s=now - at(cases_done), elapsed_s=now - started,
                prepare_problem=prepare_problem, before_s=before, engine_spec=engine,
                selection=selection_text(pattern, shard),
                bundles_digest=R.bundles_digest([*loaded.files, *B.manifest_files(root, manifest)], root),
                complete=complete, versions=executor.versions,
                per_device=tuple(t.to_json() for t in per_device), lane=lane,
                workers_per_device=workers_per_device,
                served_by=session.record() if session else None, mps=mps, mps_reruns=reruns,
                engine_config_digest=config_digest, tolerances_digest=manifest.tolerances_digest,
                shuffle_seed=shuffle, order=tuple(c.id for c in todo) if shuffle is not None else (),
                run_skipped=run_skipped)

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
        if shuffle is not None:
            todo = shuffled(todo, shuffle)
        R.write_run_times(run_path, run_times(False))
        try:
            graphs = prepared_graphs(todo)
            prepare_problem = executor.prepare_graphs(graphs)
            prepared = time.perf_counter()
            predicted = {c.id: predicted_seconds(c, workers[0], manifest, executor.engine_name) or 0.0
                         for c in todo} if progress else None
            with R.ResultsWriter(results_path) as writer, \
                    Progress(progress, len(todo), predicted, len(workers)) as advance:
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
                    joining = JoiningWorker(executor, starting, graphs if prepare_problem is None else [],
                                            skip_shared=not switches.turned_off(SHARED_PREPARE_SWITCH))
                    order = todo if shuffle is not None else longest_first(todo, workers[0], manifest, executor.engine_name)
                    held = run_spread(executors, per_device, order,
                                      count, advance, hold_crashes=crash_hold(mps, workers), join=joining,
                                      # a served worker is the server's to keep
                                      release_idle=session is None and early_exits)
                    prepare_problem = prepare_problem or joining.problem
                    if held:
                        reruns = len(held)
                        rerun_alone(executors, per_device, held, count, advance)
                advance(None)
        except KeyboardInterrupt:
            interrupted = True   # what finished is recorded; junit and run.json still follow
        # the cases end with the last one recorded: the workers' exits after it are the finish
        cases_done = last_recorded if last_recorded is not None else time.perf_counter()
        wait_for_exits = interrupted or not early_exits
    finally:
        # idle workers exit while the files are written, and the MPS server after them
        close_all(executors, wait=wait_for_exits)
        if session:
            session.close()
        if daemon:
            daemon.stop(wait=wait_for_exits)

    records = previous + new_records
    R.write_junit(junit_path, records, levels, engine_spec=engine)
    if writer is not None:
        writer.wait_synced()   # its last fsync ran beside the workers' exits
    times = run_times(complete=not interrupted)
    stale = ()
    if skip_config is not None:
        stale = stale_skips(skip_config, cases, {r.get("case_id"): r.get("verdict") for r in records},
                            executor.arch, executor.versions)
        times = replace(times, stale_skips=tuple(row.to_json() for row in stale))
    R.write_run_times(run_path, times)
    return RunSummary(level=level, levels=tuple(R.summarize(records, levels)),
                      results_path=results_path, junit_path=junit_path, ran=ran,
                      resumed=len(cases) - len(todo), bundle_errors=tuple(str(e) for e in loaded.errors),
                      times=times, interrupted=interrupted, planned=len(todo), server_note=server_note,
                      stale_skips=tuple(row.line(skip_config.source) for row in stale), dead_rows=dead)


def _dead_rows(config, root: Path, manifest, level: str, loaded) -> tuple[str, ...]:
    """The config's rows that select no case of the whole plan (harness.dead_rows); the
    plan's cases are loaded only when there are rows to look at."""
    if not config.overrides and not config.skips:
        return ()
    from bundlegen.harness.dead_rows import dead_rows, plan_cases

    top = manifest.levels[-1].name
    return dead_rows(config, loaded.cases if level == top else plan_cases(root, manifest))



def selection_text(pattern: str | Sequence[str] | None, shard: tuple[int, int] | None) -> str:
    patterns = [pattern] if isinstance(pattern, str) else list(pattern or [])
    parts = [f"-k {p!r}" for p in patterns] + ([f"--shard {shard[0]}/{shard[1]}"] if shard else [])
    return " ".join(parts) or "all"


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc, 10 ms ticks); None elsewhere."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            after_name = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - int(after_name[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None


def engine_label(engine: str) -> str:
    """A directory-safe name for `--engine package.module:Class` too."""
    return engine.rsplit(":", 1)[-1] if ":" in engine else engine
