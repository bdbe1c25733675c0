"""The io-precision reference of a case (docs/DESIGN.md, "The io-precision reference"): the
backward a correct kernel in the graph's io dtype computes, from what such a kernel reads,
beside the float64 oracle; the statistical judge (harness/statistical.py) measures an honest
error level by it. `materialize` computes it; `judged_honest` cuts it to the judged rows."""
from __future__ import annotations

import torch

from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.graph import OUTPUT_PORTS, Graph
from bundlegen.harness import oracle, oracle_ragged


def io_reference(graph: Graph, inputs: tuple, engine_forward: oracle.Forward, mods: oracle.Modifiers,
                 seqs, max_block_elems: int | None) -> oracle.Backward:
    """The io-precision reference of the case (oracle.io_precision) from the inputs, O and
    LSE as an engine reads them, each output rounded to its port's dtype as an engine
    writes it. float32 products stay IEEE float32 (no TF32) while it runs."""
    q, k, v, do = inputs
    precision = oracle.io_precision(TORCH_DTYPES[graph.dtype])
    matmul_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        if seqs is None:
            ref = oracle.backward(q, k, v, do, graph.attributes, engine_forward, modifiers=mods,
                                  max_block_elems=max_block_elems, precision=precision)
        else:
            ref = oracle_ragged.backward(q, k, v, do, graph.attributes, engine_forward, seqs, modifiers=mods,
                                         max_block_elems=max_block_elems, precision=precision)
    finally:
        torch.set_float32_matmul_precision(matmul_precision)
    specs = graph.tensors
    return oracle.Backward(**{port: ref.gradient(port).to(TORCH_DTYPES[specs[port].dtype])
                              for port in graph.output_ports})


def judged_honest(m) -> oracle.Backward | None:
    """The io-precision reference over the judged rows (as judged_outputs cuts the oracle's),
    or None when the case has none."""
    honest = m.io_reference
    if honest is None or m.judged_rows is None:
        return honest
    return oracle.Backward(**{port: honest.gradient(port).index_select(0, m.judged_rows[port])
                              if port in OUTPUT_PORTS else honest.gradient(port)
                              for port in m.case.graph.output_ports})
