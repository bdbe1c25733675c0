"""What numbers a tolerance may have, wherever one is read (a class in the tolerance TOML,
an engine's override row): finite, rtol above 0, atol 0 or above, neither above 1. A NaN
bound makes every comparison false, an rtol or atol above 1 passes a gradient element off
by its whole size, and a zero rtol judges a rounded output bit for bit. A zero atol is
allowed: it only tightens the bound on elements whose magnitude is zero, so it can never
pass what a positive one would fail."""
from __future__ import annotations

import math
from typing import Any

MAX_TOLERANCE = 1.0
TOLERANCE_KEYS = ("rtol", "atol")


def tolerance_problem(key: str, value: Any) -> str | None:
    """Why `value` cannot be the tolerance's `key` ("rtol" or "atol"), else None."""
    bound = "> 0" if key == "rtol" else ">= 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a finite number {bound}, got {value!r}"
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < 0 or (key == "rtol" and number == 0):
        return f"expected a finite number {bound}, got {value!r}"
    if number > MAX_TOLERANCE:
        return (f"{value!r} is more than {MAX_TOLERANCE:g}: it would pass a gradient element off by "
                "its whole size")
    return None
