"""Pair coverage: allpairspy proposes rows, then the generator proves coverage itself.

The universe of a scope is every (axis value, axis value) pair of two different axes in
the scope that some legal full combination contains (allpairspy's filtering is known to
drop such pairs, so its output is never trusted). Missing pairs get repair rows: the
cheapest legal completion of each, skipping pairs an earlier repair already covers.
"""
from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Iterable

from allpairspy import AllPairs

from bundlegen.generator.errors import PlanError
from bundlegen.generator.legality import Legality
from bundlegen.generator.records import Combo, PairProof
from bundlegen.plans.records import PairSuite

SCOPES = ("values", "core", "all")


def scope_positions(legality: Legality, scope: str) -> tuple[int, ...]:
    if scope not in SCOPES:
        raise PlanError(f"unknown pair scope {scope!r} (known: {', '.join(SCOPES)})")
    if scope == "core":
        return tuple(p for p, a in enumerate(legality.space.axes) if a.core)
    return tuple(range(len(legality.axes)))


# ----------------------------------------------------------------------------- proposal
def suite_rows(legality: Legality, suite: PairSuite) -> list[Combo]:
    """allpairspy over the suite's axes (value indices, so the output does not depend on
    string hashing), axes outside the scope held at their defaults. Extension axes
    (Axis.extension) are held at their defaults for a first pass, whose rows are the ones
    the suite gave before they were added; a second pass, told those rows are tested, adds
    the rows for the pairs the extension axes take part in."""
    scope = scope_positions(legality, suite.scope)
    extension = [p for p in scope if legality.space.axes[p].extension]
    first = _proposed(legality, suite, [p for p in scope if p not in extension])
    if not extension:
        return first
    return first + _proposed(legality, suite, list(scope), tested=first)


def _proposed(legality: Legality, suite: PairSuite, positions: list[int],
              tested: list[Combo] = ()) -> list[Combo]:
    # largest axes first: allpairspy re-weighs every value of an axis against the values
    # already chosen in the row, so this order does the least work (and gives fewer rows)
    scope = tuple(sorted(positions, key=lambda p: (-len(legality.values[p]), p)))
    base: list[int | None] = [None] * len(legality.axes)
    for p, axis in enumerate(legality.space.axes):
        if p not in scope:
            base[p] = axis.values.index(axis.default)
    checks_at: list[list] = [[] for _ in scope]
    for c in legality.compiled:
        read = {a for a, _ in c.when + c.require}
        inside = [scope.index(p) for p in read if p in scope]
        if not inside:
            if c.violated(base):
                raise PlanError(f"pair suite '{suite.item}': the defaults outside its scope break "
                                f"rule '{c.rule.name}'")
            continue
        checks_at[max(inside)].append(c)

    def legal_prefix(prefix: list[int]) -> bool:
        # allpairspy grows a row one value at a time and has accepted every shorter prefix,
        # so only the rules that become decidable at the newest value need checking.
        checks = checks_at[len(prefix) - 1]
        if not checks:
            return True
        row = list(base)
        for i, v in enumerate(prefix):
            row[scope[i]] = v
        return not any(c.violated(row) for c in checks)

    params = [list(range(len(legality.values[p]))) for p in scope]
    index = [{v: i for i, v in enumerate(legality.values[p])} for p in range(len(legality.axes))]
    prior = [[index[p][combo[p]] for p in scope] for combo in tested]
    combos = []
    for proposed in AllPairs(params, filter_func=legal_prefix, previously_tested=prior or None):
        row = list(base)
        for i, v in enumerate(proposed):
            row[scope[i]] = v
        combos.append(tuple(legality.values[p][v] for p, v in enumerate(row)))
    return combos


# ----------------------------------------------------------------------------- proof
def _units(legality: Legality, combo: Combo, scope: tuple[int, ...], single: bool):
    names = legality.axes
    if single:
        return (((names[p], combo[p]),) for p in scope)
    return (((names[p], combo[p]), (names[q], combo[q])) for p, q in itertools.combinations(scope, 2))


@lru_cache(maxsize=16)
def _universe(legality: Legality, scope_name: str) -> tuple[frozenset, frozenset]:
    scope = scope_positions(legality, scope_name)
    names, values = legality.axes, legality.values
    legal, illegal = set(), set()
    if scope_name == "values":
        for p in scope:
            for v in values[p]:
                unit = ((names[p], v),)
                (legal if legality.complete({names[p]: v}) is not None else illegal).add(unit)
        return frozenset(legal), frozenset(illegal)
    for p, q in itertools.combinations(scope, 2):
        for a in values[p]:
            for b in values[q]:
                unit = ((names[p], a), (names[q], b))
                (legal if legality.complete({names[p]: a, names[q]: b}) is not None else illegal).add(unit)
    return frozenset(legal), frozenset(illegal)


def universe(legality: Legality, scope: str) -> frozenset:
    """Every legal unit of the scope: single values for 'values', else value pairs."""
    return _universe(legality, scope)[0]


def illegal_units(legality: Legality, scope: str) -> frozenset:
    return _universe(legality, scope)[1]


def covered_units(legality: Legality, combos: Iterable[Combo], scope: str) -> set:
    positions = scope_positions(legality, scope)
    out: set = set()
    for combo in combos:
        out.update(_units(legality, combo, positions, scope == "values"))
    return out


def prove(legality: Legality, level: str, scope: str, combos: Iterable[Combo]) -> PairProof:
    legal = universe(legality, scope)
    covered = covered_units(legality, combos, scope) & legal
    missing = tuple(sorted(legal - covered))
    return PairProof(level=level, scope=scope, total=len(legal), covered=len(covered), missing=missing)


def repair_rows(legality: Legality, missing: Iterable[tuple], scope: str) -> list[Combo]:
    """One cheapest legal completion per missing unit, skipping units an earlier repair covers."""
    rows: list[Combo] = []
    covered: set = set()
    for unit in sorted(missing):
        if unit in covered:
            continue
        combo = legality.complete(dict(unit))
        if combo is None:   # cannot happen for a unit of the legal universe
            raise PlanError(f"pair {unit}: no legal combination holds it")
        rows.append(combo)
        covered |= covered_units(legality, [combo], scope)
    return rows
