"""Which cases a run takes: `-k PATTERN` and `--shard I/N`."""
from __future__ import annotations

import fnmatch
import hashlib

from bundlegen.graph import Case


def matches_pattern(case: Case, pattern: str | None) -> bool:
    """A substring or an fnmatch glob over the case id, its group, its items and
    `level/group/id`."""
    if not pattern:
        return True
    names = [case.id, case.group, f"{case.level}/{case.group}/{case.id}", *case.items]
    return any(pattern in name or fnmatch.fnmatchcase(name, pattern) for name in names)


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
