"""Which cases a run takes, and in what order: `-k EXPRESSION`, `--shard I/N`, `--shuffle SEED`.

A `-k` expression is built from terms with `and`, `or`, `not` and parentheses, as in
pytest; a term matches a case when it is a substring or an fnmatch glob of the case id,
its group, one of its items or `level/group/id`. Several `-k` must all match."""
from __future__ import annotations

import fnmatch
import hashlib
import random
import re
from typing import Callable, Sequence

from bundlegen.graph import Case

Predicate = Callable[[Case], bool]
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_KEYWORDS = frozenset({"and", "or", "not", "(", ")"})


def term_matches(case: Case, term: str) -> bool:
    names = [case.id, case.group, f"{case.level}/{case.group}/{case.id}", *case.items]
    return any(term in name or fnmatch.fnmatchcase(name, term) for name in names)


def parse_expression(text: str) -> Predicate:
    """The predicate of one -k expression; ValueError naming the expression when malformed."""
    tokens = _TOKEN.findall(text)
    pos = 0

    def error(why: str) -> ValueError:
        return ValueError(f"-k {text!r}: {why}")

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def either() -> Predicate:
        parts = [both()]
        while peek() == "or":
            take()
            parts.append(both())
        return parts[0] if len(parts) == 1 else (lambda c: any(p(c) for p in parts))

    def both() -> Predicate:
        parts = [negated()]
        while peek() == "and":
            take()
            parts.append(negated())
        return parts[0] if len(parts) == 1 else (lambda c: all(p(c) for p in parts))

    def negated() -> Predicate:
        token = peek()
        if token is None:
            raise error("ends where a term was expected")
        if token == "not":
            take()
            inner = negated()
            return lambda c: not inner(c)
        if token == "(":
            take()
            inner = either()
            if peek() != ")":
                raise error("a '(' is not closed")
            take()
            return inner
        if token in _KEYWORDS:
            raise error(f"{token!r} where a term was expected")
        term = take()
        return lambda c: term_matches(c, term)

    if not tokens:
        raise error("empty expression")
    predicate = either()
    if pos != len(tokens):
        raise error(f"unexpected {tokens[pos]!r}")
    return predicate


def selection(patterns: str | Sequence[str] | None) -> Predicate:
    """One predicate for every -k given (all must match); everything when none is."""
    if not patterns:
        return lambda case: True
    predicates = [parse_expression(p) for p in ([patterns] if isinstance(patterns, str) else patterns)]
    return lambda case: all(p(case) for p in predicates)


def matches_pattern(case: Case, pattern: str | Sequence[str] | None) -> bool:
    return selection(pattern)(case)


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'I/N' with 1 <= I <= N (the first shard is 1/N)."""
    if not text:
        return None
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected I/N, e.g. 1/4") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text!r}: need 1 <= I <= N")
    return index, count


def in_shard(key: str, shard: tuple[int, int] | None) -> bool:
    """Deterministic on every machine: a hash of the key, not Python's salted hash()."""
    if shard is None:
        return True
    index, count = shard
    digest = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return digest % count == index - 1


def shuffled(cases: Sequence[Case], seed: int) -> list[Case]:
    """`cases` in the order a seeded shuffle gives (`--shuffle SEED`): the same seed, the
    same order, so an order that changed a verdict can be run again."""
    order = list(cases)
    random.Random(seed).shuffle(order)
    return order
