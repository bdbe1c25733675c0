"""torch-math: autograd through the math SDPA (scores, mask, softmax, weighted sum),
recomputed from Q, K, V and dO. Runs on every device torch runs on; declines only what it
cannot do: output layouts no engine may write (zero-stride or overlapping outputs), and
dropout without a dropout_mask port (it draws no mask of its own). Dropout with the mask
port: P * keep / (1 - p) before the product with V, by autograd like the rest. Every score modifier (bias, dbias, sinks, softcap, ALiBi
slopes as a materialised bias with no gradient; padded and ragged graphs) by autograd too: the bias is a leaf of its stored size (1 on a broadcast axis), so
autograd's sum over the broadcast is dBias; the sink is one more logit column.

Ragged graphs (DESIGN section 10) are computed sequence by sequence: the engine reads the
offsets back to the host (a reference may), keeps the sequences validate.good_sequences
calls good (every one of a valid graph) and skips the others, reading and writing nothing
for them, so a device probe's bad sequences cannot take it outside its tensors. A padded
graph's sequences are their used rows (tensors['seqused_*']): padding rows are neither read
nor written.

Precision is PyTorch's math SDPA's (torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp
is False by default): fp16/bf16 in and out, intermediates in fp32. Computing the scores
themselves in bf16 is not a fair reference: a score s rounded to bf16 moves exp(s) by
about |s| * 2^-9, which for peaked attention (|s| ~ 10) exceeds the plan's bf16 tolerance
(measured: margin 0.87 on a scale-0.9, D=24 case). fp32 io is computed in fp32 with true
fp32 products (engines/fp32_products.py: no TF32 on a GPU)."""
from __future__ import annotations

import dataclasses
from typing import Mapping

import torch

from bundlegen import reasons as R
from bundlegen.graph import Attributes, Graph
from bundlegen.mask import diagonal_shift, keep_mask
from bundlegen.validate import good_sequences, launch_reason, output_layout_reason
from bundlegen.engines.base import Engine
from bundlegen.engines.fp32_products import ieee_fp32

SERVED_DTYPES = ("bf16", "fp16", "fp32")
#: the dtype of every intermediate, as PyTorch's math SDPA upcasts fp16/bf16
COMPUTE_DTYPE = torch.float32


class TorchMathEngine(Engine):
    name = "torch-math"
    deterministic = True
    ragged = True
    seqused = True
    score_modifiers = frozenset({"bias", "dbias", "sinks", "softcap", "alibi_slopes"})

    def archs(self) -> tuple[str, ...]:
        return ("cpu", "sm90", "sm120", "gfx942")

    def is_applicable(self, graph: Graph) -> str | None:
        invalid = launch_reason(graph)
        if invalid:
            return invalid
        if graph.dtype not in SERVED_DTYPES:
            return f"{R.DTYPE_NOT_SERVED}: {graph.dtype} (served: {', '.join(SERVED_DTYPES)})"
        layout = output_layout_reason(graph)
        if layout:
            return layout
        if graph.asks_drawn_dropout:
            return f"{R.DROPOUT_NOT_SERVED}: no dropout_mask port (torch-math draws no mask of its own)"
        return None

    def run(self, graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
        with ieee_fp32(graph.dtype == "fp32"):
            self._run(graph, tensors)

    def _run(self, graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
        if graph.ragged is not None:
            ragged_backward(graph, tensors)
            return
        grads = attention_backward_heads(graph.attributes, tensors["q"], tensors["k"], tensors["v"],
                                         tensors["do"], bias=tensors.get("bias"),
                                         sinks=tensors.get("sinks"),
                                         dropout_keep=tensors.get("dropout_mask"),
                                         alibi_slopes=tensors.get("alibi_slopes"))
        names = ["dq", "dk", "dv"] + ["dbias"] * ("bias" in tensors) + ["dsinks"] * ("sinks" in tensors)
        for port, grad in zip(names, grads):
            if port in tensors:   # a bias or sinks input without its gradient port: not asked for
                tensors[port].copy_(grad.reshape(tensors[port].shape))


def sequence_rows(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> list[tuple[int, range, range]]:
    """(b, q rows, kv rows) of every sequence to compute: the good ones (validate's
    definition) of the offsets in tensors['cu_seqlens_*'] and the used lengths in
    tensors['seqused_*'] (a padded graph's), read back to the host; a sequence's rows are
    its used ones."""
    read = lambda port: tuple(int(x) for x in tensors[port].tolist())
    cu_q, cu_kv = read("cu_seqlens_q"), read("cu_seqlens_kv")
    if len(cu_q) != graph.B + 1 or len(cu_kv) != graph.B + 1:
        raise ValueError(f"cu_seqlens: {len(cu_q)} and {len(cu_kv)} offsets for {graph.B} sequences")
    used = {p: read(p) for p in graph.ragged.seqused_ports}
    if any(len(u) != graph.B for u in used.values()):
        raise ValueError(f"seqused: {[len(u) for u in used.values()]} used lengths for {graph.B} sequences")
    seen = dataclasses.replace(graph, ragged=dataclasses.replace(
        graph.ragged, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, **used))
    uq, uk = seen.ragged.used_lengths("q"), seen.ragged.used_lengths("kv")
    return [(b, range(cu_q[b], cu_q[b] + uq[b]), range(cu_kv[b], cu_kv[b] + uk[b]))
            for b in good_sequences(seen)]


def ragged_backward(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
    """Each good sequence as a batch of one ([1, H, S_b, D]), its gradients written into its
    own rows; rows of no good sequence are neither read nor written. Modifiers per sequence:
    its block [b, :, :S_q_b, :S_kv_b] of the padded bias and of the padded dropout mask
    ([B, H_q, max_seqlen_q, max_seqlen_kv]), its row of [B, H_q] slopes; dBias (zeroed whole
    first) gathers each sequence's block, dSinks each sequence's sum."""
    q, k, v, do = (tensors[p] for p in ("q", "k", "v", "do"))
    bias, sinks, slopes = (tensors.get(p) for p in ("bias", "sinks", "alibi_slopes"))
    mask = tensors.get("dropout_mask")
    dbias, dsinks = tensors.get("dbias"), tensors.get("dsinks")
    dbias_sum = None if dbias is None else torch.zeros(dbias.shape, dtype=torch.float32, device=dbias.device)
    dsinks_sum = None if dsinks is None else torch.zeros(dsinks.shape, dtype=torch.float32, device=dsinks.device)
    for b, rq, rk in sequence_rows(graph, tensors):
        if len(rq) == 0:            # no query: no key is kept, dK = dV = 0
            tensors["dk"][rk.start:rk.stop].zero_()
            tensors["dv"][rk.start:rk.stop].zero_()
            continue
        if len(rk) == 0:            # no key: every row's LSE is -inf (sink_h with sinks), dQ = 0
            tensors["dq"][rq.start:rq.stop].zero_()
            continue
        as_batch = lambda t, rows: t[rows.start:rows.stop].transpose(0, 1).unsqueeze(0)
        grads = attention_backward_heads(
            graph.attributes, as_batch(q, rq), as_batch(k, rk), as_batch(v, rk), as_batch(do, rq),
            bias=None if bias is None else bias[b:b + 1, :, :len(rq), :len(rk)], sinks=sinks,
            alibi_slopes=None if slopes is None else slopes if slopes.dim() == 1 else slopes[b:b + 1],
            dropout_keep=None if mask is None else mask[b:b + 1, :, :len(rq), :len(rk)])
        dq, dk, dv = grads[:3]
        tensors["dq"][rq.start:rq.stop].copy_(dq[0].transpose(0, 1))
        tensors["dk"][rk.start:rk.stop].copy_(dk[0].transpose(0, 1))
        tensors["dv"][rk.start:rk.stop].copy_(dv[0].transpose(0, 1))
        rest = list(grads[3:])
        if bias is not None:
            seq_dbias = rest.pop(0)
            if dbias_sum is not None:   # the bias's stored size: its head axis is dbias's
                b0 = 0 if dbias.shape[0] == 1 else b
                dbias_sum[b0:b0 + 1, :, :len(rq), :len(rk)] += seq_dbias.to(torch.float32)
        if sinks is not None and dsinks_sum is not None:
            dsinks_sum += rest.pop(0)
    if dbias_sum is not None:
        dbias.copy_(dbias_sum)
    if dsinks_sum is not None:
        dsinks.copy_(dsinks_sum)


def attention_backward(graph: Graph, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       do: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV in q's dtype by autograd through softmax(scale * Q K^T + mask) V, computed
    in at least COMPUTE_DTYPE. K and V heads are repeated to H_q (GQA/MQA); autograd sums
    each group back."""
    return attention_backward_heads(graph.attributes, q, k, v, do)


def attention_backward_heads(attrs: Attributes, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             do: torch.Tensor, bias: torch.Tensor | None = None,
                             sinks: torch.Tensor | None = None,
                             dropout_keep: torch.Tensor | None = None,
                             alibi_slopes: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """attention_backward on [B, H, S, D] tensors, sizes read from them: dQ, dK, dV, then
    dBias (the bias's stored size: 1 on its broadcast axes) when `bias` is given, then
    dSinks (fp32) when `sinks` is. `dropout_keep` ([B, H_q, S_q, S_kv], 1 kept, 0 dropped)
    scales the kept probabilities by 1 / (1 - attrs.dropout_probability). `alibi_slopes`
    ([H_q] or [B, H_q], no gradient) adds the materialised ALiBi bias (`alibi_bias`)."""
    H_q, H_k, H_v = q.shape[1], k.shape[1], v.shape[1]
    B, S_q, S_kv = q.shape[0], q.shape[2], k.shape[2]
    io_dtype = q.dtype
    compute = torch.promote_types(io_dtype, COMPUTE_DTYPE)
    # Leaves own their memory: the harness's views may be strided or broadcast.
    leaf = lambda t: (t.detach().to(compute, memory_format=torch.contiguous_format, copy=True)
                      .requires_grad_())
    q, k, v = (leaf(t) for t in (q, k, v))
    leaves = [q, k, v]
    if bias is not None:
        bias = leaf(_stored(bias))
        leaves.append(bias)
    if sinks is not None:
        sinks = leaf(sinks)
        leaves.append(sinks)
    with torch.enable_grad():
        kk = k.repeat_interleave(H_q // H_k, dim=1)
        vv = v.repeat_interleave(H_q // H_v, dim=1)
        scores = torch.matmul(q, kk.transpose(-2, -1)) * attrs.attn_scale
        if attrs.softcap is not None:
            scores = torch.tanh(scores / attrs.softcap) * attrs.softcap
        if bias is not None:
            scores = scores + bias
        if alibi_slopes is not None:
            scores = scores + alibi_bias(alibi_slopes, S_q, S_kv, attrs, compute)
        keep = keep_mask(S_q, S_kv, attrs, device=q.device)
        if sinks is not None:
            # the sink: one more logit per row, in the denominator only; a row with no kept
            # key then has a finite softmax (all of it on the sink), so mask it as is
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            column = sinks.view(1, H_q, 1, 1).expand(B, H_q, S_q, 1)
            probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :S_kv]
        elif keep is None:
            probs = torch.softmax(scores, dim=-1)
        else:
            # A row with no kept key has O = 0 and zero gradients: mask it nowhere (so the
            # softmax stays finite) and zero its probabilities instead.
            row_has_key = keep.any(dim=-1, keepdim=True)
            drop = ~keep & row_has_key
            probs = torch.softmax(scores.masked_fill(drop, float("-inf")), dim=-1)
            probs = probs * row_has_key.to(probs.dtype)
        if dropout_keep is not None:
            keep = dropout_keep.detach().to(compute)
            probs = probs * (keep * (1.0 / (1.0 - attrs.dropout_probability)))
        out = torch.matmul(probs, vv)
        grads = torch.autograd.grad(out, leaves, grad_outputs=do.detach().to(compute))
    dtypes = [io_dtype] * (3 + (bias is not None)) + [torch.float32] * (sinks is not None)
    return tuple(g.to(dt) for g, dt in zip(grads, dtypes))


def _stored(t: torch.Tensor) -> torch.Tensor:
    """t with every broadcast axis (stride 0, longer than 1) narrowed to size 1."""
    for axis, (d, st) in enumerate(zip(t.shape, t.stride())):
        if st == 0 and d > 1:
            t = t.narrow(axis, 0, 1)
    return t


def alibi_bias(slopes: torch.Tensor, S_q: int, S_kv: int, attrs: Attributes,
               dtype: torch.dtype) -> torch.Tensor:
    """The ALiBi bias of [H_q] or [B, H_q] slopes, [1|B, H_q, S_q, S_kv]: -slope[b, h] *
    |i - j + shift|, shift the mask's diagonal shift (docs/CONTRACTS.md, "Score modifiers")."""
    shift = diagonal_shift(S_q, S_kv, attrs.diagonal_alignment)
    i = torch.arange(S_q, device=slopes.device, dtype=dtype).view(-1, 1)
    j = torch.arange(S_kv, device=slopes.device, dtype=dtype).view(1, -1)
    per_head = slopes.detach().to(dtype)
    per_head = per_head.view(1, -1) if per_head.dim() == 1 else per_head
    return -per_head[:, :, None, None] * (i - j + shift).abs()
