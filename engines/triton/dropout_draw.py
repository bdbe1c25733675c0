"""The dropout mask the Triton kernels draw themselves (docs/CONTRACTS.md, "Dropout"): a graph
with dropout_probability p > 0 and no dropout_mask port.

The generator is counter-based: Philox 4x32-10 (tl.philox) keyed by the engine's 64-bit seed,
with the counter (j, i, b * H_q + h, offset) of each score entry (b, h, i, j), i and j
counted inside the sequence (a ragged batch's sequence b starts at row 0 on both sides). The
first 32-bit word's top 24 bits make a uniform u in [0, 1), exactly representable in fp32,
and the entry is kept where u >= p. So the mask is a function of the seed, the offset and
the entry's coordinates alone: the same on every backend and in the interpreter (only
integer operations and one exact conversion), whichever kernel, tile or program order
draws it. The dK/dV and dQ kernels draw it tile by tile (`dropout_scale_tile`); the host
side reads it whole from `keep_mask_kernel`, the same function on a [B, H_q, S_q, S_kv] grid,
so the mask the harness judges with is bitwise the mask the kernels used.

Four 32-bit counters, not one 64-bit offset: Triton's tl.rand takes 64-bit offsets as two
32-bit words in 3.9 and as a 64-bit Philox in earlier releases, so its bits would change
with the Triton version; these do not, and no coordinate overflows (each is below 2^31).
"""
import triton
import triton.language as tl

from bundlegen.engines.triton.tile_ops import keep_scaled_tile

#: rows of keep_mask_kernel's tiles (a power of two)
MASK_BLOCK = 64


@triton.jit
def drawn_keep(seed, offset, bh, i, j, p):
    """Bool tile: entry (i, j) of batch-head bh (= b * H_q + h) kept, i and j broadcast."""
    zero = (i * 0 + j * 0).to(tl.uint32)
    r, _, _, _ = tl.philox(seed, j.to(tl.uint32) + zero, i.to(tl.uint32) + zero,
                           bh.to(tl.uint32) + zero, offset.to(tl.uint32) + zero)
    u = (r >> 8).to(tl.float32) * (1.0 / 16777216.0)   # 24 bits: exact in fp32
    return u >= p


@triton.jit
def dropout_scale_tile(DROP, off, b, s_b, h, s_h, i0, s_i, j0, s_j, ri, rj, ok, VEC: tl.constexpr,
                       EVEN: tl.constexpr, drop_scale, TRANS: tl.constexpr, DRAWN: tl.constexpr, seed,
                       offset, H_q, p):
    """keep * drop_scale (1 / (1 - p)), fp32, 0 where not ok: a [len(ri), len(rj)] tile, or
    its transpose when TRANS (the dK/dV kernel's), of rows i0 + ri and columns j0 + rj (VEC,
    EVEN: the mask port's addressing, tile_ops.score_tile). DRAWN:
    the mask drawn here (drawn_keep, for query head h of batch b); else read from the
    dropout_mask port (tile_ops.keep_scaled_tile)."""
    if DRAWN:
        bh = b * H_q + h
        if TRANS:
            keep = drawn_keep(seed, offset, bh, (i0 + ri)[None, :], (j0 + rj)[:, None], p)
        else:
            keep = drawn_keep(seed, offset, bh, (i0 + ri)[:, None], (j0 + rj)[None, :], p)
        x = tl.where(ok & keep, drop_scale, 0.0)
    else:
        x = keep_scaled_tile(DROP, off, b, s_b, h, s_h, i0, s_i, j0, s_j, ri, rj, ok, VEC, EVEN,
                             drop_scale, TRANS)
    return x


@triton.jit(do_not_specialize=["seed", "offset", "H_q", "S_q", "S_kv"])
def keep_mask_kernel(OUT, seed, offset, H_q, S_q, S_kv, p, BLOCK: tl.constexpr):
    """OUT [B, H_q, S_q, S_kv] (packed, uint8) = drawn_keep: one program per (b, h, row block,
    column block)."""
    n_m = tl.cdiv(S_q, BLOCK)
    n_n = tl.cdiv(S_kv, BLOCK)
    pid = tl.program_id(0)
    pid_n = pid % n_n
    pid_m = (pid // n_n) % n_m
    bh = (pid // (n_n * n_m)).to(tl.int64)
    i = pid_m * BLOCK + tl.arange(0, BLOCK)
    j = pid_n * BLOCK + tl.arange(0, BLOCK)
    keep = drawn_keep(seed, offset, bh, i[:, None], j[None, :], p)
    ptrs = OUT + (bh * S_q + i[:, None].to(tl.int64)) * S_kv + j[None, :]
    tl.store(ptrs, keep.to(tl.uint8), mask=(i[:, None] < S_q) & (j[None, :] < S_kv))


def drawn_keep_mask(kernels, graph, seed: int, offset: int, device) -> "torch.Tensor":
    """The keep mask [B, H_q, S_q, S_kv] (uint8, 1 kept) a DRAWN_DROPOUT launch of `graph`
    draws with (seed, offset): `kernels`' keep_mask_kernel (a kernels module as
    launch.kernels_module returns it: decorated for the mode this process runs Triton in) on
    `device`. A ragged graph's is [B, H_q, max_seqlen_q, max_seqlen_kv], sequence-local."""
    import torch

    B, H_q, S_q, S_kv = graph.B, graph.H_q, graph.S_q, graph.S_kv
    out = torch.zeros((B, H_q, S_q, S_kv), dtype=torch.uint8, device=device)
    grid = B * H_q * triton.cdiv(S_q, MASK_BLOCK) * triton.cdiv(S_kv, MASK_BLOCK)
    if grid:
        kernels.keep_mask_kernel[(grid,)](out, seed, offset, H_q, S_q, S_kv,
                                          float(graph.attributes.dropout_probability),
                                          BLOCK=MASK_BLOCK)
    return out
