"""`bundlegen shrink CASE_ID --engine E [--into MODULE]`: shrink a failing case to a minimal
graph with the same verdict class and print it, its case id and a `Regression(...)` for the
plan; with --into, write that Regression into the workspace plan module MODULE's
REGRESSIONS (generator/plan_edit.py), ready for `bundlegen generate`.

The loop (generator/shrink.py) needs the plan; judging a candidate needs an engine run.
This module is where the two meet: generator may import the harness's in-process runner
(bundlegen.harness.repro) and its verdict names, nothing else of the harness
(tests/test_import_directions.py says why)."""
from __future__ import annotations

import argparse
import shlex
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bundlegen.harness.repro import add_case_arguments

    add_case_arguments(parser)      # claims in --engine-config are ignored while shrinking
    parser.add_argument("--plan", default=None, metavar="MODULE",
                        help="the plan module (default: the workspace's only plan, else the built-in one)")
    parser.add_argument("--item", default=None, metavar="ID",
                        help="item id of the printed Regression (default REG-SHRUNK-<CASE_ID>)")
    parser.add_argument("--max-runs", type=int, default=500, metavar="N",
                        help="stop after N engine runs (default 500)")
    parser.add_argument("--into", default=None, metavar="MODULE",
                        help="write the Regression into the REGRESSIONS tuple of workspace plan module MODULE "
                             "(its file must lie in the workspace); then run `bundlegen generate`")


def main(args: argparse.Namespace) -> int:
    from bundlegen.describe import graph_line
    from bundlegen.graph import BundleError
    from bundlegen.workspace import WorkspaceError, find_workspace
    from bundlegen.generator import shrink as S
    from bundlegen.generator.calibrate_command import choose_plan, writable_plan_file
    from bundlegen.generator.checks import declared_items
    from bundlegen.generator.command import effective_plan, plan_module
    from bundlegen.generator.plan_edit import write_regression
    from bundlegen.generator.declaration import regression_text, spec_text
    from bundlegen.generator.errors import PlanError
    from bundlegen.generator.spec_recover import SpecNotFound, spec_of_graph
    import bundlegen.harness.verdicts as V
    from bundlegen.harness.repro import CaseNotFound, RunnerError, find_case, open_runner

    def usage(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return V.EXIT_USAGE

    try:
        workspace = find_workspace()
        module = plan_module(args.into or choose_plan(args.plan, workspace), workspace)
        plan = effective_plan(module)
        target = writable_plan_file(module, "shrink --into") if args.into else None
        stored = case_plan(module, args.bundles)
        case = find_case(args.case_id, args.bundles, stored)
        if case.expected_rejection is not None:
            return usage(f"case {case.id}: a probe is never run, so there is nothing to shrink")
        item = args.item or f"REG-SHRUNK-{case.id.upper()}"
        if target is not None and item in declared_items(plan):
            raise PlanError(f"{args.into}: already declares item {item}; name another with --item")
        start = spec_of_graph(plan, case.graph, case.data.distribution, case.id,
                              bias_values=case.data.bias_values)
        runner = open_runner(args.engine, args.device, engine_config=args.engine_config,
                             bundles=args.bundles, plan=stored, claims=False)
    except (CaseNotFound, BundleError, PlanError, SpecNotFound, RunnerError, WorkspaceError) as exc:
        return usage(str(exc))
    verdict = runner.verdict(case).verdict
    if not V.is_failing(verdict) or verdict in (V.ERROR_BUNDLE, V.CLAIM_BROKEN):
        return usage(f"case {case.id}: {verdict} on {args.engine}, nothing to shrink")
    print(f"shrinking case {case.id} ({case.level}/{case.group}) on {args.engine}, {args.device}: {verdict}")
    print(f"start:   {graph_line(case.graph)}")
    print(f"as:      {spec_text(start, helper=hasattr(module, '_shape'))}")

    def show(step: S.Step) -> None:
        print(f"  {step.move:<36s} {step.verdict}  (engine runs: {step.runs + 1})", flush=True)

    try:
        result = S.shrink(plan, start, verdict, lambda c: runner.verdict(c).verdict, item=item,
                          level=case.level, on_step=show, max_runs=args.max_runs)
    except S.NotReproduced as exc:
        print(f"case {case.id}: {exc}", file=sys.stderr)
        return V.EXIT_FAILED
    runs = result.runs + 1       # the original case's run
    stop = "run limit reached" if result.runs >= args.max_runs else "fixpoint"
    print(f"{stop}: {len(result.steps)} steps accepted, {runs} engine runs")
    print(f"minimal: {graph_line(result.graph)}")
    print(f"case id: {result.case.id} (seed {result.case.data.seed}, tolerance class "
          f"{result.case.tolerance_class}; generated as a regression)")
    source = " ".join(shlex.quote(w) for w in ("bundlegen", "shrink", case.id, "--engine", args.engine))
    defect = f"{verdict} on {args.engine}, shrunk from case {case.id}"
    declaration = regression_text(item, defect, source, result.minimal, helper=hasattr(module, "_shape"))
    print(f"declaration for {module.__name__} REGRESSIONS:")
    print(declaration)
    if target is not None:
        try:
            write_regression(module.__name__, target, declaration, item,
                             lambda m: plan_module(m.__name__, workspace))
        except PlanError as exc:
            print(f"shrink --into: {exc}", file=sys.stderr)
            return V.EXIT_USAGE
        print(f"wrote {item} into {target}; run `bundlegen generate`, and the next run holds case {result.case.id}")
    return V.EXIT_OK


def case_plan(module, bundles) -> str:
    """The plan whose bundles hold the case to shrink: the module's own, or, for an extension
    whose workspace has not generated its bundles yet, the plan it extends."""
    from bundlegen.manifest import plans_in
    from bundlegen.workspace import default_bundle_root
    from bundlegen.generator import extend

    name = module.PLAN.name
    if extend.is_extension(module.PLAN) and name not in plans_in(bundles or default_bundle_root()):
        return extend.base_plan(module.PLAN).name
    return name
