"""All four levels' prepare from an empty Triton cache: the Triton engine's own prepare
(TritonEngine.prepare over the graphs `bundlegen run` hands it: engines/triton/warm.py
compiles every kernel the levels need, in parallel processes), timed, with the loading of
the cases apart. Target: under 60 s on one H100 / H200 for the four levels.

    python bench/cold_start.py --out out/cold_start.json            # a fresh cache of its own
    python bench/cold_start.py --dry-run                             # the cases and graphs only

The cache is a new temporary folder unless --cache-dir names an empty one (a folder with
files in it is refused: that run would not be cold); TRITON_CACHE_DIR is set to it before
Triton is imported. On the CPU the engine runs the interpreter and its prepare compiles
nothing (the figure is then the load alone).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

TARGET_S = 60.0
LEVEL = "full"   # load_level gives a level with the levels below it: all four


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cache-dir", type=Path, default=None, help="an empty folder (default: a new one)")
    parser.add_argument("--out", type=Path, default=None, help="JSON of the measurement")
    parser.add_argument("--dry-run", action="store_true", help="load the cases and count the graphs only")
    args = parser.parse_args(argv)
    if args.cache_dir is not None and args.cache_dir.exists() and any(args.cache_dir.iterdir()):
        parser.error(f"--cache-dir {args.cache_dir}: not empty (the prepare would not start cold)")
    return args


def write(out: Path | None, record: dict) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        cache = args.cache_dir or Path(tempfile.gettempdir()) / "(a new folder)"
    else:
        cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="bundlegen-cold-triton-"))
        cache.mkdir(parents=True, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = str(cache)   # before anything imports Triton
    started = time.perf_counter()
    from bundlegen.engines.triton.engine import TritonEngine
    from bundlegen.engines.triton.warm import default_jobs
    from bundlegen.harness.bundles import load_level
    from bundlegen.harness.executor import prepared_graphs
    cases = load_level(REPO_ROOT / "bundles", LEVEL).cases
    graphs = prepared_graphs(cases)
    load_s = time.perf_counter() - started
    record = {"levels": "quick pr nightly full", "cases": len(cases), "graphs": len(graphs),
              "load_s": round(load_s, 2), "device": args.device, "jobs": default_jobs(),
              "cpu_count": os.cpu_count(), "target_s": TARGET_S, "cache_dir": str(cache)}
    print(f"cold start: {len(cases)} cases, {len(graphs)} graphs to prepare, loaded in {load_s:.1f} s; "
          f"cache {cache}", flush=True)
    if args.dry_run:
        return 0
    write(args.out, record)   # the load, should the prepare not finish
    engine = TritonEngine(args.device)
    made = time.perf_counter()
    try:
        engine.prepare(graphs)
    except Exception as exc:  # noqa: BLE001 - recorded with its seconds, then the exit says it
        record.update(error=f"{type(exc).__name__}: {str(exc)[:500]}", prepare_s=round(time.perf_counter() - made, 2))
        write(args.out, record)
        print(f"cold start: the prepare failed after {record['prepare_s']:.1f} s: {record['error']}", file=sys.stderr)
        return 1
    record["prepare_s"] = round(time.perf_counter() - made, 2)
    record["engine_s"] = round(made - started - load_s, 2)
    record["total_s"] = round(time.perf_counter() - started, 2)
    # the interpreter compiles nothing: no verdict on the target there
    record["met"] = record["total_s"] < TARGET_S if engine.device.type == "cuda" else None
    write(args.out, record)
    verdict = {True: "met", False: "NOT met", None: "not measured: nothing compiles off the GPU"}[record["met"]]
    print(f"cold start: prepare {record['prepare_s']:.1f} s with {record['jobs']} processes, all four levels "
          f"ready in {record['total_s']:.1f} s (target {TARGET_S:g} s: {verdict})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
