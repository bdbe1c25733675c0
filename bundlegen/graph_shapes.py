"""Graphs built from sizes: the port dims of a dense (BHSD) or ragged (THD) graph, packed
strides in a named layout, and the score-modifier ports added to a graph."""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from bundlegen.graph_records import Attributes, Graph, Ragged, TensorSpec, packed_strides


def default_scale(d_qk: int) -> float:
    return 1.0 / math.sqrt(d_qk)


#: Axis order from outermost to innermost, as indices into [B, H, S, D].
LAYOUT_ORDERS = {"bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3)}


def port_dims(B: int, H_q: int, H_k: int, H_v: int, S_q: int, S_kv: int, D_qk: int,
              D_v: int) -> dict[str, tuple[int, int, int, int]]:
    """The logical dims of every port (DESIGN section 2)."""
    return {"q": (B, H_q, S_q, D_qk), "k": (B, H_k, S_kv, D_qk), "v": (B, H_v, S_kv, D_v),
            "o": (B, H_q, S_q, D_v), "do": (B, H_q, S_q, D_v), "stats": (B, H_q, S_q, 1),
            "dq": (B, H_q, S_q, D_qk), "dk": (B, H_k, S_kv, D_qk), "dv": (B, H_v, S_kv, D_v)}


def dense_graph(B: int = 1, H_q: int = 2, H_k: int | None = None, H_v: int | None = None,
                S_q: int = 16, S_kv: int | None = None, D_qk: int = 16, D_v: int | None = None,
                dtype: str = "fp16", layout: str = "bhsd", scale: float | None = None,
                alignment: str = "TOP_LEFT", left: int | None = None, right: int | None = None,
                dropout: float | None = None, strides: Mapping[str, tuple[int, ...]] | None = None,
                offsets: Mapping[str, int] | None = None) -> Graph:
    """A graph from sizes: every port packed in `layout` (stats packed [B, H_q, S_q, 1],
    fp32); H_k defaults to H_q, H_v to H_k, S_kv to S_q, D_v to D_qk. `strides` and
    `offsets` override any port's strides or offset by name."""
    H_k = H_q if H_k is None else H_k
    H_v = H_k if H_v is None else H_v
    S_kv = S_q if S_kv is None else S_kv
    D_v = D_qk if D_v is None else D_v
    strides, offsets = dict(strides or {}), dict(offsets or {})
    tensors = {}
    for port, d in port_dims(B, H_q, H_k, H_v, S_q, S_kv, D_qk, D_v).items():
        order = LAYOUT_ORDERS["bhsd" if port == "stats" else layout]
        tensors[port] = TensorSpec(dims=d, strides=tuple(strides.get(port, packed_strides(d, order))),
                                   dtype="fp32" if port == "stats" else dtype,
                                   offset=offsets.get(port, 0))
    attrs = Attributes(attn_scale=default_scale(D_qk) if scale is None else scale,
                       diagonal_alignment=alignment, left_bound=left, right_bound=right,
                       dropout_probability=dropout)
    return Graph(tensors=tensors, attributes=attrs)


#: bias broadcast kinds: which of the bias's axes 0 (batch) and 1 (heads) have stride 0
BIAS_BROADCASTS = {"full": (), "batch": (0,), "head": (1,), "both": (0, 1)}


#: the two forms of the alibi_slopes port: one slope per query head, or per sequence and head
ALIBI_SLOPES_DIMS = {"head": lambda B, H_q: (H_q,), "batch": lambda B, H_q: (B, H_q)}


def with_modifiers(graph: Graph, *, bias: str | None = None, dbias: bool = False,
                   sinks: bool = False, dsinks: bool = False,
                   softcap: float | None = None, dropout: float | None = None,
                   dropout_mask: str | None = "full", alibi_slopes: str | None = None) -> Graph:
    """`graph` (padded) with score-modifier ports added, each packed: a bias broadcast as
    BIAS_BROADCASTS[bias] (zero strides on its broadcast axes), its dbias summed over them
    (dims 1 there), sinks / dsinks [H_q] fp32; `softcap` sets the attribute; `dropout` sets
    dropout_probability and, unless `dropout_mask` is None, adds the dropout_mask port
    broadcast as BIAS_BROADCASTS[dropout_mask]; `alibi_slopes` adds that fp32 port, one slope
    per query head ("head": [H_q]) or per sequence and query head ("batch": [B, H_q]). On a
    ragged graph B is its batch and S_q, S_kv its max_seqlens: the bias is the padded
    [B, H_q, max_seqlen_q, max_seqlen_kv] (docs/CONTRACTS.md, "Score modifiers")."""
    B, H_q, S_q, S_kv = graph.B, graph.H_q, graph.S_q, graph.S_kv
    tensors = dict(graph.tensors)
    if bias is not None:
        axes = BIAS_BROADCASTS[bias]
        reduced = tuple(1 if a in axes else d for a, d in enumerate((B, H_q, S_q, S_kv)))
        strides = tuple(0 if a in axes else s for a, s in enumerate(packed_strides(reduced)))
        tensors["bias"] = TensorSpec(dims=(B, H_q, S_q, S_kv), strides=strides, dtype=graph.dtype)
        if dbias:
            tensors["dbias"] = TensorSpec(dims=reduced, strides=packed_strides(reduced),
                                          dtype=graph.dtype)
    elif dbias:
        raise ValueError("dbias needs a bias")
    if sinks:
        tensors["sinks"] = TensorSpec(dims=(H_q,), strides=(1,), dtype="fp32")
        if dsinks:
            tensors["dsinks"] = TensorSpec(dims=(H_q,), strides=(1,), dtype="fp32")
    elif dsinks:
        raise ValueError("dsinks needs sinks")
    if alibi_slopes is not None:
        dims = ALIBI_SLOPES_DIMS[alibi_slopes](B, H_q)
        tensors["alibi_slopes"] = TensorSpec(dims=dims, strides=packed_strides(dims), dtype="fp32")
    attrs = graph.attributes if softcap is None else dataclasses.replace(graph.attributes,
                                                                         softcap=float(softcap))
    if dropout is not None:
        attrs = dataclasses.replace(attrs, dropout_probability=float(dropout))
        if dropout_mask is not None:
            axes = BIAS_BROADCASTS[dropout_mask]
            stored = tuple(1 if a in axes else d for a, d in enumerate((B, H_q, S_q, S_kv)))
            strides = tuple(0 if a in axes else s for a, s in enumerate(packed_strides(stored)))
            tensors["dropout_mask"] = TensorSpec(dims=(B, H_q, S_q, S_kv), strides=strides,
                                                 dtype=graph.dtype)
    return dataclasses.replace(graph, tensors=tensors, attributes=attrs)


def dbias_dims(bias: TensorSpec) -> tuple[int, ...]:
    """The dims a dBias for `bias` must have: 1 on every axis the bias broadcasts (stride
    0 on an axis longer than 1), the bias's length elsewhere."""
    return tuple(1 if s == 0 and d > 1 else d for d, s in zip(bias.dims, bias.strides))


#: Token-major storage orders of a ragged graph's [T, H, D] ports, outermost first:
#: "thd" token by token (FlashAttention's varlen layout), "htd" head by head.
RAGGED_LAYOUT_ORDERS = {"thd": (0, 1, 2), "htd": (1, 0, 2)}
#: a ragged graph's stats [T_q, H_q, 1] head by head: FlashAttention's [H, total_q] LSE
RAGGED_STATS_ORDER = (1, 0, 2)


def ragged_port_dims(T_q: int, T_kv: int, H_q: int, H_k: int, H_v: int, D_qk: int,
                     D_v: int) -> dict[str, tuple[int, int, int]]:
    """The logical dims of every port of a ragged graph (DESIGN section 10)."""
    return {"q": (T_q, H_q, D_qk), "k": (T_kv, H_k, D_qk), "v": (T_kv, H_v, D_v),
            "o": (T_q, H_q, D_v), "do": (T_q, H_q, D_v), "stats": (T_q, H_q, 1),
            "dq": (T_q, H_q, D_qk), "dk": (T_kv, H_k, D_qk), "dv": (T_kv, H_v, D_v)}


def ragged_graph(cu_seqlens_q, cu_seqlens_kv=None, *, H_q: int = 2, H_k: int | None = None,
                 H_v: int | None = None, D_qk: int = 16, D_v: int | None = None,
                 dtype: str = "fp16", layout: str = "thd", scale: float | None = None,
                 alignment: str = "TOP_LEFT", left: int | None = None, right: int | None = None,
                 max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
                 T_q: int | None = None, T_kv: int | None = None,
                 strides: Mapping[str, tuple[int, ...]] | None = None,
                 offsets: Mapping[str, int] | None = None,
                 seqused_q: tuple[int, ...] | None = None, seqused_kv: tuple[int, ...] | None = None) -> Graph:
    """A ragged graph from its offsets (and per-sequence used lengths, when given): every port packed in `layout` (stats head by head,
    fp32); T_q / T_kv default to the last offset, cu_seqlens_kv to cu_seqlens_q, the
    max_seqlens to the longest lengths. `strides` and `offsets` override any port's."""
    cu_seqlens_kv = cu_seqlens_q if cu_seqlens_kv is None else cu_seqlens_kv
    H_k = H_q if H_k is None else H_k
    H_v = H_k if H_v is None else H_v
    D_v = D_qk if D_v is None else D_v
    T_q = cu_seqlens_q[-1] if T_q is None else T_q
    T_kv = cu_seqlens_kv[-1] if T_kv is None else T_kv
    strides, offsets = dict(strides or {}), dict(offsets or {})
    tensors = {}
    for port, d in ragged_port_dims(T_q, T_kv, H_q, H_k, H_v, D_qk, D_v).items():
        order = RAGGED_STATS_ORDER if port == "stats" else RAGGED_LAYOUT_ORDERS[layout]
        tensors[port] = TensorSpec(dims=d, strides=tuple(strides.get(port, packed_strides(d, order))),
                                   dtype="fp32" if port == "stats" else dtype,
                                   offset=offsets.get(port, 0))
    attrs = Attributes(attn_scale=default_scale(D_qk) if scale is None else scale,
                       diagonal_alignment=alignment, left_bound=left, right_bound=right)
    return Graph(tensors=tensors, attributes=attrs,
                 ragged=dataclasses.replace(Ragged.of(cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv),
                                            seqused_q=seqused_q if seqused_q is None else tuple(seqused_q),
                                            seqused_kv=seqused_kv if seqused_kv is None else tuple(seqused_kv)))
