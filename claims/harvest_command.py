"""`bundlegen harvest RESULTS... [--min-runs N] [--min-orders N] [--keep-unbacked]`: passing
results -> claims.json in each engine's config folder of the current workspace (dropping, by
default, the claims of the covered engine/archs that these runs no longer back); cases whose
verdict differs between the runs are listed as order-dependent, one line each. Results under
the run's default output folder (out/) are refused: copy them to evidence first."""
from __future__ import annotations

import argparse
from pathlib import Path

from bundlegen.graph import BundleError
from bundlegen.manifest import load_manifest
from bundlegen.results_file import results_file
from bundlegen.workspace import WorkspaceError, default_bundle_root, find_workspace, require_workspace
from bundlegen.claims.harvest import (DEFAULT_MIN_ORDERS, DEFAULT_MIN_RUNS, HarvestRules, harvest, order_dependent,
                                      read_run, run_json_of, run_order, run_source)
from bundlegen.claims.evidence_path import transient_problem
from bundlegen.claims.provenance import digest_mismatch
from bundlegen.safe_write import UnsafeWrite
from bundlegen.claims.store import ClaimsError, claims_path, read_claim_set, write_claim_set


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="*", metavar="RESULTS",
                        help="results files (.jsonl, .jsonl.gz, or run directories), one per run, oldest "
                             "first; claims.json cites each (path, sha256, its run.json's level and versions)")
    parser.add_argument("--min-runs", type=int, default=DEFAULT_MIN_RUNS,
                        help=f"runs a case must pass in to be claimed (default {DEFAULT_MIN_RUNS})")
    parser.add_argument("--min-orders", type=int, default=None,
                        help="different case orders a case must pass in (default "
                             f"{DEFAULT_MIN_ORDERS}, or --min-runs when that is less: shuffle the runs, "
                             "`bundlegen run --shuffle`); a run whose run.json records no order ran in "
                             "the natural order. 1 harvests runs made before run.json recorded the order")
    parser.add_argument("--min-margin", type=float, default=None,
                        help="least margin in every run (default: the bundle manifest's min_claim_margin)")
    parser.add_argument("--plan", default=None, metavar="NAME",
                        help="whose manifest gives the margin, when the bundle root holds several plans")
    parser.add_argument("--keep-unbacked", dest="prune", action="store_false", default=True,
                        help="keep the claims of the covered engine/archs these runs no longer back "
                             "(default: drop them; `matrix --check` fails on claims their evidence does not back)")
    parser.add_argument("--prune", action="store_true", help="drop what these runs do not back (the default)")
    parser.add_argument("--claims-root", type=Path, default=None,
                        help="directory holding <engine dir>/claims.json (default: the workspace's "
                             "engine config folders)")
    parser.add_argument("--dry-run", action="store_true", help="report, write nothing")
    parser.add_argument("--from-gtest", nargs="+", type=Path, default=(), metavar="RESULTS.xml",
                        help="GTest junit of a hipDNN lane run on `bundlegen export hipdnn`'s bundles: each is "
                             "converted beside it (<name>.bundlegen/) and harvested as a run (needs --engine, --arch)")
    parser.add_argument("--engine", default=None, metavar="NAME", help="with --from-gtest: the hipDNN engine it ran")
    parser.add_argument("--arch", default=None, metavar="ARCH", help="with --from-gtest: the device's base arch (gfx942)")


def main(args: argparse.Namespace) -> int:
    if getattr(args, "from_gtest", ()):      # callers that build the Namespace by hand leave it out
        converted = _from_gtest(args)
        if converted is None:
            return 2
        args.results = [*args.results, *converted]
    if not args.results:
        print("harvest: give results files, or --from-gtest RESULTS.xml")
        return 2
    missing = [p for p in args.results if not results_file(p).is_file()]
    if missing:
        print(f"harvest: no results file at {', '.join(map(str, missing))}")
        return 2
    here = find_workspace()
    transient = [line for p in args.results for root in dict.fromkeys([Path.cwd(), *([here.root] if here else [])])
                 if (line := transient_problem(p, root))]
    if transient:
        print(f"harvest: {transient[0]}")
        return 2
    min_orders = min(DEFAULT_MIN_ORDERS, args.min_runs) if args.min_orders is None else args.min_orders
    if args.min_runs < 1 or min_orders < 1:
        print("harvest: --min-runs and --min-orders must be at least 1")
        return 2
    try:
        workspace = None if args.claims_root is not None else require_workspace("harvest")
        min_margin = (load_manifest(default_bundle_root(), args.plan).min_claim_margin
                      if args.min_margin is None else args.min_margin)
    except (WorkspaceError, BundleError) as exc:
        print(f"harvest: {exc}")
        return 2
    mismatches = [m for p in args.results
                  if (m := digest_mismatch(p, run_json_of(p), default_bundle_root(), args.plan))]
    if mismatches:
        for line in mismatches:
            print(f"harvest: {line}")
        return 2
    rules = HarvestRules(min_runs=args.min_runs, min_margin=min_margin, min_orders=min_orders)
    runs = [read_run(p) for p in args.results]
    orders = [run_order(p) for p in args.results]
    engines = sorted({r.get("engine") for run in runs for r in run if isinstance(r.get("engine"), str)})
    storable = [e for e in engines if ":" not in e]
    for engine in sorted(set(engines) - set(storable)):
        print(f"harvest: {engine}: not a registered engine name, its claims are not stored")
    try:
        paths = {e: claims_path(e, args.claims_root, workspace) for e in storable}
        existing = {e: read_claim_set(paths[e], e) for e in storable}
    except (ClaimsError, WorkspaceError) as exc:
        print(f"harvest: {exc}")
        return 2
    root = workspace.root if workspace is not None else Path.cwd()
    sources = [run_source(p, root) for p in args.results]
    updated, changes = harvest(runs, existing, rules, prune=args.prune, sources=sources, orders=orders)
    print(f"harvest: {len(runs)} run(s) in {len(set(orders))} case order(s), min runs {rules.min_runs}, "
          f"min orders {rules.min_orders}, min margin {rules.min_margin:g}{', pruning' if args.prune else ''}")
    for c in changes:
        if c.engine in storable:
            print(f"  {c.engine:16s} {c.arch:8s} claims {c.total:5d} (+{c.added} -{c.dropped}), "
                  f"declines {c.declines}, accepted but unclaimed {c.unclaimed}")
    for dependence in order_dependent(runs, orders):
        print(f"  {dependence.line()}")
    if args.dry_run:
        return 0
    inside = workspace.root if workspace is not None else args.claims_root
    for engine in storable:
        path = paths[engine]
        try:
            if write_claim_set(path, updated[engine], inside=inside):
                print(f"  wrote {path}")
        except UnsafeWrite as exc:
            print(f"harvest: {exc}")
            return 2
    return 0


def _from_gtest(args: argparse.Namespace) -> list[Path] | None:
    """The converted run folders of --from-gtest's junits; None after one error line."""
    from bundlegen.claims.hipdnn_export import ExportError
    from bundlegen.claims.hipdnn_gtest import convert_junits

    if args.engine is None or args.arch is None:
        print("harvest: --from-gtest needs --engine NAME (the hipDNN engine) and --arch ARCH")
        return None
    try:
        return convert_junits(list(args.from_gtest), args.engine, args.arch, default_bundle_root(), args.plan)
    except (ExportError, BundleError, ValueError) as exc:
        print(f"harvest: {exc}")
        return None
