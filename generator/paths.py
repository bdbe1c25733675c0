"""Where the generator reads and writes."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLE_ROOT = REPO_ROOT / "bundles"
ENGINES_DIR = "engines"


def bundle_relpath(level: str, plan: str, group: str) -> str:
    """bundles/<level>/<plan>/<group>.json, relative to the repository root."""
    return f"bundles/{level}/{plan}/{group}.json"


def engine_toml_relpath(engine_dir: str) -> str:
    return f"{ENGINES_DIR}/{engine_dir}/engine.toml"
