"""What a fresh worker's first cases cost beyond the later ones: on an H200 each worker's
first case of a run took 0.34-0.48 s against some 10 ms for the rest (the oracle 0.2-0.3 s,
the checks 0.1-0.15 s), eight times over in a run of eight workers.

In a fresh process, started and built as a worker is (harness/workers/worker.py: the engine built
and warmed up), the level's first --cases cases run in-process in the order a run hands
them out (longest predicted first), each timed by phase; the first one under cProfile,
whose top entries say where its extra time goes (torch's lazily loaded modules, cuBLAS,
Python imports). A GPU worker warms the case path first (harness/workers/warm_path.py), timed here
on its own; --no-warm-path leaves that to the first case, as before.

    python bench/first_case.py --level quick --engine triton --device cuda [--cases 6] [--no-warm-path] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import cProfile, io, json, pstats, sys, time
t0 = time.perf_counter()
from bundlegen.harness.workers import gpu_early
gpu_early.open_in_background(sys.argv[2])
from bundlegen.harness.bundles import load_level
from bundlegen.harness.config import load_engine_config
from bundlegen.harness.results import PHASES
from bundlegen.harness.case import run_case
from bundlegen.harness.executor import longest_first
from bundlegen.harness.workers.worker import WorkerSpec, build_engine
from bundlegen.workspace import default_bundle_root, engine_config_dir
level, engine_name, device, count = sys.argv[1], sys.argv[3], sys.argv[2], int(sys.argv[4])
loaded = load_level(default_bundle_root(), level)
config = load_engine_config(engine_config_dir(engine_name), loaded.manifest)
engine = build_engine(WorkerSpec(engine_name, device, config))
started = time.perf_counter() - t0
from bundlegen.harness.workers import warm_path
t = time.perf_counter()
warming = warm_path.start(device)   # as the worker does; the worker's prepare would run beside it
if warming is not None:
    warming.join()
warm_s = round(time.perf_counter() - t, 3) if warming is not None else None
cases = [c for c in longest_first(loaded.cases, device, loaded.manifest) if c.expected_rejection is None]
rows, profile_text = [], ""
for i, case in enumerate(cases[:count]):
    profiler = cProfile.Profile() if i == 0 else None
    t = time.perf_counter()
    if profiler:
        profiler.enable()
    outcome = run_case(case, engine, config)
    if profiler:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        profile_text = out.getvalue()
    rows.append({"case": case.id, "group": case.group, "verdict": outcome.verdict,
                 "wall_s": round(time.perf_counter() - t, 4),
                 **{k: getattr(outcome, k, None) for k in PHASES}})
print(profile_text, file=sys.stderr)
print(json.dumps({"start_s": round(started, 3), "warm_path_s": warm_s, "cases": rows}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--level", default="quick")
    ap.add_argument("--engine", default="triton")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--no-warm-path", action="store_true",
                    help="without the worker's warm-up of the case path (harness/workers/warm_path.py)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from bundlegen.harness.workers import warm_path
    from bundlegen.harness.results import PHASES

    env = dict(os.environ)
    if args.no_warm_path:
        env[warm_path.SWITCH] = "0"
    done = subprocess.run([sys.executable, "-c", CHILD, args.level, args.device, args.engine,
                           str(args.cases)], capture_output=True, text=True, env=env)
    print(done.stderr[-8000:], file=sys.stderr)
    if done.returncode != 0:
        return 1
    data = json.loads(done.stdout.strip().splitlines()[-1])
    warmed = data["warm_path_s"]
    print(f"worker start in-process {data['start_s']:.2f} s; the case path's warm-up "
          + (f"{warmed:.2f} s" if warmed is not None else "off"))
    for row in data["cases"]:
        phases = ", ".join(f"{k[:-2]} {row[k]:.3f}" for k in PHASES if isinstance(row.get(k), (int, float)))
        print(f"{row['case']} {row['group']:<14} {row['verdict']:<8} {row['wall_s']:.3f} s ({phases})")
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
