"""Graph rules shared by every layer: the frontend validator and the layout predicates
engines decline with. Each rule returns the first reason code (bundlegen.reasons) or None."""
from __future__ import annotations

import math
from dataclasses import dataclass

from bundlegen import reasons as R
from bundlegen.graph import (ALIGNMENTS, DTYPES, MODIFIER_INPUT_PORTS, MODIFIER_OUTPUT_PORTS,
                             OUTPUT_PORTS, PORTS, Graph, TensorSpec, dbias_dims)


#: the largest element index a tensor may address (offset + span): 64-bit offset arithmetic
#: with room to spare; past it sizes and costs are not numbers any engine computes with
MAX_SPAN = 2 ** 62
#: canary elements the harness puts before and after every port's storage (a port's
#: declared offset is canary too): a device probe's stray rows must stay inside them
#: (the generator checks each probe's reach against it); a multiple of 64, so a view keeps
#: the alignment its declared offset gives it
GUARD_ELEMS = 512


@dataclass(frozen=True)
class Finding:
    """Why a graph is invalid: the reason code and the field at fault."""
    reason: str
    field: str      # e.g. "graph.tensors.k.dims", "graph.attributes.left_bound"

    def __str__(self) -> str:
        return f"{self.reason} at {self.field}"


def frontend_reason(graph: Graph, *, offsets_on_device: bool = False) -> str | None:
    """The first reason the graph is not a well-formed SDPA backward node, else None."""
    finding = frontend_finding(graph, offsets_on_device=offsets_on_device)
    return None if finding is None else finding.reason


def launch_reason(graph: Graph) -> str | None:
    """What an engine's own checks can find on its launch path: every frontend rule but a
    ragged graph's offset values, which live on the device (a graph as launched has none).
    Engines decline with it first, so an invalid graph offered to them is declined."""
    return frontend_reason(graph, offsets_on_device=True)


def span(spec: TensorSpec) -> int:
    """The last element index the tensor addresses, plus one (its offset included)."""
    return spec.offset + sum((d - 1) * s for d, s in zip(spec.dims, spec.strides)) + 1


def frontend_finding(graph: Graph, *, offsets_on_device: bool = False) -> Finding | None:
    """frontend_reason with the field at fault. `offsets_on_device`: a ragged graph's
    offset values are left unchecked, as on a launch path where they live on the device
    (a device probe); everything else is checked."""
    if graph.ragged is not None:
        return _ragged_finding(graph, offsets_on_device)
    finding = _tensor_finding(graph, rank=4)
    if finding is not None:
        return finding
    t, at = graph.tensors, _at
    B, H_q, S_q, D_qk = t["q"].dims
    _, H_k, S_kv, _ = t["k"].dims
    H_v, D_v = t["v"].dims[1], t["v"].dims[3]
    for port in ("k", "v"):
        if t[port].dims[0] != B:
            return Finding(R.BATCH_MISMATCH, at(port, "dims"))
    q_like = (B, H_q, S_q)
    for port, want in (("dq", (*q_like, D_qk)), ("o", (*q_like, D_v)), ("do", (*q_like, D_v))):
        if t[port].dims != want:
            return Finding(R.O_DIMS_MISMATCH, at(port, "dims"))
    if t["v"].dims[2] != S_kv:
        return Finding(R.KV_DIMS_MISMATCH, at("v", "dims"))
    for port, like in (("dk", "k"), ("dv", "v")):
        if t[port].dims != t[like].dims:
            return Finding(R.KV_DIMS_MISMATCH, at(port, "dims"))
    if t["stats"].dims != (B, H_q, S_q, 1):
        return Finding(R.STATS_DIMS_MISMATCH, at("stats", "dims"))
    for port, heads in (("k", H_k), ("v", H_v)):
        if H_q % heads:
            return Finding(R.GQA_NOT_DIVISIBLE, at(port, "dims"))
    return _modifier_finding(graph) or _attributes_finding(graph)


def _tensor_finding(graph: Graph, rank: int) -> Finding | None:
    """The rules every port obeys on its own, then the dtype rules."""
    t = graph.tensors
    for port in PORTS:
        if port not in t:
            return Finding(R.MISSING_TENSOR, _at(port))
    for port in PORTS:
        finding = _spec_finding(port, t[port], rank)
        if finding is not None:
            return finding
    io = t["q"].dtype
    for port in PORTS:
        if port != "stats" and t[port].dtype != io:
            return Finding(R.DTYPE_MISMATCH, _at(port, "dtype"))
    if t["stats"].dtype != "fp32":
        return Finding(R.STATS_DTYPE, _at("stats", "dtype"))
    return None


def _spec_finding(port: str, spec: TensorSpec, rank: int) -> Finding | None:
    """The rules one port obeys on its own."""
    if len(spec.dims) != rank:
        return Finding(R.BAD_RANK, _at(port, "dims"))
    if len(spec.strides) != len(spec.dims):
        return Finding(R.STRIDE_COUNT, _at(port, "strides"))
    if any(d <= 0 for d in spec.dims):
        return Finding(R.NONPOSITIVE_DIM, _at(port, "dims"))
    if any(s < 0 for s in spec.strides):
        return Finding(R.NEGATIVE_STRIDE, _at(port, "strides"))
    if spec.offset < 0:
        return Finding(R.NEGATIVE_OFFSET, _at(port, "offset"))
    if spec.dtype not in DTYPES:
        return Finding(R.UNKNOWN_DTYPE, _at(port, "dtype"))
    if max(*spec.dims, *spec.strides, spec.offset) >= MAX_SPAN or span(spec) > MAX_SPAN:
        return Finding(R.SPAN_OVERFLOW, _at(port))
    return None


#: each modifier port's rank and the input an output needs
_MODIFIER_RANKS = {"bias": 4, "dbias": 4, "sinks": 1, "dsinks": 1, "dropout_mask": 4, "alibi_slopes": 1}
_NEEDS = {"dbias": ("bias", R.DBIAS_WITHOUT_BIAS), "dsinks": ("sinks", R.DSINKS_WITHOUT_SINKS)}


def _score_shaped(graph: Graph, port: str, spec: TensorSpec, dims_code: str, axis_code: str) -> Finding | None:
    """A port shaped like the scores ([B, H_q, S_q, S_kv]: the bias, the dropout mask), which
    may broadcast over batch and heads only."""
    if spec.dims != (graph.B, graph.H_q, graph.S_q, graph.S_kv):
        return Finding(dims_code, _at(port, "dims"))
    if any(s == 0 and d > 1 for d, s in zip(spec.dims[2:], spec.strides[2:])):
        return Finding(axis_code, _at(port, "strides"))
    return None


def _modifier_finding(graph: Graph) -> Finding | None:
    """The score-modifier ports' rules (docs/CONTRACTS.md, "Score modifiers") on a graph
    whose core ports are valid (a ragged graph's bias is the padded [B, H_q, max_seqlen_q,
    max_seqlen_kv]): an output needs its input; each port on its own; bias and dbias in
    the io dtype, sinks, dsinks and alibi_slopes fp32; then their dims and layouts."""
    t = graph.tensors
    for port, (needed, code) in _NEEDS.items():
        if port in t and needed not in t:
            return Finding(code, _at(port))
    present = [p for p in MODIFIER_INPUT_PORTS + MODIFIER_OUTPUT_PORTS if p in t]
    for port in present:
        finding = _spec_finding(port, t[port], _modifier_rank(port, t[port]))
        if finding is not None:
            return finding
    for port in present:
        if port == "alibi_slopes" and t[port].dtype != "fp32":
            return Finding(R.ALIBI_SLOPES_DTYPE, _at(port, "dtype"))
        if port in ("bias", "dbias", "dropout_mask") and t[port].dtype != graph.dtype:
            return Finding(R.DTYPE_MISMATCH, _at(port, "dtype"))
        if port in ("sinks", "dsinks") and t[port].dtype != "fp32":
            return Finding(R.SINKS_DTYPE, _at(port, "dtype"))
    if "bias" in t:
        bias = t["bias"]
        if (found := _score_shaped(graph, "bias", bias, R.BIAS_DIMS_MISMATCH, R.BIAS_BROADCAST_AXIS)):
            return found
        if "dbias" in t:
            if t["dbias"].dims != dbias_dims(bias):
                return Finding(R.DBIAS_DIMS_MISMATCH, _at("dbias", "dims"))
            if overlaps_itself(t["dbias"]):
                return Finding(R.DBIAS_OVERLAP, _at("dbias", "strides"))
    if "dropout_mask" in t:
        if (found := _score_shaped(graph, "dropout_mask", t["dropout_mask"], R.DROPOUT_MASK_DIMS_MISMATCH,
                                   R.DROPOUT_MASK_BROADCAST_AXIS)):
            return found
        if not graph.attributes.dropout_probability:
            return Finding(R.DROPOUT_MASK_WITHOUT_PROBABILITY, "graph.attributes.dropout_probability")
    for port in ("sinks", "dsinks"):
        if port in t and t[port].dims != (graph.H_q,):
            return Finding(R.SINKS_DIMS_MISMATCH, _at(port, "dims"))
    if "dsinks" in t and overlaps_itself(t["dsinks"]):
        return Finding(R.DSINKS_OVERLAP, _at("dsinks", "strides"))
    if "alibi_slopes" in t and t["alibi_slopes"].dims not in ((graph.H_q,), (graph.B, graph.H_q)):
        return Finding(R.ALIBI_SLOPES_DIMS_MISMATCH, _at("alibi_slopes", "dims"))
    return None


def _modifier_rank(port: str, spec: TensorSpec) -> int:
    """The rank a modifier port must have: alibi_slopes takes rank 1 ([H_q]) or 2
    ([B, H_q]); the others their one rank."""
    if port == "alibi_slopes":
        return len(spec.dims) if len(spec.dims) in (1, 2) else 1
    return _MODIFIER_RANKS[port]


def _at(port: str, field: str = "") -> str:
    return f"graph.tensors.{port}" + (f".{field}" if field else "")


def _ragged_finding(graph: Graph, offsets_on_device: bool) -> Finding | None:
    """The rules of a ragged graph (DESIGN section 10): token-major [T, H, D] ports (stats
    [T_q, H_q, 1]), then the offsets, then the attributes."""
    finding = _tensor_finding(graph, rank=3)
    if finding is not None:
        return finding
    t = graph.tensors
    T_q, H_q, D_qk = t["q"].dims
    T_kv, H_k, _ = t["k"].dims
    H_v, D_v = t["v"].dims[1], t["v"].dims[2]
    if t["k"].dims[2] != D_qk:
        return Finding(R.KV_DIMS_MISMATCH, _at("k", "dims"))
    if t["v"].dims[0] != T_kv:
        return Finding(R.KV_DIMS_MISMATCH, _at("v", "dims"))
    for port, want in (("dq", (T_q, H_q, D_qk)), ("o", (T_q, H_q, D_v)), ("do", (T_q, H_q, D_v))):
        if t[port].dims != want:
            return Finding(R.O_DIMS_MISMATCH, _at(port, "dims"))
    for port, like in (("dk", "k"), ("dv", "v")):
        if t[port].dims != t[like].dims:
            return Finding(R.KV_DIMS_MISMATCH, _at(port, "dims"))
    if t["stats"].dims != (T_q, H_q, 1):
        return Finding(R.STATS_DIMS_MISMATCH, _at("stats", "dims"))
    for port, heads in (("k", H_k), ("v", H_v)):
        if H_q % heads:
            return Finding(R.GQA_NOT_DIVISIBLE, _at(port, "dims"))
    rag = graph.ragged
    launched = rag.cu_seqlens_q is None and rag.cu_seqlens_kv is None and offsets_on_device
    if launched:   # as an engine gets it: the offsets are on the device, B is known
        if rag.batch < 1:
            return Finding(R.RAGGED_OFFSETS_COUNT, "graph.ragged.batch")
    elif (rag.cu_seqlens_q is None or rag.cu_seqlens_kv is None or len(rag.cu_seqlens_q) < 2
            or len(rag.cu_seqlens_kv) != len(rag.cu_seqlens_q)):
        return Finding(R.RAGGED_OFFSETS_COUNT, "graph.ragged.cu_seqlens_kv")
    for port in rag.seqused_ports if not launched else ():
        used = getattr(rag, port)
        if len(used) != rag.batch:
            return Finding(R.RAGGED_SEQUSED_COUNT, f"graph.ragged.{port}")
        if max(abs(x) for x in used) >= MAX_SPAN:
            return Finding(R.SPAN_OVERFLOW, f"graph.ragged.{port}")
    for side in ("q", "kv"):
        if getattr(rag, f"max_seqlen_{side}") < 0:
            return Finding(R.RAGGED_MAX_SEQLEN_NEGATIVE, f"graph.ragged.max_seqlen_{side}")
        if not launched and max(abs(x) for x in getattr(rag, f"cu_seqlens_{side}")) >= MAX_SPAN:
            return Finding(R.SPAN_OVERFLOW, f"graph.ragged.cu_seqlens_{side}")
    if not offsets_on_device:
        finding = ragged_offsets_finding(graph)
        if finding is not None:
            return finding
    # score modifiers and the dropout mask: the padded [B, H_q, max_seqlen_q, max_seqlen_kv]
    # layouts (docs/CONTRACTS.md), checked as on a padded graph
    return _modifier_finding(graph) or _attributes_finding(graph)


def ragged_offsets_finding(graph: Graph) -> Finding | None:
    """The first offset rule a ragged graph's cu_seqlens break (codes in reasons.DEVICE), or
    None. Checked per side, q first: cu[0] >= 0, never decreasing, cu[B] <= T, every length
    <= max_seqlen."""
    rag = graph.ragged
    for side, tokens in (("q", graph.T_q), ("kv", graph.T_kv)):
        cu, field = getattr(rag, f"cu_seqlens_{side}"), f"graph.ragged.cu_seqlens_{side}"
        if cu[0] < 0:
            return Finding(R.RAGGED_NEGATIVE_OFFSET, f"{field}[0]")
        for b in range(len(cu) - 1):
            if cu[b + 1] < cu[b]:
                return Finding(R.RAGGED_OFFSETS_DECREASE, f"{field}[{b + 1}]")
        if cu[-1] > tokens:
            return Finding(R.RAGGED_OFFSET_PAST_STORAGE, f"{field}[{len(cu) - 1}]")
        bound = getattr(rag, f"max_seqlen_{side}")
        for b in range(len(cu) - 1):
            if cu[b + 1] - cu[b] > bound:
                return Finding(R.RAGGED_LENGTH_OVER_MAX, f"{field}[{b + 1}]")
    return seqused_finding(graph)


def seqused_finding(graph: Graph) -> Finding | None:
    """The first rule a padded ragged graph's used lengths break (valid offsets assumed),
    per side, q first: 0 <= seqused[b] (`ragged-seqused-negative`) and seqused[b] <= the
    length of sequence b's cu_seqlens range (`ragged-seqused-past-range`)."""
    rag = graph.ragged
    for side, lengths in (("q", rag.lengths_q), ("kv", rag.lengths_kv)):
        used = getattr(rag, f"seqused_{side}")
        for b, (n, whole) in enumerate(zip(used or (), lengths)):
            if n < 0:
                return Finding(R.RAGGED_SEQUSED_NEGATIVE, f"graph.ragged.seqused_{side}[{b}]")
            if n > whole:
                return Finding(R.RAGGED_SEQUSED_PAST_RANGE, f"graph.ragged.seqused_{side}[{b}]")
    return None


def good_sequences(graph: Graph) -> tuple[int, ...]:
    """The sequences of a ragged graph a device probe's engine must get right (every one,
    for a valid graph): on both sides 0 <= start <= end <= T, length <= max_seqlen, no
    earlier offset above its start and no later offset below its end (so a good sequence
    shares no row with another sequence), and a used length (where the side has them)
    within 0 .. its range's length."""
    rag = graph.ragged
    good = set(range(rag.batch))
    for side, tokens in (("q", graph.T_q), ("kv", graph.T_kv)):
        cu, bound = getattr(rag, f"cu_seqlens_{side}"), getattr(rag, f"max_seqlen_{side}")
        for b in range(rag.batch):
            start, end = cu[b], cu[b + 1]
            if not (0 <= start <= end <= tokens and end - start <= bound
                    and max(cu[:b + 1]) <= start and min(cu[b + 1:]) >= end):
                good.discard(b)
            used = getattr(rag, f"seqused_{side}")
            if used is not None and not 0 <= used[b] <= end - start:
                good.discard(b)
    return tuple(sorted(good))


def _attributes_finding(graph: Graph) -> Finding | None:
    a = graph.attributes
    if a.diagonal_alignment not in ALIGNMENTS:
        return Finding(R.BAD_ALIGNMENT, "graph.attributes.diagonal_alignment")
    if a.right_bound is not None and a.right_bound < -1:
        return Finding(R.RIGHT_BOUND_BELOW_MINUS_ONE, "graph.attributes.right_bound")
    if a.left_bound is not None and a.left_bound <= 0:
        return Finding(R.LEFT_BOUND_NONPOSITIVE, "graph.attributes.left_bound")
    if not math.isfinite(a.attn_scale):
        return Finding(R.SCALE_NONFINITE, "graph.attributes.attn_scale")
    if a.attn_scale <= 0:
        return Finding(R.SCALE_NONPOSITIVE, "graph.attributes.attn_scale")
    if a.softcap is not None and not math.isfinite(a.softcap):
        return Finding(R.SOFTCAP_NONFINITE, "graph.attributes.softcap")
    if a.softcap is not None and a.softcap <= 0:
        return Finding(R.SOFTCAP_NONPOSITIVE, "graph.attributes.softcap")
    p = a.dropout_probability
    if p is not None and not (math.isfinite(p) and 0 <= p < 1):
        return Finding(R.DROPOUT_PROBABILITY_RANGE, "graph.attributes.dropout_probability")
    return None


def has_zero_stride_on_long_axis(spec: TensorSpec) -> bool:
    return any(s == 0 and d > 1 for d, s in zip(spec.dims, spec.strides))


def overlaps_itself(spec: TensorSpec) -> bool:
    """Footprint rule (DESIGN section 6): sort the axes longer than 1 by stride; each stride
    must be at least the span of the axes inside it, or two indices share an element."""
    axes = sorted((s, d) for d, s in zip(spec.dims, spec.strides) if d > 1)
    span = 1  # elements covered by the inner axes, as an extent
    for stride, dim in axes:
        if stride < span:
            return True
        span = stride * (dim - 1) + span
    return False


def output_layout_reason(graph: Graph) -> str | None:
    """The rule every engine needs for its outputs: no zero stride on an axis longer than 1
    (checked first: it is how a broadcast is written), then no self-overlap."""
    for port in OUTPUT_PORTS:
        if has_zero_stride_on_long_axis(graph.tensors[port]):
            return R.ZERO_STRIDE_OUTPUT
    for port in OUTPUT_PORTS:
        if overlaps_itself(graph.tensors[port]):
            return R.OVERLAPPING_OUTPUT
    return None


def stats_is_packed(graph: Graph) -> bool:
    """Stats stored [B, H_q, S_q, 1] contiguous (strides of size-1 axes are free)."""
    spec = graph.tensors["stats"]
    expect = 1
    for d, s in reversed(list(zip(spec.dims, spec.strides))):
        if d > 1 and s != expect:
            return False
        expect *= d
    return True


def stray_reach(graph: Graph) -> dict[str, tuple[int, int]]:
    """Per port, how many elements before its view's first element and past its last
    addressed element the rows of the graph's sequences reach (a kernel with no token-base
    bound reads and writes every row a sequence claims, by its range or its used length):
    rows below 0 and from T on, times the port's token stride."""
    rag = graph.ragged
    rows = {}
    for side, tokens in (("q", graph.T_q), ("kv", graph.T_kv)):
        cu = getattr(rag, f"cu_seqlens_{side}")
        used = getattr(rag, f"seqused_{side}") or (0,) * (len(cu) - 1)   # a used length may run past its range
        spans = [(a, max(b, a + u)) for a, b, u in zip(cu, cu[1:], used) if max(b, a + u) > a]
        rows[side] = (max([0, *(-a for a, _ in spans)]), max([0, *(b - tokens for _, b in spans)]))
    out = {}
    for port, spec in graph.tensors.items():
        below, above = rows["q" if port in ("q", "o", "do", "dq", "stats") else "kv"]
        out[port] = (below * spec.strides[0], above * spec.strides[0])
    return out


def stray_reach_problem(graph: Graph) -> str | None:
    """Why a device probe's bad sequences reach past a port's guard band (the generator
    refuses to write such a probe, and the bundle loader refuses to run one), else None."""
    for port, (before, after) in sorted(stray_reach(graph).items()):
        spec = graph.tensors[port]
        if before > GUARD_ELEMS + spec.offset or after > GUARD_ELEMS:
            return (f"its bad sequences reach {before} elements before and {after} after port '{port}' "
                    f"(guard band {GUARD_ELEMS} + offset {spec.offset}): an unbounded kernel's stray rows "
                    "would land outside the canary")
    return None
