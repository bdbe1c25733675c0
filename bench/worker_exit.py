"""What stopping a run's workers costs: N workers started as a run starts them (clients of a
private MPS server with --mps), each runs one tiny case, then all are stopped and the MPS
server is told to quit, waiting for the exits or not
(close(wait=False), MpsDaemon.stop(wait=False): the run goes on while they exit). Each
figure is a wall time in the parent, as `bundlegen run` pays it.

    python bench/worker_exit.py --engine triton --device cuda --workers 8 [--mps] [--repeat 2] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def one_round(engine: str, device: str, workers: int, mps: bool, wait: bool) -> dict:
    from bundlegen.harness.workers import worker
    from bundlegen.harness.bundles import manifest_of
    from bundlegen.harness.workers.mps import start_mps
    from bundlegen.harness.executor import CaseExecutor
    from bundlegen.harness.workers.pool import close_all
    from bundlegen.harness.workers.warm_path import warm_cases

    manifest = manifest_of()
    daemon = start_mps([device] * workers) if mps else None
    executors = [CaseExecutor(engine, device, manifest=manifest, wait=False,
                              env=daemon.env if daemon else None) for _ in range(workers)]
    for ex in executors:
        ex.wait_ready()
    for ex in executors:   # every worker has run a tiny case, as at the end of a run
        ex.execute(warm_cases()[0])
    start = time.perf_counter()
    close_all(executors, wait=wait)   # as run_level stops them
    stopped = time.perf_counter()
    if daemon:
        daemon.stop(wait=wait)
    quit_done = time.perf_counter()
    worker.wait_exits()
    exited = time.perf_counter()
    return {"wait": wait, "stop_s": round(stopped - start, 3), "mps_quit_s": round(quit_done - stopped, 3),
            "until_exited_s": round(exited - start, 3), "run_pays_s": round(quit_done - start, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="triton")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--mps", action="store_true")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rounds = []
    for _ in range(args.repeat):
        for wait in (True, False):
            row = one_round(args.engine, args.device, args.workers, args.mps, wait)
            rounds.append(row)
            print(f"{args.workers} workers{' (MPS)' if args.mps else ''}, "
                  f"{'waiting for the exits' if wait else 'not waiting'}: stop {row['stop_s']:.3f} s, "
                  f"MPS quit {row['mps_quit_s']:.3f} s, the run pays {row['run_pays_s']:.3f} s; "
                  f"all exited after {row['until_exited_s']:.3f} s", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"engine": args.engine, "device": args.device, "workers": args.workers,
                       "mps": args.mps, "rounds": rounds}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
