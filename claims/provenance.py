"""Whether a results file was run against the workspace's bundles: its run.json records the
digest of the bundle files the run loaded (the run's level and every lower one, and the
manifest: bundlegen.harness.results.bundles_digest); harvest computes the same digest over
the workspace's bundle root for that level and refuses a file whose digest differs, since
its case ids and verdicts speak of other cases."""
from __future__ import annotations

import json
from pathlib import Path

from bundlegen.graph import BundleError
from bundlegen.manifest import load_manifest
from bundlegen.harness.bundles import level_files
from bundlegen.harness.results import bundles_digest


def workspace_digest(bundle_root: Path | str, level: str, plan: str | None = None) -> str | None:
    """The digest a run of `level` over `bundle_root` records; None when the root's manifest
    does not know the level."""
    root = Path(bundle_root)
    manifest = load_manifest(root, plan)
    if level not in manifest.level_names:
        return None
    return bundles_digest(level_files(root, level, manifest), root)


def digest_mismatch(results: Path | str, run_json: Path | str, bundle_root: Path | str,
                    plan: str | None = None) -> str | None:
    """One line naming both digests when the run recorded bundles other than the
    workspace's; None when they agree, or when the run.json records no digest (a results
    file without one is harvested as before: nothing says which bundles it ran)."""
    try:
        run = json.loads(Path(run_json).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    theirs = run.get("bundles_digest") if isinstance(run, dict) else None
    if not isinstance(theirs, str) or not theirs:
        return None
    level = str(run.get("level") or "")
    try:
        ours = workspace_digest(bundle_root, level, plan)
    except BundleError as exc:
        return f"{results}: ran bundles {theirs}; the workspace's bundles cannot be read: {exc}"
    if ours == theirs:
        return None
    shown = ours if ours is not None else f"none (its manifest has no level {level!r})"
    return (f"{results}: ran against bundles {theirs} (level {level}), the workspace's are {shown}; "
            "run it again on these bundles")
