"""`bundlegen report RESULTS... --html OUT`: an HTML report with plots of one or more runs."""
from __future__ import annotations

import argparse
from pathlib import Path

from bundlegen.claims.harvest import plan_min_margin, read_run, results_file
from bundlegen.claims.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="results.jsonl files (or run directories holding one)")
    parser.add_argument("--html", type=Path, required=True, metavar="OUT",
                        help="directory to write index.html and the PNG plots into")


def main(args: argparse.Namespace) -> int:
    missing = [p for p in args.results if not results_file(p).is_file()]
    if missing:
        print(f"report: no results file at {', '.join(map(str, missing))}")
        return 2
    runs = [read_run(p) for p in args.results]
    index = write_report(runs, [str(results_file(p)) for p in args.results], args.html, plan_min_margin())
    print(f"report: wrote {index}")
    return 0
