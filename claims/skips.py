"""Where a skipped case's skip comes from, for the support matrix's footnotes. A skipped
result carries only its detail; the detail names its source:
- a size limit of the device or level: `too large for cpu` (the plan's CPU case limit: the
  cost model predicts the case slower than it on a CPU) or `too large: ...` (the case's
  peak memory passes its level's per-case byte ceiling), both bundlegen.harness.verdicts;
- an engine.toml `[[test_skips]]` row: the row's detail (`ticket: reason`), matched against
  the rows of the engine's engine.toml; a row with `seen_with` applies only at the library
  versions it names, and the note says so;
- anything else: a skip row the engine's engine.toml does not hold (a lanes.yaml lane's
  `skips`, or a row removed since the run)."""
from __future__ import annotations

from typing import Sequence

from bundlegen.harness.config import SkipRow
from bundlegen.harness.verdicts import TOO_LARGE, TOO_LARGE_FOR_CPU

CPU_LIMIT_NOTE = ("skipped on the CPU: the cost model predicts the case slower than the plan's CPU case limit "
                  "(a size limit of the device, not a defect; run it on a GPU)")
MEMORY_NOTE = ("skipped: the case's peak memory passes its level's per-case byte ceiling (a size limit "
               "of the level, not a defect)")


def is_size_limit(detail: str) -> bool:
    return detail == TOO_LARGE_FOR_CPU or detail.startswith(TOO_LARGE)


def skip_note(detail: str, rows: Sequence[SkipRow] = (), engine_toml: str | None = None) -> str:
    """One footnote text for the skips with this detail on one engine (`rows`: its
    engine.toml's [[test_skips]], `engine_toml`: a link to that file from the matrix)."""
    if detail == TOO_LARGE_FOR_CPU:
        return CPU_LIMIT_NOTE
    if detail.startswith(TOO_LARGE):
        return MEMORY_NOTE
    where = f"[engine.toml]({engine_toml})" if engine_toml else "engine.toml"
    for row in rows:
        if row.detail == detail:
            scope = [f"on {', '.join(row.archs)}"] if row.archs else []
            if row.seen_with:
                versions = ", ".join(f"{lib} {spec.text}" for lib, spec in sorted(row.seen_with.items()))
                scope.append(f"seen with {versions}: the row applies only at those versions")
            shown = f" ({'; '.join(scope)})" if scope else ""
            return f"skipped by a `[[test_skips]]` row of the engine's {where}{shown}: {detail}"
    holder = f"the engine's {where} does not hold" if rows or engine_toml else "in no engine.toml of the engine"
    return (f"skipped by a skip row {holder} (a lanes.yaml lane's `skips`, or a row removed since the run): "
            f"{detail}")
