"""`bundlegen shrink CASE_ID --engine E`: shrink a failing case to a minimal graph with the
same verdict class and print it, its case id and a `Regression(...)` for the plan.

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


def main(args: argparse.Namespace) -> int:
    from bundlegen.describe import graph_line
    from bundlegen.graph import BundleError
    from bundlegen.workspace import find_workspace
    from bundlegen.generator import shrink as S
    from bundlegen.generator.calibrate_command import choose_plan
    from bundlegen.generator.command import plan_module
    from bundlegen.generator.declaration import regression_text, spec_text
    from bundlegen.generator.errors import PlanError
    from bundlegen.generator.spec_recover import SpecNotFound, spec_of_graph
    import bundlegen.harness.verdicts as V
    from bundlegen.harness.repro import CaseNotFound, RunnerError, find_case, open_runner

    def usage(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return V.EXIT_USAGE

    try:
        module = plan_module(choose_plan(args.plan, find_workspace()), find_workspace())
        plan = module.PLAN
        case = find_case(args.case_id, args.bundles, plan.name)
        if case.expected_rejection is not None:
            return usage(f"case {case.id}: a probe is never run, so there is nothing to shrink")
        start = spec_of_graph(plan, case.graph, case.data.distribution, case.id,
                              bias_values=case.data.bias_values)
        runner = open_runner(args.engine, args.device, engine_config=args.engine_config,
                             bundles=args.bundles, plan=plan.name, claims=False)
    except (CaseNotFound, BundleError, PlanError, SpecNotFound, RunnerError) as exc:
        return usage(str(exc))
    verdict = runner.verdict(case).verdict
    if not V.is_failing(verdict) or verdict in (V.ERROR_BUNDLE, V.CLAIM_BROKEN):
        return usage(f"case {case.id}: {verdict} on {args.engine}, nothing to shrink")
    item = args.item or f"REG-SHRUNK-{case.id.upper()}"
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
    print(f"declaration for {module.__name__} REGRESSIONS:")
    print(regression_text(item, defect, source, result.minimal, helper=hasattr(module, "_shape")))
    return V.EXIT_OK
