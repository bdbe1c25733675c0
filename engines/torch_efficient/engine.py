"""`TorchEfficientEngine` (torch-efficient): aten::_scaled_dot_product_efficient_attention_backward.

The op transposes to [B, S, H, D] and calls _efficient_attention_backward, the CUTLASS
kernels from xformers (attention_backward.cu, mem_eff_attention/kernel_backward.h). LSE is
[B, H, ceil(S_q / 32) * 32] fp32. The kernel derives O's sequence stride as H * D_v (the
layout its forward writes), which is why O is presented packed [B, S, H, D_v]. Sources:
sdp_utils.cpp (dispatcher) and kernel_backward.h check_supported (kernel).

Score modifiers: an additive bias goes in as attn_bias (its zero strides kept: the kernel
takes per-axis strides, checked only for alignment) and grad_input_mask[3] asks for its
gradient, which the op allocates [B, H, S_q, S_kv] and the adapter sums over the
broadcast axes. _efficient_attention_backward checks bias.stride(3) == 1; check_supported
checks strideB (B > 1), strideH (H > 1) and strideM multiples of kMinimumAlignment. No
sinks, no softcap (the kernel has neither).
"""
from __future__ import annotations

from typing import Mapping

import torch

from bundlegen import reasons as R
from bundlegen.graph import Graph
from bundlegen.engines.torch_sdpa_common import (DeviceFacts, RaggedRows, TorchSdpaEngine,
                                       aligned_offsets, aligned_strides, bias_last_dim_contiguous,
                                       bshd_packed_copy, with_bias,
                                       call_by_schema, capability_between, causal_only,
                                       head_dim_stride_one, is_causal, lse_padded,
                                       lse_per_sequence, needs_nvidia_gpu, no_dropout, no_gqa,
                                       no_rng, packed_rows_copy, ragged_causal_only,
                                       writable_outputs, draws_only)
from bundlegen.engines.torch_drawn_dropout import efficient_keep, efficient_philox

LSE_ROW_MULTIPLE = 32      # kAlignLSE
KERNEL_ALIGNMENT = 4       # DefaultGemmType<Sm80+, f16/bf16/f32>::kMinimumAlignment


def gemm_alignment(graph: Graph) -> int:
    """minimum_gemm_alignment (sdp_utils.cpp) on sm80+: 128 bits of the io dtype."""
    return 4 if graph.dtype == "fp32" else 8


def efficient_dtype(graph: Graph, facts: DeviceFacts) -> str | None:
    served = ("fp16", "bf16", "fp32") if (facts.capability or (0, 0)) >= (8, 0) else ("fp16", "fp32")
    if graph.dtype not in served:
        return f"{R.DTYPE_NOT_SERVED}: {graph.dtype} on {facts.arch} (served: {', '.join(served)})"
    return None


def efficient_head_dims(graph: Graph, facts: DeviceFacts) -> str | None:
    n = gemm_alignment(graph)
    if graph.D_qk % n or graph.D_v % n:
        return (f"{R.HEAD_DIM_NOT_SERVED}: D_qk={graph.D_qk}, D_v={graph.D_v} not multiples of {n} "
                "(check_head_dim_size_mem_efficient)")
    return None


#: sdp::CustomMaskType, the efficient kernel's mask switch
NO_CUSTOM_MASK, CAUSAL_FROM_TOP_LEFT, CAUSAL_FROM_BOTTOM_RIGHT = 0, 1, 2


def custom_mask_type(graph: Graph) -> int:
    if not is_causal(graph):
        return NO_CUSTOM_MASK
    if graph.attributes.diagonal_alignment == "BOTTOM_RIGHT":
        return CAUSAL_FROM_BOTTOM_RIGHT
    return CAUSAL_FROM_TOP_LEFT


def varlen_max_seqlens(graph: Graph) -> tuple[int, int]:
    """(max_seqlen_q, max_seqlen_k) handed to the op. The kernel sizes its per-(batch,
    head) dQ workspace by max_seqlen_q (workspace_elements_gq) but walks each sequence's
    real length (the assert that would bound it is compiled out), so a sequence longer than
    max_seqlen_q would write into the next slot or past the workspace. The offsets are
    device data, so only T_q bounds every contained length: max_seqlen_q is T_q. Keys are
    walked split by split over one reused tile, so max_seqlen_k keeps the graph's bound
    (capped by T_kv: the op checks max_seqlen_k <= key.size(1); at least 1: it checks > 0)."""
    return graph.T_q, max(1, min(graph.S_kv, graph.T_kv))


def efficient_varlen_values(graph: Graph, tensors: Mapping[str, torch.Tensor],
                            q_rows: RaggedRows, kv_rows: RaggedRows) -> dict:
    """The arguments of aten::_efficient_attention_backward's varlen path ("Mode 1MHK":
    batch 1, cu_seqlens_q/k), by schema name. q, k, v, dO: the declared [T, H, D] views with
    a batch axis of 1 in front (no copy). O: packed [1, T_q, H_q, D_v] (the kernel derives
    O's token stride as H * D_v). LSE: [B, H_q, ceil(max_seqlen_q / 32) * 32], row i of
    sequence b at [b, h, i]."""
    rng = no_rng(tensors["q"].device)
    max_q, max_k = varlen_max_seqlens(graph)
    return {
        "grad_out": tensors["do"].unsqueeze(0), "query": tensors["q"].unsqueeze(0),
        "key": tensors["k"].unsqueeze(0), "value": tensors["v"].unsqueeze(0), "bias": None,
        "out": packed_rows_copy(tensors["o"], q_rows).unsqueeze(0),
        "cu_seqlens_q": q_rows.offsets, "cu_seqlens_k": kv_rows.offsets,
        "max_seqlen_q": max_q, "max_seqlen_k": max_k,
        "logsumexp": lse_per_sequence(tensors["stats"], q_rows, max_q, LSE_ROW_MULTIPLE),
        "dropout_p": 0.0, "philox_seed": rng, "philox_offset": rng,
        "custom_mask_type": custom_mask_type(graph), "bias_requires_grad": False,
        "scale": graph.attributes.attn_scale}


#: what the op needs whatever the graph's batch layout (dropout: see each layout's rules)
_OWN_RULES = (
        needs_nvidia_gpu,
        capability_between((5, 0), (12, 1), "check_mem_efficient_hardware_support"),
        writable_outputs,
        efficient_dtype,
        efficient_head_dims,
)


#: the bias rules (a graph without a bias passes them)
BIAS_RULES = (
    bias_last_dim_contiguous("_efficient_attention_backward: bias->stride(3) == 1"),
    with_bias(aligned_offsets(gemm_alignment, "the bias pointer, aligned as q's (check_data_ptr_alignment)",
                              ports=("bias",))),
    with_bias(aligned_strides(lambda graph: KERNEL_ALIGNMENT, "cutlassB check_supported: attn_bias strides",
                              ports=("bias",), axes_always=(2,))),
)


def efficient_values(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> dict:
    """The arguments of aten::_scaled_dot_product_efficient_attention_backward, by schema
    name: the declared q, k, v, dO, bias views; O packed [B, S, H, D_v]; LSE padded to a
    multiple of 32 rows; the bias gradient asked for when the graph has a dbias; with
    dropout, p and the Philox seed and offset whose mask drawn_dropout_mask reports."""
    rng = no_rng(tensors["q"].device)
    seed, offset = efficient_philox() if graph.asks_drawn_dropout else (rng, rng)
    return {
        "grad_out": tensors["do"], "query": tensors["q"], "key": tensors["k"],
        "value": tensors["v"], "attn_bias": tensors.get("bias"), "out": bshd_packed_copy(tensors["o"]),
        "logsumexp": lse_padded(tensors["stats"], LSE_ROW_MULTIPLE),
        "philox_seed": seed, "philox_offset": offset,
        "dropout_p": graph.attributes.dropout_probability or 0.0,
        "grad_input_mask": [True, True, True, "dbias" in tensors], "is_causal": is_causal(graph),
        "scale": graph.attributes.attn_scale}


class TorchEfficientEngine(TorchSdpaEngine):
    name = "torch-efficient"
    #: PyTorch runs this backward deterministically under torch.use_deterministic_algorithms
    deterministic_mode = True
    score_modifiers = frozenset({"bias", "dbias"})
    #: its Philox mask is recovered with aten::_fill_mem_eff_dropout_mask_ (padded graphs)
    draws_dropout_mask = True
    RULES = (
        *_OWN_RULES,
        draws_only,
        no_gqa("_efficient_attention_backward needs equal head counts; SDPA repeats K/V "
               "before this op"),
        causal_only("TOP_LEFT", "is_causal maps to CausalFromTopLeft"),
        head_dim_stride_one,
        aligned_offsets(gemm_alignment, "check_data_ptr_alignment_mem_efficient"),
        # dO's strides are free: the op copies it to packed [B, S, H, D] unless it is already.
        aligned_strides(lambda graph: KERNEL_ALIGNMENT, "cutlassB check_supported",
                        ports=("q", "k", "v"), axes_always=(1, 2)),
        *BIAS_RULES,
    )

    # Ragged: _efficient_attention_backward with cu_seqlens_q / cu_seqlens_k (batch 1,
    # [1, T, H, D]); the kernel takes its mask as custom_mask_type, causal from the top
    # left or the bottom right of each sequence (causal_diagonal_offset = num_keys -
    # num_queries after the offsets set the sequence's lengths).
    RAGGED_RULES = (
        *_OWN_RULES,
        no_dropout,
        no_gqa("_efficient_attention_backward checks query.size(2) == key.size(2)"),
        ragged_causal_only(("TOP_LEFT", "BOTTOM_RIGHT"), "custom_mask_type 1 or 2; window_size "
                                                        "not used"),
        head_dim_stride_one,
        aligned_offsets(gemm_alignment, "check_data_ptr_alignment_mem_efficient"),
        aligned_strides(lambda graph: KERNEL_ALIGNMENT, "cutlassB check_supported",
                        ports=("q", "k", "v"), axes_always=(0, 1)),
    )

    def drawn_dropout_mask(self, graph: Graph) -> torch.Tensor | None:
        return efficient_keep(graph, self.device)

    def ragged_backward(self, graph: Graph, tensors: Mapping[str, torch.Tensor],
                        q_rows: RaggedRows, kv_rows: RaggedRows):
        op = torch.ops.aten._efficient_attention_backward.default
        dq, dk, dv, _dbias = call_by_schema(op, efficient_varlen_values(graph, tensors, q_rows, kv_rows))
        return dq.squeeze(0), dk.squeeze(0), dv.squeeze(0)

    def backward(self, graph: Graph, tensors: Mapping[str, torch.Tensor]):
        op = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default
        return tuple(call_by_schema(op, efficient_values(graph, tensors)))
