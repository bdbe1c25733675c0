"""Wall time of `bundlegen run` per level on one GPU with the float64 oracle: first the
top level in a fresh Triton cache (cold: kernels compile), then every level again on
the warm cache. Each run is a fresh `python -m bundlegen run` process, timed whole; its
results.jsonl gives each case's phases: `materialize_s` (input fill, layout, copies),
`oracle_s` (the float64 forward and backward alone), `engine_s` (the first run) and
`check_s` (guards, inputs, tolerance, determinism re-run), and the executed case count.
The oracle share is the summed oracle_s over the process's elapsed time. A level
includes every lower level, so `full` is all four levels. (Results files written before
the phases were split have no materialize_s/check_s, and their oracle_s is all of
materialize: they read as 0 and as that.)

Targets (printed, not asserted): all four levels against triton in under 20 s with a warm
cache, and the oracle under 30 % of it.

    python bench/harness_throughput.py                  # triton on cuda, ~2-5 min on an H200
    python bench/harness_throughput.py --levels quick   # just the quick level
    python bench/harness_throughput.py --device cpu --engine torch-math --levels quick -k shapes
                                                        # smoke test of the code path
The warm top-level run's directory is what `bundlegen calibrate` takes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

LEVELS = ("quick", "pr", "nightly", "full")
TARGET_WARM_S = 20.0
TARGET_ORACLE_SHARE = 0.30
RESULTS_DIR = REPO_ROOT / "bench" / "results"

from bundlegen.harness.results import PHASES, phase_seconds  # noqa: E402  (needs REPO_ROOT on sys.path)


@dataclass(frozen=True)
class LevelStats:
    """Sums over one level's own records of a run."""
    level: str
    cases: int
    executed: int        # the engine ran (engine_s recorded)
    wall_s: float        # sum of per-case wall_s
    oracle_s: float
    engine_s: float
    predicted_s: float
    materialize_s: float = 0.0
    check_s: float = 0.0


@dataclass(frozen=True)
class RunStats:
    label: str           # cold | warm
    level: str           # the --level given (it includes the lower levels)
    elapsed_s: float     # the whole process: imports, worker start, every case
    exit_code: int
    levels: tuple[LevelStats, ...]
    results: str
    start_s: float | None = None      # run.json: until the worker's engine was ready
    prepare_s: float | None = None    # run.json: Engine.prepare (parallel compile when cold)
    run_start_s: float = 0.0          # the cost model's per-run start for this device class

    @property
    def predicted_run_s(self) -> float:
        """The cost model's whole-process prediction: every case plus the run start."""
        return self.total("predicted_s") + self.run_start_s

    def total(self, field: str) -> float:
        return sum(getattr(s, field) for s in self.levels)

    @property
    def oracle_share(self) -> float:
        return self.total("oracle_s") / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def cases_per_s(self) -> float:
        return self.total("executed") / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "oracle_share": self.oracle_share, "executed_cases_per_s": self.cases_per_s,
                "predicted_run_s": self.predicted_run_s,
                "case_wall_s": self.total("wall_s"), "executed": self.total("executed"),
                **{phase: self.total(phase) for phase in PHASES}}

    @property
    def other_s(self) -> float:
        """Case wall time outside the four phases (worker round trip, skips, probes, ...)."""
        return self.total("wall_s") - sum(self.total(phase) for phase in PHASES)


def level_stats(records: list[dict], levels: tuple[str, ...]) -> tuple[LevelStats, ...]:
    out = []
    for level in levels:
        rows = [r for r in records if r.get("level") == level]
        out.append(LevelStats(
            level=level, cases=len(rows), executed=sum(r.get("engine_s") is not None for r in rows),
            wall_s=sum(r.get("wall_s") or 0.0 for r in rows),
            predicted_s=sum(r.get("predicted_s") or 0.0 for r in rows),
            **phase_seconds(rows)))
    return tuple(out)


def run_level(label: str, level: str, args, cache: Path) -> RunStats:
    from bundlegen.harness.results import read_results, read_run_times
    from bundlegen.plans.sdpa_bwd import COST_MODEL

    out = args.runs_dir / f"{label}-{level}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "bundlegen", "run", "--level", level, "--engine", args.engine,
           "--device", args.device, "--out", str(out), "--quiet"]
    if args.pattern:
        cmd += ["-k", args.pattern]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache),
           "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    with open(out / "log.txt", "w") as log:
        try:
            code = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=args.timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = -1
    elapsed = time.perf_counter() - start
    records = read_results(out / "results.jsonl")
    upto = LEVELS[: LEVELS.index(level) + 1]
    times = read_run_times(out)
    device_class = "cpu" if args.device.startswith("cpu") else "h200"
    return RunStats(label, level, elapsed, code, level_stats(records, upto), str(out / "results.jsonl"),
                    start_s=times.start_s if times else None, prepare_s=times.prepare_s if times else None,
                    run_start_s=COST_MODEL[device_class].run_start_s)


def print_runs(runs: list[RunStats]) -> None:
    def opt(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    print(f"{'run':5s} {'level':8s} {'elapsed s':>10s} {'predicted':>10s} {'error':>7s} {'case wall s':>12s} "
          f"{'outside s':>10s} {'start s':>8s} {'prepare s':>10s} {'oracle s':>9s} {'oracle %':>9s} "
          f"{'engine s':>9s} {'executed':>9s} {'cases/s':>8s} {'exit':>5s}")
    for r in runs:
        wall = r.total("wall_s")
        error = (r.predicted_run_s - r.elapsed_s) / r.elapsed_s if r.elapsed_s > 0 else 0.0
        print(f"{r.label:5s} {r.level:8s} {r.elapsed_s:10.1f} {r.predicted_run_s:10.1f} {error:+7.0%} "
              f"{wall:12.1f} {r.elapsed_s - wall:10.1f} {opt(r.start_s):>8s} {opt(r.prepare_s):>10s} "
              f"{r.total('oracle_s'):9.1f} {r.oracle_share:9.1%} {r.total('engine_s'):9.1f} "
              f"{r.total('executed'):9d} {r.cases_per_s:8.1f} {r.exit_code:5d}")


def print_phases(runs: list[RunStats]) -> None:
    """Where the case wall time went, per run: the four phases and the rest."""
    print(f"\n{'run':5s} {'level':8s} {'case wall s':>12s} {'materialize s':>14s} {'oracle s':>9s} "
          f"{'engine s':>9s} {'check s':>8s} {'other s':>8s}")
    for r in runs:
        print(f"{r.label:5s} {r.level:8s} {r.total('wall_s'):12.1f} {r.total('materialize_s'):14.1f} "
              f"{r.total('oracle_s'):9.1f} {r.total('engine_s'):9.1f} {r.total('check_s'):8.1f} {r.other_s:8.1f}")


def print_breakdown(run: RunStats) -> None:
    print(f"\nper level, {run.label} --level {run.level} (each level's own cases):")
    print(f"{'level':8s} {'cases':>6s} {'executed':>9s} {'wall s':>8s} {'materialize s':>14s} {'oracle s':>9s} "
          f"{'engine s':>9s} {'check s':>8s} {'predicted s':>12s}")
    for s in run.levels:
        print(f"{s.level:8s} {s.cases:6d} {s.executed:9d} {s.wall_s:8.1f} {s.materialize_s:14.1f} "
              f"{s.oracle_s:9.1f} {s.engine_s:9.1f} {s.check_s:8.1f} {s.predicted_s:12.1f}")


def target_lines(cold: RunStats | None, warm: RunStats | None, judged: bool = True) -> list[str]:
    """`judged`: the run is what the targets are about (all four levels, triton, a GPU);
    otherwise the numbers are printed without a verdict."""
    lines = []
    if warm is not None:
        which = "all four levels" if warm.level == LEVELS[-1] else f"--level {warm.level}"
        judged = judged and warm.level == LEVELS[-1]

        def verdict(ok: bool, target: str) -> str:
            if not judged:
                return f"(target {target} is for all four levels against triton on a GPU)"
            return f"(target {target}: {'met' if ok else 'NOT met'})"
        lines.append(f"warm cache, {which}: {warm.elapsed_s:.1f} s "
                     + verdict(warm.elapsed_s < TARGET_WARM_S and warm.exit_code in (0, 1),
                               f"< {TARGET_WARM_S:.0f} s"))
        lines.append(f"oracle share of it: {warm.oracle_share:.1%} "
                     + verdict(warm.oracle_share < TARGET_ORACLE_SHARE, f"< {TARGET_ORACLE_SHARE:.0%}"))
        lines.append(f"executed cases per second (warm): {warm.cases_per_s:.1f}")
    if cold is not None:
        extra = f", {cold.elapsed_s - warm.elapsed_s:+.1f} s over warm" if warm is not None else ""
        compiled = f" (of which the engine's prepare, compiling ahead: {cold.prepare_s:.1f} s)" \
            if cold.prepare_s is not None else ""
        lines.append(f"cold cache, --level {cold.level}: {cold.elapsed_s:.1f} s{extra}{compiled}")
    for r in (cold, warm):
        if r is not None and r.exit_code not in (0, 1):
            lines.append(f"WARNING: {r.label} --level {r.level} exited {r.exit_code} (see {Path(r.results).parent}/log.txt)")
    return lines


def default_out(device: str) -> Path:
    import torch

    if not device.startswith("cuda"):
        return RESULTS_DIR / "harness_throughput_cpu.json"
    name = torch.cuda.get_device_name(torch.device(device))
    tag = "h200" if "H200" in name else "sm{}{}".format(*torch.cuda.get_device_capability(torch.device(device)))
    return RESULTS_DIR / f"harness_throughput_{tag}.json"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="triton")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--levels", nargs="+", default=list(LEVELS), choices=LEVELS,
                        help="levels to run warm, each cumulatively (the highest also runs cold)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-cache run")
    parser.add_argument("-k", dest="pattern", default=None, help="passed to bundlegen run -k")
    parser.add_argument("--runs-dir", type=Path, default=REPO_ROOT / "out" / "harness_throughput",
                        help="where each run's results.jsonl and log go (and the Triton cache)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default bench/results/harness_throughput_h200.json on an H200)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per bundlegen run process")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("harness_throughput: no CUDA device here. This benchmark times the harness on a GPU "
              "(written for an H200); for a smoke test run with --device cpu --engine torch-math "
              "--levels quick -k shapes.", file=sys.stderr)
        return 2
    levels = sorted(set(args.levels), key=LEVELS.index)
    out = args.out or default_out(args.device)
    cache = args.runs_dir / "triton-cache"
    if cache.exists() and not args.no_cold:   # --no-cold times the cache that is there
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)

    runs: list[RunStats] = []
    cold = warm = None
    plan = ([("cold", levels[-1])] if not args.no_cold else []) + [("warm", lv) for lv in levels]
    for label, level in plan:
        print(f"running {label} --level {level} --engine {args.engine} --device {args.device} ...", flush=True)
        run = run_level(label, level, args, cache)
        print(f"  {run.elapsed_s:.1f} s, exit {run.exit_code}, {run.total('executed')} executed", flush=True)
        runs.append(run)
        if label == "cold":
            cold = run
        elif level == levels[-1]:
            warm = run
    print()
    print_runs(runs)
    print_phases(runs)
    if warm is not None:
        print_breakdown(warm)
    print()
    lines = target_lines(cold, warm, judged=args.engine == "triton" and not args.pattern
                         and args.device.startswith("cuda"))
    for line in lines:
        print(line)
    if warm is not None:
        print(f"\ncalibrate the cost model with:  bundlegen calibrate {Path(warm.results).parent} "
              f"--device-class {'h200' if args.device.startswith('cuda') else 'cpu'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"engine": args.engine, "device": args.device,
                               "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
                               "torch": torch.__version__, "runs": [r.to_json() for r in runs],
                               "targets": lines}, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
