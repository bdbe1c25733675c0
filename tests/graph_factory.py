"""Small Graph and Case builders for tests: bundlegen.graph.dense_graph with the tests'
default sizes (GQA 2:1:1, S_q 17 and S_kv 33, bf16), and a Case around a graph."""
from __future__ import annotations

import hashlib
from typing import Mapping

from bundlegen.graph import (Case, DataSpec, Graph, Rejection, canonical_json, dense_graph,
                             packed_strides)

__all__ = ["make_case", "make_graph", "packed_strides"]


def make_graph(*, H_k: int = 1, H_v: int = 1, S_q: int = 17, S_kv: int = 33, D_v: int = 16,
               dtype: str = "bf16", out_strides: Mapping[str, tuple[int, ...]] | None = None,
               **sizes) -> Graph:
    """dense_graph with the tests' defaults; `out_strides` overrides any port's strides."""
    return dense_graph(H_k=H_k, H_v=H_v, S_q=S_q, S_kv=S_kv, D_v=D_v, dtype=dtype,
                       strides=out_strides, **sizes)


def make_case(graph: Graph, seed: int = 1, distribution: str = "randn",
              purpose: str = "claim", rejection: Rejection | None = None) -> Case:
    """A case around `graph`; its id is a hash of the graph and data."""
    data = DataSpec(seed=seed, distribution=distribution)
    text = canonical_json({"graph": graph.to_json(), "data": data.to_json(), "purpose": purpose})
    case_id = "t" + hashlib.sha256(text.encode()).hexdigest()[:11]
    return Case(id=case_id, purpose=purpose, items=("TEST",), graph=graph, data=data,
                expected_rejection=rejection)
