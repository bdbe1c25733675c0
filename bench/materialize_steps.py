"""Where `materialize` spends its time, per step, on chosen cases: the slowest cases of a
results file (by materialize_s) and a sample of the rest, each materialized once to warm
up and then timed. Steps are the module's own functions, wrapped with a device
synchronisation so that asynchronous work is billed to the step that queued it (which
slows the whole a little: the totals without --steps are the honest ones).

    python bench/materialize_steps.py RESULTS.jsonl.gz --device cuda --slowest 30 --every 25
    python bench/materialize_steps.py RESULTS.jsonl.gz --module OLD_MATERIALIZE.py ...
                                                       # another materialize, side by side

`--module` loads a materialize.py from a file (an older version, say) in its place.
Prints the per-step sums and the slowest cases; --json writes them.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import importlib.util
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
STEPS = ("draw_inputs", "_write_input", "_first_storage", "_copy_to", "write_view", "canary_storage",
         "_input_storage", "_ragged_rows")


def load_module(path: str | None):
    from bundlegen.harness import materialize
    if path is None:
        return materialize
    spec = importlib.util.spec_from_file_location("materialize_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def pick_cases(results: str, slowest: int, every: int):
    from bundlegen.harness import bundles as B

    opener = gzip.open if results.endswith(".gz") else open
    with opener(results, "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    rows = [r for r in rows if r.get("materialize_s") is not None]
    rows.sort(key=lambda r: -r["materialize_s"])
    ids = [r["case_id"] for r in rows[:slowest]] + [r["case_id"] for r in rows[slowest::every]]
    root = B.default_bundle_root()
    by_id = {c.id: c for c in B.load_level(root, "full", B.manifest_of(root, None).plan).cases}
    recorded = {r["case_id"]: r["materialize_s"] for r in rows}
    return [by_id[i] for i in ids if i in by_id], recorded


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--slowest", type=int, default=30)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--module", default=None)
    ap.add_argument("--steps", action="store_true", help="time each step (synchronising after it)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    M = load_module(args.module)
    device = torch.device(args.device)
    sums: dict[str, float] = collections.defaultdict(float)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if args.steps:
        for name in STEPS:
            fn = getattr(M, name, None)
            if fn is None:
                continue

            def timed(*a, _fn=fn, _name=name, **kw):
                sync()
                t = time.perf_counter()
                try:
                    return _fn(*a, **kw)
                finally:
                    sync()
                    sums[_name] += time.perf_counter() - t
            setattr(M, name, timed)
    cases, recorded = pick_cases(args.results, args.slowest, args.every)
    per_case = []
    for case in cases:
        M.materialize(case, device)   # warm-up (allocator, kernels, pools)
    sums.clear()
    total = oracle = 0.0
    for case in cases:
        sync()
        t = time.perf_counter()
        m = M.materialize(case, device)
        sync()
        wall = time.perf_counter() - t
        del m
        total += wall
        oracle += 0.0
        per_case.append((case.id, case.group, wall, recorded.get(case.id)))
    steps = {k: round(v, 4) for k, v in sorted(sums.items(), key=lambda kv: -kv[1])}
    print(f"{args.module or 'harness/materialize.py'} on {device}: {len(cases)} cases, "
          f"materialize (oracle included) {total:.3f} s")
    if steps:
        print("steps (s): " + ", ".join(f"{k} {v:.3f}" for k, v in steps.items()))
    print(f"{'case':14s} {'group':18s} {'now s':>8s} {'recorded s':>11s}")
    for cid, group, wall, rec in sorted(per_case, key=lambda r: -r[2])[:15]:
        print(f"{cid:14s} {group:18s} {wall:8.4f} {rec if rec is None else round(rec, 4)!s:>11s}")
    if args.json:
        Path(args.json).write_text(json.dumps({"module": args.module, "device": str(device),
                                               "total_s": total, "steps": steps,
                                               "cases": per_case}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
