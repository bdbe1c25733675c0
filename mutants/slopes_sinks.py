"""Mutants of ALiBi slopes and of score modifiers on ragged graphs: a correct engine that
misbehaves only where its condition holds (conditional.py's style: plain wrappers that
present the whole engine, so the condition, not a decline, decides where the defect shows).

- AlibiSlopeOfKvHead: under GQA / MQA each query head reads the slope of its K head's index
  (h // (H_q / H_k)), as a kernel that indexes the slopes by the program's K/V head would.
- AlibiShiftNotPerSequence: on a ragged graph with a bottom-right mask, ALiBi's diagonal
  takes the batch's shift max_seqlen_kv - max_seqlen_q instead of each sequence's
  S_kv_b - S_q_b (the mask itself stays per sequence).
- DsinksOverPaddingRows: on a ragged graph, dSinks sums each sequence's rows up to
  max_seqlen_q: the rows past a sequence's end (the next sequences' tokens, up to T_q) are
  counted again.
"""
from __future__ import annotations

from typing import Mapping

import torch

from bundlegen.graph import Graph
from bundlegen.mask import diagonal_shift
from bundlegen.engines.torch_math.engine import attention_backward_heads, sequence_rows
from bundlegen.mutants.wrappers import WholeEngineWrapper


class AlibiSlopeOfKvHead(WholeEngineWrapper):
    def run(self, graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
        slopes = tensors.get("alibi_slopes")
        if slopes is None or graph.H_k == graph.H_q:
            return self.inner.run(graph, tensors)
        group = graph.H_q // graph.H_k
        kv_index = torch.arange(graph.H_q, device=slopes.device) // group
        self.inner.run(graph, {**tensors, "alibi_slopes": slopes.index_select(-1, kv_index)})


class AlibiShiftNotPerSequence(WholeEngineWrapper):
    def run(self, graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
        self.inner.run(graph, tensors)
        a = graph.attributes
        if graph.ragged is None or "alibi_slopes" not in tensors or a.diagonal_alignment != "BOTTOM_RIGHT":
            return
        # the shift the defect uses, as a correction to each sequence's own (S_kv_b - S_q_b)
        batch_shift = diagonal_shift(graph.S_q, graph.S_kv, a.diagonal_alignment)
        slopes = tensors["alibi_slopes"]
        q, k, v, do = (tensors[p] for p in ("q", "k", "v", "do"))
        for b, rq, rk in sequence_rows(graph, tensors):
            own = len(rk) - len(rq)
            if not len(rq) or not len(rk) or own == batch_shift:
                continue
            i = torch.arange(len(rq), device=q.device, dtype=torch.float32).view(-1, 1)
            j = torch.arange(len(rk), device=q.device, dtype=torch.float32).view(1, -1)
            s = (slopes if slopes.dim() == 1 else slopes[b]).float().view(-1, 1, 1)
            # -slope |i - j + batch_shift| = -slope |i - j + own| + this correction
            correction = -s * ((i - j + batch_shift).abs() - (i - j + own).abs())
            bias = correction.unsqueeze(0)
            if "bias" in tensors:
                bias = bias + tensors["bias"][b:b + 1, :, :len(rq), :len(rk)].float()
            as_batch = lambda t, rows: t[rows.start:rows.stop].transpose(0, 1).unsqueeze(0)
            grads = attention_backward_heads(a, as_batch(q, rq), as_batch(k, rk), as_batch(v, rk),
                                             as_batch(do, rq), bias=bias,
                                             sinks=tensors.get("sinks"), alibi_slopes=s.view(1, -1))
            for port, rows, g in (("dq", rq, grads[0]), ("dk", rk, grads[1]), ("dv", rk, grads[2])):
                tensors[port][rows.start:rows.stop].copy_(g[0].transpose(0, 1))


class DsinksOverPaddingRows(WholeEngineWrapper):
    def run(self, graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
        self.inner.run(graph, tensors)
        if graph.ragged is None or "dsinks" not in tensors:
            return
        sinks = tensors["sinks"].float()
        delta = (tensors["do"].float() * tensors["o"].float()).sum(-1)         # [T_q, H_q]
        lse = tensors["stats"].float()[..., 0]                                  # [T_q, H_q]
        extra = torch.zeros_like(sinks)
        for _, rq, _ in sequence_rows(graph, tensors):
            past = slice(rq.stop, min(rq.start + graph.S_q, graph.T_q))         # rows past its end
            p_sink = torch.exp(sinks.view(1, -1) - lse[past]).nan_to_num(posinf=0.0)
            extra -= (p_sink * delta[past]).sum(0)
        tensors["dsinks"].copy_(tensors["dsinks"].float() + extra)
