"""The whole resource sweep of the Triton kernels: every variant the launcher can choose
(engines/triton/resources.py enumerates them from launch.py), compiled for sm90, sm120 and
gfx942 without a GPU, measured, checked, and written to engines/triton/resources.json.

    python bench/triton_resources.py                    # every arch (about 20 minutes, 2 jobs)
    python bench/triton_resources.py --arch sm120       # one arch; the others' entries are kept
    python bench/triton_resources.py --no-write         # measure and check only
    python bench/triton_resources.py --missing          # only the variants the report lacks
    python bench/triton_resources.py --missing --only '*/drawn*'   # ... whose labels match

Exit status 1 when any variant fails the check (spill, shared memory / LDS over budget,
occupancy under the arch's floor); the report is written either way, with each variant's
problems in it. Run it without TRITON_INTERPRET (it is removed from the environment here).
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # silences Triton 3.9's notice
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bundlegen.engines.triton import resources as R  # noqa: E402


def _measure(job: tuple) -> tuple:
    arch, name, var = job
    entry = dict(R.measure_alone(arch, var), **var)
    entry["problems"] = R.check(arch, name, entry)
    return arch, name, entry


def sweep(archs: list[str], jobs: int, reported: dict | None = None, only: str = "*") -> dict:
    """Every variant of `archs`, measured; with `reported` (arch -> the report's variants),
    only those it lacks or has compiled from other constexprs or options, the others' entries
    taken from it (and its entries the launcher no longer chooses left out), and of those
    only the ones whose label matches the glob `only` (the rest stay missing)."""
    graphs = R.bundle_graphs()
    work = []
    out: dict = {arch: {} for arch in archs}
    for arch in archs:
        variants = R.sweep_variants(arch, R.launcher_choices(arch, graphs))
        if reported is not None:
            missing = set(R.uncovered(variants, reported.get(arch, {})))
            out[arch] = {n: reported[arch][n] for n in variants if n not in missing}
            variants = {n: v for n, v in variants.items() if n in missing and fnmatch.fnmatch(n, only)}
        work += [(arch, name, var) for name, var in variants.items()]
    print(f"{len(work)} variants for {' '.join(archs)}, {jobs} process(es)", flush=True)
    start = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:   # each variant compiles in a process of its own
        for i, (arch, name, entry) in enumerate(pool.map(_measure, work)):
            out[arch][name] = entry
            if entry["problems"] or (i + 1) % 50 == 0:
                print(f"[{i + 1}/{len(work)} {time.perf_counter() - start:.0f}s] {arch} {name}"
                      f" {entry['problems'] or ''}", flush=True)
    return out


def summary(report: dict) -> str:
    """Per arch and tier: the worst registers / VGPRs, spills, shared memory / LDS, lowest
    occupancy, largest code, and the failing variants."""
    lines = []
    for arch, sec in sorted(report["archs"].items()):
        nv = sec["limits"]["kind"] == "nvidia"
        for tier in sorted({int(n.split("/")[1][1:]) for n in sec["variants"]}):
            rows = {n: e for n, e in sec["variants"].items() if n.split("/")[1] == f"d{tier}"}
            regs = max(rows.items(), key=lambda kv: kv[1]["registers" if nv else "vgpr_count"])
            occ = min(rows.items(), key=lambda kv: kv[1]["occupancy"][
                "warps_per_sm" if nv else "waves_per_simd"])
            smem = max(rows.items(), key=lambda kv: kv[1]["shared_bytes"])
            spills = {n: e["spill_bytes"] for n, e in rows.items() if e["spill_bytes"]}
            lines.append(
                f"{arch:7s} d{tier:<3d} {len(rows):3d} variants  "
                f"{'regs' if nv else 'vgprs'} max {regs[1]['registers' if nv else 'vgpr_count']} "
                f"({regs[0]})  shared max {smem[1]['shared_bytes']} ({smem[0].split('/')[0]})  "
                f"occupancy min {occ[1]['occupancy']['warps_per_sm' if nv else 'waves_per_simd']}"
                f" {'warps/SM' if nv else 'waves/SIMD'} ({occ[0]})  spills {len(spills)}"
                f"{' max ' + str(max(spills.values())) + ' B' if spills else ''}  "
                f"code max {max(e['code_bytes'] for e in rows.values())} B")
            for n, e in rows.items():
                if e["problems"]:
                    lines.append(f"    FAIL {n}: {'; '.join(e['problems'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=list(R.ARCHS), choices=R.ARCHS)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=R.REPORT)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--missing", action="store_true",
                        help="compile only the variants the report lacks (or has from other "
                             "constexprs or options); keep its other entries (same Triton only)")
    parser.add_argument("--only", default="*", metavar="GLOB",
                        help="with --missing: compile only the missing variants whose label "
                             "matches GLOB (run again for the others)")
    parser.add_argument("--recheck", action="store_true",
                        help="compile nothing: re-apply the limits, floors and known spills "
                             "to the report (refused when a config changed)")
    args = parser.parse_args(argv)

    report = {"triton_version": R.triton_version(), "io_dtype": R.IO,
              "generated_by": "python bench/triton_resources.py", "archs": {}}
    if args.out.exists():   # the archs not swept now keep their entries (same Triton only)
        old = R.load_report(args.out)
        if old.get("triton_version") == report["triton_version"]:
            report["archs"].update(old.get("archs", {}))
    if args.recheck:
        for arch in args.arch:
            sec = report["archs"][arch]
            if sec["configs"] != R.json_form(R.arch_header(arch))["configs"]:
                sys.exit(f"{arch}: the configs changed: run the sweep")
            for name, entry in sec["variants"].items():
                entry["problems"] = R.check(arch, name, entry)
            report["archs"][arch] = dict(R.arch_header(arch), variants=sec["variants"])
    else:
        reported = None
        if args.missing:
            reported = {a: sec["variants"] for a, sec in report["archs"].items()}
        measured = sweep(args.arch, args.jobs, reported, args.only)
        for arch in args.arch:
            report["archs"][arch] = dict(R.arch_header(arch), variants=measured[arch])
    report = R.json_form(report)
    print(summary(report))
    if not args.no_write:
        args.out.write_text(R.report_text(report))
        print(f"wrote {args.out}")
    failed = sum(bool(e["problems"]) for sec in report["archs"].values()
                 for e in sec["variants"].values())
    print(f"{failed} variant(s) fail the check")
    return int(failed > 0)


if __name__ == "__main__":
    sys.exit(main())
