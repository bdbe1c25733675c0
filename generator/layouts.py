"""Storage kinds: a named way to lay out one rank-4 tensor [B, H, S, D] in memory,
returned as (strides, offset) in elements. Plans name kinds per port; nothing else
in the generator knows about strides."""
from __future__ import annotations

from typing import Callable

Dims = tuple[int, int, int, int]
Placement = tuple[tuple[int, int, int, int], int]

STATS_HEAD_PAD = 64      # stats-padded-head: head stride S_q + 64
STATS_BATCH_PAD = 32     # stats-padded-batch: batch stride H*S_q + 32
BHSD_OFFSET = 7          # bhsd+7: packed, storage starts 7 elements in


def _bhsd(d: Dims, pitch: int | None = None, offset: int = 0) -> Placement:
    B, H, S, D = d
    row = D if pitch is None else pitch
    return (H * S * row, S * row, row, 1), offset


def _bshd(d: Dims, pitch: int | None = None) -> Placement:
    B, H, S, D = d
    row = H * D if pitch is None else pitch
    return (S * row, D, row, 1), 0


def _sbhd(d: Dims) -> Placement:
    B, H, S, D = d
    return (H * D, D, B * H * D, 1), 0


def _order(order: str) -> Callable[[Dims], Placement]:
    """Dense storage with B, H, S nested in `order` (outermost first), D innermost."""
    def place(d: Dims) -> Placement:
        B, H, S, D = d
        size = {"b": B, "h": H, "s": S}
        stride, step = {}, D
        for axis in reversed(order):
            stride[axis] = step
            step *= size[axis]
        return (stride["b"], stride["h"], stride["s"], 1), 0
    return place


def _kv(slot: int) -> Callable[[Dims], Placement]:
    """Slot `slot` of one [B, S, 2, H, D] buffer (k, v packed)."""
    def place(d: Dims) -> Placement:
        B, H, S, D = d
        return (S * 2 * H * D, D, 2 * H * D, 1), slot * H * D
    return place


def _bhds(d: Dims) -> Placement:
    """Head dim outermost within a head: the head-dim stride is S, not 1."""
    B, H, S, D = d
    return (H * D * S, D * S, 1, S), 0


def _qkv(slot: int) -> Callable[[Dims], Placement]:
    """Slot `slot` of one [B, S, 3, H, D] buffer (q, k, v interleaved)."""
    def place(d: Dims) -> Placement:
        B, H, S, D = d
        return (S * 3 * H * D, D, 3 * H * D, 1), slot * H * D
    return place


def _broadcast(axis: int) -> Callable[[Dims], Placement]:
    """Packed storage of one batch (axis 0) or one head (axis 1), read with stride 0."""
    def place(d: Dims) -> Placement:
        B, H, S, D = d
        return ((0, S * D, D, 1) if axis == 0 else (S * D, 0, D, 1)), 0
    return place


PORT_KINDS: dict[str, Callable[[Dims], Placement]] = {
    "bhsd": _bhsd,
    "bhsd+7": lambda d: _bhsd(d, offset=BHSD_OFFSET),
    "bshd": _bshd,
    "sbhd": _sbhd,
    "bhds": _bhds,
    "pad1": lambda d: _bhsd(d, pitch=d[3] + 1),
    "pad8": lambda d: _bhsd(d, pitch=d[3] + 8),
    "odd-pitch": lambda d: _bshd(d, pitch=d[1] * d[3] + 1 + (d[1] * d[3]) % 2),
    "bcast-batch": _broadcast(0),
    "bcast-head": _broadcast(1),
    "qkv-0": _qkv(0),
    "qkv-1": _qkv(1),
    "qkv-2": _qkv(2),
    "hbsd": _order("hbs"),
    "hsbd": _order("hsb"),
    "shbd": _order("shb"),
    "kv-0": _kv(0),
    "kv-1": _kv(1),
}


def _stats(strides: Callable[[int, int], tuple[int, int, int]]) -> Callable[[Dims], Placement]:
    def place(d: Dims) -> Placement:
        B, H, S, _one = d
        b, h, s = strides(H, S)
        return (b, h, s, 1), 0
    return place


STATS_KINDS: dict[str, Callable[[Dims], Placement]] = {
    "stats-packed": _stats(lambda H, S: (H * S, S, 1)),
    "stats-padded-head": _stats(lambda H, S: (H * (S + STATS_HEAD_PAD), S + STATS_HEAD_PAD, 1)),
    "stats-s-major": _stats(lambda H, S: (S * H, 1, H)),
    "stats-seq-stride-2": _stats(lambda H, S: (2 * H * S, 2 * S, 2)),
    "stats-padded-batch": _stats(lambda H, S: (H * S + STATS_BATCH_PAD, S, 1)),
}


def place(kind: str, dims: Dims) -> Placement:
    """(strides, offset) of a tensor with `dims` stored as `kind`."""
    table = STATS_KINDS if kind.startswith("stats-") else PORT_KINDS
    return table[kind](dims)


# ----------------------------------------------------------------------------- ragged graphs
# A ragged graph's ports are token-major [T, H, D] (stats [T_q, H_q, 1]); its kinds place
# one such tensor. The storage offset is the TokenStorage's, added by the caller.
RaggedDims = tuple[int, int, int]
TOKEN_PAD = 16           # thd-pad16: token stride H*D + 16


RAGGED_KINDS: dict[str, Callable[[RaggedDims], tuple[int, int, int]]] = {
    "thd": lambda d: (d[1] * d[2], d[2], 1),                 # token by token (FlashAttention varlen)
    "htd": lambda d: (d[2], d[0] * d[2], 1),                 # head by head
    "thd-pad16": lambda d: (d[1] * d[2] + TOKEN_PAD, d[2], 1),
}

RAGGED_STATS_KINDS: dict[str, Callable[[RaggedDims], tuple[int, int, int]]] = {
    "stats-ht": lambda d: (1, d[0], 1),                      # [H, T_q]: FlashAttention's LSE
    "stats-th": lambda d: (d[1], 1, 1),                      # [T_q, H]
}


def ragged_strides(kind: str, dims: RaggedDims) -> tuple[int, int, int]:
    """Strides of a token-major tensor with `dims` stored as `kind`."""
    table = RAGGED_STATS_KINDS if kind.startswith("stats-") else RAGGED_KINDS
    return table[kind](dims)


#: packed token storages (TokenStorage.packed): the slot of each port in its [T, n, H, D]
#: buffer. Inputs and their gradients share the slot numbering (dQKV like QKV), as
#: FlashAttention's varlen qkvpacked / kvpacked entry points return them.
PACKED_SLOTS: dict[str, dict[str, int]] = {
    "qkv": {"q": 0, "k": 1, "v": 2, "dq": 0, "dk": 1, "dv": 2},
    "kv": {"k": 0, "v": 1, "dk": 0, "dv": 1},
}


def packed_placement(packed: str, port: str, dims: RaggedDims) -> tuple[tuple[int, int, int], int] | None:
    """(strides, slot offset) of a port of a packed token storage, or None for a port the
    packing leaves alone (o, do, stats; q under "kv")."""
    slot = PACKED_SLOTS[packed].get(port)
    if slot is None:
        return None
    n, (_, H, D) = len(set(PACKED_SLOTS[packed].values())), dims
    return (n * H * D, D, 1), slot * H * D
