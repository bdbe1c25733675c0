"""The combinations view (`bundlegen matrix --combinations heads=gqa*,mask=window*,dtype`):
does an engine serve these values together? One row per combination of the chosen axes'
values (each axis `NAME` for every value, or `NAME=GLOB` for the values matching the glob)
that some case of the bundles holds; one cell per engine and arch that was run, by the
support matrix's rule (bundlegen.claims.matrix.cell_for) over the cases holding every value
of the row, counted over the levels the column's runs covered."""
from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass
from typing import Mapping, Sequence

from bundlegen.manifest import AxisItems
from bundlegen.claims.cases import BundleCases
from bundlegen.claims.matrix import Cell, Column, cell_for, covered_levels, served_items
from bundlegen.claims.store import ClaimSet


class CombinationError(ValueError):
    """A --combinations argument that names no axis of the plan, or a glob no value matches."""


@dataclass(frozen=True)
class AxisPick:
    axis: AxisItems
    values: tuple[tuple[str, str], ...]      # (value, AX- item) the glob chose, in plan order


@dataclass(frozen=True)
class CombinationRow:
    values: tuple[str, ...]
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Combinations:
    axes: tuple[str, ...]
    columns: tuple[Column, ...]
    rows: tuple[CombinationRow, ...]


def parse_picks(text: str, axes: Sequence[AxisItems]) -> tuple[AxisPick, ...]:
    """`heads=gqa*,mask=window*,dtype` -> one pick per axis."""
    by_name = {a.name: a for a in axes}
    picks = []
    for part in (p.strip() for p in text.split(",")):
        name, _, glob = part.partition("=")
        axis = by_name.get(name.strip())
        if axis is None:
            raise CombinationError(f"--combinations: {name.strip()!r} is no axis of the plan "
                                   f"(axes: {', '.join(by_name)})")
        glob = glob.strip() or "*"
        chosen = tuple((v, i) for v, i in zip(axis.values, axis.items) if fnmatch.fnmatchcase(v, glob))
        if not chosen:
            raise CombinationError(f"--combinations: no value of {axis.name} matches {glob!r} "
                                   f"(values: {', '.join(axis.values)})")
        picks.append(AxisPick(axis, chosen))
    return tuple(picks)


def combinations(picks: Sequence[AxisPick], cases: BundleCases, columns: Sequence[Column],
                 claim_sets: Mapping[str, ClaimSet]) -> Combinations:
    sets = {c.engine: claim_sets.get(c.engine) or ClaimSet(engine=c.engine) for c in columns}
    run = tuple(c for c in columns if c.arch in sets[c.engine].archs_run)
    scope = {c: cases.upto(levels[-1]) if (levels := covered_levels(sets[c.engine], c.arch, cases)) else frozenset()
             for c in run}
    served = {c: served_items(sets[c.engine].claimed(c.arch), cases.case_items) for c in run}
    rows = []
    for combo in itertools.product(*(p.values for p in picks)):
        items = frozenset(item for _, item in combo)
        held = frozenset.intersection(*(cases.items.get(i, frozenset()) for i in items))
        if not held:
            continue
        rows.append(CombinationRow(tuple(v for v, _ in combo), tuple(
            cell_for(held & scope[c], c, sets[c.engine], cases.case_items, items, served[c]) for c in run)))
    return Combinations(tuple(p.axis.name for p in picks), run, tuple(rows))


def combinations_text(view: Combinations) -> str:
    """A markdown table: one column per axis, then one per engine and arch."""
    header = [*view.axes, *(c.label for c in view.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join([*row.values, *(cell.text for cell in row.cells)]) + " |" for row in view.rows]
    if not view.rows:
        lines.append("no case of the bundles holds these values together")
    return "\n".join(lines) + "\n"
