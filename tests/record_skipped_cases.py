"""Which cases of the checked-in bundles each engine's [[test_skips]] rows skip, in one
environment: the arch and library versions torch-cudnn's claims were harvested with (an
H200: sm90, torch 2.11, cuDNN 9.19), read from its claims.json evidence.

    python -m tests.record_skipped_cases REVISION > tests/data/skipped_cases_sm90.json

reads every engines/*/engine.toml as it was at git REVISION and records, per engine folder,
case id -> the detail a skipped case carries. tests/test_harness_config.py checks the rows of
the working tree against the recording, so a rewrite of the rows keeps what they skip."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bundlegen.graph import Case
from bundlegen.harness import bundles as B
from bundlegen.harness.config import EngineConfig, load_engine_config
from bundlegen.workspace import builtin_bundle_root, package_root

ENGINES = package_root() / "engines"


def every_case() -> tuple[tuple[Case, ...], object]:
    """Every case of the checked-in bundles (the top level holds the lower ones) and the manifest."""
    root = builtin_bundle_root()
    manifest = B.manifest_of(root)
    return B.load_level(root, manifest.levels[-1].name, manifest.plan).cases, manifest


def harvest_environment() -> tuple[str, dict[str, str]]:
    """The one arch and versions torch-cudnn's claims cite (each evidence file the same)."""
    evidence = json.loads((ENGINES / "torch_cudnn" / "claims.json").read_text())["evidence"]
    (arch, cited), = evidence.items()
    versions = {json.dumps(r["versions"], sort_keys=True) for r in cited["results"]}
    (only,) = versions
    return arch, json.loads(only)


def skipped(config: EngineConfig, cases, arch: str, versions: dict[str, str]) -> dict[str, str]:
    found = {c.id: config.skip_reason(c, arch, versions) for c in cases}
    return {case_id: detail for case_id, detail in sorted(found.items()) if detail is not None}


def record(revision: str) -> dict:
    cases, manifest = every_case()
    arch, versions = harvest_environment()
    out = {}
    for folder in sorted(p.parent.name for p in ENGINES.glob("*/engine.toml")):
        text = subprocess.run(["git", "show", f"{revision}:engines/{folder}/engine.toml"], cwd=package_root(),
                              capture_output=True, text=True, check=True).stdout
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "engine.toml").write_text(text)
            out[folder] = skipped(load_engine_config(tmp, manifest), cases, arch, versions)
    return {"revision": revision, "arch": arch, "versions": versions, "skipped": out}


if __name__ == "__main__":
    json.dump(record(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
