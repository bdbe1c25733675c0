"""`TorchEfficientEngine` (torch-efficient): aten::_scaled_dot_product_efficient_attention_backward.

The op transposes to [B, S, H, D] and calls _efficient_attention_backward, the CUTLASS
kernels from xformers (attention_backward.cu, mem_eff_attention/kernel_backward.h). LSE is
[B, H, ceil(S_q / 32) * 32] fp32. The kernel derives O's sequence stride as H * D_v (the
layout its forward writes), which is why O is presented packed [B, S, H, D_v]. Sources:
sdp_utils.cpp (dispatcher) and kernel_backward.h check_supported (kernel).
"""
from __future__ import annotations

from typing import Mapping

import torch

from bundlegen import reasons as R
from bundlegen.graph import Graph
from bundlegen.engines.torch_sdpa_common import (DeviceFacts, TorchSdpaEngine, aligned_offsets,
                                       aligned_strides, bshd_packed_copy, call_by_schema,
                                       capability_between, causal_only, head_dim_stride_one,
                                       is_causal, lse_padded, needs_nvidia_gpu, no_dropout,
                                       no_gqa, no_rng, writable_outputs)

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


class TorchEfficientEngine(TorchSdpaEngine):
    name = "torch-efficient"
    RULES = (
        needs_nvidia_gpu,
        capability_between((5, 0), (12, 1), "check_mem_efficient_hardware_support"),
        no_dropout,
        writable_outputs,
        efficient_dtype,
        efficient_head_dims,
        no_gqa("_efficient_attention_backward needs equal head counts; SDPA repeats K/V "
               "before this op"),
        causal_only("TOP_LEFT", "is_causal maps to CausalFromTopLeft"),
        head_dim_stride_one,
        aligned_offsets(gemm_alignment, "check_data_ptr_alignment_mem_efficient"),
        # dO's strides are free: the op copies it to packed [B, S, H, D] unless it is already.
        aligned_strides(lambda graph: KERNEL_ALIGNMENT, "cutlassB check_supported",
                        ports=("q", "k", "v"), axes_always=(1, 2)),
    )

    def backward(self, graph: Graph, tensors: Mapping[str, torch.Tensor]):
        op = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default
        rng = no_rng(tensors["q"].device)
        dq, dk, dv, _dbias = call_by_schema(op, {
            "grad_out": tensors["do"], "query": tensors["q"], "key": tensors["k"],
            "value": tensors["v"], "attn_bias": None, "out": bshd_packed_copy(tensors["o"]),
            "logsumexp": lse_padded(tensors["stats"], LSE_ROW_MULTIPLE),
            "philox_seed": rng, "philox_offset": rng, "dropout_p": 0.0,
            "grad_input_mask": [True, True, True, False], "is_causal": is_causal(graph),
            "scale": graph.attributes.attn_scale})
        return dq, dk, dv
