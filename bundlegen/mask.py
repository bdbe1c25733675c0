"""The mask semantics of DESIGN section 2 (cuDNN's), in one place.

Row i, column j is kept iff (right_bound is None or j' - i <= right_bound) and
(left_bound is None or i - j' < left_bound), where j' = j - (S_kv - S_q) under
BOTTOM_RIGHT and j' = j under TOP_LEFT.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from bundlegen.graph import Attributes

if TYPE_CHECKING:
    import torch


def diagonal_shift(S_q: int, S_kv: int, alignment: str) -> int:
    """How far right the diagonal starts: keep iff lo <= j - i - shift <= hi."""
    return S_kv - S_q if alignment == "BOTTOM_RIGHT" else 0


def is_masked(attrs: Attributes) -> bool:
    return attrs.left_bound is not None or attrs.right_bound is not None


def keep_mask(S_q: int, S_kv: int, attrs: Attributes, rows: range | None = None,
              device: torch.device | str = "cpu", cols: range | None = None) -> torch.Tensor | None:
    """Bool [len(rows), len(cols)] (cols default: all S_kv): True where (i, j) is kept.
    None when nothing is masked."""
    if not is_masked(attrs):
        return None
    import torch   # here: the cost model reads this module's rule in processes without torch

    rows = rows if rows is not None else range(S_q)
    cols = cols if cols is not None else range(S_kv)
    i = torch.arange(rows.start, rows.stop, device=device).unsqueeze(1)
    j = torch.arange(cols.start, cols.stop, device=device).unsqueeze(0)
    jp = j - diagonal_shift(S_q, S_kv, attrs.diagonal_alignment)
    keep = torch.ones(len(rows), len(cols), dtype=torch.bool, device=device)
    # |j' - i| < S_q + S_kv, so a bound past that keeps everything on its side; clamping it
    # keeps a bound like 10**30 from overflowing the int64 comparison.
    reach = S_q + S_kv
    if attrs.right_bound is not None:
        keep &= (jp - i) <= min(attrs.right_bound, reach)
    if attrs.left_bound is not None:
        keep &= (i - jp) < min(attrs.left_bound, reach)
    return keep
