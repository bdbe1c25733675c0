"""The float64 oracle: SDPA forward (O, natural-log LSE) and backward (dQ, dK, dV) with
the elementwise magnitudes the tolerance rule needs (docs/CONTRACTS.md, "Tolerance
semantics"), for the whole graph semantics of DESIGN section 2.

Inputs are logical tensors ([B, H, S, D], any dtype, any strides) on one device; all math
runs there in float64. Work is split into blocks of (batches, q heads, query rows, key
columns) whose score block holds at most `max_block_elems` elements, so a long sequence
never needs a float64 S_q x S_kv matrix for all heads at once. A block's columns are
every column any of its rows may keep, so each row's softmax is complete inside it.
A block spans as many heads, then batches, as the budget allows (a small case is one
block: few, large operations rather than many small ones); a block with fewer than all
heads starts and ends on a multiple of lcm(H_q/H_k, H_q/H_v) heads whenever that many fit,
so each kv group lies inside one block.

GQA/MQA: q head h reads k head h // (H_q // H_k) and v head h // (H_q // H_v); dK and dV
are summed over the q heads of their group, in head order, by one reduction over the
group axis per block (deterministic for a given shape on every device). Rows with no
kept key: O = 0, LSE = -inf, P = 0, so every gradient there is 0 and nothing is NaN.

Score modifiers (docs/CONTRACTS.md, "Score modifiers"; `Modifiers`): the softcap (from the
attributes) and an additive bias act on each block's scores before the mask; a sink logit
per head joins each row's softmax denominator only; ALiBi slopes add -slope * |i - j + shift|
per block, formed from the indices (the forward folds it into LSE and O
after the blocks; the backward reads that LSE). dBias is dS before the softcap's factor,
summed over dbias's size-1 axes; dSinks = -sum_{b,i} exp(sink_h - LSE_i) D_i.

Dropout (docs/CONTRACTS.md, "Dropout"; `Modifiers.dropout_keep` with the attributes'
dropout_probability p): the forward's P_drop = P * keep / (1 - p) and O = P_drop V (LSE is
that of P, undropped); the backward's dV = P_drop^T dO and dP = (dO V^T) * keep / (1 - p)
before dS = P (dP - Delta), Delta = rowsum(dO * O) of the dropped O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

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
    #: (q, k, v, q64, k64, v64, masks): the float64 operands and score masks of the forward,
    #: which `backward` reuses when it is given the same q, k, v objects (not carried by `to`)
    operands: tuple | None = field(default=None, repr=False)

    def to(self, device: torch.device | str) -> "Forward":
        return Forward(o=self.o.to(device), lse=self.lse.to(device))

    def without_operands(self) -> "Forward":
        return Forward(o=self.o, lse=self.lse)


@dataclass(frozen=True, eq=False)
class Modifiers:
    """The score modifiers' tensors (the softcap is an attribute). `bias`: logical
    [B, H_q, S_q, S_kv] (zero strides allowed); `sinks`: [H_q]; `dbias_dims`: the dbias's
    dims (1 on the axes it sums over), None for no dBias; `dsinks`: compute dSinks;
    `dropout_keep`: logical [B, H_q, S_q, S_kv] keep mask (1 kept, 0 dropped; zero strides
    allowed), applied with the attributes' dropout_probability."""
    bias: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    dbias_dims: tuple[int, ...] | None = None
    dsinks: bool = False
    dropout_keep: torch.Tensor | None = None
    #: [H_q] or [B, H_q]: ALiBi from the indices, score += -slope[b, h] * |i - j + shift|
    #: (shift the mask's diagonal shift); no gradient
    alibi_slopes: torch.Tensor | None = None


NO_MODIFIERS = Modifiers()


@dataclass(frozen=True)
class Precision:
    """How `backward` computes: the oracle's float64 with the magnitudes the bound needs, or
    the io-precision reference (`io_precision`; docs/DESIGN.md): fp32 arithmetic, P (after
    dropout's scaling) and dS rounded to the io dtype before their products, no magnitudes."""
    compute: torch.dtype
    rounds_to: torch.dtype | None = None
    magnitudes: bool = True

    def rounded(self, t: torch.Tensor) -> torch.Tensor:
        """t as a kernel hands it to a product: rounded to the io dtype, then widened back."""
        return t if self.rounds_to is None else t.to(self.rounds_to).to(self.compute)


ORACLE_PRECISION = Precision(F64)


def io_precision(io_dtype: torch.dtype) -> Precision:
    return Precision(torch.float32, rounds_to=io_dtype, magnitudes=False)


@dataclass(frozen=True, eq=False)
class Backward:
    dq: torch.Tensor      # [B, H_q, S_q, D_qk]
    dk: torch.Tensor      # [B, H_k, S_kv, D_qk]
    dv: torch.Tensor      # [B, H_v, S_kv, D_v]
    #: same shapes: the sums on absolute values of their terms (None for the io-precision
    #: reference, which has none)
    mag_dq: torch.Tensor | None = None
    mag_dk: torch.Tensor | None = None
    mag_dv: torch.Tensor | None = None
    dbias: torch.Tensor | None = None       # dbias dims, when asked for
    mag_dbias: torch.Tensor | None = None
    dsinks: torch.Tensor | None = None      # [H_q], when asked for
    mag_dsinks: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> "Backward":
        return Backward(**{name: None if getattr(self, name) is None else getattr(self, name).to(device)
                           for name in GRADIENT_FIELDS + MODIFIER_FIELDS})

    def gradient(self, port: str) -> torch.Tensor:
        return getattr(self, port)

    def magnitude(self, port: str) -> torch.Tensor:
        return getattr(self, f"mag_{port}")


GRADIENT_FIELDS = ("dq", "dk", "dv", "mag_dq", "mag_dk", "mag_dv")
MODIFIER_FIELDS = ("dbias", "mag_dbias", "dsinks", "mag_dsinks")


@dataclass(frozen=True)
class Block:
    """Batches [b0, b1), q heads [h0, h1), query rows [r0, r1), key columns [c0, c1)."""
    b0: int
    b1: int
    h0: int
    h1: int
    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def empty(self) -> bool:
        return self.c1 <= self.c0

    @property
    def elements(self) -> int:
        """Score elements of the block."""
        return (self.b1 - self.b0) * (self.h1 - self.h0) * (self.r1 - self.r0) * max(0, self.c1 - self.c0)


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


def head_alignment(H_q: int, H_k: int, H_v: int) -> int:
    """Heads a block should start and end on so that it holds whole k and v groups."""
    return math.lcm(H_q // H_k, H_q // H_v)


def blocks(B: int, H_q: int, S_q: int, S_kv: int, attrs: Attributes,
           max_block_elems: int, align: int = 1) -> Iterator[Block]:
    """The blocks covering every (b, h, row) once, each with at most max_block_elems scores
    (a single row longer than that is still one block). A block takes as many heads as
    fit (a multiple of `align` when fewer than H_q and at least `align` fit), and when all
    H_q heads fit, as many batches as fit. Row blocks are outermost, so consecutive blocks
    share their mask."""
    rows = row_blocks(S_q, S_kv, attrs, max_block_elems)
    widest = max((r1 - r0) * max(0, c1 - c0) for r0, r1 in rows
                 for c0, c1 in [kept_columns(S_q, S_kv, attrs, r0, r1)])
    planes = max(1, max_block_elems // max(1, widest))  # (batch, head) score planes that fit
    if planes >= H_q:
        heads, batches = H_q, max(1, min(B, planes // max(1, H_q)))
    else:
        heads, batches = (planes // align * align if planes >= align else planes), 1
    for r0, r1 in rows:
        c0, c1 = kept_columns(S_q, S_kv, attrs, r0, r1)
        for b0 in range(0, B, batches):
            for h0 in range(0, H_q, heads):
                yield Block(b0, min(B, b0 + batches), h0, min(H_q, h0 + heads), r0, r1, c0, c1)


def default_block_elems(device: torch.device) -> int:
    return GPU_BLOCK_ELEMS if device.type == "cuda" else CPU_BLOCK_ELEMS


# ----------------------------------------------------------------------------- block math
def _per_q_head(t: torch.Tensor, H_q: int, dtype: torch.dtype = F64) -> torch.Tensor:
    """A k or v tensor [B, H, S, D] as `dtype` [B, H_q, S, D]: q head h sees head
    h // (H_q // H)."""
    group = H_q // t.shape[1]
    if group == 1:
        return t.to(dtype)
    B, H, S, D = t.shape
    return t.unsqueeze(2).expand(B, H, group, S, D).to(dtype).reshape(B, H_q, S, D)


def _finite_lse(lse: torch.Tensor) -> torch.Tensor:
    """LSE with -inf (a row with no kept key) as 0: P = exp(s - lse), never exp(s) alone
    (LSE may be far below -88.7); such a row has every s = -inf, and shifting it by 0
    gives P = 0, not NaN."""
    return lse.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


#: masks a _DroppedMask keeps (bool elements) so the backward reuses the forward's
MASK_CACHE_ELEMS = 1 << 24


class _DroppedMask:
    """The masked-out entries of a block's [R, W] scores. Masks are kept (up to
    MASK_CACHE_ELEMS elements in all), so the backward of the same inputs reuses the
    forward's; past that, the last one is reused while consecutive blocks cover the same
    rows and columns (they differ only in batch and heads)."""

    def __init__(self, S_q: int, S_kv: int, attrs: Attributes, device: torch.device):
        self.S_q, self.S_kv, self.attrs, self.device = S_q, S_kv, attrs, device
        self.shift = diagonal_shift(S_q, S_kv, attrs.diagonal_alignment)
        self._cache: dict[tuple, torch.Tensor | None] = {}
        self._cached = 0
        self._last_key, self._last = None, None

    def serves(self, S_q: int, S_kv: int, attrs: Attributes, device: torch.device) -> bool:
        return (self.S_q, self.S_kv, self.attrs, self.device) == (S_q, S_kv, attrs, device)

    def keeps_all(self, blk: Block) -> bool:
        """Every (row, column) of the block kept: the extreme corners decide (no device
        round trip). j' - i is largest at (r0, c1 - 1); i - j' at (r1 - 1, c0)."""
        a = self.attrs
        right_ok = a.right_bound is None or (blk.c1 - 1 - self.shift) - blk.r0 <= a.right_bound
        left_ok = a.left_bound is None or (blk.r1 - 1) - (blk.c0 - self.shift) < a.left_bound
        return right_ok and left_ok

    def __call__(self, blk: Block) -> torch.Tensor | None:
        key = (blk.r0, blk.r1, blk.c0, blk.c1)
        if key in self._cache:
            return self._cache[key]
        if key == self._last_key:
            return self._last
        dropped = None
        if not self.keeps_all(blk):
            keep = keep_mask(self.S_q, self.S_kv, self.attrs, rows=range(blk.r0, blk.r1),
                             device=self.device, cols=range(blk.c0, blk.c1))
            dropped = None if keep is None else keep.logical_not_()
        size = 0 if dropped is None else dropped.numel()
        if self._cached + size <= MASK_CACHE_ELEMS:
            self._cache[key] = dropped
            self._cached += size
        self._last_key, self._last = key, dropped
        return dropped


def _scores(qb: torch.Tensor, kb: torch.Tensor, scale: float,
            dropped: torch.Tensor | None, cap: float | None = None,
            bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(scores, t): scale * Q K^T, capped (cap * t, t = tanh(s / cap)) when `cap`, plus
    `bias`, with masked positions at -inf: [nb, nh, R, W]; t is None without a cap."""
    s = torch.matmul(qb, kb.transpose(-1, -2)).mul_(scale)
    t = None
    if cap is not None:
        t = s.div_(cap).tanh_()
        s = t * cap
    if bias is not None:
        s.add_(bias)
    if dropped is not None:
        s.masked_fill_(dropped, float("-inf"))
    return s, t


def _score_bias(modifiers: Modifiers, B: int, H_q: int, S_q: int, S_kv: int,
                attrs: Attributes, dtype: torch.dtype = F64) -> Callable[[Block], torch.Tensor | None]:
    """A block's additive score term (the bias's slice plus ALiBi from the slopes), `dtype`
    [nb, nh, R, W], or None for a graph with neither. ALiBi is formed per block from the
    indices (never a whole [B, H_q, S_q, S_kv])."""
    bias = None if modifiers.bias is None else _broadcast_as(modifiers.bias, (B, H_q, S_q, S_kv), dtype)
    slopes = None
    if modifiers.alibi_slopes is not None:
        slopes = modifiers.alibi_slopes.to(dtype)
        slopes = (slopes.view(1, H_q) if slopes.dim() == 1 else slopes).expand(B, H_q)
    if bias is None and slopes is None:
        return lambda blk: None
    shift = diagonal_shift(S_q, S_kv, attrs.diagonal_alignment)

    def term(blk: Block) -> torch.Tensor:
        out = None
        if bias is not None:
            out = bias[blk.b0:blk.b1, blk.h0:blk.h1, blk.r0:blk.r1, blk.c0:blk.c1]
        if slopes is not None:
            i = torch.arange(blk.r0, blk.r1, dtype=dtype, device=slopes.device).view(-1, 1)
            j = torch.arange(blk.c0, blk.c1, dtype=dtype, device=slopes.device).view(1, -1)
            distance = (i - j + shift).abs_()
            alibi = -slopes[blk.b0:blk.b1, blk.h0:blk.h1, None, None] * distance
            out = alibi if out is None else out + alibi
        return out
    return term


def additive_scores(modifiers: Modifiers, B: int, H_q: int, S_q: int, S_kv: int,
                    attrs: Attributes) -> torch.Tensor | None:
    """The whole additive score term [B, H_q, S_q, S_kv] (bias plus ALiBi from the slopes),
    float64, or None: for checks that recompute the scores (harness/tolerance_power.py)."""
    return _score_bias(modifiers, B, H_q, S_q, S_kv, attrs)(Block(0, B, 0, H_q, 0, S_q, 0, S_kv))


def _keep_scale(modifiers: Modifiers, attrs: Attributes, shape: tuple[int, ...],
                dtype: torch.dtype = F64) -> Callable[[tuple], torch.Tensor] | None:
    """A block's keep / (1 - p) as `dtype` (the block's index tuple -> [nb, nh, R, W]), or
    None without a dropout mask. Only a block's slice is ever scaled (never the whole
    [B, H_q, S_q, S_kv])."""
    if modifiers.dropout_keep is None:
        return None
    keep = _broadcast_as(modifiers.dropout_keep, shape, dtype)
    scale = 1.0 / (1.0 - attrs.dropout_probability)
    return lambda index: keep[index] * scale


def _broadcast_as(t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """t (broadcastable to `shape`, zero strides allowed) as a `dtype` view of `shape`:
    converted at its stored size, then expanded (a broadcast axis is never copied)."""
    for axis, (d, st) in enumerate(zip(t.shape, t.stride())):
        if st == 0 and d > 1:
            t = t.narrow(axis, 0, 1)
    return t.to(dtype).expand(shape)


def _add_reduced(dst: torch.Tensor, part: torch.Tensor, blk: Block) -> None:
    """dst[b, h, rows, cols] += part ([nb, nh, R, W] for the block), summed over the
    batches and heads where dst has size 1 (a dBias of a broadcast bias)."""
    if dst.shape[0] == 1 and part.shape[0] > 1:
        part = part.sum(0, keepdim=True)
    if dst.shape[1] == 1 and part.shape[1] > 1:
        part = part.sum(1, keepdim=True)
    b = slice(0, 1) if dst.shape[0] == 1 else slice(blk.b0, blk.b1)
    h = slice(0, 1) if dst.shape[1] == 1 else slice(blk.h0, blk.h1)
    dst[b, h, blk.r0:blk.r1, blk.c0:blk.c1].add_(part)


def _add_group_sums(dst: torch.Tensor, part: torch.Tensor, blk: Block, group: int,
                    scale: float = 1.0) -> None:
    """dst[b, kv, cols] += scale * sum over the q heads of group kv in the block of part.
    part: [nb, h1 - h0, W, D] for the block's q heads. Whole groups are summed by one
    reduction over the group axis (head order); a block that cuts a group (only when
    fewer than `group` heads fit the budget) adds its share of that group."""
    b, cols = slice(blk.b0, blk.b1), slice(blk.c0, blk.c1)
    if group == 1:
        dst[b, blk.h0:blk.h1, cols].add_(part, alpha=scale)
        return
    g0 = -(-blk.h0 // group) * group   # first group start at or after h0
    g1 = blk.h1 // group * group       # last group end at or before h1
    pieces = [(blk.h0, blk.h1)] if g0 >= blk.h1 else [(blk.h0, g0), (g0, g1), (max(g0, g1), blk.h1)]
    for lo, hi in pieces:
        if hi <= lo:
            continue
        sub = part[:, lo - blk.h0:hi - blk.h0]
        if lo % group == 0 and hi % group == 0:
            sums = sub.unflatten(1, (-1, group)).sum(2)
            dst[b, lo // group:hi // group, cols].add_(sums, alpha=scale)
        else:
            dst[b, lo // group, cols].add_(sub.sum(1), alpha=scale)


# ----------------------------------------------------------------------------- public API
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attrs: Attributes, *,
            modifiers: Modifiers = NO_MODIFIERS, max_block_elems: int | None = None) -> Forward:
    """O = softmax(scale Q K^T, masked) V and LSE = logsumexp of the masked scaled scores
    (with the score modifiers: capped, biased, a sink in the denominator)."""
    B, H_q, S_q, _ = q.shape
    H_k, S_kv = k.shape[1], k.shape[2]
    H_v, D_v = v.shape[1], v.shape[3]
    device = q.device
    budget = max_block_elems or default_block_elems(device)
    q64, k64, v64 = q.to(F64), _per_q_head(k, H_q), _per_q_head(v, H_q)
    dropped = _DroppedMask(S_q, S_kv, attrs, device)
    score_bias = _score_bias(modifiers, B, H_q, S_q, S_kv, attrs)
    keep_scale = _keep_scale(modifiers, attrs, (B, H_q, S_q, S_kv))
    todo = [blk for blk in blocks(B, H_q, S_q, S_kv, attrs, budget, head_alignment(H_q, H_k, H_v))
            if not blk.empty]
    whole = len(todo) == 1 and (todo[0].b0, todo[0].b1, todo[0].h0, todo[0].h1,
                                todo[0].r0, todo[0].r1) == (0, B, 0, H_q, 0, S_q)
    if not whole:
        o = torch.zeros(B, H_q, S_q, D_v, dtype=F64, device=device)
        lse = torch.full((B, H_q, S_q), float("-inf"), dtype=F64, device=device)
    for blk in todo:
        rows = (slice(blk.b0, blk.b1), slice(blk.h0, blk.h1), slice(blk.r0, blk.r1))
        kv = (slice(blk.b0, blk.b1), slice(blk.h0, blk.h1), slice(blk.c0, blk.c1))
        s, _ = _scores(q64[rows], k64[kv], attrs.attn_scale, dropped(blk), attrs.softcap,
                       score_bias(blk))
        row_lse = torch.logsumexp(s, dim=-1)  # -inf for a row with no kept key
        p = s.sub_(_finite_lse(row_lse).unsqueeze(-1)).exp_()
        if keep_scale is not None:   # P_drop = P * keep / (1 - p)
            p.mul_(keep_scale((*rows, slice(blk.c0, blk.c1))))
        if whole:  # one block holds everything: its results are O and LSE
            o, lse = torch.matmul(p, v64[kv]), row_lse
        else:
            o[rows] = torch.matmul(p, v64[kv])
            lse[rows] = row_lse
    if modifiers.sinks is not None:   # the sink joins every row's denominator, keys or none
        sink = modifiers.sinks.to(device=device, dtype=F64).view(1, H_q, 1)
        with_sink = torch.logaddexp(lse, sink)
        o = o * torch.exp(lse - with_sink).unsqueeze(-1)   # 0 for a row with no kept key
        lse = with_sink
    return Forward(o=o, lse=lse, operands=(q, k, v, q64, k64, v64, dropped))


@dataclass(frozen=True, eq=False)
class _Operands:
    """What every block of a backward reads, converted once to the compute dtype."""
    q: torch.Tensor
    k: torch.Tensor          # per q head
    v: torch.Tensor          # per q head
    do: torch.Tensor
    delta: torch.Tensor      # rowsum(dO * O), [B, H_q, S_q, 1]
    lse: torch.Tensor        # finite LSE, [B, H_q, S_q, 1]
    dropped: _DroppedMask
    #: the magnitudes' operands (|Q|, |dO|, |K|, |V|, rowsum(|dO| |O|)); None without magnitudes
    absolute: tuple | None


def _operands(q, k, v, do, attrs: Attributes, fwd: Forward, precision: Precision) -> _Operands:
    """The backward's whole-tensor operands, once: a block then only slices them. The
    oracle reuses the float64 copies its forward made of the same q, k, v."""
    B, H_q, S_q, _ = q.shape
    device, cdt = q.device, precision.compute
    ops = fwd.operands
    if cdt == F64 and ops is not None and ops[0] is q and ops[1] is k and ops[2] is v:
        qc, kc, vc, dropped = ops[3:]
    else:
        qc, kc, vc, dropped = q.to(cdt), _per_q_head(k, H_q, cdt), _per_q_head(v, H_q, cdt), None
    if dropped is None or not dropped.serves(S_q, k.shape[2], attrs, device):
        dropped = _DroppedMask(S_q, k.shape[2], attrs, device)
    doc, oc = do.to(cdt), fwd.o.to(device=device, dtype=cdt)
    absolute = None
    if precision.magnitudes:
        abs_do = doc.abs()
        absolute = (qc.abs(), abs_do, kc.abs(), vc.abs(), (abs_do * oc.abs()).sum(-1, keepdim=True))
    return _Operands(q=qc, k=kc, v=vc, do=doc, delta=(doc * oc).sum(-1, keepdim=True),
                     lse=_finite_lse(fwd.lse.to(device=device, dtype=cdt)).unsqueeze(-1),
                     dropped=dropped, absolute=absolute)


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
             attrs: Attributes, fwd: Forward, *, modifiers: Modifiers = NO_MODIFIERS,
             max_block_elems: int | None = None, precision: Precision = ORACLE_PRECISION) -> Backward:
    """The true gradient (from the exact float64 O and LSE of `fwd`) and its magnitudes;
    with `precision` the io-precision reference (from the O and LSE an engine reads), with
    no magnitudes.

    Per block, with P = exp(S - LSE):
      dV  += P^T dO                     mag_dV  += P^T |dO|
      dS   = P * (dO V^T - rowsum(dO*O)) |dS|mag = P * (|dO| |V|^T + rowsum(|dO|*|O|))
      dBias = dS                        mag_dBias = |dS|mag   (over its size-1 axes: the root
                                                             of the sum of squares)
      softcap: dS *= 1 - t^2            |dS|mag *= 1 - t^2
      dQ   = scale * dS K               mag_dQ   = scale * |dS|mag |K|
      dK  += scale * dS^T Q             mag_dK  += scale * |dS|mag^T |Q|
    with dK, dV summed over the q heads of each kv group; then
      dSinks_h = -sum_{b,i} exp(sink_h - LSE) rowsum(dO*O), mag the root of the sum over
      (b, i) of (exp(sink_h - LSE) rowsum(|dO|*|O|))^2.
    A reduced output (dSinks; dBias over its size-1 axes) adds independent rows or copies:
    their rounding errors add in quadrature, so its magnitude does too, and a bound from it
    stays below one missing batch's, head's or key tile's share (bundlegen tolerance-power).
    The io-precision reference rounds P (dropped and scaled) before P^T dO and dS before
    dS K and dS^T Q (Precision.rounded); dBias and dSinks come from the unrounded float32
    terms, as a kernel reduces them.
    """
    B, H_q, S_q, D_qk = q.shape
    H_k, S_kv = k.shape[1], k.shape[2]
    H_v, D_v = v.shape[1], v.shape[3]
    device, cdt = q.device, precision.compute
    budget = max_block_elems or default_block_elems(device)
    # the results as views of one zeroed buffer (one allocation, one fill)
    shapes = [(B, H_q, S_q, D_qk), (B, H_k, S_kv, D_qk), (B, H_v, S_kv, D_v)] * (2 if precision.magnitudes else 1)
    sizes = [math.prod(shape) for shape in shapes]
    flat = torch.zeros(sum(sizes), dtype=cdt, device=device)
    grads = [part.view(shape) for part, shape in zip(flat.split(sizes), shapes)]
    dq, dk, dv = grads[:3]
    mags = grads[3:] or [None] * 3
    ops = _operands(q, k, v, do, attrs, fwd, precision)
    score_bias = _score_bias(modifiers, B, H_q, S_q, S_kv, attrs, cdt)
    keep_scale = _keep_scale(modifiers, attrs, (B, H_q, S_q, S_kv), cdt)
    dbias = mag_dbias = None
    if modifiers.dbias_dims is not None:
        dbias = torch.zeros(modifiers.dbias_dims, dtype=cdt, device=device)
        mag_dbias = torch.zeros_like(dbias) if precision.magnitudes else None
    groups = (H_q // H_k, H_q // H_v)
    for blk in blocks(B, H_q, S_q, S_kv, attrs, budget, head_alignment(H_q, H_k, H_v)):
        if blk.empty:
            continue
        ks = None if keep_scale is None else keep_scale((slice(blk.b0, blk.b1), slice(blk.h0, blk.h1),
                                                         slice(blk.r0, blk.r1), slice(blk.c0, blk.c1)))
        p, slope = _block_gradients(ops, blk, attrs, score_bias(blk), ks, precision, groups,
                                    (dq, dk, dv), dbias)
        if precision.magnitudes:
            _block_magnitudes(ops, blk, attrs.attn_scale, p, slope, ks, groups, mags, mag_dbias)
    dsinks = mag_dsinks = None
    if modifiers.dsinks:
        p_sink = torch.exp(modifiers.sinks.to(device=device, dtype=cdt).view(1, H_q, 1, 1) - ops.lse)
        dsinks = -(p_sink * ops.delta).sum(dim=(0, 2, 3))
        if precision.magnitudes:   # rows in quadrature (each row's worst case, rowsum(|dO| |O|), is its own)
            mag_dsinks = (p_sink * ops.absolute[4]).square_().sum(dim=(0, 2, 3)).sqrt_()
    if mag_dbias is not None:
        mag_dbias.sqrt_()
    return Backward(dq=dq, dk=dk, dv=dv, mag_dq=mags[0], mag_dk=mags[1], mag_dv=mags[2],
                    dbias=dbias, mag_dbias=mag_dbias, dsinks=dsinks, mag_dsinks=mag_dsinks)


def _block_gradients(ops: _Operands, blk: Block, attrs: Attributes, bias: torch.Tensor | None,
                     ks: torch.Tensor | None, precision: Precision, groups: tuple[int, int],
                     out: tuple, dbias: torch.Tensor | None) -> tuple:
    """One block's share of dQ, dK, dV (and dBias) added into `out`; (P, the softcap's
    slope or None) for the magnitudes."""
    rows = (slice(blk.b0, blk.b1), slice(blk.h0, blk.h1), slice(blk.r0, blk.r1))
    kv = (slice(blk.b0, blk.b1), slice(blk.h0, blk.h1), slice(blk.c0, blk.c1))
    dq, dk, dv = out
    qb, dob, kb, vb = ops.q[rows], ops.do[rows], ops.k[kv], ops.v[kv]
    s, t = _scores(qb, kb, attrs.attn_scale, ops.dropped(blk), attrs.softcap, bias)
    p = s.sub_(ops.lse[rows]).exp_()
    del s
    # d(cap * tanh(s / cap)) / ds
    slope = None if t is None else t.square_().neg_().add_(1.0)
    pt = precision.rounded(p if ks is None else p * ks).transpose(-1, -2)   # P_drop^T under dropout
    _add_group_sums(dv, torch.matmul(pt, dob), blk, groups[1])
    del pt
    dp = torch.matmul(dob, vb.transpose(-1, -2))
    if ks is not None:                                     # dP = dP_drop * keep / (1 - p)
        dp.mul_(ks)
    ds = dp.sub_(ops.delta[rows]).mul_(p)
    del dp
    if dbias is not None:
        _add_reduced(dbias, ds, blk)
    if slope is not None:
        ds.mul_(slope)
    ds = precision.rounded(ds)
    torch.mul(torch.matmul(ds, kb), attrs.attn_scale, out=dq[rows])
    _add_group_sums(dk, torch.matmul(ds.transpose(-1, -2), qb), blk, groups[0], attrs.attn_scale)
    return p, slope


def _block_magnitudes(ops: _Operands, blk: Block, scale: float, p: torch.Tensor,
                      slope: torch.Tensor | None, ks: torch.Tensor | None, groups: tuple[int, int],
                      mags: list, mag_dbias: torch.Tensor | None) -> None:
    """One block's share of the magnitudes (the same sums on absolute values)."""
    rows = (slice(blk.b0, blk.b1), slice(blk.h0, blk.h1), slice(blk.r0, blk.r1))
    kv = (slice(blk.b0, blk.b1), slice(blk.h0, blk.h1), slice(blk.c0, blk.c1))
    abs_q, abs_do, abs_k, abs_v, abs_delta = ops.absolute
    mag_dq, mag_dk, mag_dv = mags
    adob = abs_do[rows]
    pt = (p if ks is None else p * ks).transpose(-1, -2)
    _add_group_sums(mag_dv, torch.matmul(pt, adob), blk, groups[1])
    del pt
    ds_mag = torch.matmul(adob, abs_v[kv].transpose(-1, -2))
    if ks is not None:
        ds_mag.mul_(ks)
    ds_mag = ds_mag.add_(abs_delta[rows]).mul_(p)
    if mag_dbias is not None:   # squares: a reduced dBias adds its copies' in quadrature
        _add_reduced(mag_dbias, ds_mag.square(), blk)
    if slope is not None:
        ds_mag.mul_(slope)
    torch.mul(torch.matmul(ds_mag, abs_k[kv]), scale, out=mag_dq[rows])
    _add_group_sums(mag_dk, torch.matmul(ds_mag.transpose(-1, -2), abs_q[rows]), blk, groups[0], scale)
