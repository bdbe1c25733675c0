"""Legality of axis combinations: the plan's rules compiled to index form, a completion
search (the least-cost legal combination containing some fixed values) and the
per-rule exclusion counts for the report."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Mapping

from bundlegen.generator.records import Combo, RuleExclusion
from bundlegen.plans.records import Rule, Space


@dataclass(frozen=True)
class _Compiled:
    rule: Rule
    when: tuple[tuple[int, frozenset[int]], ...]      # (axis position, allowed value indices)
    require: tuple[tuple[int, frozenset[int]], ...]

    def violated(self, row: list[int | None]) -> bool:
        """True when `row` (value index per axis) breaks the rule; every axis it reads is set."""
        return (all(row[a] in vals for a, vals in self.when)
                and not all(row[a] in vals for a, vals in self.require))

    def doomed(self, row: list[int | None]) -> bool:
        """True when `row`, set only in part, breaks the rule whatever its unset axes take:
        every `when` axis is set and matches, and a set `require` axis does not."""
        return (all(row[a] is not None and row[a] in vals for a, vals in self.when)
                and any(row[a] is not None and row[a] not in vals for a, vals in self.require))


class Legality:
    """Over one axis space of a plan (its padded or its ragged one): its axes and rules."""

    def __init__(self, space: Space):
        self.space = space
        self.axes = tuple(a.name for a in space.axes)
        self.values = tuple(a.values for a in space.axes)
        self.index = tuple({v: i for i, v in enumerate(a.values)} for a in space.axes)
        self.position = {name: i for i, name in enumerate(self.axes)}
        # completion tries the default first, then the declared order (cheapest first)
        self.preference = tuple(
            (a.values.index(a.default),) + tuple(i for i in range(len(a.values)) if a.values[i] != a.default)
            for a in space.axes)
        self.compiled = tuple(self._compile(r) for r in space.rules)

    def _compile(self, rule: Rule) -> _Compiled:
        def side(cond: Mapping[str, tuple[str, ...]]):
            return tuple((self.position[ax], frozenset(self.index[self.position[ax]][v] for v in vals))
                         for ax, vals in sorted(cond.items()))
        when, require = side(rule.when), side(rule.require)
        return _Compiled(rule, when, require)

    # ------------------------------------------------------------------ checks
    def to_row(self, combo: Combo) -> list[int]:
        return [self.index[p][v] for p, v in enumerate(combo)]

    def broken_rules(self, combo: Combo) -> tuple[str, ...]:
        row = self.to_row(combo)
        return tuple(c.rule.name for c in self.compiled if c.violated(row))

    def is_legal(self, combo: Combo) -> bool:
        return not self.broken_rules(combo)

    # ------------------------------------------------------------------ completion
    def complete(self, fixed: Mapping[str, str]) -> Combo | None:
        """The first legal combination (in preference order) holding every `fixed` value,
        or None when there is none."""
        row: list[int | None] = [None] * len(self.axes)
        for a, v in fixed.items():
            row[self.position[a]] = self.index[self.position[a]][v]
        free = [row[p] is None for p in range(len(row))]
        first = [row[p] if not free[p] else self.preference[p][0] for p in range(len(row))]
        if not any(c.violated(first) for c in self.compiled):   # the usual case: defaults fit
            return tuple(self.values[p][i] for p, i in enumerate(first))
        # the values each axis may still take, in preference order: an axis no rule reads
        # takes its preferred value; a rule whose `when` the axes settled so far meet
        # narrows the axes it requires (until nothing changes). Only values no legal
        # combination holds are dropped, so the first legal combination stays the same.
        read = {a for c in self.compiled for a, _ in c.when + c.require}
        domains = [[row[p]] if not free[p] else list(self.preference[p]) if p in read
                   else [self.preference[p][0]] for p in range(len(row))]
        changed = True
        while changed:
            changed = False
            for c in self.compiled:
                if not all(len(domains[a]) == 1 and domains[a][0] in vals for a, vals in c.when):
                    continue
                for a, vals in c.require:
                    narrowed = [v for v in domains[a] if v in vals]
                    if not narrowed:
                        return None
                    if len(narrowed) != len(domains[a]):
                        domains[a], changed = narrowed, True
        # each rule is checked as soon as every axis it reads is set, and in part (doomed)
        # at every axis it reads
        decide_at: list[list[_Compiled]] = [[] for _ in row]
        reads_at: list[list[_Compiled]] = [[] for _ in row]
        for c in self.compiled:
            free_read = [a for a, _ in c.when + c.require if free[a]]
            if not free_read:
                if c.violated(row):
                    return None
                continue
            decide_at[max(free_read)].append(c)
            for a in set(free_read):
                reads_at[a].append(c)
        found = self._search(0, row, free, domains, decide_at, reads_at)
        return None if found is None else tuple(self.values[p][i] for p, i in enumerate(found))

    def _search(self, p: int, row: list, free: list[bool], domains: list, decide_at: list,
                reads_at: list) -> list[int] | None:
        if p == len(row):
            return list(row)
        if not free[p]:
            return self._search(p + 1, row, free, domains, decide_at, reads_at)
        for choice in domains[p]:
            row[p] = choice
            if not any(c.violated(row) for c in decide_at[p]) and not any(c.doomed(row) for c in reads_at[p]):
                found = self._search(p + 1, row, free, domains, decide_at, reads_at)
                if found is not None:
                    return found
        row[p] = None      # unset again: doomed() reads only the axes set so far
        return None

    # ------------------------------------------------------------------ report
    def exclusions(self, illegal_pairs: Iterable[tuple]) -> tuple[RuleExclusion, ...]:
        """Per rule: how many combinations of its own axes it excludes, and how many of the
        illegal value pairs it excludes on its own (a pair is blamed on every rule that
        rejects the pair's two values whatever the other axes hold)."""
        illegal_pairs = list(illegal_pairs)
        out = []
        for c in self.compiled:
            positions = sorted({a for a, _ in c.when + c.require})
            total = excluded = 0
            for values in itertools.product(*(range(len(self.values[p])) for p in positions)):
                row: list[int | None] = [None] * len(self.axes)
                for p, v in zip(positions, values):
                    row[p] = v
                total += 1
                excluded += c.violated(row)
            blamed = sum(1 for pair in illegal_pairs if self._pair_breaks(c, pair))
            out.append(RuleExclusion(c.rule.name, c.rule.reason, c.rule.axes, excluded, total, blamed))
        return tuple(out)

    def _pair_breaks(self, c: _Compiled, pair) -> bool:
        (a1, v1), (a2, v2) = pair
        fixed = {self.position[a1]: self.index[self.position[a1]][v1],
                 self.position[a2]: self.index[self.position[a2]][v2]}
        read = {a for a, _ in c.when + c.require}
        if not read <= set(fixed):
            return False
        row: list[int | None] = [None] * len(self.axes)
        for p, v in fixed.items():
            row[p] = v
        return c.violated(row)
