"""The generated block of a hipDNN engine TOML (`config/<ENGINE>.toml`): one
`[[tolerance_overrides]]` row per tolerance class, whose `filters` are the full GTest names
of the exported cases of that class, and one `[[test_skips]]` row per skip row of the
engine (`ticket - reason`, its archs) naming the valid graphs it covers. hipDNN matches
filters as globs against the full name; an exact name matches itself only, as none holds
`*`, `?` or `[`. Between the markers of bundlegen.tolerance_block; everything else stays
byte for byte (its `refresh`).

hipDNN compares with allclose (|out - ref| <= atol + rtol * |ref|), where our classes bound
by the magnitude of the terms summed (docs/CONTRACTS.md, "Tolerance semantics"), which is
never below |ref|: the same numbers are at least as strict there, stricter where a sum cancels."""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Mapping, Sequence

from bundlegen.tolerance import Tolerance
from bundlegen.tolerance_block import BEGIN, END
from bundlegen.claims.hipdnn_export import Export
from bundlegen.claims.hipdnn_quarantine import KnownDefect


def class_names(export: Export) -> dict[str, list[str]]:
    """tolerance class -> the full GTest names of the exported cases of that class (probes
    name none: they never run to a comparison)."""
    out: dict[str, list[str]] = defaultdict(list)
    for e in export.exported:
        if e.case.tolerance_class is not None:
            out[e.case.tolerance_class].append(e.placement.gtest_name)
    return {k: sorted(v) for k, v in out.items()}


def block_text(export: Export, classes: Mapping[str, Tolerance], skips: Sequence[KnownDefect],
               source: str) -> str:
    """BEGIN line to END line (no newline after END)."""
    names = class_names(export)
    lines = [BEGIN, f"# Written by `bundlegen tolerances --format hipdnn` from {source}.",
             "# Do not edit between the markers: run the command again after `bundlegen export hipdnn`.",
             "# A row's filters are the exported cases of one tolerance class, by full GTest name."]
    for name, tc in classes.items():
        if names.get(name):
            lines += ["", f"# {name}: {tc.dtype} io", "[[tolerance_overrides]]",
                      "filters = [", *(f"  {json.dumps(n)}," for n in names[name]), "]",
                      f"atol = {float(tc.atol)!r}", f"rtol = {float(tc.rtol)!r}"]
    for defect in skips:
        lines += ["", "[[test_skips]]"]
        if defect.archs is not None:
            lines.append(f"archs = {json.dumps(list(defect.archs))}")
        reason = f"{defect.ticket} - " + " ".join(defect.reason.split())
        lines += ["filters = [", *(f"  {json.dumps(n)}," for n in defect.names), "]",
                  f"reason = {json.dumps(reason)}"]
    lines += ["", END]
    return "\n".join(lines)
