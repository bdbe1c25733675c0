"""The support matrix's record of tolerance overrides: every `[[tolerance_overrides]]` row
of an engine's engine.toml whose numbers are not the plan's own for the class it names (the
rows `bundlegen tolerances` generates carry the plan's numbers and are left out). A run
refuses a tolerance TOML that differs from the plan's derivation, so such a row is the one
way a workspace judges an engine with looser numbers: explicit, named by its file and
index in every result that takes it, and listed here."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from bundlegen.harness.config import EngineConfig, OverrideRow
from bundlegen.manifest import Manifest

TITLE = "## Tolerance overrides"
INTRO = ("Rows of an engine's engine.toml that judge some of its cases with numbers other than their "
         "tolerance class's (each result names the row it took).")


def own_numbers(row: OverrideRow, manifest: Manifest) -> bool:
    """Whether the row names one class of the plan and carries exactly its numbers."""
    name = row.filters.get("tolerance_class")
    tc = manifest.tolerance_classes.get(name) if isinstance(name, str) else None
    return (tc is not None and row.filters.get("plan") in (None, manifest.plan)
            and (tc.rtol, tc.atol) == (row.rtol, row.atol))


def override_section(configs: Mapping[str, EngineConfig], manifest: Manifest, root: Path) -> str:
    """The section's markdown ('' when no engine overrides its numbers), engines by name."""
    rows = []
    for engine in sorted(configs):
        config = configs[engine]
        source = Path(config.source)
        shown = Path(os.path.relpath(source, root)).as_posix() if source.is_absolute() else config.source
        for row in config.overrides:
            if own_numbers(row, manifest):
                continue
            filters = ", ".join(f"{k}={v if isinstance(v, str) else '|'.join(v)}" for k, v in sorted(row.filters.items()))
            rows.append(f"| {engine} | `{shown}` tolerance_overrides[{row.index}] | {filters or '(every case)'} "
                        f"| {row.rtol:g} | {row.atol:g} |")
    if not rows:
        return ""
    return "\n".join(["", TITLE, "", INTRO, "", "| engine | row | filters | rtol | atol |",
                      "|---|---|---|---|---|", *rows, ""])
