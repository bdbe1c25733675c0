"""What numbers a tolerance may have, wherever one is read (a class in the tolerance TOML,
an engine's override row): finite, and within each key's range.

- rtol above 0 and atol 0 or above, neither above 1: a NaN bound makes every comparison
  false, an rtol or atol above 1 passes a gradient element off by its whole size, and a zero
  rtol judges a rounded output bit for bit. A zero atol is allowed: it only tightens the
  bound on elements whose magnitude is zero, so it can never pass what a positive one would
  fail.
- k (the statistical judge's factor on the io-precision reference's error) from 1 to 64: below
  1 it asks an engine to be more exact than an honest io-precision computation, above 64 it
  passes errors of tens of per cent in bf16.
- floor (the statistical judge's allowance relative to a slice's scale) from 0 to 0.1: it is
  for slices whose honest error is near zero, and 0.1 would pass a 10 % error anywhere.
"""
from __future__ import annotations

import math
from typing import Any

#: key -> (least, most, whether the least itself is allowed)
RANGES = {"rtol": (0.0, 1.0, False), "atol": (0.0, 1.0, True), "k": (1.0, 64.0, True),
          "floor": (0.0, 0.1, True)}
TOLERANCE_KEYS = tuple(RANGES)
#: what passing the most of each key would mean, for the error line
_TOO_LARGE = {"rtol": "it would pass a gradient element off by its whole size",
              "atol": "it would pass a gradient element off by its whole size",
              "k": "it would pass errors of tens of per cent in bf16",
              "floor": "it would pass a 10 % error in any slice"}


def tolerance_problem(key: str, value: Any) -> str | None:
    """Why `value` cannot be the tolerance's `key` (one of TOLERANCE_KEYS), else None."""
    least, most, least_allowed = RANGES[key]
    bound = f"{'>=' if least_allowed else '>'} {least:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a finite number {bound}, got {value!r}"
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < least or (number == least and not least_allowed):
        return f"expected a finite number {bound}, got {value!r}"
    if number > most:
        return f"{value!r} is more than {most:g}: {_TOO_LARGE[key]}"
    return None
