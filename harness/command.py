"""`bundlegen run`: a thin layer over bundlegen.harness.run.run_level."""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--level", required=True, help="quick, pr, nightly or full (lower levels included)")
    parser.add_argument("--engine", required=True,
                        help="engine name (torch-math, triton, ...) or package.module:Class")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--out", default=None, help="output directory (default out/<engine>-<level>)")
    parser.add_argument("-k", dest="pattern", default=None, metavar="PATTERN",
                        help="only cases whose id, group, level/group/id or an item contains PATTERN "
                             "or matches it as a glob")
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="run shard I of N (1-based), split by a hash of the case id")
    parser.add_argument("--resume", action="store_true",
                        help="keep OUT/results.jsonl and skip the cases it already records")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="per-case timeout in seconds (default 300 on cuda, 600 on cpu)")
    parser.add_argument("--repeat", type=int, default=None, metavar="N",
                        help="runs per case for the determinism check (default 2 for a deterministic engine)")
    parser.add_argument("--no-isolation", action="store_true",
                        help="run the engine in this process (debugging: no timeout, a crash ends the run)")
    parser.add_argument("--bundles", default=None, metavar="DIR",
                        help="bundle root (default: the workspace's bundles, else the built-in ones)")
    parser.add_argument("--plan", default=None, metavar="NAME",
                        help="the plan to run when the bundle root holds several")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from bundlegen.engines.registry import EngineNotFound
    from bundlegen.harness.bundles import levels_upto
    from bundlegen.harness.config import EngineConfigError
    from bundlegen.harness.results import summary_table
    from bundlegen.harness.run import run_level
    from bundlegen.harness.selection import parse_shard
    from bundlegen.harness.worker import WorkerStartError

    err = Console(stderr=True)
    try:
        levels_upto(args.level, args.bundles, args.plan)
        shard = parse_shard(args.shard)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    try:
        summary = run_level(
            args.level, args.engine, device=args.device, out=args.out, bundles=args.bundles, plan=args.plan,
            pattern=args.pattern, shard=shard, resume=args.resume, timeout_s=args.timeout,
            repeat=args.repeat, isolation=not args.no_isolation,
            progress=not args.quiet and sys.stderr.isatty())
    except (EngineNotFound, EngineConfigError, WorkerStartError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    for line in summary.bundle_errors:
        err.print(f"[red]malformed bundle:[/red] {line}", highlight=False)
    if summary.times is not None and summary.times.prepare_problem:
        err.print(f"[yellow]engine prepare failed (cases built on use instead):[/yellow] "
                  f"{summary.times.prepare_problem}", highlight=False)
    out = Console()
    out.print(summary_table(list(summary.levels), title=f"{args.engine} {args.level}"))
    resumed = f" ({summary.resumed} already recorded)" if summary.resumed else ""
    out.print(f"ran {summary.ran} cases{resumed}; results {summary.results_path}, "
              f"junit {summary.junit_path}", highlight=False, soft_wrap=True)
    if summary.times is not None:
        t = summary.times
        before = f"process start {t.before_s:.1f} + " if t.before_s is not None else ""
        out.print(f"time: {(t.before_s or 0.0) + t.elapsed_s:.1f} s = {before}worker start {t.start_s:.1f} "
                  f"+ prepare {t.prepare_s:.1f} + cases {t.cases_s:.1f} + finish {t.finish_s:.1f}",
                  highlight=False, soft_wrap=True)
    return summary.exit_code
