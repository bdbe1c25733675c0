"""Where a worker's start goes (what `bundlegen run` waits for before its first case):
each step of harness/worker.py's start timed in a fresh process, in order: interpreter,
import torch, the CUDA context, import triton, the engine's modules, building the engine,
its warm-up, the software versions, the harness modules a case needs. Run twice: the
first pays for a cold page cache.

    python bench/worker_start.py --engine triton --device cuda [--repeat 2] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import gc, json, sys, time
gc.disable()   # as the worker starts (harness/worker.py, _worker_main)
t0 = time.perf_counter()
marks = []
def mark(name):
    marks.append((name, time.perf_counter()))
import torch; mark("import torch")
device = sys.argv[2]
if device.startswith("cuda"):
    torch.cuda.init(); torch.empty(1, device=device); mark("cuda context")
try:
    import triton; mark("import triton")
except ImportError:
    pass
from bundlegen.harness import worker
from bundlegen.harness.config import EngineConfig
from bundlegen.engines.registry import engine_class
cls = engine_class(sys.argv[1]); mark("engine modules")
engine = cls(device); mark("build engine")
worker._collector_on()
worker.warm_up(engine); mark("warm-up")
worker.software_versions(engine.device); mark("software versions")
from bundlegen.harness import run, materialize, oracle, checks; mark("harness modules")
prev, out = t0, []
for name, t in marks:
    out.append((name, round(t - prev, 3)))
    prev = t
print(json.dumps({"steps": out, "in_process_s": round(prev - t0, 3)}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="triton")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    runs = []
    for i in range(args.repeat):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, args.engine, args.device],
                             capture_output=True, text=True)
        total = time.perf_counter() - start
        if out.returncode != 0:
            print(out.stderr[-2000:], file=sys.stderr)
            return 1
        data = json.loads(out.stdout.strip().splitlines()[-1])
        data["process_s"] = round(total, 3)
        runs.append(data)
        print(f"run {i + 1}: process {total:.2f} s (interpreter and exit "
              f"{total - data['in_process_s']:.2f} s): "
              + ", ".join(f"{name} {s:.2f}" for name, s in data["steps"]))
    if args.json:
        Path(args.json).write_text(json.dumps({"engine": args.engine, "device": args.device,
                                               "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
