"""Where a cold run's compile time goes: how many kernels the levels need, and what each
stage of compiling one costs on this host.

A cold run compiles every distinct kernel its cases launch before the first case
(engines/triton/warm.py: the cases' twins, their launches, and the groups Triton compiles
as one kernel). This counts those kernels for sm90, then compiles sample kernels for sm90
(engines/triton/aot.py: the dQ and dK/dV variants of the table configs with the band on,
dense and ragged, at D 64, 128 and 256 or --dims; no GPU needed) into an empty Triton cache,
each stage of Triton's NVIDIA backend timed. It prints each stage's share and the least time
the compile of a cold run can take here: kernels x seconds per kernel / processes.

    python bench/compile_stages.py [--levels quick pr nightly full] [--jobs N] [--dims D ...]
        [--json PATH]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

SAMPLE_DIMS = (64, 128, 256)
SAMPLE_LABELS = ("dq", "dkdv", "dk", "dv", "dq-ragged", "dkdv-ragged", "dk-ragged")
FRONTEND = "frontend"   # AST to TTIR and everything around the stages (the rest of a compile)


def kernel_counts(levels: list[str], bundles: str) -> dict:
    """Variants, launches and kernels (Triton compiles) of the levels' cases on sm90."""
    from bundlegen.engines.triton import warm
    graphs = warm.level_graphs(levels, bundles)
    keys, wide = warm.twin_keys(graphs, "sm90")
    launches = warm.twin_launches(keys, "sm90")
    groups = warm.compile_groups(list(launches.values()))
    by_kernel = collections.Counter(group[0][0] for group in groups)
    return {"graphs": len(graphs), "variants": len(keys), "wide_graphs": wide,
            "launches": len(launches), "kernels": len(groups), "by_kernel": dict(by_kernel)}


_STAGE_SECONDS: dict[str, float] = {}   # this compile's seconds per backend stage


def time_stages() -> None:
    """Wrap every stage the NVIDIA backend adds, adding its seconds to _STAGE_SECONDS."""
    from triton.backends.nvidia.compiler import CUDABackend
    original = CUDABackend.add_stages

    def add_stages(self, stages, options, *rest):
        original(self, stages, options, *rest)
        for name, stage in list(stages.items()):
            def timed(src, metadata, stage=stage, name=name):
                start = time.perf_counter()
                try:
                    return stage(src, metadata)
                finally:
                    _STAGE_SECONDS[name] = (_STAGE_SECONDS.get(name, 0.0)
                                            + time.perf_counter() - start)
            stages[name] = timed
    CUDABackend.add_stages = add_stages


def launched(label: str, split: bool) -> bool:
    """Whether an MHA launch of a config runs this kernel: the dK/dV kernel, or (split_dkdv)
    its dK and dV passes."""
    base = label.split("-")[0]
    return {"dkdv": not split, "dk": split, "dv": split}.get(base, True)


def sample_compiles(dims=SAMPLE_DIMS) -> list[dict]:
    """Compile the sample kernels for sm90, each stage timed; one row per kernel. A first,
    untimed compile pays for what a process does once (Triton's and the backend's set-up)."""
    from bundlegen.engines.triton import aot, configs
    aot.compile_all("sm90", 16, 16, only=("preprocess",))
    time_stages()
    rows = []
    for d in dims:
        split = configs.config_for("sm90", d, d).split_dkdv
        for label in (lb for lb in SAMPLE_LABELS if launched(lb, split)):
            _STAGE_SECONDS.clear()
            start = time.perf_counter()
            aot.compile_all("sm90", d, d, only=(label,))
            total = time.perf_counter() - start
            times = dict(_STAGE_SECONDS, **{FRONTEND: total - sum(_STAGE_SECONDS.values())})
            rows.append({"d": d, "kernel": label, "seconds": total, "stages": times})
            print(f"  D{d:<3d} {label:12s} {total:5.2f} s  " + "  ".join(
                f"{k} {v:.2f}" for k, v in times.items()), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", nargs="+", default=["quick", "pr", "nightly", "full"])
    parser.add_argument("--bundles", default="bundles")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="compile processes of a cold run (default: the cores less one)")
    parser.add_argument("--dims", type=int, nargs="+", default=list(SAMPLE_DIMS),
                        help="head dims of the sample kernels")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("TRITON_INTERPRET is set: the interpreter compiles nothing to time; "
                     "unset it")
    if not Path(args.bundles, args.levels[0]).is_dir():
        parser.error(f"--bundles {args.bundles}: no {args.levels[0]} level there "
                     "(run `bundlegen generate` first)")
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile-stages-")

    counts = kernel_counts(args.levels, args.bundles)
    print(f"{' '.join(args.levels)} on sm90: {counts['graphs']} graphs, {counts['variants']} "
          f"variants, {counts['launches']} launches, {counts['kernels']} kernels "
          f"({', '.join(f'{k} {n}' for k, n in sorted(counts['by_kernel'].items()))})")
    print(f"compiling the dQ and dK/dV kernels of D {', '.join(map(str, args.dims))} for sm90, "
          "one process, empty cache:", flush=True)
    rows = sample_compiles(args.dims)
    per_kernel = sum(r["seconds"] for r in rows) / len(rows)
    stages: dict[str, float] = collections.defaultdict(float)
    for r in rows:
        for k, v in r["stages"].items():
            stages[k] += v / len(rows)
    print(f"per kernel {per_kernel:.2f} s: " + ", ".join(
        f"{k} {v:.2f} s ({v / per_kernel:.0%})" for k, v in stages.items()))
    floor = counts["kernels"] * per_kernel / args.jobs
    print(f"least compile of a cold run here: {counts['kernels']} kernels x {per_kernel:.2f} s / "
          f"{args.jobs} processes = {floor:.0f} s (these are band kernels, the most code; "
          "processes side by side each run slower than one alone)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"levels": args.levels, "counts": counts, "jobs": args.jobs, "samples": rows,
             "per_kernel_s": per_kernel, "stages_s": stages, "floor_s": floor}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
