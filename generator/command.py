"""`bundlegen generate`: expand the plan into bundles and engine-TOML tolerance blocks.

  bundlegen generate                      write bundles/ and the TOML blocks
  bundlegen generate --dry-run --report   write nothing, print the plan report
  bundlegen generate --check              exit 1 with a summary when checked-in files drift
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bundlegen.generator import report, write
from bundlegen.generator.errors import PlanError
from bundlegen.generator.generate import build_default
from bundlegen.generator.paths import REPO_ROOT
from bundlegen.generator.records import GeneratedPlan

EXIT_DRIFT = 1
EXIT_PLAN_ERROR = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="write nothing")
    parser.add_argument("--report", action="store_true",
                        help="print counts, budgets, the pair proof, legality, gates and traceability")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the checked-in bundles or TOML blocks differ from the plan")
    parser.add_argument("--root", type=Path, default=REPO_ROOT,
                        help="repository root to write to or check (default: this checkout)")


def main(args: argparse.Namespace) -> int:
    try:
        generated = build_default()
    except PlanError as exc:
        print(f"plan error: {exc}", file=sys.stderr)
        return EXIT_PLAN_ERROR
    return run(args, generated)


def run(args: argparse.Namespace, generated: GeneratedPlan) -> int:
    """The subcommand on an already built plan (tests pass one in)."""
    root = Path(args.root)
    if args.report:
        print(report.render(generated), end="")
    for proof in generated.proofs:
        if not proof.complete:
            print(f"generate: coverage gap at {proof.level}: {proof.covered} of {proof.total} "
                  f"{proof.scope} units", file=sys.stderr)
    if args.check:
        drift = write.check(generated, root)
        if drift:
            print(f"generate --check: {len(drift)} file(s) differ from the plan "
                  f"(run `bundlegen generate`):", file=sys.stderr)
            for line in drift:
                print(f"  {line}", file=sys.stderr)
            return EXIT_DRIFT
        print(f"generate --check: bundles and tolerance blocks match the plan ({len(generated.cases)} cases)")
        return 0
    if args.dry_run:
        return 0
    result = write.write(generated, root)
    print(f"generate: {len(generated.cases)} cases; {len(result.written)} file(s) written, "
          f"{result.unchanged} unchanged, {len(result.removed)} stale removed")
    return 0
