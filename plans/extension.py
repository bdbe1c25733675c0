"""The record a workspace plan extends the built-in plan with: only its additions and
removals. Declarations only; generator/extend.py interprets them.

A workspace plan module (named in its bundlegen.toml's `plans`) sets `PLAN = Extension(...)`.
`bundlegen generate` writes bundles of only the cases the extension adds; a run loads the
built-in plan's bundles (where the package installed them) and the extension's as one
level. docs/ADOPTING.md, "Your own plan", shows the whole loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from bundlegen.plans.records import CatalogEntry, Gated, Layout, MaskSpec, Probe, Regression


@dataclass(frozen=True)
class Budget:
    """A level's budgets for the built-in cases and the added ones together: `seconds` (h200,
    the level and every lower one, as Level.budget_seconds) and, for quick, `cpu_seconds`
    (a whole run on the cpu class, as Level.cpu_budget_seconds). None: the built-in level's."""
    level: str
    seconds: float | None = None
    cpu_seconds: float | None = None


@dataclass(frozen=True)
class Extension:
    """A plan that is the built-in plan (`extends`, a plan module) plus `regressions`,
    `catalog` entries and `probes` (padded or ragged: each entry's specs say which), named
    table entries they may use (`masks`, `scales`, `layouts`; a new name only), and level
    `budgets`; less the built-in items in `removed` and in `gated` (a Gated naming a built-in
    item leaves its cases out until its gate lifts; one naming a new item declares it).
    A built-in case leaves the run when any item it traces to is removed or gated."""
    name: str
    extends: str = "bundlegen.plans.sdpa_bwd"
    regressions: tuple[Regression, ...] = ()
    catalog: tuple[CatalogEntry, ...] = ()
    probes: tuple[Probe, ...] = ()
    masks: Mapping[str, MaskSpec] = field(default_factory=dict)
    scales: Mapping[str, float | None] = field(default_factory=dict)
    layouts: Mapping[str, Layout] = field(default_factory=dict)
    budgets: tuple[Budget, ...] = ()
    removed: tuple[str, ...] = ()
    gated: tuple[Gated, ...] = ()
