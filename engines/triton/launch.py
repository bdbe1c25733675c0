"""Argument and stride marshalling for the kernels, and their grids.

The user's tensors are addressed where they are, through their storage offsets and
strides: nothing is made contiguous or copied. The only allocation is the fp32 Delta
scratch, packed [B, H_q, S_q].
"""
from __future__ import annotations

import math
from typing import Mapping

import torch

from bundlegen.graph import Graph
from bundlegen.mask import diagonal_shift
from engines.triton.configs import BlockConfig, block_d
from engines.triton.defects import NO_DEFECTS, KernelDefects
from engines.triton.engine import interpret_enabled, triton_mode_error

VEC = 8                       # fp16/bf16 elements per 16 bytes: the vectorised layout (VEC)
ALIGN_BYTES = 16
TILE_OFFSET_LIMIT = 2 ** 31   # a tile whose offsets reach this needs 64-bit offsets (WIDE)
IO_PORTS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")


def kernels_module():
    """engines.triton.kernels, decorated for the mode TRITON_INTERPRET asks for now. Triton
    reads it when a function is decorated: a kernels module imported under the other mode
    is reloaded, but Triton's own library (tl.sum, tl.cdiv, ...) cannot be, so a process
    that imported Triton under the other mode gets a clear error instead of a crash inside."""
    import importlib

    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    from engines.triton import kernels
    error = triton_mode_error()
    if error is not None:
        raise RuntimeError(error)
    if isinstance(kernels.bwd_dq, InterpretedFunction) != isinstance(tl.cdiv, InterpretedFunction):
        kernels = importlib.reload(kernels)
    assert isinstance(kernels.bwd_dq, InterpretedFunction) == interpret_enabled()
    return kernels


def out_of_resources(exc: BaseException) -> bool:
    """A launch failed for shared memory or registers: a smaller config may fit."""
    from triton.runtime.errors import OutOfResources
    return isinstance(exc, OutOfResources) or "out of resource" in str(exc).lower()


def _base(t: torch.Tensor) -> torch.Tensor:
    """A one-element view at the start of t's storage: the kernels get the storage's base
    pointer (always allocation-aligned, so one compiled variant) and t's offset separately.
    Nothing is copied."""
    return t.as_strided((1,), (1,), 0)


def rows_aligned(dims, strides, offset: int) -> bool:
    """A tensor whose rows start and step in whole 16-byte groups (given an aligned base):
    offset and batch/head/sequence strides multiples of VEC, head-dim stride 1, head dim a
    multiple of VEC."""
    return (dims[3] % VEC == 0 and strides[3] == 1 and offset % VEC == 0
            and all(s % VEC == 0 for s in strides[:3]))


def vec_for(tensors: Mapping[str, torch.Tensor]) -> int:
    """VEC when every io tensor has aligned rows on an aligned storage; else 1 (scalar
    access, any strides)."""
    for port in IO_PORTS:
        t = tensors[port]
        if (t.untyped_storage().data_ptr() % ALIGN_BYTES
                or not rows_aligned(t.shape, t.stride(), t.storage_offset())):
            return 1
    return VEC


def _addr(t: torch.Tensor, vec: int) -> tuple:
    """(base, offset, stride_b, stride_h, stride_s, stride_d), offset and strides / vec."""
    return (_base(t), *(x // vec for x in (t.storage_offset(), *t.stride())))


def _stats_addr(t: torch.Tensor) -> tuple:
    """Stats [B, H_q, S_q, 1]: (base, offset, stride_b, stride_h, stride_s), never scaled."""
    return (_base(t), t.storage_offset(), *t.stride()[:3])


def _packed_stats(t: torch.Tensor) -> torch.Tensor:
    """Mutant only (KernelDefects.stats_packed): stats re-strided as packed [B, H_q, S_q, 1]
    over its own storage (as_strided raises where that would reach past the storage)."""
    B, H, S, _ = t.shape
    return t.as_strided(t.shape, (H * S, S, 1, 1), t.storage_offset())


def _bounds(graph: Graph, defects: KernelDefects = NO_DEFECTS) -> tuple[int, int, int]:
    """(shift, left, right) for the kernels. A bound beyond every |j - i - shift| changes
    nothing, so bounds are clipped to that range to keep them 32-bit."""
    a = graph.attributes
    shift = diagonal_shift(graph.S_q, graph.S_kv, a.diagonal_alignment)
    reach = graph.S_q + graph.S_kv + 1
    left = min(a.left_bound, reach) if a.left_bound is not None else 0
    right = min(a.right_bound, reach) if a.right_bound is not None else 0
    if defects.top_left:          # mutant only: the alignment asked is ignored
        shift = 0
    if defects.left_off_by_one:   # mutant only: keeps i - j' <= left_bound
        left += 1
    return shift, left, right


def needs_wide(tensors: Mapping[str, torch.Tensor], cfg: BlockConfig) -> bool:
    """True when some tile spans TILE_OFFSET_LIMIT elements or more: the offsets inside a
    tile are then computed in 64 bits (the offset of a tile's start always is)."""
    rows = max(cfg.block_m1, cfg.block_n1, cfg.block_m2, cfg.block_n2)
    for t in tensors.values():
        _, _, s_row, s_col = t.stride()
        span = (rows - 1) * s_row + (t.shape[3] - 1) * s_col   # masked lanes never load
        if span >= TILE_OFFSET_LIMIT:
            return True
    return False


def launch(graph: Graph, tensors: Mapping[str, torch.Tensor], cfg: BlockConfig,
           defects: KernelDefects = NO_DEFECTS) -> None:
    """Run preprocess, dK/dV (one or two passes) and dQ into tensors['dq'|'dk'|'dv'].
    `defects` (the mutation gate only) puts defect classes back; see defects.py."""
    kernels = kernels_module()

    B, H_q, H_k, H_v = graph.B, graph.H_q, graph.H_k, graph.H_v
    S_q, S_kv, D_qk, D_v = graph.S_q, graph.S_kv, graph.D_qk, graph.D_v
    a = graph.attributes
    shift, left, right = _bounds(graph, defects)
    vec = vec_for(tensors)
    flags = dict(HAS_LEFT=a.left_bound is not None, HAS_RIGHT=a.right_bound is not None,
                 # the interpreter's tl.dot cannot multiply bf16 (see kernels._dot)
                 UPCAST=interpret_enabled() and graph.dtype == "bf16",
                 WIDE=needs_wide(tensors, cfg), VEC=vec)
    tiles = dict(BLOCK_DQK=block_d(D_qk), BLOCK_DV=block_d(D_v))
    kw = cfg.launch_kwargs()
    q, k, v, o, do, dq, dk, dv = (_addr(tensors[p], vec) for p in IO_PORTS)
    stats = tensors["stats"]
    lse = _stats_addr(_packed_stats(stats) if defects.stats_packed else stats)

    delta = torch.empty((B, H_q, S_q), dtype=torch.float32, device=tensors["q"].device)
    kernels.bwd_preprocess[(math.ceil(S_q / cfg.block_m2) * B * H_q,)](
        o[0], do[0], delta, *o[1:], *do[1:], H_q, S_q, D_v // vec,
        BLOCK_M=cfg.block_m2, BLOCK_DV=tiles["BLOCK_DV"], VEC=vec, WIDE=flags["WIDE"],
        **defects.constexprs("preprocess"), **kw)

    pointers = (q[0], k[0], v[0], do[0], lse[0], delta)
    addressing = (*q[1:], *k[1:], *v[1:], *do[1:], *lse[1:])
    sizes = (S_q, S_kv, D_qk // vec, D_v // vec, float(a.attn_scale), shift, left, right)

    # dK/dV: one pass grouped by K heads when H_k == H_v, else a dK pass and a dV pass.
    passes = [(H_k, True, True)] if H_k == H_v else [(H_k, True, False), (H_v, False, True)]
    for H_grp, do_dk, do_dv in passes:
        kernels.bwd_dkdv[(math.ceil(S_kv / cfg.block_n1) * B * H_grp,)](
            *pointers, dk[0], dv[0], *addressing, *dk[1:], *dv[1:],
            H_q, H_grp, H_q // H_k, H_q // H_v, *sizes,
            COMPUTE_DK=do_dk, COMPUTE_DV=do_dv, BLOCK_M=cfg.block_m1, BLOCK_N=cfg.block_n1,
            **flags, **tiles, **defects.constexprs("dkdv"), **kw)

    kernels.bwd_dq[(math.ceil(S_q / cfg.block_m2) * B * H_q,)](
        *pointers, dq[0], *addressing, *dq[1:], H_q, H_q // H_k, H_q // H_v, *sizes,
        BLOCK_M=cfg.block_m2, BLOCK_N=cfg.block_n2, **flags, **tiles,
        **defects.constexprs("dq"), **kw)
