"""`bundlegen matrix [--check]`: render SUPPORT_MATRIX.md, or fail when it has drifted."""
from __future__ import annotations

import argparse
import difflib
from pathlib import Path

from bundlegen.claims.matrix import BUNDLE_ROOT, MATRIX_PATH, support_matrix_text
from bundlegen.claims.store import ClaimsError

DIFF_LINES = 40


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true",
                        help="re-render and fail (exit 1) when the file differs")
    parser.add_argument("--output", type=Path, default=MATRIX_PATH,
                        help="the matrix file (default: SUPPORT_MATRIX.md at the repository root)")
    parser.add_argument("--bundles", type=Path, default=BUNDLE_ROOT, help="bundle root (default: bundles/)")
    parser.add_argument("--claims-root", type=Path, default=None,
                        help="directory holding <engine dir>/claims.json (default: engines/)")


def drift(expected: str, path: Path) -> list[str]:
    """A short unified diff from the file to what it should be; empty when equal."""
    actual = path.read_text(encoding="utf-8") if path.is_file() else ""
    if actual == expected:
        return []
    lines = list(difflib.unified_diff(actual.splitlines(), expected.splitlines(),
                                      fromfile=f"{path} (checked in)", tofile=f"{path} (rendered)",
                                      lineterm=""))
    if len(lines) > DIFF_LINES:
        lines = lines[:DIFF_LINES] + [f"... {len(lines) - DIFF_LINES} more diff lines"]
    return lines or [f"{path}: differs (whitespace)"]


def main(args: argparse.Namespace) -> int:
    try:
        text, errors = support_matrix_text(args.bundles, args.claims_root)
    except ClaimsError as exc:
        print(f"matrix: {exc}")
        return 2
    for error in errors:
        print(f"matrix: bundle error (case left out): {error}")
    if args.check:
        diff = drift(text, args.output)
        if diff:
            print(f"matrix: {args.output} has drifted from the plan, bundles and claims; "
                  "run `bundlegen matrix`")
            print("\n".join(diff))
            return 1
        print(f"matrix: {args.output} is up to date")
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"matrix: wrote {args.output}")
    return 0
