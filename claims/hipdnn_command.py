"""`bundlegen export hipdnn --out DIR [--level L]... [--engine NAME] [--tier-yaml PATH]`:
the plan's bundles as hipDNN integration-test bundles (bundlegen.claims.hipdnn_export).
`--engine` names a hipDNN engine (ASM_SDPA_ENGINE): support.json claims what its harvested
claims hold (`bundlegen harvest --from-gtest`), and `--tier-yaml` writes the quarantine of
the rejection probes it is known to accept. Exit 0 written; 2 bad input (one line, nothing
written)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bundlegen.graph import BundleError
from bundlegen.workspace import WorkspaceError, default_bundle_root
from bundlegen.claims import hipdnn_format as fmt
from bundlegen.claims.hipdnn_export import SUMMARY_NAME, ExportError, build_export, load_cases, write_tree
from bundlegen.claims.hipdnn_quarantine import quarantine_text, write_text_whole
from bundlegen.claims.store import ClaimsError, claims_path, read_claim_set


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=("hipdnn",), help="the consumer's format")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="the bundle root to write (replaced whole; a folder holding an earlier export, or new)")
    parser.add_argument("--level", action="append", default=None, metavar="L",
                        help="a level to export (repeatable; default every level)")
    parser.add_argument("--engine", default=None, metavar="NAME",
                        help="a hipDNN engine (ASM_SDPA_ENGINE): its harvested claims go into support.json")
    parser.add_argument("--tier-yaml", type=Path, default=None, metavar="PATH",
                        help="write the quarantine of rejection probes --engine is known to accept")
    parser.add_argument("--accepted-from", nargs="+", type=Path, default=(), metavar="RESULTS",
                        help="results (ours, or converted by harvest --from-gtest) whose rejection-accepted "
                             "probes join the quarantine, besides the engine's skip rows")
    parser.add_argument("--bundles", type=Path, default=None, metavar="DIR",
                        help="bundle root (default: the workspace's, else the built-in bundles)")
    parser.add_argument("--plan", default=None, metavar="NAME", help="the plan, when the root holds several")
    parser.add_argument("--claims-root", type=Path, default=None, metavar="DIR",
                        help="folder holding <engine dir>/claims.json (default: the workspace's engine folders)")


def main(args: argparse.Namespace) -> int:
    try:
        if args.tier_yaml is not None and args.engine is None:
            raise ExportError("--tier-yaml needs --engine NAME (whose accepted probes to quarantine)")
        if args.tier_yaml is not None and (args.tier_yaml.is_dir() or not args.tier_yaml.parent.is_dir()):
            raise ExportError(f"--tier-yaml {args.tier_yaml}: a folder, or in a folder that does not exist")
        root = args.bundles if args.bundles is not None else default_bundle_root()
        cases, plan, levels = load_cases(root, args.level, args.plan)
        claims = engine_claims(args.engine, args.claims_root)
        export = build_export(cases, plan, levels, _version(), claims)
        quarantine = (quarantine_text(export, args.engine, args.claims_root, args.accepted_from)
                      if args.tier_yaml is not None else None)
        write_tree(args.out, export.files)
        if quarantine is not None:
            write_text_whole(args.tier_yaml, quarantine)
    except (ExportError, BundleError, ClaimsError, WorkspaceError, ValueError) as exc:
        print(f"error: export hipdnn: {exc}", file=sys.stderr)
        return 2
    print(export.files[SUMMARY_NAME], end="")
    print(f"export hipdnn: wrote {len(export.files)} files under {args.out}"
          + (f"; quarantine {args.tier_yaml}" if args.tier_yaml is not None else ""))
    return 0


def engine_claims(engine: str | None, claims_root: Path | None) -> dict[str, dict[str, frozenset[str]]]:
    """hipDNN engine name -> arch -> claimed case ids, from its store (empty without --engine)."""
    if engine is None:
        return {}
    store = fmt.store_engine(engine)
    return {engine: dict(read_claim_set(claims_path(store, claims_root), store).claims)}


def _version() -> str:
    from bundlegen.cli import version
    return version()
