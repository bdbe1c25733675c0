"""`bundlegen repro CASE_ID --engine E [--device D] [--dump DIR]`: one case, in-process,
with what a kernel author needs (bundlegen.harness.repro)."""
from __future__ import annotations

import argparse
import shlex
import sys

# the harness is imported inside the functions that use it: `bundlegen --help` imports every
# command module, and should not pay for what only this command runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bundlegen.harness.repro import add_case_arguments

    add_case_arguments(parser)
    parser.add_argument("--plan", default=None, metavar="NAME", help="the plan, when the root holds several")
    parser.add_argument("--dump", default=None, metavar="DIR",
                        help="write inputs, outputs and reference as .pt files and a standalone "
                             "reproduce.py into DIR")
    parser.add_argument("--worst", type=int, default=8, metavar="N", help="worst elements to print (default 8)")
    parser.add_argument("--run-skipped", action="store_true",
                        help="run the case even when a [[test_skips]] row skips it, and say whether "
                             "that row is stale (the case passes now)")


def statistical_lines(outputs) -> list[str]:
    """Each output's least statistical margin and where it was (results' output fields)."""
    lines = []
    for port, out in outputs.items():
        if isinstance(out, dict) and out.get("statistical_margin") is not None:
            ratio = out.get("error_ratio")
            lines.append(f"  {port}: statistical margin {out['statistical_margin']:.3g} at {out['slice']} "
                         f"({out['measure']} {'%.3g' % ratio if ratio is not None else 'n/a'}x the "
                         "io-precision reference's)")
    return ["statistical judge:", *lines] if lines else []


def report_lines(repro) -> list[str]:
    from bundlegen.describe import graph_line

    case, o = repro.case, repro.outcome
    lines = [f"case {case.id}  {case.level}/{case.group}  {case.purpose}  {' '.join(case.items)}",
             f"graph: {graph_line(case.graph)}",
             f"data: seed {case.data.seed}, {case.data.distribution}"
             + (f", bias {case.data.bias_values}" if "bias" in case.graph.tensors else "")
             + f"; tolerance class {case.tolerance_class}",
             f"engine: {repro.engine} ({repro.engine_name}, {repro.arch}) on {repro.device}",
             *repro.skip_note,
             f"verdict: {o.verdict}" + (f" ({o.reason})" if o.reason else "")]
    if o.detail:
        lines.append(f"detail: {o.detail}")
    if repro.captured is not None:
        tol = repro.captured.tolerance
        lines.append(f"tolerance: rtol={tol.rtol:g} atol={tol.atol:g}"
                     + (f", statistical k={tol.k:g} floor={tol.floor:g}" if tol.k is not None else "")
                     + f" ({tol.source})")
        lines += statistical_lines(o.outputs)
    if repro.patterns:
        lines.append("error pattern:")
        lines += [f"  {p.line()}" for p in repro.patterns]
    if repro.worst and repro.patterns:
        lines.append("worst elements:")
        lines += [f"  {w.line()}" for w in repro.worst]
    return lines


def main(args: argparse.Namespace) -> int:
    from bundlegen.graph import BundleError
    from bundlegen.harness import verdicts as V
    from bundlegen.harness.repro import CaseNotFound, RunnerError, find_case, open_runner, reproduce

    try:
        case = find_case(args.case_id, args.bundles, args.plan)
        runner = open_runner(args.engine, args.device, engine_config=args.engine_config,
                             bundles=args.bundles, plan=args.plan,
                             run_skipped=bool(getattr(args, "run_skipped", False)))
    except (CaseNotFound, BundleError, RunnerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return V.EXIT_USAGE
    repro = reproduce(case, runner, worst=args.worst)
    print("\n".join(report_lines(repro)))
    if args.dump:
        if repro.captured is None:
            print(f"error: --dump: case {case.id} was not run by the engine ({repro.outcome.verdict})",
                  file=sys.stderr)
            return V.EXIT_USAGE
        from bundlegen.harness.repro_dump import dump

        paths = dump(repro, args.dump)
        print(f"dumped: {', '.join(str(p) for p in paths)}")
        print(f"standalone: python {shlex.quote(str(paths[-1]))}")
    return V.EXIT_FAILED if V.is_failing(repro.outcome.verdict) else V.EXIT_OK
