"""`bundlegen tolerances --engine-toml PATH [--engine NAME] [--check]`: write, or refresh, the
generated block of `[[tolerance_overrides]]` rows (one per tolerance class of the plan, with
the numbers of the bundle root's tolerance TOML) between the markers of an engine TOML,
leaving every line outside them as it was (bundlegen.tolerance_block).

`--engine NAME` alone takes that engine's engine.toml (the workspace's, else the built-in
one); with `--engine-toml`, the file's `[meta] name` must be NAME. `--check` writes nothing
and exits 1 when the block is missing or differs from what the command would write.

Writing (not --check) happens only inside the current workspace: the engine TOML must lie
in it (through no symlink out of it), so `--engine NAME` outside a workspace never rewrites
the installed package's engine.toml. The write is atomic (bundlegen.safe_write).

Exit codes: 0 written or in sync; 1 (--check) the block drifts; 2 bad input (a missing file,
unreadable TOML, an unknown engine, malformed or near-miss markers, no bundle manifest, a
target outside the workspace, not a regular file or read-only)."""
from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

from bundlegen import safe_read
from bundlegen.engine_toml import unknown_key
from bundlegen.graph import BundleError
from bundlegen.manifest import load_manifest
from bundlegen.safe_write import UnsafeWrite, check_target, write_text
from bundlegen.tolerance_block import BlockError, block_text, refresh
from bundlegen.tolerances import tolerances_name
from bundlegen.workspace import (WorkspaceError, check_engine_name, default_bundle_root, engine_config_dir,
                                 require_workspace)

ENGINE_TOML = "engine.toml"


class BadInput(ValueError):
    """One line for exit code 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine-toml", type=Path, default=None, metavar="PATH",
                        help="the engine TOML to write the block into")
    parser.add_argument("--engine", default=None, metavar="NAME",
                        help="the engine: its engine.toml when --engine-toml is not given, else the "
                             "name its [meta] must carry")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when the block is missing or drifts")
    parser.add_argument("--bundles", type=Path, default=None, metavar="DIR",
                        help="bundle root (default: the workspace's, else the built-in bundles)")
    parser.add_argument("--plan", default=None, metavar="NAME",
                        help="the plan whose classes to write when the bundle root holds several")


def main(args: argparse.Namespace) -> int:
    try:
        path = engine_toml_path(args.engine_toml, args.engine)
        inside = None if args.check else require_workspace("bundlegen tolerances").root
        if inside is not None:
            check_target(path, inside)      # before reading: a FIFO would block the read
        text = read_engine_toml(path, args.engine)
        root = args.bundles if args.bundles is not None else default_bundle_root()
        manifest = load_manifest(root, args.plan)
        block = block_text(manifest.plan, manifest.tolerance_classes, tolerances_name(manifest.plan),
                           manifest.tolerances_digest)
        result = refresh(text, block)
        if result.changed and not args.check:
            write_text(path, result.text, inside=inside)
    except (BadInput, BlockError, BundleError, WorkspaceError, UnsafeWrite) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if result.changed:
            print(f"tolerances --check: the generated block of {path} is missing or differs from the "
                  f"{result.rows} tolerance classes of plan {manifest.plan} (run `bundlegen tolerances "
                  f"--engine-toml {path}`)", file=sys.stderr)
            return 1
        print(f"tolerances --check: {path} holds the {result.rows} tolerance classes of plan {manifest.plan}")
        return 0
    print(f"tolerances: {path}: {result.rows} rows of plan {manifest.plan} "
          f"{'written' if result.changed else 'already in sync'}")
    return 0


def engine_toml_path(explicit: Path | None, engine: str | None) -> Path:
    if explicit is not None:
        if engine is not None:
            _known_engine(engine)
        return explicit
    if engine is None:
        raise BadInput("give --engine-toml PATH or --engine NAME")
    return _known_engine(engine) / ENGINE_TOML


def _known_engine(engine: str) -> Path:
    directory = engine_config_dir(check_engine_name(engine))
    if directory is None:
        raise BadInput(f"unknown engine {engine!r}: no config folder for it in the workspace or the package")
    return directory


def read_engine_toml(path: Path, engine: str | None, ours: bool = True) -> str:
    """The file's text, exactly (line endings kept); BadInput when it is missing, not TOML,
    names another engine than `engine`, or (`ours`: an engine TOML `bundlegen run` reads,
    not another harness's) holds a key `bundlegen run` refuses."""
    try:
        text = safe_read.read_bytes(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path}: not valid TOML: {exc}") from None
    unknown = unknown_key(doc) if ours else None
    if unknown:
        raise BadInput(f"{path}: {unknown}; `bundlegen run` refuses such an engine TOML, so nothing is written")
    named = doc.get("meta", {}).get("name") if isinstance(doc.get("meta"), dict) else None
    if engine is not None and named is not None and named != engine:
        raise BadInput(f"{path}: [meta] name is {named!r}, not engine {engine!r}")
    return text
