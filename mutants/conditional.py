"""Conditional mutants: a correct engine that misbehaves only under one condition, one or
more per gap class of the plan: degenerate layouts, gradients with a realistic
range and correlation, a tolerance that cannot see a lost contribution, determinism, fp16,
and risky values that meet late. Off its condition each one is the engine itself.

Each is a plain wrapper: `Mutant(engine)` delegates to `engine` and, where its condition
holds, changes what the engine wrote the way the modelled defect would (or, for the
determinism one, what a second run writes). Each presents the whole engine
(WholeEngineWrapper: its score modifiers, ragged graphs and deterministic mode), so the
harness offers it every graph the engine serves and the condition, not a decline, decides
where the defect shows. Dense graphs only: a ragged graph is always passed through.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch

from bundlegen.graph import Graph
from bundlegen.mask import keep_mask
from bundlegen.mutants.wrappers import WholeEngineWrapper

#: fp16's largest finite value: past it an fp16 intermediate is inf
FP16_MAX = 65504.0
#: an LSE below this makes exp(s) alone underflow in fp32 (the extreme-LSE data)
EXTREME_LSE = -88.7
#: the tile the half-tile conditions measure against
TILE = 64


def _dense(graph: Graph) -> bool:
    return graph.ragged is None


def _heads_interleaved(graph: Graph, port: str) -> bool:
    """The port's head axis is inside its sequence axis (BSHD, SBHD and the like)."""
    strides = graph.tensors[port].strides
    return 0 < strides[1] < strides[2]


def _per_q_head(t: torch.Tensor, H_q: int) -> torch.Tensor:
    return t.repeat_interleave(H_q // t.shape[1], dim=1)


def _probabilities(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """P = exp(scale Q K^T - LSE), masked, float32 [B, H_q, S_q, S_kv] (no bias or softcap:
    the mutants that need P pass such graphs through)."""
    a = graph.attributes
    q = tensors["q"].float()
    k = _per_q_head(tensors["k"].float(), graph.H_q)
    s = torch.matmul(q, k.transpose(-1, -2)) * a.attn_scale
    keep = keep_mask(graph.S_q, graph.S_kv, a, device=q.device)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    lse = tensors["stats"].float()
    return torch.exp(s - torch.nan_to_num(lse, nan=0.0, posinf=0.0, neginf=0.0))


def _add_into(out: torch.Tensor, delta: torch.Tensor) -> None:
    out.copy_((out.float() + delta).to(out.dtype))


def _group_sum(t: torch.Tensor, H: int) -> torch.Tensor:
    return t.unflatten(1, (H, -1)).sum(2)


# ----------------------------------------------------------------------------- layouts
class InterleavedBatchOffsetLost(WholeEngineWrapper):
    """Degenerate layouts: with dQ in a heads-interleaved layout (BSHD, SBHD, ...) the
    batch offset of the store is lost, so every batch's dQ lands in batch 0's place and
    the others keep what they held. B = 1 (or BHSD) hides it."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        if _dense(graph) and graph.B >= 2 and graph.H_q >= 2 and _heads_interleaved(graph, "dq"):
            dq = tensors["dq"]
            dq[0].copy_(dq[-1])
            dq[1:].fill_(0.0)


class InterleavedHeadDimTailDropped(WholeEngineWrapper):
    """Degenerate layouts: a gradient port in a heads-interleaved layout with a head dim
    that is not a multiple of 32 loses its tail columns (a vectorised store sized for
    whole 32-column granules). D % 32 == 0, or a BHSD dK, hides it."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        if _dense(graph) and graph.D_qk % 32 and _heads_interleaved(graph, "dk"):
            tensors["dk"][..., graph.D_qk // 32 * 32:].zero_()


# ----------------------------------------------------------------------------- gradients
class DeltaKeptInFp8(WholeEngineWrapper):
    """Gradient range and correlation: Delta = rowsum(dO * O) kept in an fp8 (e5m2) buffer
    between the pre-pass and the main loop: a relative error up to 2^-3 of Delta. In a
    bf16 graph whose dO is drawn apart from O, Delta is a small, cancelled share of
    rowsum(|dO| |O|), which the bound allows for, and the error hides; where dO is
    correlated with O (an L2 loss) Delta is most of it and the error shows where Delta is
    summed on its own (dSinks), and where |dO| is of order 1e3 in fp16 (whose bound is
    eight times tighter) it shows in dQ's rows that keep one or two keys. The statistical
    judge sees it in dQ and dK whatever dO's distribution. (Passed through, untouched, where
    P would need a bias or a softcap.)"""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        a = graph.attributes
        if not _dense(graph) or "bias" in graph.tensors or a.softcap is not None:
            return   # (P would need the bias and the cap: passed through)
        exact = (tensors["do"].float() * tensors["o"].float()).sum(-1)
        kept = exact.to(torch.float8_e5m2).float()
        error = (kept - exact).unsqueeze(-1)           # d Delta: [B, H_q, S_q, 1]
        p = _probabilities(graph, tensors)
        d_ds = -p * error                                      # d dS
        k = _per_q_head(tensors["k"].float(), graph.H_q)
        _add_into(tensors["dq"], torch.matmul(d_ds, k) * a.attn_scale)
        dk = torch.matmul(d_ds.transpose(-1, -2), tensors["q"].float()) * a.attn_scale
        _add_into(tensors["dk"], _group_sum(dk, graph.H_k))
        if "dsinks" in graph.tensors:
            lse = torch.nan_to_num(tensors["stats"].float(), neginf=0.0)
            p_sink = torch.exp(tensors["sinks"].float().view(1, -1, 1, 1) - lse)
            _add_into(tensors["dsinks"], -(p_sink * error).sum(dim=(0, 2, 3)))


class DpSaturatesFp16(WholeEngineWrapper):
    """Gradient range: dP = dO V^T held in fp16 in an fp16 graph. Where some |dP| passes
    65504 it is inf, and dS, and so the dQ row and the dK rows it feeds, are NaN."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        if not _dense(graph) or graph.dtype != "fp16":
            return
        v = _per_q_head(tensors["v"].float(), graph.H_q)
        over = torch.matmul(tensors["do"].float(), v.transpose(-1, -2)).abs() > FP16_MAX
        if not bool(over.any()):
            return
        tensors["dq"][over.any(-1)] = math.nan
        tensors["dk"][_group_sum(over.any(2).float(), graph.H_k) > 0] = math.nan


# ----------------------------------------------------------------------------- tolerance
class DsinksLastBatchLost(WholeEngineWrapper):
    """Tolerance that cannot see a lost contribution: dSinks loses the last batch's
    contribution (a per-batch partial never added). B = 1 hides it; a bound grown with
    every row of every batch hides it too."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        if not _dense(graph) or "dsinks" not in graph.tensors or graph.B < 2:
            return
        delta = (tensors["do"].float() * tensors["o"].float()).sum(-1)[-1]      # [H_q, S_q]
        lse = tensors["stats"].float()[-1, :, :, 0]
        p_sink = torch.exp(tensors["sinks"].float().view(-1, 1) - torch.nan_to_num(lse, neginf=0.0))
        _add_into(tensors["dsinks"], (p_sink * delta).sum(-1))   # undo the batch's -sum


# ----------------------------------------------------------------------------- determinism
class NondeterministicWithoutGqa(WholeEngineWrapper):
    """Determinism: with the deterministic backward asked for and MHA (H_q == H_k), every
    second run's dK differs in its last bit (an atomic order the deterministic path only
    fixed for GQA's group reduction)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.runs = 0

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        self.runs += 1
        if (_dense(graph) and graph.attributes.deterministic_algorithm and graph.H_q == graph.H_k
                and self.runs % 2 == 0):
            first = tensors["dk"][0, 0, 0, :1]                  # one element, its last bit flipped
            bits = first.view(torch.int16 if first.element_size() == 2 else torch.int32)
            bits.bitwise_xor_(1)


# ----------------------------------------------------------------------------- fp16
class Fp16QueryTailStale(WholeEngineWrapper):
    """fp16: in an fp16 graph whose S_q is not a multiple of 16, the last dQ row is never
    stored (an fp16-only store path that rounds the row count down to its 16-row
    granule). bf16, or whole granules, hide it."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        if _dense(graph) and graph.dtype == "fp16" and graph.S_q % 16:
            tensors["dq"][:, :, -1].zero_()


# ----------------------------------------------------------------------------- risky values meeting late
class ExtremeLseWindowHalfTile(WholeEngineWrapper):
    """Risky values meeting late: extreme-LSE rows (LSE below -88.7) under a window or band
    mask with S_kv ending on a half tile: the last key block's dK and dV are zero (its P
    formed as exp(s) * exp(-LSE), which underflows, only on the masked-edge path). Any one
    of the three alone is served right."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        a = graph.attributes
        if not _dense(graph) or a.left_bound is None or graph.S_kv % TILE == 0:
            return
        if not bool((tensors["stats"].float() < EXTREME_LSE).any()):
            return
        tail = graph.S_kv // TILE * TILE if graph.S_kv > TILE else graph.S_kv // 2
        tensors["dk"][:, :, tail:].zero_()
        tensors["dv"][:, :, tail:].zero_()


class SinksDecodeBatchMixed(WholeEngineWrapper):
    """Risky values meeting late: sinks with B >= 2 at a decode-like S_q (at most 16 query
    rows): dSinks takes batch 0's rows (LSE and Delta) for every batch (a per-row read
    without the batch stride on the short path)."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        if not _dense(graph) or "dsinks" not in graph.tensors or graph.B < 2 or graph.S_q > 16:
            return
        delta = (tensors["do"].float() * tensors["o"].float()).sum(-1)          # [B, H_q, S_q]
        lse = torch.nan_to_num(tensors["stats"].float()[..., 0], neginf=0.0)
        sinks = tensors["sinks"].float().view(1, -1, 1)
        right = -(torch.exp(sinks - lse) * delta).sum(dim=(0, 2))
        wrong = -(torch.exp(sinks - lse[:1]) * delta[:1]).sum(dim=(0, 2)) * graph.B
        _add_into(tensors["dsinks"], wrong - right)


class TiledRectangleLastRowLost(WholeEngineWrapper):
    """Risky values meeting late: S_q != S_kv with both multiples of 128 (512 x 256): the
    last dQ row is lost (a loop bound taken from the other sequence when both divide the
    tile)."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        if (_dense(graph) and graph.S_q != graph.S_kv and graph.S_q % 128 == 0
                and graph.S_kv % 128 == 0):
            tensors["dq"][:, :, -1].zero_()
