"""Greedy n-way row proposal: allpairspy 2.5.1's AllPairs, row for row, without its cost.

Case ids are hashes of what the rows produce, so the proposal must give exactly the rows
allpairspy gives, in its order: the same search (grow a row one axis at a time, each axis's
values tried best first, the caller's filter judging every prefix, back up an axis when no
value passes), the same weights and the same tie-breaking (each axis keeps its order from
one re-weighing to the next and is re-sorted stably). What differs is the bookkeeping.
allpairspy keeps every covered combination as a tuple of value-id strings and, to weigh a
value, builds the set of every combination of the row so far plus that value and subtracts
the covered ones; here a value is an integer and the covered combinations are bitmasks, so
weighing a value counts only the combinations it takes part in (those of the prefix alone
are the same for every value of the axis, so leaving them out changes no order).

Only the list-of-lists form of AllPairs' parameters is supported (rows come back as lists).
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Iterator, Sequence


def all_pairs(params: Sequence[Sequence], filter_func: Callable[[list], bool] = lambda row: True,
              previously_tested: Sequence[Sequence] | None = None, n: int = 2) -> Iterator[list]:
    """allpairspy's `AllPairs(params, filter_func, previously_tested, n)` rows, as lists.

    Like AllPairs, the parameters and the previously tested rows are checked (and the
    filter called on those rows) here, before the first row is asked for."""
    _check_params(params)
    storage = _Covered(params, n)
    for row in previously_tested or ():
        if row:
            storage.add(_tested_ids(storage, row, filter_func))
    return _rows(storage, filter_func)


def _check_params(params: Sequence[Sequence]) -> None:
    if len(params) < 2:
        raise ValueError("must provide more than one option")
    if any(not values for values in params):
        raise ValueError("each parameter arrays must have at least one item")


def _tested_ids(storage: "_Covered", row: Sequence, filter_func) -> list[int]:
    if len(row) != len(storage.order):
        raise RuntimeError("previously tested combination is not complete")
    if not filter_func(row):
        raise ValueError("invalid tested combination is provided")
    ids = []
    for axis, value in enumerate(row):
        found = [g for g in storage.axis_ids[axis] if storage.values[g] == value]
        if len(found) != 1:
            raise ValueError("value from previously tested combination is not found in the "
                             "parameters or found more than once")
        ids.append(found[0])
    return ids


def _rows(storage: "_Covered", filter_func) -> Iterator[list]:
    while storage.unique < storage.expected:
        before = storage.unique
        chosen = _search(storage, filter_func)
        if chosen is None:
            return
        storage.add(chosen)
        if storage.unique == before:   # the row covers nothing new: allpairspy stops here
            return
        yield [storage.values[g] for g in chosen]


def _search(storage: "_Covered", filter_func) -> list[int] | None:
    """One row, as allpairspy's __next__ searches it (None where it gives up)."""
    order, values = storage.order, storage.values
    width = len(order)
    chosen: list[int] = [0] * width
    row: list = [None] * width            # chosen's values, what the filter judges
    masks = [0] * (width + 1)             # masks[i]: the bitmask of chosen[:i]
    tried = [0] * width
    forward, i = True, 0
    while 0 <= i < width:
        if forward:
            storage.resort(chosen, i, masks[i])
            tried[i] = 0
        else:
            tried[i] += 1
            if tried[i] >= len(order[i]):
                if i == 0:
                    return None
                i -= 1
                continue
        g = chosen[i] = order[i][tried[i]]
        row[i] = values[g]
        forward = bool(filter_func(row[:i + 1]))
        if forward:
            masks[i + 1] = masks[i] | 1 << g
            i += 1
    return chosen


class _Covered:
    """allpairspy's PairsStorage over integer value ids, plus each axis's current order.

    For a size s >= 2, `masks[s][key]` is the bitmask of the first ids of the covered
    combinations whose other s - 1 ids are `key` (a tuple; for s == 2 the bare id)."""

    def __init__(self, params: Sequence[Sequence], n: int):
        self.n = n
        self.values: list = []
        self.axis_ids: list[list[int]] = []
        for axis_values in params:
            start = len(self.values)
            self.values.extend(axis_values)
            self.axis_ids.append(list(range(start, len(self.values))))
        self.order = [list(ids) for ids in self.axis_ids]
        count = len(self.values)
        self.expected = sum(math.prod(c) for c in itertools.combinations([len(v) for v in params], n))
        self.unique = 0
        self.seen = [False] * count
        self.counter = [0] * count
        self.ins = [0] * count           # bitmask of ids before this one in a covered combination
        self.outs = [0] * count
        self.out_count = [0] * count
        self.in_count = [0] * count
        self.masks: list[dict] = [{} for _ in range(n + 1)]
        # what one row adds to a value's counter besides its first appearance: one per
        # combination of sizes 2..n it takes part in (allpairspy counts every addition)
        self.per_row = sum(math.comb(len(params) - 1, s - 1) for s in range(2, n + 1))
        # for n == 2 every weight of a value but the first is the same whatever the row
        # being grown holds: kept per value, updated as rows are added
        self.pair_rest = [self._weight(g, [], 0)[1:] for g in range(count)]

    def add(self, row: list[int]) -> None:
        """allpairspy's add_sequence: every combination of sizes 1..n of the row."""
        for s in range(2, self.n + 1):
            self._add_size(row, s)
        if self.n == 1:
            self.unique += sum(1 for g in row if not self.seen[g])
        pairs_seen = self.n >= 2 and len(row) >= 2
        before = 0
        for i, g in enumerate(row):
            if self.seen[g]:
                self.counter[g] += 1
            self.seen[g] = True
            self.counter[g] += self.per_row
            if pairs_seen:
                self.ins[g] |= before
                self.outs[g] |= _mask(row[i + 1:])
                self.in_count[g] = self.ins[g].bit_count()
                self.out_count[g] = self.outs[g].bit_count()
            before |= 1 << g
            if self.n == 2:
                self.pair_rest[g] = self._weight(g, [], 0)[1:]

    def _add_size(self, row: list[int], s: int) -> None:
        masks = self.masks[s]
        for combo in itertools.combinations(row, s):
            key = combo[1] if s == 2 else combo[1:]
            old = masks.get(key, 0)
            new = old | (1 << combo[0])
            if new != old:
                masks[key] = new
                if s == self.n:
                    self.unique += 1

    def resort(self, chosen: list[int], axis: int, prefix_mask: int) -> None:
        """allpairspy's __resort_working_array: weigh every value of the axis against the
        row's first `axis` values (`prefix_mask`: their bitmask), then sort the axis's order
        stably by the weights."""
        prefix = chosen[:axis]
        order = self.order[axis]
        if self.n == 2:   # the plan's pair suites: _weight's weights, one bitmask test each
            pairs, width, rest = self.masks[2], len(prefix), self.pair_rest
            weight = {g: ((prefix_mask & pairs.get(g, 0)).bit_count() - width,) + rest[g] for g in order}
        else:
            weight = {g: self._weight(g, prefix, prefix_mask) for g in order}
        order.sort(key=weight.__getitem__)

    def _weight(self, g: int, prefix: list[int], prefix_mask: int) -> tuple:
        # allpairspy: [-new n-combinations, outbound links, new (n-1)-, ..., new 1-combinations,
        # -times used, -inbound links]; "new" counts only those holding g (see the module)
        new = [self._uncovered(g, prefix, prefix_mask, s) for s in range(self.n, 0, -1)]
        return (-new[0], self.out_count[g], *new[1:], -self.counter[g], -self.in_count[g])

    def _uncovered(self, g: int, prefix: list[int], prefix_mask: int, s: int) -> int:
        """How many combinations of size s made of g and s - 1 prefix values are not covered."""
        if s == 1:
            return 0 if self.seen[g] else 1
        masks = self.masks[s]
        if s == 2:
            return len(prefix) - (prefix_mask & masks.get(g, 0)).bit_count()
        covered = sum((prefix_mask & masks.get((*middle, g), 0)).bit_count()
                      for middle in itertools.combinations(prefix, s - 2))
        return math.comb(len(prefix), s - 1) - covered


def _mask(ids: Sequence[int]) -> int:
    out = 0
    for g in ids:
        out |= 1 << g
    return out
