"""Defects of a few per cent (issue: verdicts that see a wrong gradient): an output, one head
of it or one sequence of it off by 1 + e (e: tolerance_power.SCALE_E of the io dtype, 2 % in
bf16, 0.5 % in fp16, 0.05 % in fp32), and a softmax scale off by 2 %. Each is a whole-engine
wrapper (every graph the engine serves can meet it); the worst-case bound alone cannot see
most of them where an output's terms cancel, the statistical judge does."""
from __future__ import annotations

import dataclasses

import torch

from bundlegen.graph import Graph
from bundlegen.harness.tolerance_power import SCALE_E
from bundlegen.mutants.wrappers import WholeEngineWrapper

#: the softmax scale's error of SoftmaxScaleOff
SCALE_ERROR = 0.02
#: what OutputScaled scales of its port
PARTS = ("whole", "head", "sequence")


def scaled_part(graph: Graph, tensors, port: str, part: str) -> torch.Tensor:
    """The view of output `port` [B, H, S, D] (ragged: [T, H, D]) that `part` names: all of
    it, its middle head, or its middle batch (a ragged graph's middle sequence's rows, from
    the offsets tensors the engine is handed: the launched graph holds no values)."""
    t = tensors[port]
    if part == "whole":
        return t
    if part == "head":
        return t.select(1, t.shape[1] // 2)
    if graph.ragged is None:
        return t.select(0, t.shape[0] // 2)
    cu = tensors["cu_seqlens_q" if port == "dq" else "cu_seqlens_kv"].tolist()
    b = (len(cu) - 1) // 2
    start, end = (min(max(0, x), t.shape[0]) for x in (cu[b], cu[b + 1]))   # a probe's offsets may be bad
    return t[start:max(start, end)]


def has_several_sequences(graph: Graph) -> bool:
    """A batch of at least two sequences, where one of them can be off alone."""
    return (graph.ragged.batch if graph.ragged is not None else graph.B) >= 2


class OutputScaled(WholeEngineWrapper):
    """`port` (all of it, one head or one sequence) written x (1 + e)."""

    def __init__(self, inner, port: str, part: str = "whole"):
        super().__init__(inner)
        assert part in PARTS, part
        self.port, self.part = port, part

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        if self.port in tensors:
            scaled_part(graph, tensors, self.port, self.part).mul_(1.0 + SCALE_E[graph.dtype])


class SoftmaxScaleOff(WholeEngineWrapper):
    """The backward run with attn_scale x (1 + SCALE_ERROR): the scores, P and the scale
    of dQ and dK off by 2 % (a scale folded with a wrong constant)."""

    def run(self, graph, tensors):
        attrs = dataclasses.replace(graph.attributes, attn_scale=graph.attributes.attn_scale * (1 + SCALE_ERROR))
        self.inner.run(dataclasses.replace(graph, attributes=attrs), tensors)
