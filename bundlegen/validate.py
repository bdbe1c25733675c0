"""Graph rules shared by every layer: the frontend validator and the layout predicates
engines decline with. Each rule returns the first reason code (bundlegen.reasons) or None."""
from __future__ import annotations

import math

from bundlegen import reasons as R
from bundlegen.graph import ALIGNMENTS, DTYPES, OUTPUT_PORTS, PORTS, Graph, TensorSpec


def frontend_reason(graph: Graph) -> str | None:
    """The first reason the graph is not a well-formed SDPA backward node, else None."""
    t = graph.tensors
    for port in PORTS:
        if port not in t:
            return R.MISSING_TENSOR
    for port in PORTS:
        spec = t[port]
        if len(spec.dims) != 4:
            return R.BAD_RANK
        if len(spec.strides) != len(spec.dims):
            return R.STRIDE_COUNT
        if any(d <= 0 for d in spec.dims):
            return R.NONPOSITIVE_DIM
        if any(s < 0 for s in spec.strides):
            return R.NEGATIVE_STRIDE
        if spec.offset < 0:
            return R.NEGATIVE_OFFSET
        if spec.dtype not in DTYPES:
            return R.UNKNOWN_DTYPE
    io = t["q"].dtype
    if any(t[p].dtype != io for p in PORTS if p != "stats"):
        return R.DTYPE_MISMATCH
    if t["stats"].dtype != "fp32":
        return R.STATS_DTYPE
    B, H_q, S_q, D_qk = t["q"].dims
    _, H_k, S_kv, _ = t["k"].dims
    H_v, D_v = t["v"].dims[1], t["v"].dims[3]
    if t["k"].dims[0] != B or t["v"].dims[0] != B:
        return R.BATCH_MISMATCH
    q_like = (B, H_q, S_q)
    if t["dq"].dims != (B, H_q, S_q, D_qk) or t["o"].dims != (*q_like, D_v) or t["do"].dims != (*q_like, D_v):
        return R.O_DIMS_MISMATCH
    if (t["v"].dims[2] != S_kv or t["dk"].dims != t["k"].dims or t["dv"].dims != t["v"].dims):
        return R.KV_DIMS_MISMATCH
    if t["stats"].dims != (B, H_q, S_q, 1):
        return R.STATS_DIMS_MISMATCH
    if H_q % H_k or H_q % H_v:
        return R.GQA_NOT_DIVISIBLE
    a = graph.attributes
    if a.diagonal_alignment not in ALIGNMENTS:
        return R.BAD_ALIGNMENT
    if a.right_bound is not None and a.right_bound < -1:
        return R.RIGHT_BOUND_BELOW_MINUS_ONE
    if a.left_bound is not None and a.left_bound <= 0:
        return R.LEFT_BOUND_NONPOSITIVE
    if not math.isfinite(a.attn_scale):
        return R.SCALE_NONFINITE
    if a.attn_scale <= 0:
        return R.SCALE_NONPOSITIVE
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
