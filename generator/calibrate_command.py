"""`bundlegen calibrate RESULTS... [--device-class CLASS] [--plan MODULE] [--write]`:
fit one cost class's coefficients (h200, cpu, or an engine's such as h200/torch-cudnn) to
the measured phases of the cases, print the fit (per level predicted and measured, per
phase, the worst cases) and the new COST_MODEL entry; `--write` puts its numbers and what
was measured into the plan's file (then run `bundlegen generate`: the predictions, and so
the level of each case, may change).

The plan is the workspace's (its only one, or `--plan`; outside a workspace the built-in
plan). `--write` edits only a plan file that lies inside the current workspace."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from bundlegen.cost import cost_class
from bundlegen.workspace import Workspace, WorkspaceError, default_bundle_root, find_workspace, require_workspace
from bundlegen.generator import calibrate as C
from bundlegen.generator import calibrate_write as W
from bundlegen.generator.command import BUILTIN_PLAN, plan_module
from bundlegen.generator.errors import PlanError


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
                        help="results.jsonl[.gz] files (or run directories holding one); use warm-cache runs")
    parser.add_argument("--device-class", default="h200", metavar="CLASS",
                        help="which COST_MODEL entry to fit: a device class (h200, cpu: records of every "
                             "engine) or one engine's class on it (cpu/torch-math, h200/torch-cudnn: its "
                             "records only); other records are ignored")
    parser.add_argument("--plan", default=None, metavar="MODULE",
                        help="the plan module to fit (default: the workspace's only plan)")
    parser.add_argument("--write", action="store_true",
                        help="rewrite (or add) that entry's numbers in the plan file in place (inside the workspace)")
    parser.add_argument("--bundles", default=None, metavar="DIR",
                        help="bundle root to find each case's graph (default: the workspace's, else built-in)")


def main(args: argparse.Namespace) -> int:
    device_class = args.device_class
    try:
        module = plan_module(choose_plan(args.plan, find_workspace()), find_workspace())
        plan = module.PLAN
        path = writable_plan_file(module) if args.write else None
        used = list(args.results)
        records = C.read_records(used)
        bundles = args.bundles if args.bundles else default_bundle_root()
        samples = C.collect(records, C.case_index(bundles, plan.name), device_class)
        device, engine = C.device_and_engine(device_class)
        # a class the plan has not yet: fitted from its device class's numbers
        prior = plan.cost_model[cost_class(device, engine or "", plan.cost_model)]
        result = C.fit(samples.executed, prior)
    except (C.CalibrationError, PlanError, WorkspaceError) as exc:
        print(f"calibrate: {exc}")
        return 2
    starts = C.run_starts(used, device_class)
    new = replace(result.coefficients, run_start_s=C.fitted_run_start(starts, prior))
    print("\n".join(fit_report(device_class, samples, prior, new, result, starts, [lv.name for lv in plan.levels],
                               len(used))))
    print(f"\nCOST_MODEL entry ({Path(module.__file__).name}):")
    print(W.coefficient_block(device_class, new))
    if path is not None:
        written = write(path, device_class, new)
        rows = C.level_errors(samples, prior, new, [lv.name for lv in plan.levels])
        if written == 0 and W.write_measured(path, device_class, W.measured_of(rows, " ".join(map(str, used)))):
            print(f"  {path.name}: COST_MEASURED[{device_class!r}]: the measured seconds per level and their source")
        return written
    return 0


def write(path: Path, device_class: str, new) -> int:
    try:
        edits = W.write_coefficients(path, device_class, new)
    except (C.CalibrationError, OSError) as exc:     # OSError: safe_write.UnsafeWrite, a read
        print(f"calibrate: cannot write {path}: {exc}")
        return 2
    changed = [e for e in edits if e.old != e.new]
    for e in changed:
        print(f"  {path.name}: {device_class}.{e.field} {e.old} -> {e.new}")
    print(f"wrote {path} ({len(changed)} number(s) changed); now run `bundlegen generate`"
          if changed else f"{path}: already holds these numbers")
    return 0


def fit_report(device_class: str, samples: C.SampleSet, prior, new, result: C.Fit, starts: list[float],
               levels: list[str], files: int) -> list[str]:
    """The fit's report: the coefficients before and after, per level the predicted and
    measured seconds (plan's and fitted), per phase, the per-case spread and the worst cases."""
    out = [f"calibrate {device_class}: {result.samples} executed case(s) from {files} "
           f"results file(s); {len(samples.probes)} probe(s), {len(samples.not_executed)} not executed, "
           f"{samples.unmatched} not in the bundles, {samples.other_device} of another class",
           "fit: per phase, non-negative least squares of its measured seconds on its features "
           "(bundlegen.cost), each level weighted the same"]
    for name in (*C.FITTED, "ordinary_runs", "requested_runs"):
        note = "   (kept: the data does not resolve it)" if name in result.kept else ""
        out.append(f"  {name:20s} {W.literal(name, prior):>10s} -> {W.literal(name, new):>10s}{note}")
    if samples.probes:
        mean = sum(p.wall_s for p in samples.probes) / len(samples.probes)
        out.append(f"  probe_s              {C.format_number(prior.probe_s):>10s}    "
                   f"(not fitted; measured mean {mean:.4f} s)")
    shown = ", ".join(f"{x:.2f}" for x in starts)
    source = f"median of {len(starts)} run.json: {shown}" if starts else "kept: no run.json among the results"
    out.append(f"  run_start_s          {C.format_number(prior.run_start_s):>10s} -> "
               f"{C.format_number(new.run_start_s):>10s}   ({source})")
    rows = C.level_errors(samples, prior, new, levels)
    out += ["", f"{'level':8s} {'cases':>6s} {'measured s':>11s} {'plan s':>9s} {'error':>8s} "
                f"{'fitted s':>9s} {'error':>8s}"]
    out += [f"{r.level:8s} {r.cases:6d} {r.measured_s:11.2f} {r.before_s:9.2f} {r.before_error:+8.1%} "
            f"{r.after_s:9.2f} {r.after_error:+8.1%}" for r in rows]
    per_phase = C.phase_errors(samples.executed, new)
    out.append("phases, measured / fitted s: " + ", ".join(
        f"{p.removesuffix('_s')} {m:.2f} / {f:.2f}" for p, (m, f) in per_phase.items()))
    ratios = C.case_ratios(samples.executed, new)
    if ratios:
        out.append(f"per executed case, fitted: {C.within_ratio(ratios):.0%} within {C.CASE_RATIO:g}x "
                   f"of measured (target 90 %); worst:")
        out += [f"  {s.case_id} {s.level:8s} measured {s.wall_s:8.3f} s, predicted "
                f"{C.predicted(s, new):8.3f} s ({r:.2f}x)" for r, s in ratios[:5]]
    per_level = [r for r in rows if r.level != "total"]
    worst = max((abs(r.after_error) for r in per_level), default=0.0)
    verdict = "met" if worst <= C.TARGET_ERROR else "NOT met"
    out.append(f"target: every level within {C.TARGET_ERROR:.0%} of measured: {verdict} (worst {worst:.1%})")
    return out
