"""Mutants of the port forms and of the newest features met together (issue 58): a correct
engine that misbehaves only where a port takes one form, or where two new features (or a
new feature and a risky core value) meet. Off its condition each one is the engine itself;
each presents the whole engine (WholeEngineWrapper), so the condition, not a decline,
decides where the defect shows. Each is modelled on a defect class public reports show:
a broadcast read with the wrong strides, a per-head index taken from the K/V head, a
scale or a branch lost in one kernel variant, a used length or a slot taken from the
wrong place."""
from __future__ import annotations

import dataclasses
from typing import Mapping

import torch

from bundlegen.graph import Graph
from bundlegen.engines.torch_math.engine import sequence_rows
from bundlegen.mutants.ragged_layouts import packed_slot
from bundlegen.mutants.wrappers import WholeEngineWrapper

Tensors = Mapping[str, torch.Tensor]


def _dense(graph: Graph) -> bool:
    return graph.ragged is None


def _broadcast(t: torch.Tensor, axis: int) -> torch.Tensor:
    """t with `axis` read from index 0 only (stride 0), as a kernel that ignores it would."""
    index = [slice(None)] * t.dim()
    index[axis] = slice(0, 1)
    return t[tuple(index)].expand(t.shape)


# ----------------------------------------------------------------------------- dropout forms
class DropoutBatchOnlyReadAsBoth(WholeEngineWrapper):
    """A dropout mask broadcast over the batch only (batch stride 0, head stride kept) read
    as one broadcast over both: every head gets head 0's mask (H_q >= 2)."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        mask = tensors.get("dropout_mask")
        if mask is not None and mask.dim() == 4 and mask.stride(0) == 0 and mask.stride(1) != 0 and mask.shape[1] >= 2:
            tensors = {**tensors, "dropout_mask": _broadcast(mask, 1)}
        self.inner.run(graph, tensors)


class DropoutMaskHeadOfKvHead(WholeEngineWrapper):
    """Under GQA / MQA a per-head dropout mask indexed by the K/V head (h // (H_q / H_k)), as
    a kernel whose program walks the K/V heads would (padded graphs)."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        mask = tensors.get("dropout_mask")
        if _dense(graph) and mask is not None and mask.stride(1) != 0 and graph.H_k < graph.H_q:
            kv = torch.arange(graph.H_q, device=mask.device) // (graph.H_q // graph.H_k)
            tensors = {**tensors, "dropout_mask": mask.index_select(1, kv)}
        self.inner.run(graph, tensors)


class DropoutScaleRoundedInFp32(WholeEngineWrapper):
    """fp32 io with dropout: the keep scale 1 / (1 - p) formed in bf16, so dV is off by
    bf16(1 / (1 - p)) (1 - p) (p = 0.1: 0.16 %); exact where 1 / (1 - p) is (p 0.5, 0.9)."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        self.inner.run(graph, tensors)
        p = graph.attributes.dropout_probability or 0.0
        if graph.dtype != "fp32" or not 0.0 < p < 1.0:
            return
        exact = 1.0 / (1.0 - p)
        rounded = torch.tensor(exact, dtype=torch.bfloat16).item()
        if rounded != exact:
            tensors["dv"].mul_(rounded / exact)


# ----------------------------------------------------------------------------- ALiBi slopes
class AlibiBatchSlopesFirstRow(WholeEngineWrapper):
    """[B, H_q] ALiBi slopes read as [H_q]: every batch (or sequence) gets batch 0's slopes."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        slopes = tensors.get("alibi_slopes")
        if slopes is not None and slopes.dim() == 2 and slopes.shape[0] >= 2:
            tensors = {**tensors, "alibi_slopes": _broadcast(slopes, 0)}
        self.inner.run(graph, tensors)


class SoftcapDroppedWithAlibi(WholeEngineWrapper):
    """The kernel variant compiled for ALiBi slopes lacks the softcap branch: with both, the
    scores are not capped."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        if "alibi_slopes" in tensors and graph.attributes.softcap is not None:
            graph = dataclasses.replace(graph, attributes=dataclasses.replace(graph.attributes, softcap=None))
        self.inner.run(graph, tensors)


class AlibiSlopesWrapPastPowerOfTwo(WholeEngineWrapper):
    """A query-head count that is not a power of two: the heads past the largest power of two
    read the slopes from the start again (slope[h - 2^k]), as a table sized for 2^k heads."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        slopes = tensors.get("alibi_slopes")
        H = graph.H_q
        if slopes is not None and H & (H - 1):
            low = 1 << (H.bit_length() - 1)
            index = torch.tensor([h if h < low else h - low for h in range(H)], device=slopes.device)
            tensors = {**tensors, "alibi_slopes": slopes.index_select(-1, index)}
        self.inner.run(graph, tensors)


# ----------------------------------------------------------------------------- ragged storages and used lengths
class RaggedFp32LastSequenceDkStale(WholeEngineWrapper):
    """A ragged graph in fp32: the last sequence's dK rows are never stored (they keep what
    they held), as an fp32 variant whose store loop stops one sequence short."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        if graph.ragged is None or graph.dtype != "fp32":
            return self.inner.run(graph, tensors)
        seqs = [rk for _b, _rq, rk in sequence_rows(graph, tensors) if len(rk)]
        before = tensors["dk"][seqs[-1].start:seqs[-1].stop].clone() if seqs else None
        self.inner.run(graph, tensors)
        if seqs:
            tensors["dk"][seqs[-1].start:seqs[-1].stop].copy_(before)


class RaggedQkvPackedDqLastHeadLost(WholeEngineWrapper):
    """Q, K and V in one packed varlen buffer with other than two heads: dQ's last head is
    never stored (a head loop unrolled for the common H = 2 packed layout)."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        self.inner.run(graph, tensors)
        if graph.ragged is not None and graph.H_q != 2 and packed_slot(graph, "q") and packed_slot(graph, "v"):
            tensors["dq"][:, -1].zero_()


class SequsedQAloneIgnored(WholeEngineWrapper):
    """seqused_q without seqused_kv ignored (an engine that reads the used lengths only as a
    pair): each sequence's query rows are its whole range, padding rows included."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        rag = graph.ragged
        if rag is not None and rag.seqused_ports == ("seqused_q",):
            graph = dataclasses.replace(graph, ragged=dataclasses.replace(rag, seqused_q=None))
            tensors = {p: t for p, t in tensors.items() if p != "seqused_q"}
        self.inner.run(graph, tensors)


class DsinksOverUsedPadding(WholeEngineWrapper):
    """Ragged dSinks with used query lengths sums each sequence's whole cu_seqlens range:
    the padding rows past a sequence's used length add their terms too."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        self.inner.run(graph, tensors)
        rag = graph.ragged
        if rag is None or "dsinks" not in tensors or "seqused_q" not in rag.seqused_ports:
            return
        cu = [int(x) for x in tensors["cu_seqlens_q"].tolist()]
        sinks = tensors["sinks"].float()
        delta = (tensors["do"].float() * tensors["o"].float()).sum(-1)        # [T_q, H_q]
        lse = tensors["stats"].float()[..., 0]
        extra = torch.zeros_like(sinks)
        for b, rq, _rk in sequence_rows(graph, tensors):
            pad = slice(rq.stop, cu[b + 1])
            extra -= (torch.exp(sinks.view(1, -1) - lse[pad]) * delta[pad]).sum(0)
        tensors["dsinks"].copy_(tensors["dsinks"].float() + extra)


class RaggedBiasHeadBroadcastAsBatch(WholeEngineWrapper):
    """A ragged bias broadcast over the heads (head stride 0) read as one broadcast over the
    sequences too: every sequence gets sequence 0's bias."""

    def run(self, graph: Graph, tensors: Tensors) -> None:
        bias = tensors.get("bias")
        if graph.ragged is not None and bias is not None and bias.stride(1) == 0 and bias.stride(0) != 0 \
                and bias.shape[0] >= 2:
            tensors = {**tensors, "bias": _broadcast(bias, 0)}
        self.inner.run(graph, tensors)
