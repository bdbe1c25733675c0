"""A graph in one line, for people: sizes, dtype, mask, scale, and each port's strides
(a port packed in BHSD order, at offset 0, is written `bhsd`)."""
from __future__ import annotations

from bundlegen.graph import PORTS, Graph, TensorSpec, default_scale, packed_strides


def _layout(spec: TensorSpec) -> str:
    if spec.strides == packed_strides(spec.dims) and spec.offset == 0:
        return "bhsd"
    text = "[" + ",".join(map(str, spec.strides)) + "]"
    return text + (f"+{spec.offset}" if spec.offset else "")


def mask_text(graph: Graph) -> str:
    a = graph.attributes
    if a.left_bound is None and a.right_bound is None:
        return "none"
    return f"{a.diagonal_alignment} left={a.left_bound} right={a.right_bound}"


def graph_line(graph: Graph) -> str:
    g, a = graph, graph.attributes
    scale = f"{a.attn_scale:.6g}" + (" (default)" if a.attn_scale == default_scale(g.D_qk) else "")
    heads = f"H_q={g.H_q}" + ("" if g.H_k == g.H_v == g.H_q else f" H_k={g.H_k} H_v={g.H_v}")
    seqs = f"S_q={g.S_q}" + ("" if g.S_kv == g.S_q else f" S_kv={g.S_kv}")
    dims = f"D={g.D_qk}" if g.D_v == g.D_qk else f"D_qk={g.D_qk} D_v={g.D_v}"
    layouts = " ".join(f"{p}={_layout(g.tensors[p])}" for p in PORTS if p in g.tensors)
    dropout = "" if a.dropout_probability is None else f" dropout={a.dropout_probability:g}"
    return (f"{g.dtype} B={g.B} {heads} {seqs} {dims} scale={scale} mask={mask_text(g)}{dropout} | "
            f"{layouts}")
