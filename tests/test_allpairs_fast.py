"""generator/allpairs_fast.py gives allpairspy's rows exactly, in allpairspy's order.

Case ids are hashes of what the rows produce, so a proposal that differs from allpairspy's by
one row or one tie renames cases. Both are run on the same inputs and their rows compared:
every search a build of the plan makes (its pair suites and risk suites, with their real
filters and earlier passes' rows) and seeded random small spaces with filters, earlier rows
and n from 1 to 3. allpairspy is a test dependency for this alone.
"""
from __future__ import annotations

import random

import pytest
from allpairspy import AllPairs

from bundlegen.generator import pairs
from bundlegen.generator.allpairs_fast import all_pairs
from bundlegen.generator.generate import build


def _reference(params, filter_func=lambda row: True, previously_tested=None, n=2):
    return [list(row) for row in AllPairs(params, filter_func=filter_func,
                                          previously_tested=previously_tested, n=n)]


def _outcome(search, *args, **kwargs):
    """A search's rows, or the error it raised (type and message)."""
    try:
        return list(search(*args, **kwargs))
    except (ValueError, RuntimeError) as e:
        return (type(e).__name__, str(e))


def _random_space(rng: random.Random):
    """A few axes of 1-5 values, a few forbidden value pairs (judged on prefixes, as the
    generator's filter is), maybe some earlier rows, n 1-3."""
    params = [list(range(rng.randint(1, 5))) for _ in range(rng.randint(2, 6))]
    forbidden = []
    for _ in range(rng.randint(0, 4)):
        a, b = rng.sample(range(len(params)), 2)
        forbidden.append((a, rng.randrange(len(params[a])), b, rng.randrange(len(params[b]))))

    def legal(row):
        return not any(max(a, b) < len(row) and row[a] == x and row[b] == y for a, x, b, y in forbidden)

    tested = [[rng.choice(v) for v in params] for _ in range(rng.randint(0, 3))]
    return params, legal, [r for r in tested if legal(r)] or None, rng.choice([1, 2, 2, 3, 3])


@pytest.mark.parametrize("seed_block", range(4))
def test_random_spaces_give_allpairspys_rows(seed_block):
    compared = 0
    for seed in range(seed_block * 150, (seed_block + 1) * 150):
        params, legal, tested, n = _random_space(random.Random(seed))
        ours = _outcome(all_pairs, params, filter_func=legal, previously_tested=tested, n=n)
        theirs = _outcome(_reference, params, filter_func=legal, previously_tested=tested, n=n)
        assert ours == theirs, f"seed {seed}: params {params}, tested {tested}, n {n}"
        compared += isinstance(ours, list) and len(ours) > 0
    assert compared > 100


def test_bad_input_raises_what_allpairspy_raises():
    for args, kwargs in [(([[1, 2]],), {}), (([[1, 2], []],), {}),
                         (([[1, 2], [3]],), {"previously_tested": [[1]]}),
                         (([[1, 2], [3]],), {"previously_tested": [[1, 4]]}),
                         (([[1, 2], [3]],), {"previously_tested": [[2, 3]], "filter_func": lambda r: r[0] == 1})]:
        ours, theirs = _outcome(all_pairs, *args, **kwargs), _outcome(_reference, *args, **kwargs)
        assert isinstance(theirs, tuple) and ours == theirs, (args, kwargs)


def test_every_search_of_the_plans_build_gives_allpairspys_rows(monkeypatch):
    """Every other search of a build, in build order (allpairspy's side of all of them costs
    about 50 CPU s on a 2-core host, docs/PERFORMANCE.md section 8; the seeded random spaces
    above cover the search's branches)."""
    searches, seen = [], []

    def both(params, filter_func, previously_tested, n):
        ours = list(all_pairs(params, filter_func=filter_func, previously_tested=previously_tested, n=n))
        seen.append(n)
        if len(seen) % 2:
            theirs = _reference(params, filter_func, previously_tested, n)
            searches.append((n, bool(previously_tested), len(ours), ours == theirs))
        return iter(ours)

    monkeypatch.setattr(pairs, "all_pairs", both)
    monkeypatch.setattr(pairs, "_PROPOSED", {})     # no search answered from an earlier build
    build()
    differing = [s for s in searches if not s[3]]
    assert not differing, f"{len(differing)} of {len(searches)} searches differ: (n, earlier rows, rows) {differing}"
    assert {n for n, *_ in searches} == {2, 3}                 # pair suites and risk suites
    assert any(tested for _, tested, *_ in searches)           # later passes, given earlier rows
    assert sum(rows for *_, rows, _ in searches) > 100
