"""Pair coverage: allpairspy's greedy search proposes rows, then the generator proves coverage itself.

The universe of a scope is every (axis value, axis value) pair of two different axes in
the scope that some legal full combination contains (allpairspy's filtering is known to
drop such pairs, so its output is never trusted). Missing pairs get repair rows: the
cheapest legal completion of each, skipping pairs an earlier repair already covers.
allpairspy's search runs here as allpairs_fast.all_pairs: the same rows, much faster.
"""
from __future__ import annotations

import itertools
import operator
from functools import lru_cache
from typing import Iterable

from bundlegen.generator.allpairs_fast import all_pairs
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
    string hashing), axes outside the scope held at their defaults, in passes: each axis
    and value takes part from the pass it joined (Axis.pass_joined, Axis.value_pass). The
    first pass gives the rows the suite gave before anything joined later; each later
    pass, told every earlier row is tested, adds the rows for the pairs the newcomers take
    part in."""
    scope = scope_positions(legality, suite.scope)
    axes = legality.space.axes
    rows: list[Combo] = []
    for k in passes(legality, suite.scope):
        positions = [p for p in scope if axes[p].pass_joined <= k]
        allowed = {p: [i for i, v in enumerate(axes[p].values) if axes[p].value_pass(v) <= k] for p in positions}
        rows += propose(legality, f"pair suite '{suite.item}'", allowed, tested=rows)
    return rows


def passes(legality: Legality, scope: str) -> list[int]:
    """The pair-suite passes the scope's axes and values joined, in order."""
    axes = legality.space.axes
    return sorted({axes[p].value_pass(v) for p in scope_positions(legality, scope) for v in axes[p].values})


def combo_pass(legality: Legality, combo: Combo) -> int:
    """The latest pass a value of the combination other than its axis's default joined."""
    axes = legality.space.axes
    return max((a.value_pass(v) for a, v in zip(axes, combo) if v != a.default), default=0)


def unit_pass(legality: Legality, unit: tuple) -> int:
    """The pass a unit of the proof joined: its latest value's (an axis's default included)."""
    axes = legality.space.axes
    return max(axes[legality.position[a]].value_pass(v) for a, v in unit)


#: propose()'s rows by what they depend on (the space's axes and rules, the allowed values,
#: the rows already tested, n): a process that builds plans differing only in their levels,
#: costs or entries (a calibration, the tests) runs each search once
_PROPOSED: dict[tuple, tuple[Combo, ...]] = {}
_PROPOSED_KEPT = 32


def propose(legality: Legality, label: str, allowed: dict[int, list[int]], tested: list[Combo] = (),
            n: int = 2) -> list[Combo]:
    """allpairspy's rows covering the n-way combinations of the `allowed` value indices
    (axis position -> indices), every other axis at its default, legal rows only (its
    coverage is not trusted: callers prove it)."""
    key = (repr(legality.space.axes), repr(legality.space.rules),
           tuple((p, tuple(v)) for p, v in allowed.items()), tuple(tested), n)
    if key not in _PROPOSED:
        if len(_PROPOSED) >= _PROPOSED_KEPT:
            _PROPOSED.pop(next(iter(_PROPOSED)))
        _PROPOSED[key] = tuple(_propose(legality, label, allowed, tested, n))
    return list(_PROPOSED[key])


def _propose(legality: Legality, label: str, allowed: dict[int, list[int]], tested, n: int) -> list[Combo]:
    # largest axes first: the search re-weighs every value of an axis against the values
    # already chosen in the row, so this order does the least work (and gives fewer rows)
    positions = list(allowed)
    scope = tuple(sorted(positions, key=lambda p: (-len(allowed[p]), p)))
    base: list[int | None] = [None] * len(legality.axes)
    for p, axis in enumerate(legality.space.axes):
        if p not in scope:
            base[p] = axis.values.index(axis.default)
    params = [allowed[p] for p in scope]
    index = [{v: i for i, v in enumerate(legality.values[p])} for p in range(len(legality.axes))]
    prior = [[index[p][combo[p]] for p in scope] for combo in tested]
    combos = []
    legal_prefix = _prefix_filter(legality, label, scope, base)
    for proposed in all_pairs(params, filter_func=legal_prefix, previously_tested=prior or None, n=n):
        row = list(base)
        for i, v in enumerate(proposed):
            row[scope[i]] = v
        combos.append(tuple(legality.values[p][v] for p, v in enumerate(row)))
    return combos


def _prefix_filter(legality: Legality, label: str, scope: tuple[int, ...], base: list[int | None]):
    """The search's filter: whether a row's first values (of the scope's axes, in order;
    every other axis at `base`) break no rule."""
    checks_at: list[list] = [[] for _ in scope]
    for c in legality.compiled:
        read = {a for a, _ in c.when + c.require}
        inside = [scope.index(p) for p in read if p in scope]
        if not inside:
            if c.violated(base):
                raise PlanError(f"{label}: the defaults outside its scope break "
                                f"rule '{c.rule.name}'")
            continue
        checks_at[max(inside)].append(c)
    # a depth's checks read only a few prefix entries (the rest of the row they judge is
    # `base`): their verdict is kept per value of those entries, asked once
    reads_at = [sorted({(a, scope.index(a)) for c in checks for a, _ in c.when + c.require if a in scope})
                for checks in checks_at]
    read_at = [operator.itemgetter(*(i for _, i in reads)) if reads else None for reads in reads_at]
    verdicts: list[dict] = [{} for _ in scope]
    judged = list(base)

    def legal_prefix(prefix: list[int]) -> bool:
        # the search grows a row one value at a time and has accepted every shorter prefix,
        # so only the rules that become decidable at the newest value need checking.
        depth = len(prefix) - 1
        if not checks_at[depth]:
            return True
        read = read_at[depth](prefix)
        verdict = verdicts[depth].get(read)
        if verdict is None:
            for p, i in reads_at[depth]:
                judged[p] = prefix[i]
            verdict = verdicts[depth][read] = not any(c.violated(judged) for c in checks_at[depth])
        return verdict

    return legal_prefix


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


def pack_rows(legality: Legality, missing: Iterable[tuple], held_by, label: str) -> list[Combo]:
    """Rows for missing units of several values each (pairs, triples): each row starts from
    the first unit left and takes every later one that agrees with it and keeps it legal;
    `held_by(combo)` is the set of units a row holds."""
    left = sorted(missing)
    rows: list[Combo] = []
    while left:
        fixed = dict(left[0])
        for u in left[1:]:
            if all(fixed.get(a, v) == v for a, v in u) and not all(a in fixed for a, _ in u):
                trial = {**fixed, **dict(u)}
                if legality.complete(trial) is not None:
                    fixed = trial
        combo = legality.complete(fixed)
        if combo is None:   # cannot happen for a unit of the legal universe
            raise PlanError(f"{label} {left[0]}: no legal combination holds it")
        rows.append(combo)
        covered = held_by(combo)
        left = [u for u in left if u not in covered]
    return rows


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
