"""`bundlegen matrix [--check]`: render the workspace's support matrix (its `matrix` path,
SUPPORT_MATRIX.md here), or fail when it has drifted or a claim is not backed by the
results it cites (bundlegen.claims.integrity). It reads the bundles and manifest of the
default bundle root and the claims of every engine with a config folder in the workspace."""
from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path

from bundlegen import safe_write
from bundlegen.graph import BundleError
from bundlegen.manifest import load_manifest
from bundlegen.workspace import WorkspaceError, default_bundle_root, require_workspace
from bundlegen.claims.cases import bundle_cases
from bundlegen.claims.combinations import CombinationError, combinations, combinations_text, parse_picks
from bundlegen.claims.integrity import verify
from bundlegen.claims.matrix import (compile_reports, default_columns, load_claim_sets, support_matrix_text,
                                     workspace_engines)
from bundlegen.claims.overrides import override_section
from bundlegen.claims.store import CLAIMS_NAME, ClaimsError, claims_path, read_claim_set, write_claim_set
from bundlegen.harness.config import EngineConfigError, load_engine_config

DIFF_LINES = 40


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true",
                        help="re-render and fail (exit 1) when the file differs")
    parser.add_argument("--bundles", type=Path, default=None,
                        help="bundle root (default: the workspace's, else the built-in bundles)")
    parser.add_argument("--plan", default=None, metavar="NAME",
                        help="the plan to render when the bundle root holds several")
    parser.add_argument("--claims-root", type=Path, default=None,
                        help="directory holding <engine dir>/claims.json (default: the workspace's "
                             "engine config folders)")
    parser.add_argument("--drop-retired", action="store_true",
                        help="first drop from each engine's claims.json the claims, declines and notes of "
                             "cases the bundles no longer hold (a changed plan retired them; case ids are "
                             "content hashes, so every other claim still names the case its evidence ran)")
    parser.add_argument("--combinations", default=None, metavar="AXIS[=GLOB],...",
                        help="print, instead of writing the matrix, whether each engine serves the chosen "
                             "axes' values together, e.g. heads=gqa*,mask=window*,dtype (one row per "
                             "combination some case holds)")


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


def engine_toml_links(folders: dict[str, Path], output: Path, root: Path) -> dict[str, str]:
    """engine -> its engine.toml relative to the matrix file, for engines inside the workspace."""
    links = {}
    for name, folder in folders.items():
        toml = folder.resolve() / "engine.toml"
        if toml.is_file() and toml.is_relative_to(root.resolve()):
            links[name] = Path(os.path.relpath(toml, output.resolve().parent)).as_posix()
    return links


def _entries(by_arch) -> int:
    return sum(len(ids) for ids in by_arch.values())


def drop_retired(claim_sets: dict, folders: dict[str, Path], claims_root: Path | None, cases,
                 root: Path) -> dict:
    """The claim sets without the cases the bundles no longer hold, each changed one written
    back to its claims.json (a line per engine says how many went)."""
    known = lambda case_id: cases.level_of(case_id) is not None  # noqa: E731
    kept = {}
    for name, claim_set in sorted(claim_sets.items()):
        kept[name] = held = claim_set.held_in(known)
        if held == claim_set:
            continue
        path = claims_path(name, claims_root) if claims_root is not None else folders[name] / CLAIMS_NAME
        write_claim_set(path, held, inside=root)
        print(f"matrix: {name}: dropped {_entries(claim_set.claims) - _entries(held.claims)} claims and "
              f"{_entries(claim_set.declines) + _entries(claim_set.unclaimed) - _entries(held.declines) - _entries(held.unclaimed)} "
              f"declines and notes of retired cases from {path}")
    return kept


def main(args: argparse.Namespace) -> int:
    try:
        workspace = require_workspace("matrix")
        bundles = args.bundles if args.bundles is not None else default_bundle_root()
        manifest = load_manifest(bundles, args.plan)
        folders = workspace_engines(workspace)
        if args.claims_root is not None:
            claim_sets = load_claim_sets(folders, args.claims_root)
        else:
            claim_sets = {name: read_claim_set(folder / CLAIMS_NAME, name) for name, folder in folders.items()}
        cases = bundle_cases(bundles, manifest.plan, manifest.level_names)
        if getattr(args, "drop_retired", False):
            claim_sets = drop_retired(claim_sets, folders, args.claims_root, cases, workspace.root)
        configs = {name: load_engine_config(folder) for name, folder in folders.items()}
        combos = getattr(args, "combinations", None)    # callers building a Namespace may leave it out
        if combos is not None:
            picks = parse_picks(combos, manifest.axes)
            view = combinations(picks, cases, default_columns(list(claim_sets), claim_sets), claim_sets)
            print(combinations_text(view), end="")
            return 0
        text, errors = support_matrix_text(manifest, bundles, claim_sets, cases=cases,
                                           engine_tomls=engine_toml_links(folders, workspace.matrix,
                                                                          workspace.root),
                                           compiled=compile_reports(folders),
                                           skip_rows={name: configs[name].skips for name in configs})
        text = text.rstrip("\n") + "\n" + override_section(configs, manifest, workspace.root) \
            if any(configs[name].overrides for name in configs) else text
    except (ClaimsError, BundleError, WorkspaceError, EngineConfigError, CombinationError,
            safe_write.UnsafeWrite) as exc:
        print(f"matrix: {exc}")
        return 2
    output = workspace.matrix
    for error in errors:
        print(f"matrix: bundle error (case left out): {error}")
    if args.check:
        failed = False
        diff = drift(text, output)
        if diff:
            print(f"matrix: {output} has drifted from the plan, bundles and claims; "
                  "run `bundlegen matrix`")
            print("\n".join(diff))
            failed = True
        problems = [p for name in sorted(claim_sets) for p in verify(claim_sets[name], cases, workspace.root)]
        for problem in problems:
            print(f"matrix: claims: {problem}")
        if problems:
            print("matrix: claims are not backed by the results they cite; harvest again "
                  "(`bundlegen harvest RESULTS... --prune`) from complete runs, or, where the plan "
                  "retired the cases they name, `bundlegen matrix --drop-retired`")
            failed = True
        if failed:
            return 1
        print(f"matrix: {output} is up to date and every claim is backed by the results it cites")
        return 0
    try:
        safe_write.write_text(output, text, inside=workspace.root)
    except safe_write.UnsafeWrite as exc:
        print(f"matrix: {exc}")
        return 2
    print(f"matrix: wrote {output}")
    return 0
