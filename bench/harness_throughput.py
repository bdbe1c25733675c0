"""Wall time of `bundlegen run` against one engine, as the harness's speed targets are stated, in one
run of this script: every level asked for (default: quick alone, and full = all four
levels) on a warm Triton cache on one GPU with one worker and with N worker processes
sharing it (--workers), on several GPUs of the host when --devices names them (N workers
each; the per-GPU split and the speed-up over one GPU printed side by side), and the top
level once first on a cold cache on one GPU. Each run is a fresh `python -m bundlegen run`
process, timed whole; its run.json gives the worker start, prepare and case-loop seconds
and the per-worker split; its results.jsonl each case's phases: `materialize_s` (inputs,
layout, copies), `oracle_s` (the float64 forward and backward), `engine_s` (the first
run) and `check_s` (guards, inputs, tolerance, determinism re-run). The oracle share is
the summed oracle_s over the process's elapsed time times its workers (for one worker: of
its elapsed time).

Targets (printed, not asserted; set when the plan had 783 cases, the case count is
printed beside them): on one GPU, warm, all four levels under 12 s and quick alone under
3 s, the oracle under 30 % of the one-worker all-levels run; on two GPUs of one host, all
four levels under 8 s; cold cache on one GPU under 45 s.

    python bench/harness_throughput.py --workers 4 --out out/harness_throughput_h200.json
    python bench/harness_throughput.py --devices cuda:0,cuda:1 --workers 4   # and two GPUs
    python bench/harness_throughput.py --device cpu --engine torch-math --levels quick -k shapes \
        --workers 2 --devices cpu,cpu --no-cold        # smoke test of the code path
The warm one-worker top-level run's directory is what `bundlegen calibrate` takes.

--server: after the fresh-worker runs, start `bundlegen serve` once per device list and
worker count and time the same warm runs through it ("served": the workers were started
before the timed process, so their start is not in its elapsed time; each served run's
run.json must say it was served, else it is flagged). The fresh-worker runs pass
--no-server, so a server left running never serves them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

LEVELS = ("quick", "pr", "nightly", "full")
#: the harness's speed targets (seconds), and the oracle share
TARGET_WARM_ALL_S = 12.0
TARGET_WARM_QUICK_S = 3.0
TARGET_TWO_GPUS_ALL_S = 8.0
TARGET_COLD_ALL_S = 45.0
TARGET_ORACLE_SHARE = 0.30
TARGETS_SET_AT_CASES = 783
#: measurements land under out/, which git ignores: the figures worth keeping are in
#: docs/PERFORMANCE.md, each with the command that measures it again
RESULTS_DIR = REPO_ROOT / "out"

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
    devices: str = ""                 # --device or --devices as given
    workers: int = 1                  # worker processes per device
    start_s: float | None = None      # run.json: until the workers' engines were ready
    prepare_s: float | None = None    # run.json: Engine.prepare (parallel compile when cold)
    cases_s: float | None = None      # run.json: the case loop
    run_start_s: float = 0.0          # the cost model's per-run start for this device class
    split: dict = field(default_factory=dict)   # device -> {"workers", "cases", "seconds"}
    served_by: dict | None = None     # run.json: the `bundlegen serve` whose pre-started workers ran it
    mps: bool = False                 # --mps: the workers were clients of a private CUDA MPS server

    @property
    def name(self) -> str:
        return f"{self.label} {self.level} on {self.where}"

    @property
    def where(self) -> str:
        """'cuda x4', 'cuda x8 mps': the devices, workers per device and MPS."""
        return f"{self.devices} x{self.workers}{' mps' if self.mps else ''}"

    @property
    def total_workers(self) -> int:
        return self.workers * len(self.devices.split(","))

    @property
    def predicted_run_s(self) -> float:
        """The cost model's whole-process prediction for one worker: every case plus the run start."""
        return self.total("predicted_s") + self.run_start_s

    def total(self, name: str) -> float:
        return sum(getattr(s, name) for s in self.levels)

    @property
    def oracle_share(self) -> float:
        busy = self.elapsed_s * self.total_workers
        return self.total("oracle_s") / busy if busy > 0 else 0.0

    @property
    def cases_per_s(self) -> float:
        return self.total("executed") / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def ok(self) -> bool:
        """The run finished (exit 0, or 1 for failing cases: still a timing)."""
        return self.exit_code in (0, 1)

    def to_json(self) -> dict:
        return {**asdict(self), "oracle_share": self.oracle_share, "executed_cases_per_s": self.cases_per_s,
                "predicted_run_s": self.predicted_run_s, "cases": self.total("cases"),
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


def split_of(per_device) -> dict:
    """run.json's per-worker tallies summed per device."""
    out: dict[str, dict] = {}
    for d in per_device or ():
        row = out.setdefault(d["device"], {"workers": 0, "cases": 0, "seconds": 0.0})
        row["workers"] += 1
        row["cases"] += d["cases"]
        row["seconds"] = round(row["seconds"] + d["seconds"], 3)
    return out


def run_env(cache: Path) -> dict:
    """The environment of every timed process (a server's too: its key must match the runs')."""
    return {**os.environ, "TRITON_CACHE_DIR": str(cache),
            "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def device_args(devices: list[str]) -> list[str]:
    where = ",".join(devices)
    return ["--device", where] if len(devices) == 1 else ["--devices", where]


def run_level(label: str, level: str, devices: list[str], workers: int, args, cache: Path,
              mps: bool = False) -> RunStats:
    from bundlegen.harness.results import read_results, read_run_times
    from bundlegen.plans.sdpa_bwd import COST_MODEL

    where = ",".join(devices)
    out = args.runs_dir / f"{label}-{level}-{where.replace(':', '').replace(',', '-')}-x{workers}{'-mps' * mps}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "bundlegen", "run", "--level", level, "--engine", args.engine,
           *device_args(devices), "--workers-per-device", str(workers), "--out", str(out), "--quiet"]
    if label != "served":
        cmd.append("--no-server")
    if mps:
        cmd.append("--mps")
    if args.pattern:
        cmd += ["-k", args.pattern]
    env = run_env(cache)
    print(f"running {label} --level {level} on {where}, {workers} worker(s) each"
          f"{', MPS' if mps else ''} ...", flush=True)
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
    device_class = "cpu" if devices[0].startswith("cpu") else "h200"
    run = RunStats(label, level, elapsed, code, level_stats(records, upto), str(out / "results.jsonl"),
                   devices=where, workers=workers,
                   start_s=times.start_s if times else None, prepare_s=times.prepare_s if times else None,
                   cases_s=times.cases_s if times else None,
                   run_start_s=COST_MODEL[device_class].run_start_s,
                   split=split_of(times.per_device if times else ()),
                   served_by=dict(times.served_by) if times and times.served_by else None, mps=mps)
    print(f"  {run.elapsed_s:.1f} s, exit {run.exit_code}, {run.total('executed')} executed", flush=True)
    return run


def start_server(devices: list[str], workers: int, args, cache: Path, mps: bool = False) -> subprocess.Popen:
    """`bundlegen serve` for these devices and workers, once its workers are ready."""
    cmd = [sys.executable, "-m", "bundlegen", "serve", "--engine", args.engine, *device_args(devices),
           "--workers-per-device", str(workers), "--idle-timeout", str(args.timeout_s), *["--mps"] * mps]
    print(f"starting bundlegen serve on {','.join(devices)}, {workers} worker(s) each"
          f"{', MPS' if mps else ''} ...", flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=run_env(cache), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"bundlegen serve did not start: {line}{proc.stdout.read()}")
    print(f"  workers ready after {time.perf_counter() - start:.1f} s (not part of the served runs' times)",
          flush=True)
    return proc


def stop_server(proc: subprocess.Popen, cache: Path) -> None:
    subprocess.run([sys.executable, "-m", "bundlegen", "serve", "--stop"], cwd=REPO_ROOT, env=run_env(cache),
                   capture_output=True, timeout=60)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def served_runs(runs: list[RunStats], args, cache: Path) -> list[RunStats]:
    """The warm runs again, through one `bundlegen serve` per device list and worker count."""
    out = []
    warm = [r for r in runs if r.label == "warm"]
    for devices, workers, mps in dict.fromkeys((r.devices, r.workers, r.mps) for r in warm):
        device_list = devices.split(",")
        proc = start_server(device_list, workers, args, cache, mps)
        try:
            for r in warm:
                if (r.devices, r.workers, r.mps) == (devices, workers, mps):
                    out.append(run_level("served", r.level, device_list, workers, args, cache, mps))
        finally:
            stop_server(proc, cache)
    return out


def print_served(runs: list[RunStats]) -> None:
    """Each warm run with fresh workers beside the same run through `bundlegen serve`."""
    served = {(r.level, r.where): r for r in runs if r.label == "served"}
    if not served:
        return
    print("\nfresh workers vs workers pre-started by `bundlegen serve` (served: the workers' start "
          "is NOT in its elapsed time):")
    print(f"  {'level':8s} {'devices, workers':20s} {'fresh s':>8s} {'served s':>9s} {'speed-up':>9s}"
          f"  served run.json")
    for r in runs:
        s = served.get((r.level, r.where)) if r.label == "warm" else None
        if s is None:
            continue
        ratio = f"{r.elapsed_s / s.elapsed_s:.2f}x" if s.elapsed_s > 0 else "-"
        said = (f"served by pid {s.served_by['pid']}, workers started "
                f"{s.served_by['workers_started_s_ago']:.0f} s before" if s.served_by
                else "NOT SERVED (fresh workers started: no matching server)")
        print(f"  {r.level:8s} {r.where:20s} {r.elapsed_s:8.1f} {s.elapsed_s:9.1f} "
              f"{ratio:>9s}  {said}")


def _opt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def print_runs(runs: list[RunStats]) -> None:
    print(f"{'run':6s} {'level':8s} {'devices, workers':20s} {'cases':>6s} {'elapsed s':>10s} "
          f"{'start s':>8s} {'prepare s':>10s} {'cases s':>8s} {'case wall s':>12s} {'oracle %':>9s} "
          f"{'cases/s':>8s} {'exit':>5s}")
    for r in runs:
        print(f"{r.label:6s} {r.level:8s} {r.where:20s} {r.total('cases'):6d} "
              f"{r.elapsed_s:10.1f} {_opt(r.start_s):>8s} {_opt(r.prepare_s):>10s} {_opt(r.cases_s):>8s} "
              f"{r.total('wall_s'):12.1f} {r.oracle_share:9.1%} {r.cases_per_s:8.1f} {r.exit_code:5d}")


def print_phases(runs: list[RunStats]) -> None:
    """Where the case wall time went, per run (summed over its workers)."""
    print(f"\n{'run':6s} {'level':8s} {'devices, workers':20s} {'case wall s':>12s} {'materialize s':>14s} "
          f"{'oracle s':>9s} {'engine s':>9s} {'check s':>8s} {'other s':>8s}")
    for r in runs:
        print(f"{r.label:6s} {r.level:8s} {r.where:20s} {r.total('wall_s'):12.1f} "
              f"{r.total('materialize_s'):14.1f} {r.total('oracle_s'):9.1f} {r.total('engine_s'):9.1f} "
              f"{r.total('check_s'):8.1f} {r.other_s:8.1f}")


def print_side_by_side(runs: list[RunStats]) -> None:
    """Per level, the warm runs side by side: elapsed, the speed-up over one worker on one
    device, and each device's share of the cases (cases, summed worker seconds)."""
    warm = [r for r in runs if r.label == "warm"]
    for level in dict.fromkeys(r.level for r in warm):
        rows = [r for r in warm if r.level == level]
        base = next((r for r in rows if r.total_workers == 1), None)
        one_device = [r for r in rows if "," not in r.devices]
        best_one = min(one_device, key=lambda r: r.elapsed_s) if one_device else None
        print(f"\nwarm --level {level} ({rows[0].total('cases')} cases), side by side:")
        print(f"  {'devices, workers':20s} {'elapsed s':>10s} {'vs 1 worker':>12s} "
              f"{'vs 1 device':>12s}  split per device (cases, worker-seconds)")
        for r in rows:
            vs_one = f"{base.elapsed_s / r.elapsed_s:.2f}x" if base and r.elapsed_s > 0 else "-"
            vs_dev = (f"{best_one.elapsed_s / r.elapsed_s:.2f}x"
                      if best_one and "," in r.devices and r.elapsed_s > 0 else "-")
            split = ", ".join(f"{dev} {v['cases']} / {v['seconds']:.1f} s" for dev, v in r.split.items())
            print(f"  {r.where:20s} {r.elapsed_s:10.1f} {vs_one:>12s} {vs_dev:>12s}  {split}")


def target_lines(runs: list[RunStats], judged: bool = True) -> list[str]:
    """The harness's speed targets against the runs that answer them. `judged`: the runs are what
    the targets are about (triton on GPUs, no -k); otherwise the numbers are printed with
    no verdict."""
    def verdict(ok: bool) -> str:
        return ("met" if ok else "NOT met") if judged else "not judged: the targets are for triton on GPUs"

    def best(label: str, level: str, several: bool) -> RunStats | None:
        rows = [r for r in runs if r.label == label and r.level == level and r.ok
                and ("," in r.devices) == several]
        return min(rows, key=lambda r: r.elapsed_s) if rows else None

    lines = []
    top = LEVELS[-1]
    cases = next((r.total("cases") for r in runs if r.level == top), None)
    if cases is not None:
        lines.append(f"(targets set at {TARGETS_SET_AT_CASES} cases; all four levels are {cases} now)")
    for level, several, target, what in ((top, False, TARGET_WARM_ALL_S, "one GPU, warm, all four levels"),
                                         ("quick", False, TARGET_WARM_QUICK_S, "one GPU, warm, quick alone"),
                                         (top, True, TARGET_TWO_GPUS_ALL_S, "several GPUs, warm, all four levels")):
        r = best("warm", level, several)
        if r is not None:
            lines.append(f"{what}: {r.elapsed_s:.1f} s ({r.devices}, {r.workers} worker(s) each{', MPS' * r.mps}) "
                         f"-- target < {target:.0f} s: {verdict(r.elapsed_s < target)}")
    served = best("served", "quick", False)
    if served is not None:
        note = "" if served.served_by else " (run.json says NOT served)"
        lines.append(f"one GPU, warm, quick alone, workers pre-started by bundlegen serve: "
                     f"{served.elapsed_s:.1f} s ({served.devices}, {served.workers} worker(s) each"
                     f"{', MPS' * served.mps}){note} "
                     f"-- target < {TARGET_WARM_QUICK_S:.0f} s: "
                     f"{verdict(served.elapsed_s < TARGET_WARM_QUICK_S and bool(served.served_by))}")
    single = [r for r in runs if r.label == "warm" and r.level == top and r.total_workers == 1 and r.ok]
    if single:
        r = single[0]
        lines.append(f"oracle share, one worker, all four levels: {r.oracle_share:.1%} "
                     f"-- target < {TARGET_ORACLE_SHARE:.0%}: {verdict(r.oracle_share < TARGET_ORACLE_SHARE)}")
    cold = next((r for r in runs if r.label == "cold" and r.ok), None)
    if cold is not None:
        which = "all four levels" if cold.level == top else f"--level {cold.level}"
        lines.append(f"one GPU, cold cache, {which}: {cold.elapsed_s:.1f} s ({cold.workers} worker(s); "
                     f"prepare, compiling ahead: {_opt(cold.prepare_s)} s) -- target < "
                     f"{TARGET_COLD_ALL_S:.0f} s: {verdict(cold.elapsed_s < TARGET_COLD_ALL_S and cold.level == top)}")
    for r in runs:
        if not r.ok:
            lines.append(f"WARNING: {r.name} exited {r.exit_code} (see {Path(r.results).parent}/log.txt)")
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
    parser.add_argument("--device", default="cuda", help="the one device of the one-GPU runs")
    parser.add_argument("--devices", default=None, metavar="LIST",
                        help="also run on these devices together (cuda:0,cuda:1), --workers each")
    parser.add_argument("--workers", type=int, default=4, metavar="N",
                        help="worker processes per device for the shared runs (1: one-worker runs only)")
    parser.add_argument("--levels", nargs="+", default=["quick", "full"], choices=LEVELS,
                        help="levels to run warm, each cumulatively (the highest also runs cold)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-cache run")
    parser.add_argument("-k", dest="pattern", default=None, help="passed to bundlegen run -k")
    parser.add_argument("--runs-dir", type=Path, default=REPO_ROOT / "out" / "harness_throughput",
                        help="where each run's results.jsonl and log go (and the Triton cache)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default out/harness_throughput_h200.json on an H200)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per bundlegen run process")
    parser.add_argument("--no-one-worker", action="store_true",
                        help="skip the one-worker reference runs (and so the oracle-share figure)")
    parser.add_argument("--mps-workers", type=int, nargs="+", default=[], metavar="N",
                        help="also run each level warm on --device with N workers as clients of a "
                             "private CUDA MPS server (bundlegen run --mps), for each N given")
    parser.add_argument("--server", action="store_true",
                        help="also time the warm runs through `bundlegen serve` (workers pre-started)")
    return parser.parse_args(argv)


def plan_runs(args, cache_filled: bool = True) -> list[tuple[str, str, list[str], int]]:
    """(label, level, devices, workers per device), in the order they run: the cold run
    first (it fills the cache the warm runs use), on one device with the shared workers;
    with --no-cold and an empty cache an untimed "fill" run takes its place (otherwise the
    first warm run would compile). Then per level the runs the targets are judged on (N
    workers sharing one GPU, several GPUs) before the one-worker reference, so a run cut
    short by a time limit has measured the targets first."""
    levels = sorted(set(args.levels), key=LEVELS.index)
    shared = max(1, args.workers)
    if not args.no_cold:
        plan = [("cold", levels[-1], [args.device], shared)]
    else:
        plan = [] if cache_filled else [("fill", levels[-1], [args.device], shared)]
    for level in levels:
        if shared > 1:
            plan.append(("warm", level, [args.device], shared))
        if args.devices and len(args.devices.split(",")) > 1:
            plan.append(("warm", level, [d.strip() for d in args.devices.split(",")], shared))
        if shared == 1 or not args.no_one_worker:
            plan.append(("warm", level, [args.device], 1))
    return plan


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("harness_throughput: no CUDA device here. This benchmark times the harness on a GPU "
              "(written for an H200); for a smoke test run with --device cpu --engine torch-math "
              "--levels quick -k shapes.", file=sys.stderr)
        return 2
    out = args.out or default_out(args.device)
    cache = args.runs_dir / "triton-cache"
    if cache.exists() and not args.no_cold:   # --no-cold times the cache that is there
        shutil.rmtree(cache)
    # (only a GPU run compiles into it: off a GPU Triton interprets)
    cache_filled = not args.device.startswith("cuda") or (cache.exists() and any(cache.iterdir()))
    cache.mkdir(parents=True, exist_ok=True)

    runs = [run_level(label, level, devices, workers, args, cache)
            for label, level, devices, workers in plan_runs(args, cache_filled)]
    runs += [run_level("warm", level, [args.device], workers, args, cache, mps=True)
             for level in sorted(set(args.levels), key=LEVELS.index) for workers in args.mps_workers]
    runs = [r for r in runs if r.label != "fill"]
    if args.server:
        runs += served_runs(runs, args, cache)
    print()
    print_runs(runs)
    print_phases(runs)
    print_side_by_side(runs)
    print_served(runs)
    print()
    lines = target_lines(runs, judged=args.engine == "triton" and not args.pattern
                         and args.device.startswith("cuda"))
    for line in lines:
        print(line)
    calibrate = next((r for r in runs if r.label == "warm" and r.total_workers == 1
                      and r.level == max(args.levels, key=LEVELS.index)), None)
    if calibrate is not None:
        print(f"\ncalibrate the cost model with:  bundlegen calibrate {Path(calibrate.results).parent} "
              f"--device-class {'h200' if args.device.startswith('cuda') else 'cpu'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"engine": args.engine, "device": args.device, "devices": args.devices,
                               "workers": args.workers,
                               "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
                               "torch": torch.__version__, "runs": [r.to_json() for r in runs],
                               "targets": lines}, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
