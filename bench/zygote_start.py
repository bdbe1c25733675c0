"""Workers started plainly every time (BUNDLEGEN_ZYGOTE=0: each start its own `python -m
bundlegen.harness.workers.worker`, importing torch) against the default (zygote: the first start
plain, restarts forked from the zygote, harness.workers.zygote, which has imported torch once), side
by side in turns: how long until the first worker is ready, until all are, and how long a
worker's restart after a crash takes (what a run waits for after a fault; under MPS a fault
restarts every worker of the GPU).

Each round starts --workers IsolatedRunners at once in a fresh process per mode (as
`bundlegen run --workers-per-device N` does), records when each is ready, then kills one
worker (SIGKILL) and times its restart, three times in a row (the first right after the
start, while the zygote, started once a worker is ready, may still be importing torch).

    python bench/zygote_start.py --engine triton --device cuda --workers 8 --rounds 3 [--mps]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, signal, sys, threading, time
t0 = time.perf_counter()
from bundlegen.harness.config import EngineConfig
from bundlegen.harness.workers.worker import IsolatedRunner, WorkerSpec
engine, device, workers, mps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
daemon = None
if mps:
    from bundlegen.harness.workers.mps import start_mps
    daemon = start_mps([device] * workers)
spec = WorkerSpec(engine, device, EngineConfig(), env=tuple(sorted(daemon.env.items())) if daemon else ())
runners = [IsolatedRunner(spec, wait=False) for _ in range(workers)]
ready = [None] * workers
def wait(i):
    runners[i].wait_ready()
    ready[i] = time.perf_counter() - t0
threads = [threading.Thread(target=wait, args=(i,)) for i in range(workers)]
for t in threads: t.start()
for t in threads: t.join()
restarts = []
for _ in range(3):   # at once after the start, then twice more
    os.kill(runners[0].pid, signal.SIGKILL)
    runners[0]._proc.wait(10)
    t1 = time.perf_counter()
    runners[0]._restart()
    restarts.append(time.perf_counter() - t1)
for r in runners: r.close()
if daemon: daemon.stop()
print(json.dumps({"ready_s": ready, "restart_s": restarts}))
"""

MODES = {"plain": "0", "zygote": "1"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="triton")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mps", action="store_true", help="the workers as clients of an MPS server")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = {mode: [] for mode in MODES}
    for i in range(args.rounds):
        for mode, flag in MODES.items():
            env = dict(os.environ, BUNDLEGEN_ZYGOTE=flag)
            proc = subprocess.run([sys.executable, "-c", CHILD, args.engine, args.device,
                                   str(args.workers), "1" if args.mps else "0"],
                                  capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                print(f"{mode}: exit {proc.returncode}\n{proc.stderr[-3000:]}", file=sys.stderr)
                return 1
            data = json.loads(proc.stdout.strip().splitlines()[-1])
            rows[mode].append(data)
            print(f"round {i + 1} {mode:6s}: first ready {min(data['ready_s']):5.2f} s, all ready "
                  f"{max(data['ready_s']):5.2f} s, restarts after a kill "
                  + " ".join(f"{x:5.2f}" for x in data["restart_s"]) + " s",
                  flush=True)
    med = {m: {k: statistics.median(f(r) for r in rs) for k, f in
               (("first", lambda r: min(r["ready_s"])), ("all", lambda r: max(r["ready_s"])),
                ("restart1", lambda r: r["restart_s"][0]),
                ("restart3", lambda r: r["restart_s"][-1]))} for m, rs in rows.items()}
    print(f"{args.workers} worker(s) of {args.engine} on {args.device}{' under MPS' if args.mps else ''}, "
          f"median of {args.rounds} rounds:")
    for key, what in (("first", "first ready"), ("all", "all ready"), ("restart1", "1st restart"),
                      ("restart3", "3rd restart")):
        print(f"  {what:12s} plain {med['plain'][key]:5.2f} s  zygote {med['zygote'][key]:5.2f} s  "
              f"speed-up {med['plain'][key] / med['zygote'][key]:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(engine=args.engine, device=args.device,
                                                   workers=args.workers, mps=args.mps, rounds=rows,
                                                   median=med), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
