"""A graph in one line, for people: sizes, dtype, mask, scale, and each port's strides
(a port packed in BHSD order, at offset 0, is written `bhsd`; a ragged graph's token-major
port packed token by token `thd`, head by head `htd`)."""
from __future__ import annotations

from bundlegen.graph import RAGGED_LAYOUT_ORDERS, Graph, TensorSpec, default_scale, packed_strides


def _layout(spec: TensorSpec) -> str:
    if len(spec.dims) == 4 and spec.strides == packed_strides(spec.dims) and spec.offset == 0:
        return "bhsd"
    if len(spec.dims) == 3:
        named = [n for n, order in RAGGED_LAYOUT_ORDERS.items() if spec.strides == packed_strides(spec.dims, order)]
        if named:
            return named[0] + (f"+{spec.offset}" if spec.offset else "")
    text = "[" + ",".join(map(str, spec.strides)) + "]"
    return text + (f"+{spec.offset}" if spec.offset else "")


def mask_text(graph: Graph) -> str:
    a = graph.attributes
    if a.left_bound is None and a.right_bound is None:
        return "none"
    return f"{a.diagonal_alignment} left={a.left_bound} right={a.right_bound}"


def ragged_text(graph: Graph) -> str:
    """A ragged graph's sequences: each side's lengths and offsets (hidden on a launched
    graph), its used lengths where it has them, its token rows and max_seqlen bounds."""
    r = graph.ragged

    def side(name: str, cu) -> str:
        if cu is None:
            return f"cu_{name}=hidden"
        lengths = ",".join(str(b - a) for a, b in zip(cu, cu[1:]))
        return f"len_{name}=({lengths}) cu_{name}=[{','.join(map(str, cu))}]"
    used = "".join(f" used_{p[8:]}=" + (f"({','.join(map(str, getattr(r, p)))})" if getattr(r, p) else "hidden")
                   for p in r.seqused_ports)   # seqused_q -> used_q
    return (f"ragged {side('q', r.cu_seqlens_q)} {side('kv', r.cu_seqlens_kv)}{used} T_q={graph.T_q} "
            f"T_kv={graph.T_kv} max_q={r.max_seqlen_q} max_kv={r.max_seqlen_kv}")


def graph_line(graph: Graph) -> str:
    g, a = graph, graph.attributes
    scale = f"{a.attn_scale:.6g}" + (" (default)" if a.attn_scale == default_scale(g.D_qk) else "")
    heads = f"H_q={g.H_q}" + ("" if g.H_k == g.H_v == g.H_q else f" H_k={g.H_k} H_v={g.H_v}")
    seqs = f"S_q={g.S_q}" + ("" if g.S_kv == g.S_q else f" S_kv={g.S_kv}")
    if g.ragged is not None:
        seqs = ragged_text(g)
    dims = f"D={g.D_qk}" if g.D_v == g.D_qk else f"D_qk={g.D_qk} D_v={g.D_v}"
    layouts = " ".join(f"{p}={_layout(g.tensors[p])}" for p in g.ports if p in g.tensors)
    dropout = "" if a.dropout_probability is None else f" dropout={a.dropout_probability:g}"
    if a.softcap is not None:
        dropout += f" softcap={a.softcap:g}"
    if a.deterministic_algorithm:
        dropout += " deterministic"
    return (f"{g.dtype} B={g.B} {heads} {seqs} {dims} scale={scale} mask={mask_text(g)}{dropout} | "
            f"{layouts}")
