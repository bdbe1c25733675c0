"""`bundlegen generate`: expand the workspace's plans into bundles and their manifests.

  bundlegen generate                      write <workspace bundles>/ (bundles + manifests)
  bundlegen generate --dry-run            write nothing, print a short summary: counts per
                                          level, budgets, whether every proof holds (anywhere:
                                          outside a workspace, the built-in plan)
  bundlegen generate --dry-run --report   write nothing, print the whole plan report
  bundlegen generate --check              exit 1 with a summary when the workspace's bundles
                                          or manifests drift from its plans
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from bundlegen.safe_write import UnsafeWrite
from bundlegen.workspace import DEFAULTS, Workspace, WorkspaceError, find_workspace, require_workspace
from bundlegen.generator import extend, report, report_layout, write
from bundlegen.generator.errors import PlanError
from bundlegen.generator.generate import build, build_default
from bundlegen.generator.records import GeneratedPlan
from bundlegen.plans.extension import Extension
from bundlegen.plans.records import Plan

EXIT_DRIFT = 1
EXIT_PLAN_ERROR = 2
BUILTIN_PLAN = DEFAULTS["plans"][0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="write nothing; print a short summary (counts per level, budgets, proofs)")
    parser.add_argument("--report", action="store_true",
                        help="print the whole report: counts, budgets, the pair proof, legality, gates and "
                             "traceability")
    parser.add_argument("--peer-gaps", action="store_true",
                        help="list every peer value pair (plans/peers.py) no case of a level holds")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the workspace's bundles or manifests differ from its plans")


def plan_module(name: str, workspace: Workspace | None):
    """Import plan module `name`, the workspace folder first on sys.path (a workspace's own
    plans live there)."""
    if workspace is not None and str(workspace.root) not in sys.path:
        sys.path.insert(0, str(workspace.root))
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        where = f"{workspace.source}: plans" if workspace is not None else "plan"
        raise PlanError(f"{where}: cannot import {name!r}: {exc}") from None
    except Exception as exc:    # a misspelt record field (TypeError) or any fault of the plan's own code
        raise PlanError(f"plan {name}: {type(exc).__name__}: {exc}{extend.field_hint(exc)}") from None
    except SystemExit as exc:   # sys.exit() at import: named, not an exit with no message
        raise PlanError(f"plan {name}: exits at import (SystemExit({exc.code!r})): a plan module only "
                        "declares") from None
    if not hasattr(module, "PLAN"):
        raise PlanError(f"{name}: defines no PLAN")
    if not isinstance(module.PLAN, (Plan, Extension)):
        raise PlanError(f"{name}: PLAN is a {type(module.PLAN).__name__}, not a Plan or an Extension")
    problem = extend.untaken_error(module, module.PLAN)
    if problem:
        raise PlanError(problem)
    return module


def effective_plan(module) -> Plan:
    """The whole plan a plan module means: its PLAN, or the plan an Extension extends with
    the extension's additions."""
    return extend.merged_plan(module.PLAN) if extend.is_extension(module.PLAN) else module.PLAN


def build_plans(workspace: Workspace | None) -> list[GeneratedPlan]:
    """Every plan the workspace names (outside one: the built-in plan), built."""
    names = workspace.plans if workspace is not None else (BUILTIN_PLAN,)
    out = []
    for name in names:
        module = plan_module(name, workspace)
        if extend.is_extension(module.PLAN):
            out.append(extend.build_extension(module.PLAN))
        else:
            out.append(build_default() if name == BUILTIN_PLAN else build(module.PLAN))
    return out


def main(args: argparse.Namespace) -> int:
    try:
        workspace = require_workspace("generate") if args.check or not args.dry_run else find_workspace()
    except WorkspaceError as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return EXIT_PLAN_ERROR
    try:
        generated = build_plans(workspace)
    except PlanError as exc:
        print(f"plan error: {exc}", file=sys.stderr)
        return EXIT_PLAN_ERROR
    return run(args, generated, workspace.bundles if workspace is not None else None)


def run(args: argparse.Namespace, plans: list[GeneratedPlan], bundle_root: Path | None) -> int:
    """The subcommand on already built plans (tests pass them in); `bundle_root`: where to
    write or check (None only for --dry-run)."""
    if len({g.plan.name for g in plans}) != len(plans):
        print("generate: two plans share a name", file=sys.stderr)
        return EXIT_PLAN_ERROR
    written = not (args.dry_run or args.check)
    for generated in plans:
        if args.report:
            print(report.render(generated, written), end="")
        elif args.dry_run:
            print(report_layout.summary(generated, written), end="")
        if getattr(args, "peer_gaps", False):
            print("\n".join(report.peer_lines(generated, gaps=True)))
        for p in report.peer_coverage.of_generated(generated):
            if not p.meets_target:
                print(f"generate: {generated.plan.name}: peer {p.peer} at {p.level}: {p.covered} of {p.total} "
                      f"value pairs ({p.share:.1%}), under the plan's {p.target:.0%}", file=sys.stderr)
        for proof in generated.proofs + generated.ragged_proofs:
            if not proof.complete:
                print(f"generate: {generated.plan.name}: coverage gap at {proof.level}: {proof.covered} of "
                      f"{proof.total} {proof.space} {proof.scope} units", file=sys.stderr)
        for rproof in generated.risk_proofs:
            if not rproof.complete:
                print(f"generate: {generated.plan.name}: risk triple gap at {rproof.level}: {len(rproof.missing)} "
                      f"{rproof.required} triples missing", file=sys.stderr)
        if generated.layout_proof is not None:
            names = [lv.name for lv in generated.plan.levels]
            for line in generated.layout_proof.short(names):
                print(f"generate: {generated.plan.name}: layout gap: {line}", file=sys.stderr)
        for bproof in generated.boundary_proofs:
            if not bproof.complete:
                print(f"generate: {generated.plan.name}: boundary gap at {bproof.level}: {bproof.item} needs "
                      f"{bproof.required} of its values, covers {len(bproof.covered)} of {bproof.total}",
                      file=sys.stderr)
    cases = sum(len(g.cases) for g in plans)
    if args.check:
        drift = [line for g in plans for line in write.check(g, bundle_root)]
        if drift:
            print(f"generate --check: {len(drift)} file(s) in {bundle_root} differ from the plan "
                  f"(run `bundlegen generate`):", file=sys.stderr)
            for line in drift:
                print(f"  {line}", file=sys.stderr)
            return EXIT_DRIFT
        print(f"generate --check: bundles and manifests match the plan ({cases} cases)")
        return 0
    if args.dry_run:
        return 0
    for generated in plans:
        try:
            result = write.write(generated, bundle_root)
        except UnsafeWrite as exc:
            print(f"generate: {exc}", file=sys.stderr)
            return EXIT_PLAN_ERROR
        print(f"generate: {generated.plan.name}: {len(generated.cases)} cases; {len(result.written)} file(s) "
              f"written, {result.unchanged} unchanged, {len(result.removed)} stale removed in {bundle_root}")
    return 0
