"""The JSON Schemas of the files an adopter writes, published in the package
(bundlegen/schemas/, package data) for editors and CI checks: bundlegen.toml, lanes.yaml and
one engine.toml [[test_skips]] row. Each is built from the tables its loader checks by
(workspace_schema, lanes_schema, skip_row_schema); the loaders keep their own checks (jsonschema
is no dependency) and tests/test_schemas.py holds both to the same answers and these files
to their builders. `python -m bundlegen.harness.schema_files` writes them again."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from bundlegen.harness.config import skip_row_schema
from bundlegen.harness.lanes import lanes_schema
from bundlegen.workspace import workspace_schema

#: file name under bundlegen/schemas -> its builder
SCHEMAS: dict[str, Callable[[], dict]] = {
    "bundlegen-toml.schema.json": workspace_schema,
    "lanes-yaml.schema.json": lanes_schema,
    "test-skips-row.schema.json": skip_row_schema,
}


def schema_dir() -> Path:
    """bundlegen/schemas beside the package's own __init__ (a checkout and a wheel alike)."""
    import bundlegen

    return Path(bundlegen.__file__).resolve().parent / "schemas"


def schema_text(name: str) -> str:
    return json.dumps(SCHEMAS[name](), indent=2, ensure_ascii=False) + "\n"


def write_schemas(folder: Path | None = None) -> list[Path]:
    folder = schema_dir() if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SCHEMAS:
        (folder / name).write_text(schema_text(name), encoding="utf-8")
        written.append(folder / name)
    return written


if __name__ == "__main__":
    for path in write_schemas(Path(sys.argv[1]) if len(sys.argv) > 1 else None):
        print(f"wrote {path}")
