"""`bundlegen report RESULTS... --html OUT`: one self-contained HTML file (plots embedded) of
one or more runs, failing cases first."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bundlegen.safe_write import UnsafeWrite
from bundlegen.graph import BundleError
from bundlegen.manifest import load_manifest
from bundlegen.results_file import results_file
from bundlegen.workspace import default_bundle_root
from bundlegen.claims.cases import graph_lines
from bundlegen.claims.harvest import read_run, run_json_of
from bundlegen.claims.report import core_axes, write_report
from bundlegen.harness.verdicts import FAILING


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="results.jsonl files (or run directories holding one)")
    parser.add_argument("--html", type=Path, required=True, metavar="OUT",
                        help="the report file when it ends in .html, else a directory to write "
                             "index.html into (one file, plots embedded)")
    parser.add_argument("--bundles", type=Path, default=None,
                        help="bundle root whose manifest gives the claim margin and core axes "
                             "(default: the workspace's, else the built-in bundles)")
    parser.add_argument("--plan", default=None, metavar="NAME",
                        help="the plan, when the bundle root holds several")


def engine_specs(results: str | Path) -> dict[str, str]:
    """engine name -> the --engine its run was given, from the run.json beside the results
    (`engine`, `engine_spec`); empty without one."""
    try:
        run = json.loads(run_json_of(results).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(run, dict):
        return {}
    name, spec = run.get("engine"), run.get("engine_spec")
    return {name: spec} if isinstance(name, str) and isinstance(spec, str) and name and spec else {}


def main(args: argparse.Namespace) -> int:
    missing = [p for p in args.results if not results_file(p).is_file()]
    if missing:
        print(f"report: no results file at {', '.join(map(str, missing))}")
        return 2
    bundles = args.bundles if args.bundles is not None else default_bundle_root()
    try:
        manifest = load_manifest(bundles, args.plan)
    except BundleError as exc:
        print(f"report: {exc}")
        return 2
    runs = [read_run(p) for p in args.results]
    failing = {r.get("case_id") for run in runs for r in run if r.get("verdict") in FAILING}
    try:
        index = write_report(runs, [str(results_file(p)) for p in args.results], args.html,
                             manifest.min_claim_margin, core_axes(manifest),
                             specs=[engine_specs(p) for p in args.results],
                             graphs=graph_lines(bundles, manifest.plan, {c for c in failing if isinstance(c, str)}))
    except UnsafeWrite as exc:
        print(f"report: {exc}")
        return 2
    print(f"report: wrote {index}")
    return 0
