"""The float64 oracle: SDPA forward (O, natural-log LSE) and backward (dQ, dK, dV) with
the elementwise magnitudes the tolerance rule needs (docs/CONTRACTS.md, "Tolerance
semantics"), for the whole graph semantics of DESIGN section 2.

Inputs are logical tensors ([B, H, S, D], any dtype, any strides) on one device; all math
runs there in float64. Work is split into blocks of (batch, q heads, query rows, key
columns) whose score block holds at most `max_block_elems` elements, so a long sequence
never needs a float64 S_q x S_kv matrix for all heads at once. A block's columns are
every column any of its rows may keep, so each row's softmax is complete inside it.

GQA/MQA: q head h reads k head h // (H_q // H_k) and v head h // (H_q // H_v); dK and dV
are summed over the q heads of their group. Rows with no kept key: O = 0, LSE = -inf,
P = 0, so every gradient there is 0 and nothing is NaN.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from bundlegen.graph import Attributes
from bundlegen.mask import diagonal_shift, keep_mask

F64 = torch.float64
#: Default score-block size: 2^22 float64 elements (32 MiB) on the CPU, 2^24 on a GPU.
CPU_BLOCK_ELEMS = 1 << 22
GPU_BLOCK_ELEMS = 1 << 24


@dataclass(frozen=True, eq=False)
class Forward:
    o: torch.Tensor    # [B, H_q, S_q, D_v] float64
    lse: torch.Tensor  # [B, H_q, S_q] float64, -inf where a row keeps no key

    def to(self, device: torch.device | str) -> "Forward":
        return Forward(o=self.o.to(device), lse=self.lse.to(device))


@dataclass(frozen=True, eq=False)
class Backward:
    dq: torch.Tensor      # [B, H_q, S_q, D_qk]
    dk: torch.Tensor      # [B, H_k, S_kv, D_qk]
    dv: torch.Tensor      # [B, H_v, S_kv, D_v]
    mag_dq: torch.Tensor  # same shapes: the sums on absolute values of their terms
    mag_dk: torch.Tensor
    mag_dv: torch.Tensor

    def to(self, device: torch.device | str) -> "Backward":
        return Backward(**{name: getattr(self, name).to(device) for name in GRADIENT_FIELDS})

    def gradient(self, port: str) -> torch.Tensor:
        return getattr(self, port)

    def magnitude(self, port: str) -> torch.Tensor:
        return getattr(self, f"mag_{port}")


GRADIENT_FIELDS = ("dq", "dk", "dv", "mag_dq", "mag_dk", "mag_dv")


@dataclass(frozen=True)
class Block:
    """Batch b, q heads [h0, h1), query rows [r0, r1), key columns [c0, c1)."""
    b: int
    h0: int
    h1: int
    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def empty(self) -> bool:
        return self.c1 <= self.c0


# ----------------------------------------------------------------------------- blocking
def kept_columns(S_q: int, S_kv: int, attrs: Attributes, r0: int, r1: int) -> tuple[int, int]:
    """[c0, c1): every key column some row in [r0, r1) may keep (c1 <= c0: none).
    Kept iff -left_bound < j - shift - i <= right_bound (DESIGN section 2)."""
    shift = diagonal_shift(S_q, S_kv, attrs.diagonal_alignment)
    c0 = 0 if attrs.left_bound is None else max(0, r0 + shift - attrs.left_bound + 1)
    c1 = S_kv if attrs.right_bound is None else min(S_kv, r1 - 1 + shift + attrs.right_bound + 1)
    return c0, c1


#: a banded mask (both bounds) caps a row block at max(BAND_MIN_ROWS, band width) rows, so
#: its score block is mostly kept entries rather than a wide, mostly masked rectangle
BAND_MIN_ROWS = 64


def row_blocks(S_q: int, S_kv: int, attrs: Attributes,
               max_block_elems: int) -> list[tuple[int, int]]:
    """Query-row ranges covering [0, S_q) whose one-head score blocks stay within
    max_block_elems (a single row longer than that is still one block)."""
    def cost(r0: int, r1: int) -> int:
        c0, c1 = kept_columns(S_q, S_kv, attrs, r0, r1)
        return (r1 - r0) * max(0, c1 - c0)

    cap = S_q
    if attrs.left_bound is not None and attrs.right_bound is not None:
        cap = max(BAND_MIN_ROWS, attrs.left_bound + attrs.right_bound)
    out, r0 = [], 0
    while r0 < S_q:
        n = 1
        while r0 + n < S_q and 2 * n <= cap and cost(r0, min(S_q, r0 + 2 * n)) <= max_block_elems:
            n *= 2
        out.append((r0, min(S_q, r0 + n)))
        r0 += n
    return out


def blocks(B: int, H_q: int, S_q: int, S_kv: int, attrs: Attributes,
           max_block_elems: int) -> Iterator[Block]:
    """The blocks covering every (b, h, row) once, each with at most max_block_elems scores
    (a single row longer than that is still one block). Row blocks are outermost, so
    consecutive blocks share their mask."""
    rows = row_blocks(S_q, S_kv, attrs, max_block_elems)
    widest = max((r1 - r0) * max(0, c1 - c0) for r0, r1 in rows
                 for c0, c1 in [kept_columns(S_q, S_kv, attrs, r0, r1)])
    heads = max(1, min(H_q, max_block_elems // max(1, widest)))  # as many heads as fit
    for r0, r1 in rows:
        c0, c1 = kept_columns(S_q, S_kv, attrs, r0, r1)
        for b in range(B):
            for h0 in range(0, H_q, heads):
                yield Block(b, h0, min(H_q, h0 + heads), r0, r1, c0, c1)


def default_block_elems(device: torch.device) -> int:
    return GPU_BLOCK_ELEMS if device.type == "cuda" else CPU_BLOCK_ELEMS


# ----------------------------------------------------------------------------- block math
def _head_groups(h0: int, h1: int, group: int) -> list[tuple[int, int, int]]:
    """(kv head, first, last+1) for the q heads [h0, h1), indices relative to h0."""
    out = []
    for kv in range(h0 // group, (h1 - 1) // group + 1):
        lo, hi = max(h0, kv * group), min(h1, (kv + 1) * group)
        out.append((kv, lo - h0, hi - h0))
    return out


def _kv_rows(t: torch.Tensor, blk: Block, H_q: int) -> torch.Tensor:
    """The k or v rows [c0, c1) each q head of the block reads, float64 [nh, W, D]."""
    group = H_q // t.shape[1]
    idx = torch.arange(blk.h0, blk.h1, device=t.device) // group
    return t[blk.b, :, blk.c0:blk.c1].index_select(0, idx).to(F64)


class _DroppedMask:
    """The masked-out entries of a block's [R, W] scores, reused while consecutive blocks
    cover the same rows and columns (they differ only in batch and heads)."""

    def __init__(self, S_q: int, S_kv: int, attrs: Attributes):
        self.S_q, self.S_kv, self.attrs = S_q, S_kv, attrs
        self._key, self._dropped = None, None

    def __call__(self, blk: Block, device: torch.device) -> torch.Tensor | None:
        key = (blk.r0, blk.r1, blk.c0, blk.c1)
        if key != self._key:
            keep = keep_mask(self.S_q, self.S_kv, self.attrs, rows=range(blk.r0, blk.r1),
                             device=device, cols=range(blk.c0, blk.c1))
            self._key = key
            self._dropped = None if keep is None or bool(keep.all()) else ~keep
        return self._dropped


def _scores(qb: torch.Tensor, kb: torch.Tensor, scale: float,
            dropped: torch.Tensor | None) -> torch.Tensor:
    """scale * Q K^T with masked positions at -inf: [nh, R, W]."""
    s = torch.matmul(qb, kb.transpose(-1, -2)).mul_(scale)
    if dropped is not None:
        s.masked_fill_(dropped, float("-inf"))
    return s


def _probabilities(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """P = exp(s - lse), never exp(s) alone (LSE may be far below -88.7); rows with
    lse = -inf have every s = -inf, and shifting them by 0 gives P = 0, not NaN."""
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(s - finite.unsqueeze(-1))


# ----------------------------------------------------------------------------- public API
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attrs: Attributes, *,
            max_block_elems: int | None = None) -> Forward:
    """O = softmax(scale Q K^T, masked) V and LSE = logsumexp of the masked scaled scores."""
    B, H_q, S_q, _ = q.shape
    S_kv, D_v = k.shape[2], v.shape[3]
    device = q.device
    budget = max_block_elems or default_block_elems(device)
    o = torch.zeros(B, H_q, S_q, D_v, dtype=F64, device=device)
    lse = torch.full((B, H_q, S_q), float("-inf"), dtype=F64, device=device)
    dropped = _DroppedMask(S_q, S_kv, attrs)
    for blk in blocks(B, H_q, S_q, S_kv, attrs, budget):
        if blk.empty:
            continue
        qb = q[blk.b, blk.h0:blk.h1, blk.r0:blk.r1].to(F64)
        s = _scores(qb, _kv_rows(k, blk, H_q), attrs.attn_scale, dropped(blk, device))
        row_lse = torch.logsumexp(s, dim=-1)  # -inf for a row with no kept key
        p = _probabilities(s, row_lse)
        del s
        o[blk.b, blk.h0:blk.h1, blk.r0:blk.r1] = torch.matmul(p, _kv_rows(v, blk, H_q))
        lse[blk.b, blk.h0:blk.h1, blk.r0:blk.r1] = row_lse
    return Forward(o=o, lse=lse)


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
             attrs: Attributes, fwd: Forward, *, max_block_elems: int | None = None) -> Backward:
    """The true gradient (from the exact float64 O and LSE of `fwd`) and its magnitudes.

    Per block, with P = exp(S - LSE):
      dV  += P^T dO                     mag_dV  += P^T |dO|
      dS   = P * (dO V^T - rowsum(dO*O)) |dS|mag = P * (|dO| |V|^T + rowsum(|dO|*|O|))
      dQ   = scale * dS K               mag_dQ   = scale * |dS|mag |K|
      dK  += scale * dS^T Q             mag_dK  += scale * |dS|mag^T |Q|
    with dK, dV summed over the q heads of each kv group.
    """
    B, H_q, S_q, D_qk = q.shape
    H_k, S_kv = k.shape[1], k.shape[2]
    H_v, D_v = v.shape[1], v.shape[3]
    device = q.device
    budget = max_block_elems or default_block_elems(device)
    scale = attrs.attn_scale
    dq = torch.zeros(B, H_q, S_q, D_qk, dtype=F64, device=device)
    dk = torch.zeros(B, H_k, S_kv, D_qk, dtype=F64, device=device)
    dv = torch.zeros(B, H_v, S_kv, D_v, dtype=F64, device=device)
    mag_dq, mag_dk, mag_dv = torch.zeros_like(dq), torch.zeros_like(dk), torch.zeros_like(dv)
    o_all, lse_all = fwd.o.to(device), fwd.lse.to(device)

    dropped = _DroppedMask(S_q, S_kv, attrs)
    for blk in blocks(B, H_q, S_q, S_kv, attrs, budget):
        if blk.empty:
            continue
        rows = (blk.b, slice(blk.h0, blk.h1), slice(blk.r0, blk.r1))
        cols = slice(blk.c0, blk.c1)
        qb, dob, ob = q[rows].to(F64), do[rows].to(F64), o_all[rows]
        kb, vb = _kv_rows(k, blk, H_q), _kv_rows(v, blk, H_q)
        p = _probabilities(_scores(qb, kb, scale, dropped(blk, device)), lse_all[rows])
        pt = p.transpose(-1, -2)
        abs_do = dob.abs()

        dv_part, mag_dv_part = torch.matmul(pt, dob), torch.matmul(pt, abs_do)
        delta = (dob * ob).sum(-1, keepdim=True)
        ds = torch.matmul(dob, vb.transpose(-1, -2)).sub_(delta).mul_(p)
        dq[rows] = torch.matmul(ds, kb).mul_(scale)
        dk_part = torch.matmul(ds.transpose(-1, -2), qb).mul_(scale)
        del ds
        abs_delta = (abs_do * ob.abs()).sum(-1, keepdim=True)
        ds_mag = torch.matmul(abs_do, vb.abs().transpose(-1, -2)).add_(abs_delta).mul_(p)
        del p, pt
        mag_dq[rows] = torch.matmul(ds_mag, kb.abs()).mul_(scale)
        mag_dk_part = torch.matmul(ds_mag.transpose(-1, -2), qb.abs()).mul_(scale)
        del ds_mag

        # Sum each kv group's q heads in a fixed order (deterministic on every device).
        for kv, lo, hi in _head_groups(blk.h0, blk.h1, H_q // H_k):
            dk[blk.b, kv, cols] += dk_part[lo:hi].sum(0)
            mag_dk[blk.b, kv, cols] += mag_dk_part[lo:hi].sum(0)
        for kv, lo, hi in _head_groups(blk.h0, blk.h1, H_q // H_v):
            dv[blk.b, kv, cols] += dv_part[lo:hi].sum(0)
            mag_dv[blk.b, kv, cols] += mag_dv_part[lo:hi].sum(0)
    return Backward(dq=dq, dk=dk, dv=dv, mag_dq=mag_dq, mag_dk=mag_dk, mag_dv=mag_dv)
