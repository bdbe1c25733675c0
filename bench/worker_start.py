"""Where a worker's start goes (what `bundlegen run` waits for before its first case):
each step of harness/workers/worker.py's start timed in a fresh process, in order: interpreter,
the worker module, import torch, the CUDA context, import triton, the engine's modules, building the engine,
its warm-up, the software versions, the harness modules a case needs. Run twice: the
first pays for a cold page cache. --workers N starts N at once (--workers-per-device N):
the steps that slow down side by side are the ones a shared start would save.

    python bench/worker_start.py --engine triton --device cuda [--repeat 2] [--workers 4] [--host-env]
        [--no-early-context] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import gc, json, sys, time
gc.disable()   # as the worker starts (harness/workers/worker.py, worker_main)
t0 = time.perf_counter()
marks = []
def mark(name):
    marks.append((name, time.perf_counter()))
from bundlegen.harness.workers import worker; mark("harness worker module")
device = sys.argv[2]
driver = worker.ask_driver() if device.startswith("cuda") else None   # as the worker does
from bundlegen.harness.workers import gpu_early; gpu_early.open_in_background(device)
import torch; mark("import torch")
if device.startswith("cuda"):
    torch.cuda.init(); torch.empty(1, device=device); mark("cuda context")
try:
    import triton; mark("import triton")
except ImportError:
    pass
from bundlegen.harness.config import EngineConfig
from bundlegen.engines.registry import engine_class
cls = engine_class(sys.argv[1]); mark("engine modules")
engine = cls(device); mark("build engine")
worker.collector_on()
worker.warm_up(engine); mark("warm-up")
worker.software_versions(engine.device, driver); mark("software versions")
from bundlegen.harness import case, materialize, oracle, checks; mark("harness modules")
prev, out = t0, []
for name, t in marks:
    out.append((name, round(t - prev, 3)))
    prev = t
print(json.dumps({"steps": out, "in_process_s": round(prev - t0, 3)}))
"""


def main(argv=None) -> int:
    from bundlegen.harness.workers import pycache

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="triton")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1,
                    help="start this many at once, as --workers-per-device N does: which steps "
                         "slow down when they run side by side")
    ap.add_argument("--host-env", action="store_true",
                    help="start them in this environment as it is, not as a worker's "
                         "(harness/workers/pycache.py: bytecode under a cache prefix where it writes none)")
    ap.add_argument("--no-early-context", action="store_true",
                    help="open the CUDA context after import torch, not beside it "
                         "(harness/workers/gpu_early.py)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from bundlegen.harness.workers import gpu_early

    env = dict(os.environ) if args.host_env else pycache.with_bytecode(os.environ)
    if args.no_early_context:
        env[gpu_early.SWITCH] = "0"
    runs = []
    for i in range(args.repeat):
        start = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, args.engine, args.device],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env)
                 for _ in range(args.workers)]
        workers = []
        for proc in procs:
            stdout, stderr = proc.communicate()
            total = time.perf_counter() - start   # from the first one's launch
            if proc.returncode != 0:
                print(stderr[-2000:], file=sys.stderr)
                return 1
            data = json.loads(stdout.strip().splitlines()[-1])
            data["process_s"] = round(total, 3)
            workers.append(data)
        for w, data in enumerate(workers):
            total = data["process_s"]
            who = f"run {i + 1}" + (f" worker {w + 1}" if args.workers > 1 else "")
            print(f"{who}: process {total:.2f} s (interpreter and exit "
                  f"{total - data['in_process_s']:.2f} s): "
                  + ", ".join(f"{name} {s:.2f}" for name, s in data["steps"]))
        runs.append(workers[0] if args.workers == 1 else {"workers": workers})
    if args.json:
        Path(args.json).write_text(json.dumps({"engine": args.engine, "device": args.device,
                                               "workers": args.workers, "host_env": args.host_env,
                                               "early_context": not args.no_early_context,
                                               "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
