"""The dropout masks PyTorch's flash and efficient backward ops draw, recovered for the oracle
(docs/CONTRACTS.md, "Dropout": engine-drawn masks).

Both kernels draw their keep bits from Philox, a counter-based generator: the bit of score
(b, h, i, j) is a function of a seed, an offset and the sizes alone, and the backward draws
the same bits as the forward from the same seed and offset. What each op gives to recover
them:
- efficient (xformers' CUTLASS kernels): `aten::_fill_mem_eff_dropout_mask_` fills a
  [B, H, S_q, S_kv] float tensor with the uniform numbers the kernel compares with p, for
  a given seed and offset; kept iff the number is above p. The backward takes the seed and
  the offset as int64 scalars.
- flash (FlashAttention-2): the forward, asked for its debug mask, returns the softmax with
  every dropped entry's sign bit set, and the Philox state it drew from; the backward takes
  that state. The forward is run on zero inputs of the graph's dims (every kept entry
  holds 1/S_kv or 0, so the sign is never lost to an underflow), with the CUDA generator
  seeded inside a forked RNG state: the same seed and offset every time, and torch's own
  RNG state untouched for whatever runs next.

The bits of entries the graph's mask removes carry no meaning (flash never visits a tile
the causal mask removes whole, leaving its debug entries unwritten); they are reported as
kept, and the harness judges a drawn mask's keep rate over the entries the mask keeps.
"""
from __future__ import annotations

import functools

import torch

from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.graph import Graph
from bundlegen.mask import keep_mask
from bundlegen.engines.torch_sdpa_common import is_causal

#: the Philox seed and offset these engines draw from; fixed, so a case draws the same mask
#: in every run and in every process
PHILOX_SEED = 0x5EED_0043
PHILOX_OFFSET = 0


def only_where_attended(keep: torch.Tensor, graph: Graph) -> torch.Tensor:
    """keep with every entry the graph's mask removes set to 1 (its bit means nothing)."""
    attended = keep_mask(graph.S_q, graph.S_kv, graph.attributes, device=keep.device)
    if attended is None:
        return keep
    return torch.where(attended, keep, torch.ones_like(keep))


def efficient_keep(graph: Graph, device: torch.device, seed: int = PHILOX_SEED,
                   offset: int = PHILOX_OFFSET) -> torch.Tensor:
    """The efficient kernel's keep mask [B, H_q, S_q, S_kv] (float, 1 kept) for (seed, offset)."""
    uniform = torch.empty(graph.B, graph.H_q, graph.S_q, graph.S_kv, device=device,
                          dtype=torch.float32)
    torch.ops.aten._fill_mem_eff_dropout_mask_(uniform, graph.attributes.dropout_probability,
                                               seed, offset)
    return only_where_attended((uniform > graph.attributes.dropout_probability).float(), graph)


def efficient_philox(seed: int = PHILOX_SEED, offset: int = PHILOX_OFFSET
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The (philox_seed, philox_offset) arguments of the efficient backward ops: int64
    scalars on the host, as the op's own forward returns them outside CUDA-graph capture."""
    return torch.tensor(seed, dtype=torch.int64), torch.tensor(offset, dtype=torch.int64)


@functools.lru_cache(maxsize=8)
def _flash_draw(dims: tuple, dtype: torch.dtype, p: float, causal: bool, device: torch.device,
                seed: int, offset: int):
    B, H_q, H_k, S_q, S_kv, D_qk, D_v = dims
    q = torch.zeros(B, H_q, S_q, D_qk, dtype=dtype, device=device)
    k = torch.zeros(B, H_k, S_kv, D_qk, dtype=dtype, device=device)
    v = torch.zeros(B, H_k, S_kv, D_v, dtype=dtype, device=device)
    with torch.random.fork_rng(devices=[device]):
        torch.cuda.manual_seed(seed)
        generator = torch.cuda.default_generators[device.index if device.index is not None
                                                  else torch.cuda.current_device()]
        generator.set_offset(offset)
        out = torch.ops.aten._scaled_dot_product_flash_attention.default(
            q, k, v, p, causal, True)
    rng_state, unused, debug = out[6], out[7], out[8]
    keep = (~torch.signbit(debug[:, :, :S_q, :S_kv])).float()
    return keep, rng_state, unused


def flash_draw(graph: Graph, device: torch.device, seed: int = PHILOX_SEED,
               offset: int = PHILOX_OFFSET) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keep [B, H_q, S_q, S_kv] float, philox_seed, philox_offset) of FlashAttention-2's
    dropout for `graph`: the mask its backward applies when handed that Philox state."""
    dims = (graph.B, graph.H_q, graph.H_k, graph.S_q, graph.S_kv, graph.D_qk, graph.D_v)
    keep, rng_state, unused = _flash_draw(dims, TORCH_DTYPES[graph.dtype],
                                          graph.attributes.dropout_probability, is_causal(graph),
                                          torch.device(device), seed, offset)
    return only_where_attended(keep.clone(), graph), rng_state, unused
