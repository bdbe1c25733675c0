"""Small Graph and Case builders for tests: bundlegen.graph.dense_graph with the tests'
default sizes (GQA 2:1:1, S_q 17 and S_kv 33, bf16), and a Case around a graph."""
from __future__ import annotations

from typing import Mapping

from bundlegen import ids
from bundlegen.graph import Case, DataSpec, Graph, Rejection, dense_graph, packed_strides

__all__ = ["make_case", "make_graph", "packed_strides"]


def make_graph(*, H_k: int = 1, H_v: int = 1, S_q: int = 17, S_kv: int = 33, D_v: int = 16,
               dtype: str = "bf16", out_strides: Mapping[str, tuple[int, ...]] | None = None,
               **sizes) -> Graph:
    """dense_graph with the tests' defaults; `out_strides` overrides any port's strides."""
    return dense_graph(H_k=H_k, H_v=H_v, S_q=S_q, S_kv=S_kv, D_v=D_v, dtype=dtype,
                       strides=out_strides, **sizes)


def make_case(graph: Graph, seed: int = 1, distribution: str = "randn",
              purpose: str = "claim", rejection: Rejection | None = None) -> Case:
    """A case around `graph`, with the id bundlegen.ids gives its content and seed."""
    data = DataSpec(seed=seed, distribution=distribution)
    return Case(id=ids.case_id(purpose, graph, distribution, rejection, seed), purpose=purpose,
                items=("TEST",), graph=graph, data=data, expected_rejection=rejection)
