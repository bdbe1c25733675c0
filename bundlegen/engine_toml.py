"""The keys an engine TOML may hold, read by the harness (bundlegen.harness.config, which
checks every row) and by `bundlegen tolerances` (which refuses to write its block into a
file the harness would refuse): one list for both."""
from __future__ import annotations

from typing import Any

#: the keys of engine.toml, of its [meta] table and of a [[tolerance_overrides]] row
ENGINE_TOML_KEYS = ("meta", "tolerance_overrides", "test_skips")
META_KEYS = ("name",)
OVERRIDE_KEYS = ("filters", "rtol", "atol", "k", "floor")


def unknown_key(doc: Any) -> str | None:
    """`<key>: unknown key (known: ...)` for the first top-level or [meta] key an engine TOML
    may not hold; None when there is none."""
    if not isinstance(doc, dict):
        return None
    for key in doc:
        if key not in ENGINE_TOML_KEYS:
            return f"{key}: unknown key (known: {', '.join(ENGINE_TOML_KEYS)})"
    meta = doc.get("meta")
    for key in meta if isinstance(meta, dict) else ():
        if key not in META_KEYS:
            return f"meta.{key}: unknown key (known: {', '.join(META_KEYS)})"
    return None
