"""Rows of an engine configuration that select no case of the plan: a [[tolerance_overrides]]
or [[test_skips]] row whose filters match nothing (a misspelt item, a plan name of another
plan, cases the plan no longer has) does nothing, silently. `bundlegen run` warns of each
(a line with the row), `bundlegen lanes --check` reports each as an error. The whole plan
counts (every level): a row for pr cases is alive in a quick run."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from bundlegen.graph import Case
from bundlegen.harness.config import EngineConfig, Filter, filters_match


def _filters_text(filters: Iterable[Filter]) -> str:
    return ", ".join(json.dumps(dict(f), sort_keys=True) for f in filters)


def dead_rows(config: EngineConfig, cases: Iterable[Case]) -> tuple[str, ...]:
    """One line per row of `config` that selects none of `cases` (the whole plan's)."""
    cases = list(cases)
    plan = config.plan
    where = config.source
    lines = []
    for row in config.overrides:
        if not any(filters_match(row.filters, case, plan) for case in cases):
            lines.append(f"{where}: tolerance_overrides[{row.index}] ({_filters_text([row.filters])}) "
                         f"selects no case of plan {plan[0] if plan else '?'}")
    for index, row in enumerate(config.skips):
        if not any(row.selects(case, plan) for case in cases):
            lines.append(f"{where}: test_skips[{index}] ({row.detail}; filters {_filters_text(row.filters)}) "
                         f"selects no case of plan {plan[0] if plan else '?'}")
    return tuple(lines)


def plan_cases(root: Path | str, manifest) -> tuple[Case, ...]:
    """Every case of the plan: its highest level holds the lower ones."""
    from bundlegen.harness import bundles as B

    return B.load_level(root, manifest.levels[-1].name, manifest.plan).cases
