"""Where one worker's case time goes on a GPU: how busy the GPU is while the harness runs
cases, how many kernels, synchronisations and read-backs each case makes, and whether
several threads of one process (each on its own CUDA stream) run cases faster than one.

Cases of a level (a deterministic sample: every Nth case) run in-process through
`harness.case.run_case`, exactly as a worker runs them:
1. once to warm up (Triton compiles, pinned buffers, the allocator's pools);
2. timed: wall per case and the case records' phases (materialize, oracle, engine, checks);
3. under torch.profiler: GPU kernel time against the wall, and per case the kernel
   launches, device synchronisations and device-to-host copies, by the host op that made
   them;
4. the same cases spread over T threads (--threads), each thread on its own stream.

    python bench/case_profile.py --level full --engine triton --device cuda --every 4 \
        --threads 1 2 4 --out out/case_profile.json
    python bench/case_profile.py --level quick --engine torch-math --device cpu --every 8   # smoke
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from bundlegen.harness import verdicts as V  # noqa: E402
from bundlegen.harness.bundles import load_level  # noqa: E402
from bundlegen.harness.config import load_engine_config  # noqa: E402
from bundlegen.harness.case import run_case  # noqa: E402
from bundlegen.harness.workers.worker import WorkerSpec, build_engine, prepare_engine  # noqa: E402
from bundlegen.workspace import default_bundle_root, engine_config_dir  # noqa: E402

PHASES = ("materialize_s", "oracle_s", "engine_s", "check_s")
#: host-side CUDA runtime calls that wait for the device or read it back
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
COPY_CALLS = ("cudaMemcpyAsync", "cudaMemcpy")


def sample_cases(level: str, every: int, limit: int | None):
    loaded = load_level(default_bundle_root(), level)
    cases = [c for c in loaded.cases if c.expected_rejection is None][::every]
    return (cases[:limit] if limit else cases), loaded.manifest


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_all(cases, engine, config) -> tuple[float, list]:
    start = time.perf_counter()
    outcomes = [run_case(c, engine, config) for c in cases]
    synchronize(engine.device)
    return time.perf_counter() - start, outcomes


def phase_sums(outcomes) -> dict[str, float]:
    return {p: round(sum(getattr(o, p) or 0.0 for o in outcomes), 3) for p in PHASES}


def profile(cases, engine, config) -> dict:
    """Kernel time, launches, syncs and copies of the cases, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if engine.device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        wall, _ = run_all(cases, engine, config)
    events = prof.events()
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    gpu_s = sum(e.device_time for e in kernels) / 1e6   # device_time is in microseconds
    runtime = collections.Counter()
    runtime_us = collections.Counter()
    for e in events:
        if e.name.startswith("cuda") or e.name.startswith("cu"):
            runtime[e.name] += 1
            runtime_us[e.name] += e.cpu_time_total
    aten = collections.Counter(e.name for e in events
                               if e.device_type.name == "CPU" and e.name.startswith("aten::"))
    kernel_names = collections.Counter(e.name for e in kernels)
    n = len(cases)
    return {
        "cases": n, "wall_s": round(wall, 3), "gpu_kernel_s": round(gpu_s, 3),
        "gpu_busy_share": round(gpu_s / wall, 3) if wall else None,
        "kernels_per_case": round(len(kernels) / n, 1),
        "syncs_per_case": {k: round(runtime[k] / n, 2) for k in SYNC_CALLS if runtime[k]},
        "copies_per_case": {k: round(runtime[k] / n, 2) for k in COPY_CALLS if runtime[k]},
        "runtime_calls": {k: {"count": runtime[k], "ms": round(runtime_us[k] / 1e3, 1)}
                          for k, _ in runtime.most_common(15)},
        "top_aten_ops_per_case": {k: round(c / n, 2) for k, c in aten.most_common(30)},
        "top_kernels_per_case": {k[:90]: round(c / n, 2) for k, c in kernel_names.most_common(20)},
    }


def threaded(cases, engine, config, threads: int) -> dict:
    """The cases dealt round-robin to `threads` threads of this process, each on a stream."""
    shares = [cases[i::threads] for i in range(threads)]
    errors: list[str] = []
    verdicts = collections.Counter()
    lock = threading.Lock()

    def work(share):
        stream = torch.cuda.Stream(engine.device) if engine.device.type == "cuda" else None
        try:
            with torch.cuda.stream(stream) if stream is not None else _nothing():
                for case in share:
                    outcome = run_case(case, engine, config)
                    with lock:
                        verdicts[outcome.verdict] += 1
            if stream is not None:
                stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - an experiment: record, do not stop
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

    start = time.perf_counter()
    workers = [threading.Thread(target=work, args=(s,)) for s in shares]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    synchronize(engine.device)
    wall = time.perf_counter() - start
    return {"threads": threads, "wall_s": round(wall, 3),
            "ms_per_case": round(1e3 * wall / len(cases), 2),
            "verdicts": dict(verdicts), "errors": errors[:5]}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="full")
    parser.add_argument("--engine", default="triton")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--every", type=int, default=4, help="take every Nth executed case")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    cases, manifest = sample_cases(args.level, args.every, args.limit)
    if not cases:
        print(f"no executed cases at level {args.level}", file=sys.stderr)
        return 5
    config = load_engine_config(engine_config_dir(args.engine), manifest)
    engine = build_engine(WorkerSpec(args.engine, args.device, config))
    problem = prepare_engine(engine, [c.graph for c in cases])
    if problem:
        print(f"prepare: {problem.splitlines()[-1]}", file=sys.stderr)
    report: dict = {"level": args.level, "engine": args.engine, "device": args.device,
                    "gpu": torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else None,
                    "torch": torch.__version__, "cases": len(cases), "every": args.every}

    warm_s, outcomes = run_all(cases, engine, config)
    report["warm_up_s"] = round(warm_s, 3)
    report["verdicts"] = dict(collections.Counter(o.verdict for o in outcomes))
    executed = [o for o in outcomes if o.engine_s is not None]
    wall, outcomes = run_all(cases, engine, config)
    report["timed"] = {"wall_s": round(wall, 3), "ms_per_case": round(1e3 * wall / len(cases), 2),
                       "phases_s": phase_sums(outcomes),
                       "median_case_ms": round(1e3 * statistics.median(
                           sum(getattr(o, p) or 0.0 for p in PHASES) for o in outcomes), 2)}
    print(f"{len(cases)} cases ({len(executed)} executed): warm-up {warm_s:.2f} s, "
          f"timed {wall:.2f} s ({report['timed']['ms_per_case']} ms/case), "
          f"phases {report['timed']['phases_s']}", flush=True)
    if not args.no_profile:
        report["profile"] = profile(cases, engine, config)
        p = report["profile"]
        print(f"profiled: wall {p['wall_s']} s, GPU kernels {p['gpu_kernel_s']} s "
              f"(busy {p['gpu_busy_share']}), {p['kernels_per_case']} kernels/case, "
              f"syncs/case {p['syncs_per_case']}, copies/case {p['copies_per_case']}", flush=True)
    report["threads"] = []
    for t in args.threads:
        r = threaded(cases, engine, config, t)
        report["threads"].append(r)
        print(f"{t} thread(s): {r['wall_s']} s, {r['ms_per_case']} ms/case, {r['verdicts']}"
              + (f", errors {r['errors']}" if r["errors"] else ""), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    failing = sum(n for v, n in report["verdicts"].items() if v not in (V.PASS, V.SKIPPED, V.DECLINED))
    return 1 if failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
