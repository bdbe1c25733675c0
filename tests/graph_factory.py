"""Small Graph and Case builders for tests: packed BHSD or BSHD layouts from sizes, with
per-port overrides of strides and offsets for the odd layouts a test needs."""
from __future__ import annotations

from typing import Mapping

from bundlegen import ids
from bundlegen.graph import (Attributes, Case, DataSpec, Graph, Rejection, TensorSpec,
                             canonical_json, default_scale, packed_strides)

#: Axis order from outermost to innermost, as indices into [B, H, S, D].
LAYOUT_ORDERS = {"bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3)}


def make_graph(B: int = 1, H_q: int = 2, H_k: int = 1, H_v: int = 1, S_q: int = 17,
               S_kv: int = 33, D_qk: int = 16, D_v: int = 16, dtype: str = "bf16",
               layout: str = "bhsd", scale: float | None = None, alignment: str = "TOP_LEFT",
               left: int | None = None, right: int | None = None,
               out_strides: Mapping[str, tuple[int, ...]] | None = None,
               offsets: Mapping[str, int] | None = None) -> Graph:
    """A graph with every port packed in `layout` (stats packed [B, H_q, S_q, 1], fp32).
    `out_strides` and `offsets` override the strides / offset of any port by name."""
    dims = {
        "q": (B, H_q, S_q, D_qk), "dq": (B, H_q, S_q, D_qk),
        "k": (B, H_k, S_kv, D_qk), "dk": (B, H_k, S_kv, D_qk),
        "v": (B, H_v, S_kv, D_v), "dv": (B, H_v, S_kv, D_v),
        "o": (B, H_q, S_q, D_v), "do": (B, H_q, S_q, D_v),
        "stats": (B, H_q, S_q, 1),
    }
    out_strides, offsets = dict(out_strides or {}), dict(offsets or {})
    tensors = {}
    for port, d in dims.items():
        order = (0, 1, 2, 3) if port == "stats" else LAYOUT_ORDERS[layout]
        tensors[port] = TensorSpec(
            dims=d, strides=tuple(out_strides.get(port, packed_strides(d, order))),
            dtype="fp32" if port == "stats" else dtype, offset=offsets.get(port, 0))
    attrs = Attributes(attn_scale=default_scale(D_qk) if scale is None else scale,
                       diagonal_alignment=alignment, left_bound=left, right_bound=right)
    return Graph(tensors=tensors, attributes=attrs)


def make_case(graph: Graph, seed: int = 1, distribution: str = "randn",
              purpose: str = "claim", rejection: Rejection | None = None) -> Case:
    """A case around `graph`, with the id bundlegen.ids gives its content and seed."""
    data = DataSpec(seed=seed, distribution=distribution)
    return Case(id=ids.case_id(purpose, graph, distribution, rejection, seed), purpose=purpose,
                items=("TEST",), graph=graph, data=data, expected_rejection=rejection)
