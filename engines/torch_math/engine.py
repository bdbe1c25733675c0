"""torch-math: autograd through the math SDPA (scores, mask, softmax, weighted sum),
recomputed from Q, K, V and dO. Runs on every device torch runs on; declines only what it
cannot do: fp32 (gated by the plan), output layouts no engine may write (zero-stride or
overlapping outputs), dropout.

Precision is PyTorch's math SDPA's (torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp
is False by default): fp16/bf16 in and out, intermediates in fp32. Computing the scores
themselves in bf16 is not a fair reference: a score s rounded to bf16 moves exp(s) by
about |s| * 2^-9, which for peaked attention (|s| ~ 10) exceeds the plan's bf16 tolerance
(measured: margin 0.87 on a scale-0.9, D=24 case)."""
from __future__ import annotations

from typing import Mapping

import torch

from bundlegen import reasons as R
from bundlegen.graph import Graph
from bundlegen.mask import keep_mask
from bundlegen.validate import launch_reason, output_layout_reason
from bundlegen.engines.base import Engine

SERVED_DTYPES = ("bf16", "fp16")
#: the dtype of every intermediate, as PyTorch's math SDPA upcasts fp16/bf16
COMPUTE_DTYPE = torch.float32


class TorchMathEngine(Engine):
    name = "torch-math"
    deterministic = True

    def archs(self) -> tuple[str, ...]:
        return ("cpu", "sm90", "sm120", "gfx942")

    def is_applicable(self, graph: Graph) -> str | None:
        invalid = launch_reason(graph)
        if invalid:
            return invalid
        if graph.dtype not in SERVED_DTYPES:
            return f"{R.DTYPE_NOT_SERVED}: {graph.dtype} is gated"
        layout = output_layout_reason(graph)
        if layout:
            return layout
        if graph.attributes.dropout_probability:
            return f"{R.GATED_FEATURE}: dropout"
        return None

    def run(self, graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
        dq, dk, dv = attention_backward(graph, tensors["q"], tensors["k"], tensors["v"], tensors["do"])
        tensors["dq"].copy_(dq)
        tensors["dk"].copy_(dk)
        tensors["dv"].copy_(dv)


def attention_backward(graph: Graph, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       do: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV in q's dtype by autograd through softmax(scale * Q K^T + mask) V, computed
    in at least COMPUTE_DTYPE. K and V heads are repeated to H_q (GQA/MQA); autograd sums
    each group back."""
    attrs = graph.attributes
    io_dtype = q.dtype
    compute = torch.promote_types(io_dtype, COMPUTE_DTYPE)
    # Leaves own their memory: the harness's views may be strided or broadcast.
    q, k, v = (t.detach().to(compute, memory_format=torch.contiguous_format, copy=True)
               .requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        kk = k.repeat_interleave(graph.H_q // graph.H_k, dim=1)
        vv = v.repeat_interleave(graph.H_q // graph.H_v, dim=1)
        scores = torch.matmul(q, kk.transpose(-2, -1)) * attrs.attn_scale
        keep = keep_mask(graph.S_q, graph.S_kv, attrs, device=q.device)
        if keep is None:
            probs = torch.softmax(scores, dim=-1)
        else:
            # A row with no kept key has O = 0 and zero gradients: mask it nowhere (so the
            # softmax stays finite) and zero its probabilities instead.
            row_has_key = keep.any(dim=-1, keepdim=True)
            drop = ~keep & row_has_key
            probs = torch.softmax(scores.masked_fill(drop, float("-inf")), dim=-1)
            probs = probs * row_has_key.to(probs.dtype)
        out = torch.matmul(probs, vv)
        grads = torch.autograd.grad(out, (q, k, v), grad_outputs=do.detach().to(compute))
    return tuple(g.to(io_dtype) for g in grads)
