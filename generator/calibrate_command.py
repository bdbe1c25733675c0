"""`bundlegen calibrate RESULTS... [--device-class h200|cpu] [--plan MODULE] [--write]`:
fit the cost model's coefficients to measured case times, print the per-level prediction
error and the new COST_MODEL entry; `--write` puts its numbers into the plan's file (then
run `bundlegen generate`: the predictions, and so the level of each case, may change).

The plan is the workspace's (its only one, or `--plan`; outside a workspace the built-in
plan). `--write` edits only a plan file that lies inside the current workspace."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from bundlegen.cost import seconds
from bundlegen.workspace import Workspace, WorkspaceError, default_bundle_root, find_workspace, require_workspace
from bundlegen.generator import calibrate as C
from bundlegen.generator.command import BUILTIN_PLAN, plan_module
from bundlegen.generator.errors import PlanError

#: the per-level error the plan aims for (issue 7)
TARGET_ERROR = 0.25


def choose_plan(name: str | None, workspace: Workspace | None) -> str:
    """The plan module to calibrate: `name`, else the workspace's only plan."""
    if name is not None:
        return name
    names = workspace.plans if workspace is not None else (BUILTIN_PLAN,)
    if len(names) != 1:
        raise PlanError(f"{workspace.source}: plans: several ({', '.join(names)}); choose one with --plan")
    return names[0]


def writable_plan_file(module, command: str = "calibrate --write") -> Path:
    """The plan's file, when it lies inside the current workspace (WorkspaceError else)."""
    workspace = require_workspace(command)
    path = Path(module.__file__).resolve()
    if not path.is_relative_to(workspace.root.resolve()):
        raise WorkspaceError(f"{command}: plan file {path} lies outside the workspace {workspace.root}")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="results.jsonl files (or run directories holding one); use warm-cache runs")
    parser.add_argument("--device-class", default="h200", choices=sorted(set(C.DEVICE_CLASS_OF_ARCH.values())),
                        help="which COST_MODEL entry to fit (records of other archs are ignored)")
    parser.add_argument("--plan", default=None, metavar="MODULE",
                        help="the plan module to fit (default: the workspace's only plan)")
    parser.add_argument("--write", action="store_true",
                        help="rewrite that entry's numbers in the plan file in place (inside the workspace)")
    parser.add_argument("--bundles", default=None, metavar="DIR",
                        help="bundle root to find each case's graph (default: the workspace's, else built-in)")


def main(args: argparse.Namespace) -> int:
    device_class = args.device_class
    try:
        module = plan_module(choose_plan(args.plan, find_workspace()), find_workspace())
        plan = module.PLAN
        path = writable_plan_file(module) if args.write else None
        records = C.read_records(args.results)
        bundles = args.bundles if args.bundles else default_bundle_root()
        samples = C.collect(records, C.case_index(bundles, plan.name), device_class)
        prior = plan.cost_model[device_class]
        result = C.fit(samples.executed, prior)
    except (C.CalibrationError, PlanError, WorkspaceError) as exc:
        print(f"calibrate: {exc}")
        return 2
    starts = C.run_starts(args.results, device_class)
    new = replace(result.coefficients, run_start_s=C.fitted_run_start(starts, prior))
    print(f"calibrate {device_class}: {result.samples} executed case(s) from {len(args.results)} "
          f"results file(s); {len(samples.probes)} probe(s), {len(samples.not_executed)} not executed, "
          f"{samples.unmatched} not in the bundles, {samples.other_device} of another device class")
    print("fit: non-negative least squares of wall_s on engine FLOPs, oracle FLOPs, io bytes and 1, "
          "each level weighted the same")
    for name in C.FITTED:
        note = "   (kept: the data does not resolve it)" if name in result.kept else ""
        print(f"  {name:20s} {C.format_number(getattr(prior, name)):>10s} -> "
              f"{C.format_number(getattr(new, name)):>10s}{note}")
    correlation = C.flop_correlation(samples.executed)
    if correlation > 0.99:
        print(f"  note: engine and oracle FLOPs are nearly proportional here (correlation {correlation:.4f}): "
              "the split between their rates is loose, their sum is not")
    if samples.probes:
        mean = sum(p.wall_s for p in samples.probes) / len(samples.probes)
        print(f"  probe_s              {C.format_number(prior.probe_s):>10s}    "
              f"(not fitted; measured mean {mean:.4f} s)")

    shown = ", ".join(f"{x:.2f}" for x in starts)
    source = f"median of {len(starts)} run.json: {shown}" if starts else "kept: no run.json among the results"
    print(f"  run_start_s          {C.format_number(prior.run_start_s):>10s} -> "
          f"{C.format_number(new.run_start_s):>10s}   ({source})")

    rows = C.level_errors(samples, prior, new, [lv.name for lv in plan.levels])
    print(f"\n{'level':8s} {'cases':>6s} {'measured s':>11s} {'plan s':>9s} {'error':>8s} "
          f"{'fitted s':>9s} {'error':>8s}")
    for r in rows:
        print(f"{r.level:8s} {r.cases:6d} {r.measured_s:11.2f} {r.before_s:9.2f} {r.before_error:+8.1%} "
              f"{r.after_s:9.2f} {r.after_error:+8.1%}")
    per_case = sorted(abs(seconds(s.terms, new) - s.wall_s) / s.wall_s
                      for s in samples.executed if s.wall_s > 0)
    if per_case:
        print(f"per executed case, fitted: median |error| {per_case[len(per_case) // 2]:.0%}, "
              f"90th percentile {per_case[int(0.9 * (len(per_case) - 1))]:.0%}")
    per_level = [r for r in rows if r.level != "total"]
    worst = max((abs(r.after_error) for r in per_level), default=0.0)
    verdict = "met" if worst <= TARGET_ERROR else "NOT met"
    print(f"target: every level within {TARGET_ERROR:.0%} of measured: {verdict} (worst {worst:.1%})")

    print(f"\nCOST_MODEL entry ({Path(module.__file__).name}):")
    print(C.coefficient_block(device_class, new))
    if path is not None:
        try:
            edits = C.write_coefficients(path, device_class, new)
        except (C.CalibrationError, OSError) as exc:     # OSError: safe_write.UnsafeWrite, a read
            print(f"calibrate: cannot write {path}: {exc}")
            return 2
        changed = [e for e in edits if e.old != e.new]
        for e in changed:
            print(f"  {path.name}: {device_class}.{e.field} {e.old} -> {e.new}")
        print(f"wrote {path} ({len(changed)} number(s) changed); now run `bundlegen generate`"
              if changed else f"{path}: already holds these numbers")
    return 0
