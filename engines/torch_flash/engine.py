"""`TorchFlashEngine` (torch-flash): aten::_scaled_dot_product_flash_attention_backward.

The op transposes q, k, v, dO, O to [B, S, H, D] and calls FlashAttention-2's mha_bwd
(aten/src/ATen/native/transformers/cuda/attention_backward.cu, flash_attn/flash_api.cpp).
LSE is [B, H, S_q] fp32. Where each rule comes from is named in its decline detail; the
sources are PyTorch's sdp_utils.cpp (what SDPA's dispatcher lets through to flash) and
flash_api.cpp (what mha_bwd checks).
"""
from __future__ import annotations

from typing import Mapping

import torch

from bundlegen import reasons as R
from bundlegen.graph import Graph
from bundlegen.engines.torch_sdpa_common import (DeviceFacts, RaggedRows, TorchSdpaEngine,
                                       aligned_offsets, aligned_strides, bshd_packed_copy,
                                       call_by_schema, capability_between, causal_only,
                                       dtype_in, elements_per_16_bytes, equal_head_dims,
                                       head_dim_stride_one, is_causal, kv_heads_equal,
                                       lse_heads_tokens, lse_rows, needs_nvidia_gpu,
                                       no_dropout, no_rng, packed_rows_copy,
                                       ragged_causal_only, writable_outputs, draws_only)
from bundlegen.engines.torch_drawn_dropout import flash_draw

MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8
# check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120: no backward kernel
# for 192 < D <= 224 on these (smaller shared memory) parts.
SMALL_SMEM_ARCHS = (((8, 6), (8, 9)), ((12, 0), (12, 1)))
VECTOR_SOURCE = "flash loads 16-byte vectors; SDPA's dispatcher does not check this"


def flash_head_dim(graph: Graph, facts: DeviceFacts) -> str | None:
    D = graph.D_qk
    if D % HEAD_DIM_MULTIPLE:
        return (f"{R.HEAD_DIM_NOT_SERVED}: D={D} not a multiple of {HEAD_DIM_MULTIPLE} "
                "(mha_bwd; SDPA pads D in the forward, the backward op does not)")
    if D > MAX_HEAD_DIM:
        return f"{R.HEAD_DIM_TOO_LARGE}: D={D} (at most {MAX_HEAD_DIM}, check_head_dim_size_flash)"
    small_smem = any(lo <= (facts.capability or (0, 0)) <= hi for lo, hi in SMALL_SMEM_ARCHS)
    if small_smem and 192 < D <= 224:
        return (f"{R.HEAD_DIM_NOT_SERVED}: D={D} in (192, 224] on {facts.arch} "
                "(check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120)")
    return None


def flash_varlen_values(graph: Graph, tensors: Mapping[str, torch.Tensor], q_rows: RaggedRows,
                        kv_rows: RaggedRows) -> dict:
    """The arguments of aten::_flash_attention_backward's varlen path (mha_varlen_bwd), by
    schema name. q, k, v, dO: the declared [T, H, D] views (the op copies dO to contiguous).
    O: packed [T_q, H_q, D_v] (the op makes it contiguous anyway). LSE: [H_q, T_q] by storage
    row. Offsets: the contained device offsets, int32. max_q / max_k: the graph's bounds,
    capped by the storage (no contained sequence is longer than T) and at least 1.
    rng_state / unused (philox_seed / philox_offset in older schemas): read only with
    dropout, which is declined."""
    rng = no_rng(tensors["q"].device)
    return {
        "grad_out": tensors["do"], "query": tensors["q"], "key": tensors["k"],
        "value": tensors["v"], "out": packed_rows_copy(tensors["o"], q_rows),
        "logsumexp": lse_heads_tokens(tensors["stats"], q_rows),
        "cum_seq_q": q_rows.offsets, "cum_seq_k": kv_rows.offsets,
        "max_q": max(1, min(graph.S_q, graph.T_q)), "max_k": max(1, min(graph.S_kv, graph.T_kv)),
        "dropout_p": 0.0, "is_causal": is_causal(graph),
        "rng_state": rng, "unused": rng, "philox_seed": rng, "philox_offset": rng,
        "scale": graph.attributes.attn_scale}


class TorchFlashEngine(TorchSdpaEngine):
    name = "torch-flash"
    #: PyTorch runs this backward deterministically under torch.use_deterministic_algorithms
    deterministic_mode = True
    #: its Philox mask is recovered from the forward's debug mask (padded graphs)
    draws_dropout_mask = True
    RULES = (
        needs_nvidia_gpu,
        capability_between((8, 0), (12, 1), "check_flash_attention_hardware_support"),
        draws_only,
        writable_outputs,
        dtype_in(("fp16", "bf16"), "check_dtypes_flash_attention"),
        equal_head_dims("check_head_dim_size_flash: q, k, v share D"),
        flash_head_dim,
        kv_heads_equal("flash takes one num_heads_k for K and V"),
        causal_only("BOTTOM_RIGHT", "FlashAttention-2 aligns causal bottom-right; SDPA's "
                                    "dispatcher refuses non-square causal for that reason"),
        head_dim_stride_one,
        aligned_offsets(elements_per_16_bytes, VECTOR_SOURCE),
        # dO's strides are free: the op copies it to packed [B, S, H, D] unless it is already.
        aligned_strides(elements_per_16_bytes, VECTOR_SOURCE, ports=("q", "k", "v")),
    )

    # Ragged: _flash_attention_backward with cum_seq_q / cum_seq_k runs mha_varlen_bwd
    # (attention_backward.cu -> flash_api.cpp), q/k/v/dO/O [T, H, D], LSE [H, T_q].
    # FlashAttention-2 aligns causal bottom-right per sequence (each sequence's own S_q_b,
    # S_kv_b). Its dq_accum and softmax_d are sized total_q + 128 * B and indexed by the
    # offsets, so contained offsets keep every access inside the tensors even for a
    # sequence longer than max_q / max_k (a device probe); that sequence's rows are wrong,
    # which the contract allows.
    RAGGED_RULES = (
        needs_nvidia_gpu,
        capability_between((8, 0), (12, 1), "check_flash_attention_hardware_support"),
        no_dropout,
        writable_outputs,
        dtype_in(("fp16", "bf16"), "mha_varlen_bwd: fp16 and bf16"),
        equal_head_dims("mha_varlen_bwd: CHECK_SHAPE(v, total_k, num_heads_k, head_size)"),
        flash_head_dim,
        kv_heads_equal("mha_varlen_bwd: k and v share num_heads_k"),
        ragged_causal_only(("BOTTOM_RIGHT",), "FlashAttention-2's varlen causal mask is "
                                              "bottom-right per sequence"),
        head_dim_stride_one,
        aligned_offsets(elements_per_16_bytes, VECTOR_SOURCE),
        aligned_strides(elements_per_16_bytes, VECTOR_SOURCE, ports=("q", "k", "v")),
    )

    def ragged_backward(self, graph: Graph, tensors: Mapping[str, torch.Tensor],
                        q_rows: RaggedRows, kv_rows: RaggedRows):
        op = torch.ops.aten._flash_attention_backward.default
        return call_by_schema(op, flash_varlen_values(graph, tensors, q_rows, kv_rows))

    def drawn_dropout_mask(self, graph: Graph) -> torch.Tensor | None:
        return flash_draw(graph, self.device)[0]

    def backward(self, graph: Graph, tensors: Mapping[str, torch.Tensor]):
        op = torch.ops.aten._scaled_dot_product_flash_attention_backward.default
        seed = offset = no_rng(tensors["q"].device)
        if graph.asks_drawn_dropout:
            _keep, seed, offset = flash_draw(graph, self.device)
        dq, dk, dv = call_by_schema(op, {
            "grad_out": tensors["do"], "query": tensors["q"], "key": tensors["k"],
            "value": tensors["v"], "out": bshd_packed_copy(tensors["o"]),
            "logsumexp": lse_rows(tensors["stats"]), "cum_seq_q": None, "cum_seq_k": None,
            "max_q": graph.S_q, "max_k": graph.S_kv,
            "dropout_p": graph.attributes.dropout_probability or 0.0,
            "is_causal": is_causal(graph), "philox_seed": seed, "philox_offset": offset,
            "scale": graph.attributes.attn_scale})
        return dq, dk, dv
