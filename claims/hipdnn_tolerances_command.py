"""`bundlegen tolerances [--format bundlegen|hipdnn] ...`: the core command
(bundlegen.tolerances_command) writes our engine TOML's block; `--format hipdnn
--engine-toml PATH [--engine NAME]` writes a hipDNN engine TOML's block instead
(bundlegen.claims.hipdnn_toml): tolerance rows by GTest name for the cases `bundlegen export
hipdnn` writes, and `[[test_skips]]` rows from hipDNN engine NAME's skip rows. It lives with
the export because it names the export's cases."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bundlegen import tolerances_command as core
from bundlegen.graph import BundleError
from bundlegen.tolerance_block import BlockError, refresh
from bundlegen.tolerances import tolerances_name
from bundlegen.workspace import WorkspaceError, default_bundle_root
from bundlegen.claims.hipdnn_export import ExportError, build_export, load_cases
from bundlegen.claims.hipdnn_quarantine import defects, skip_rows, write_text_whole
from bundlegen.claims.hipdnn_toml import block_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    core.add_arguments(parser)
    parser.add_argument("--format", choices=("bundlegen", "hipdnn"), default="bundlegen",
                        help="bundlegen: our engine.toml (default); hipdnn: a hipDNN engine TOML, with --engine "
                             "naming the hipDNN engine whose skip rows to write")
    parser.add_argument("--config-root", type=Path, default=None, metavar="DIR",
                        help="with --format hipdnn: folder holding <engine dir>/engine.toml (default: the "
                             "workspace's engine folders)")


def main(args: argparse.Namespace) -> int:
    if args.format == "bundlegen":
        return core.main(args)
    try:
        if args.engine_toml is None:
            raise ExportError("--format hipdnn needs --engine-toml PATH (the hipDNN engine TOML)")
        text = core.read_engine_toml(args.engine_toml, None, ours=False)   # hipDNN's own format
        root = args.bundles if args.bundles is not None else default_bundle_root()
        cases, plan, levels = load_cases(root, None, args.plan)
        export = build_export(cases, plan, levels, "-")
        skips = defects(export, skip_rows(args.engine, args.config_root), plan, probes=False) if args.engine else []
        from bundlegen.manifest import load_manifest
        manifest = load_manifest(root, args.plan)
        result = refresh(text, block_text(export, manifest.tolerance_classes, skips, tolerances_name(plan)))
    except (core.BadInput, BlockError, BundleError, ExportError, WorkspaceError, ValueError) as exc:
        print(f"error: tolerances --format hipdnn: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"tolerances --check: {args.engine_toml} {'drifts' if result.changed else 'is in sync'}",
              file=sys.stderr if result.changed else sys.stdout)
        return 1 if result.changed else 0
    if result.changed:
        write_text_whole(args.engine_toml, result.text)
    print(f"tolerances: {args.engine_toml}: {result.rows} tolerance rows, {len(skips)} skip rows "
          f"{'written' if result.changed else 'already in sync'}")
    return 0
