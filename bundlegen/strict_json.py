"""Decoding JSON that decides verdicts (bundles, manifests, claims) strictly: the standard
decoder keeps the last of two equal keys (so a second, looser `rtol` could hide behind the
one a reviewer reads), accepts NaN and Infinity, and raises RecursionError on deep nesting.
Here each is a JSONError, one line saying where."""
from __future__ import annotations

import json
from typing import Any


class JSONError(ValueError):
    """Text that is not strict JSON: the message says what and, where known, where."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise JSONError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise JSONError(f"{name} is not a JSON number")


def loads(text: str) -> Any:
    """`text` decoded; JSONError for bad JSON, a duplicate key in any object, NaN or
    Infinity, nesting too deep to decode, or an integer too long to convert."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except JSONError:
        raise
    except json.JSONDecodeError as exc:
        raise JSONError(f"bad JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise JSONError("JSON nested too deep") from None
    except ValueError as exc:       # e.g. an integer literal past Python's digit limit
        raise JSONError(f"bad JSON: {exc}") from None
