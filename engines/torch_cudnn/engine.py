"""`TorchCudnnEngine` (torch-cudnn): aten::_scaled_dot_product_cudnn_attention_backward.

The op builds a cuDNN-frontend SDPA backward graph from the tensors' own dims and strides
(aten/src/ATen/native/cudnn/MHA.cpp) and caches it by q, k, v dims and strides. LSE is
[B, H, S_q, 1] fp32 (older torch: [B, H, S_q]; see cudnn_lse_has_unit_dim). O is presented
in the layout the cudnn forward allocates (alloc_with_matching_layout). Sources:
sdp_utils.cpp can_use_cudnn_attention and check_cudnn_tensor_shapes.

Score modifiers: an additive bias goes in as attn_bias, its broadcast axes narrowed to
length 1 (cuDNN's bias broadcasts by dims, [1|B, 1|H, S_q, S_kv]); the op returns no bias
gradient (no dbias), and cuDNN's sinks and softcap are not reachable through it.
"""
from __future__ import annotations

from typing import Mapping

import torch

from bundlegen import reasons as R
from bundlegen.graph import Graph
from bundlegen.engines.torch_sdpa_common import (DeviceFacts, TorchSdpaEngine, aligned_offsets,
                                       aligned_strides, bias_broadcast_as_dims,
                                       bias_last_dim_contiguous, call_by_schema, capability_between,
                                       with_bias,
                                       causal_only, cudnn_lse_has_unit_dim, dtype_in,
                                       elements_per_16_bytes, head_dim_stride_one, is_causal,
                                       kv_heads_equal, lse_rows, lse_unit_last,
                                       matching_layout_copy, needs_nvidia_gpu, no_dropout,
                                       no_rng, writable_outputs)

MIN_CUDNN = 90000                 # can_use_cudnn_attention: cuDNN >= 9.0.0
MAX_DIM_SIZE = 65535              # check_cudnn_tensor_shapes: B and H
HEAD_DIM_LIMIT = 128
WIDE_QK_HEAD_DIMS = (192, 128)    # (D_qk, D_v) on sm90 / sm10x with cuDNN >= 9.11
WIDE_QK_MIN_CUDNN = 91100
TMA_SOURCE = "cuDNN's kernels address q, k, v, dO through 16-byte aligned TMA descriptors"


def cudnn_runtime(graph: Graph, facts: DeviceFacts) -> str | None:
    if facts.cudnn_version is None or facts.cudnn_version < MIN_CUDNN:
        return (f"{R.DEVICE_NOT_SERVED}: cuDNN {facts.cudnn_version} "
                f"(needs >= {MIN_CUDNN}, can_use_cudnn_attention)")
    return None


def cudnn_head_dims(graph: Graph, facts: DeviceFacts) -> str | None:
    d_qk, d_v = graph.D_qk, graph.D_v
    if d_qk % 8 or d_v % 8:
        return (f"{R.HEAD_DIM_NOT_SERVED}: D_qk={d_qk}, D_v={d_v} not multiples of 8 "
                "(check_cudnn_tensor_shapes)")
    if max(d_qk, d_v) <= HEAD_DIM_LIMIT:
        return None
    cap = facts.capability or (0, 0)
    sm90_or_sm10x = cap == (9, 0) or cap[0] == 10
    if (sm90_or_sm10x and (facts.cudnn_version or 0) >= WIDE_QK_MIN_CUDNN
            and (d_qk, d_v) == WIDE_QK_HEAD_DIMS):
        return None
    # D up to 256 also needs a cudnn-frontend >= 1.24 build, which torch does not expose.
    return (f"{R.HEAD_DIM_TOO_LARGE}: D_qk={d_qk}, D_v={d_v} (at most {HEAD_DIM_LIMIT}; "
            f"{WIDE_QK_HEAD_DIMS[0]}/{WIDE_QK_HEAD_DIMS[1]} on sm90/sm10x with cuDNN >= 9.11; "
            "check_cudnn_tensor_shapes)")


def cudnn_sizes(graph: Graph, facts: DeviceFacts) -> str | None:
    if graph.B > MAX_DIM_SIZE or graph.H_q > MAX_DIM_SIZE:
        return f"{R.TOO_LARGE}: B={graph.B}, H_q={graph.H_q} (at most {MAX_DIM_SIZE} each)"
    if graph.S_kv == 1:
        return f"{R.SEQ_LEN_NOT_SERVED}: S_kv=1 (check_cudnn_tensor_shapes)"
    return None


def cudnn_ragged(graph: Graph, facts: DeviceFacts) -> str | None:
    """Why ragged graphs are declined (read in PyTorch's source, attention_backward.cu and
    cudnn/MHA.cpp): _cudnn_attention_backward's nested branch sizes the cuDNN graph with
    max_seqlen_batch_q = query.size(2) and max_seqlen_batch_k = key.size(2), which for the
    token-major [T, H, D] inputs it takes are the head dims, not max_q / max_k; and the LSE
    form that branch wants changed between releases ([T, H, 1] ragged, then 2-D [H, T])."""
    return (f"{R.RAGGED_NOT_SERVED}: the cum_seq_q path of _cudnn_attention_backward sizes "
            "its graph by query.size(2) (D for [T, H, D]) instead of max_q/max_k, and its LSE "
            "form differs between torch releases")


def cudnn_values(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> dict:
    """The arguments of aten::_scaled_dot_product_cudnn_attention_backward, by schema name:
    the declared q, k, v, dO views; O in the forward's layout; LSE in this torch's form; the
    bias (when the graph has one) with its broadcast axes as length-1 dims."""
    rng = no_rng(tensors["q"].device)
    stats, bias = tensors["stats"], tensors.get("bias")
    return {
        "grad_out": tensors["do"], "query": tensors["q"], "key": tensors["k"],
        "value": tensors["v"], "out": matching_layout_copy(tensors["q"], tensors["o"]),
        "logsumexp": lse_unit_last(stats) if cudnn_lse_has_unit_dim() else lse_rows(stats),
        "philox_seed": rng, "philox_offset": rng,
        "attn_bias": None if bias is None else bias_broadcast_as_dims(bias),
        "cum_seq_q": None, "cum_seq_k": None, "max_q": graph.S_q, "max_k": graph.S_kv,
        "dropout_p": 0.0, "is_causal": is_causal(graph), "scale": graph.attributes.attn_scale}


class TorchCudnnEngine(TorchSdpaEngine):
    name = "torch-cudnn"
    score_modifiers = frozenset({"bias"})
    RULES = (
        needs_nvidia_gpu,
        cudnn_runtime,
        capability_between((8, 0), (12, 1), "check_cudnn_hardware_support"),
        no_dropout,
        writable_outputs,
        dtype_in(("fp16", "bf16"), "check_dtypes_low_precision"),
        cudnn_head_dims,
        cudnn_sizes,
        kv_heads_equal("check_grouped_query_attention: K and V share num_heads"),
        causal_only("TOP_LEFT", "the op sets cuDNN's top-left causal mask"),
        head_dim_stride_one,
        aligned_offsets(elements_per_16_bytes, TMA_SOURCE),
        aligned_strides(elements_per_16_bytes, TMA_SOURCE),
        bias_last_dim_contiguous("cuDNN reads the bias's S_kv axis packed"),
        with_bias(aligned_offsets(elements_per_16_bytes, f"bias: {TMA_SOURCE}", ports=("bias",))),
        with_bias(aligned_strides(elements_per_16_bytes, f"bias: {TMA_SOURCE}", ports=("bias",))),
    )

    RAGGED_RULES = (cudnn_ragged,)

    def backward(self, graph: Graph, tensors: Mapping[str, torch.Tensor]):
        op = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
        return tuple(call_by_schema(op, cudnn_values(graph, tensors)))
