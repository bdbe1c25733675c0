"""How long generating the whole plan takes: import, build, and writing every bundle and
TOML block into a scratch copy of the tree. Each run is a fresh process, so imports
count. Printed, not asserted (target: under 2 s on the 2-core CI machine).

    python bench/generator_speed.py [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def once() -> dict:
    t0 = time.perf_counter()
    c0 = time.process_time()
    from bundlegen.generator import build, write
    t1 = time.perf_counter()
    generated = build()
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        engines = REPO_ROOT / "engines"
        for directory in generated.plan.engine_toml_dirs.values():
            src = engines / directory / "engine.toml"
            if src.exists():
                (root / "engines" / directory).mkdir(parents=True)
                shutil.copy(src, root / "engines" / directory / "engine.toml")
        write.write(generated, root)
    t3 = time.perf_counter()
    return {"import_s": t1 - t0, "build_s": t2 - t1, "write_s": t3 - t2, "total_s": t3 - t0,
            "cpu_s": time.process_time() - c0, "cases": len(generated.cases)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.once:
        print(json.dumps(once()))
        return 0
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, __file__, "--once"], capture_output=True, text=True,
                             check=True, cwd=REPO_ROOT, env=env)
        runs.append(json.loads(out.stdout))
    for key in ("import_s", "build_s", "write_s", "total_s", "cpu_s"):
        values = [r[key] for r in runs]
        print(f"{key:9s} median {statistics.median(values):.3f}  min {min(values):.3f}  max {max(values):.3f}")
    print(f"{runs[0]['cases']} cases, {args.runs} runs, {os.cpu_count()} cpus, "
          f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
