"""The Triton kernels of the SDPA backward (FlashAttention-2 structure).

Notation: S = scale * Q K^T, P = exp(S - LSE) (masked), O = P V, dO given.
    Delta_i = sum_d O[i,d] dO[i,d]                     (preprocess)
    dV      = sum_{q heads in group} P^T dO
    dP      = dO V^T,   dS = P * (dP - Delta)
    dK      = scale * sum_{q heads in group} dS^T Q
    dQ      = scale * dS K
P is recomputed from Q, K and the given natural-log LSE as exp2(S*log2e - LSE*log2e): the
exponent is formed in one piece, so a very negative LSE never makes exp(S) or exp(-LSE) on
its own. Rows with LSE = -inf have no kept key: their P is 0 (LSE is replaced by +inf).

Addressing. Each tensor comes as its storage's base pointer, an element offset and its
(batch, head, sequence, head-dim) strides. The offset of a head's row 0 (or a tile's first
row) is a 64-bit scalar; offsets inside a tile are 32-bit, or 64-bit when the launcher sets
WIDE (launch.tile_span: a head's tiles spanning 2^31 elements or more). The tiles streamed
in a loop (Q and dO in the dK/dV kernel, K and V in the dQ kernel) count their rows from
row 0, so their offsets change with the block and are not kept live across the loop.
VEC is 8 when every io tensor's offset and strides are multiples of 8 elements, its head-dim
stride is 1 and both head dims are multiples of 8: the launcher then passes those numbers
divided by 8 and the kernels multiply them back, so Triton knows each row starts 16-byte
aligned and vectorises the loads. Otherwise VEC is 1 and any strides are served. Head dims
are padded to power-of-two tiles (BLOCK_DQK, BLOCK_DV) with masked loads (the zero-fill
envelope); sequence tails are masked likewise.
EVEN (launch.whole_tiles: no tile crosses a sequence's or the head dims' end) leaves the
masks of the dK/dV and dQ kernels' loads and stores out.
TMA (launch.descriptor_loads: a padded graph whose io tensors are VEC-aligned, one head-dim
chunk) loads the streamed tiles, Q and dO in the dK/dV kernel and K and V in the dQ kernel,
through tensor descriptors of the [B, H, S, D] ports (QD, DOD, KD, VD; None otherwise):
the copy engine forms the addresses and fills rows past S and columns past D with zeros,
so those loads need neither offset tiles nor masks.

Ragged (THD / varlen) batches, RAGGED on: every port is token-major [T, H, D]. The
launcher hands each port as a [1, H, T, D] view whose batch stride is its token stride, so
that a program indexes a port's "batch" axis by its sequence's first token: row base =
token base * token stride, 64-bit like every tile start. Each program reads sequence b's
offsets cu_seqlens_q[b], [b+1] and cu_seqlens_kv[b], [b+1] on the device (_sequence) and
works on its own lengths S_q_b, S_kv_b; grids and Delta are sized by the max_seqlen bounds
(S_q, S_kv), and programs past their sequence's end do nothing. A side whose offsets would
address rows outside the storage is taken as empty (seed 001: no host check sees them).

Two chunks. Head dims past one power-of-two tile (128 < D <= 192) padded to 256 waste up to
half the tensor-core work. With BLOCK_DQK2 / BLOCK_DV2 > 0 the dK/dV and dQ kernels hold each
head dim in two column chunks instead, [0, BLOCK_DQK) and [BLOCK_DQK, BLOCK_DQK +
BLOCK_DQK2) (likewise V), e.g. 128 + 64 for D 192; the launcher asks for them only where both
head dims exceed BLOCK_DQK = BLOCK_DV = 128, so the first chunk is whole and its loads need
no head-dim mask. With 0 (every other launch) the chunk code is not compiled.

Mask (bundlegen/mask.py): keep (i, j) iff (not HAS_LEFT or i - j + shift < left) and
(not HAS_RIGHT or j - i - shift <= right). Loops cover only the blocks the band reaches,
and blocks the band keeps whole skip the mask. Each formula holds unchanged for a bound
past every |j - i - shift|, so the launcher serves every band kind with the kernel of both
bounds where it can (launch.band_flags).

Score modifiers (docs/CONTRACTS.md, "Score modifiers"), each behind a constexpr so that a
launch without them compiles the code it had before (the launcher then passes None for their
arguments, which Triton makes constexprs):
    SOFTCAP   S <- cap * tanh(S / cap) (cap: the runtime `softcap`); dS <- dS * (1 - t^2)
    HAS_BIAS  S <- S + bias[b, h, i, j] (h the query head), read through its 4 strides
              (0 on a broadcast axis), its tile base 64-bit like every other
    dBias     bwd_dbias: one program per dBias tile recomputes dS = P (dP - Delta) and sums
              it over the batches and heads dBias is broadcast over, in a fixed order (no
              atomics, no scratch); tiles outside the band are written as zeros
    sinks     only in the LSE the stats hold, so P, dQ, dK, dV are unchanged; bwd_dsinks:
              dSinks_h = -sum_{b,i} exp(sink_h - LSE_bhi) Delta_bhi, one program per head
    HAS_DROPOUT  the dropout_mask port (keep 1, drop 0) read like the bias, times drop_scale
              = 1 / (1 - p): dV += (P keep / (1 - p))^T dO and dS = P (dP keep / (1 - p) -
              Delta), Delta from the dropped O the harness gives (no dBias kernel variant)
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E)
TWO_LOG2E = tl.constexpr(2.8853900817779268)

# No integer argument is specialised by value: sizes, strides and offsets change from case
# to case, and one compile per combination would dominate a test run. What vectorisation
# needs is carried by VEC instead (and the base pointers are always storage-aligned).
_INPUT_INTS = ["q_off", "sq_b", "sq_h", "sq_s", "sq_d", "k_off", "sk_b", "sk_h", "sk_s", "sk_d",
               "v_off", "sv_b", "sv_h", "sv_s", "sv_d", "do_off", "sdo_b", "sdo_h", "sdo_s",
               "sdo_d", "l_off", "sl_b", "sl_h", "sl_s"]
_SIZE_INTS = ["H_q", "G_k", "G_v", "S_q", "S_kv", "D_qk", "D_v", "shift", "left", "right"]
# Run-time choices that were constexprs (one compile per value) until they were measured to
# cost nothing at run time: the program order, a ragged batch's diagonal alignment (0 or 1;
# a test run compiles 14 % fewer kernels for these two, engines/triton/warm.py), and which
# bound a band has alone (launch.band_flags: 0, 1 left, 2 right), which puts the heaviest
# programs first.
_CHOICE_INTS = ["block_major", "bottom_right", "lone_bound"]
# Ragged launches only; a dense launch passes None for CU_Q, CU_KV, T_q and T_kv, which Triton
# makes constexprs, so the dense variants compile to the code they had before RAGGED.
_RAGGED_INTS = ["T_q", "T_kv"]
# HAS_BIAS launches only (None otherwise, like the ragged ones): bias offset and strides
_BIAS_INTS = ["bias_off", "sbias_b", "sbias_h", "sbias_i", "sbias_j"]
# HAS_DROPOUT launches only (None otherwise): the dropout mask's offset and strides
_DROP_INTS = ["drop_off", "sdrop_b", "sdrop_h", "sdrop_i", "sdrop_j"]
# ATOMIC_DQ launches only (None otherwise): the strides of the fp32 dQ scratch, in its rows
_DQA_INTS = ["sqa_b", "sqa_h", "sqa_s"]


@triton.jit
def _at(X, off, b, s_b, h, s_h, row0, s_s, VEC: tl.constexpr):
    """Pointer to element (b, h, row0, 0) of a tensor; 64-bit (b, h, row0 are int64)."""
    return X + (off + b * s_b + h * s_h + row0 * s_s) * VEC


@triton.jit
def _tile(rows, cols, s_row, s_col, VEC: tl.constexpr):
    """Element offsets of a [rows, cols] tile (cols along the head dim)."""
    if VEC > 1:   # head-dim stride 1, row stride a multiple of VEC
        return rows[:, None] * (s_row * VEC) + cols[None, :]
    return rows[:, None] * s_row + cols[None, :] * s_col


@triton.jit
def _ranges(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr,
            BLOCK_DV: tl.constexpr, WIDE: tl.constexpr):
    """Row and column index vectors of the tiles, 64-bit when WIDE."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rdq = tl.arange(0, BLOCK_DQK)
    rdv = tl.arange(0, BLOCK_DV)
    if WIDE:
        rm, rn, rdq, rdv = rm.to(tl.int64), rn.to(tl.int64), rdq.to(tl.int64), rdv.to(tl.int64)
    return rm, rn, rdq, rdv


@triton.jit
def _keep(i, j, S_q, S_kv, shift, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
          EVEN: tl.constexpr = False):
    """Bool tile: (i, j) inside both sequences and inside the band (i, j broadcast). EVEN
    (launch.whole_tiles: every tile inside both sequences) leaves the sequences' compares out.
    Only the kernel of both bounds is ever EVEN (launch.band_flags)."""
    if EVEN:
        tl.static_assert(HAS_LEFT and HAS_RIGHT, "an EVEN launch with a band has both bounds")
        return (j - i - shift <= right) & (i - j + shift < left)
    keep = (i < S_q) & (j < S_kv)
    if HAS_RIGHT:
        keep = keep & (j - i - shift <= right)
    if HAS_LEFT:
        keep = keep & (i - j + shift < left)
    return keep


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr):
    """acc + a @ b with fp32 accumulation. UPCAST (the CPU interpreter with bf16 only, whose
    tl.dot multiplies bf16 bit patterns as integers) widens the operands to fp32 first:
    bf16 products are exact in fp32, so the math is the same as the GPU's. fp32 operands
    (fp32 io: every operand is an io tile or cast to io) get true fp32 products: tl.dot's
    default for fp32 is TF32 (10-bit mantissa inputs), past the fp32 tolerance classes."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc=acc, input_precision="ieee")
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc=acc, input_precision="ieee")
    return tl.dot(a, b, acc=acc)


@triton.jit
def _lse2(lse):
    """LSE in log2 units; -inf (no kept key) becomes +inf so that exp2(s - lse2) = 0."""
    return tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)


@triton.jit
def _p(keep, s2, lse2):
    """P = exp2(s2 - lse2) where kept, else 0 (s2, lse2 in log2 units, broadcast)."""
    return tl.exp2(tl.where(keep, s2 - lse2, float("-inf")))


@triton.jit
def _p_block(s2, lse2, start, mid_lo, mid_hi, i, j, S_q, S_kv, shift, left, right,
             HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, EVEN: tl.constexpr,
             P_FIRST: tl.constexpr):
    """P of the block starting at `start` along the loop, masked by _keep unless the block
    starts in [mid_lo, mid_hi) (whole: inside the band and the sequences; uniform per
    program). P_FIRST: P before the branch, which holds only the select; else an exp2 in each
    branch (_p on an edge block). P_FIRST with _keep's EVEN form and D 128's band config (3
    stages, dp_first) ran 1.03x the kernels before at D 128 causal on the H200; P first alone
    1.00x, the EVEN form and the config without it 1.01x (bench/results/h200/round21). The
    launch sites say where it is off."""
    if P_FIRST:
        p = tl.exp2(s2 - lse2)
        if (start < mid_lo) | (start >= mid_hi):
            p = tl.where(_keep(i, j, S_q, S_kv, shift, left, right, HAS_LEFT, HAS_RIGHT, EVEN),
                         p, 0.0)
    else:
        if (start < mid_lo) | (start >= mid_hi):
            p = _p(_keep(i, j, S_q, S_kv, shift, left, right, HAS_LEFT, HAS_RIGHT, EVEN), s2,
                   lse2)
        else:
            p = tl.exp2(s2 - lse2)
    return p


@triton.jit
def _tanh(x):
    """tanh(x) from exp2 (every backend and the interpreter have it; no libdevice):
    sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) <= 1, so nothing overflows."""
    e = tl.exp2(tl.abs(x) * -TWO_LOG2E)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _bias2(BIAS, off, b, s_b, h, s_h, i0, s_i, j0, s_j, ri, rj, ok, TRANS: tl.constexpr):
    """bias[b, h, i0 + ri, j0 + rj] in log2 units, fp32, 0 where not ok; a [len(ri), len(rj)]
    tile, or its transpose [len(rj), len(ri)] when TRANS (the dK/dV kernel's S^T). The tile
    base is 64-bit (b, h, i0, j0 are int64)."""
    base = BIAS + (off + b * s_b + h * s_h + i0 * s_i + j0 * s_j)
    if TRANS:
        x = tl.load(base + rj[:, None] * s_j + ri[None, :] * s_i, mask=ok, other=0.0)
    else:
        x = tl.load(base + ri[:, None] * s_i + rj[None, :] * s_j, mask=ok, other=0.0)
    return x.to(tl.float32) * LOG2E


@triton.jit
def _keep_scaled(DROP, off, b, s_b, h, s_h, i0, s_i, j0, s_j, ri, rj, ok, drop_scale,
                 TRANS: tl.constexpr):
    """keep[b, h, i0 + ri, j0 + rj] * drop_scale, fp32, 0 where not ok: a tile of the dropout
    mask, addressed as _bias2 addresses the bias (TRANS: the dK/dV kernel's transpose)."""
    base = DROP + (off + b * s_b + h * s_h + i0 * s_i + j0 * s_j)
    if TRANS:
        x = tl.load(base + rj[:, None] * s_j + ri[None, :] * s_i, mask=ok, other=0.0)
    else:
        x = tl.load(base + ri[:, None] * s_i + rj[None, :] * s_j, mask=ok, other=0.0)
    return x.to(tl.float32) * drop_scale


@triton.jit
def _cols_ok(rows_ok, cols, d, WHOLE: tl.constexpr):
    """Load/store mask of a [rows, head-dim columns] tile: rows_ok [R, 1] and cols [C] < d.
    WHOLE (the first chunk of a two-chunk launch, every column inside the head dim): the
    rows alone, as the loads need no head-dim mask there."""
    if WHOLE:   # a constexpr branch: only the taken one is compiled (one return type)
        ok = rows_ok
    else:
        ok = rows_ok & (cols[None, :] < d)
    return ok


@triton.jit
def _ld(ptrs, mask, EVEN: tl.constexpr):
    """Load a tile; masked (0 outside) unless EVEN (every tile whole: the launcher's
    launch.whole_tiles), where the masks are left out, so no predicate tile is kept live."""
    if EVEN:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    return x


@triton.jit
def _ld_rows(base, rows, cols, s_row, s_col, rows_ok, d, WHOLE: tl.constexpr, EVEN: tl.constexpr,
             VEC: tl.constexpr):
    """The tile of `rows` x `cols` at `base` through pointers: rows where rows_ok is false and
    columns past d read as 0 (WHOLE and EVEN as _cols_ok's and _ld's)."""
    return _ld(base + _tile(rows, cols, s_row, s_col, VEC),
               _cols_ok(rows_ok[:, None], cols, d, WHOLE), EVEN)


@triton.jit
def _ld_desc(desc, b, h, row, ROWS: tl.constexpr, COLS: tl.constexpr):
    """The [ROWS, COLS] tile at (b, h, row, 0) of a [B, H, S, D] port, through its tensor
    descriptor (block [1, 1, ROWS, COLS]); rows past S and columns past D read as 0."""
    return desc.load([b.to(tl.int32), h.to(tl.int32), row, 0]).reshape(ROWS, COLS)


@triton.jit
def _st(ptrs, x, mask, EVEN: tl.constexpr):
    """Store a tile; masked unless EVEN (as _ld)."""
    if EVEN:
        tl.store(ptrs, x)
    else:
        tl.store(ptrs, x, mask=mask)


@triton.jit
def _chunk_cols(BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, WIDE: tl.constexpr):
    """Column indices of a second chunk: BLOCK_A + [0, BLOCK_B), 64-bit when WIDE."""
    c = BLOCK_A + tl.arange(0, BLOCK_B)
    if WIDE:
        c = c.to(tl.int64)
    return c


@triton.jit
def _dot_rows(a_at, ra, a_ok, sa_s, sa_d, b_at, rb, b_ok, sb_s, sb_d, rd, d,
              M: tl.constexpr, N: tl.constexpr, CHUNK: tl.constexpr, VEC: tl.constexpr,
              UPCAST: tl.constexpr):
    """A B^T [M, N], fp32, of the rows ra (M of them) of A and rb (N) of B, at a_at and b_at
    (rows not ok load as 0), over their d head-dim columns, CHUNK columns (rd) at a time."""
    acc = tl.zeros([M, N], dtype=tl.float32)
    for d0 in range(0, d, CHUNK):
        cols = d0 + rd
        a = tl.load(a_at + _tile(ra, cols, sa_s, sa_d, VEC),
                    mask=a_ok[:, None] & (cols[None, :] < d), other=0.0)
        b = tl.load(b_at + _tile(rb, cols, sb_s, sb_d, VEC),
                    mask=b_ok[:, None] & (cols[None, :] < d), other=0.0)
        acc = _dot(a, tl.trans(b), acc, UPCAST)
    return acc


@triton.jit
def _block_batch_head(num_blocks, heads, block_major, reverse, BAND: tl.constexpr):
    """(block index, batch b, head h) of this program, b and h 64-bit; `heads` per batch.
    Head-major (each head's blocks are consecutive programs, so the ones running together
    share that head's tensors in L2) unless block_major: then block by block across all
    heads, so that under a one-sided band, whose blocks differ in work, every head's
    heaviest block starts in the first wave and none is left to run alone at the end.
    block_major is a run-time value (0 or 1), not a constexpr: the two orders differ in a few
    integer operations per program, and one compile serves both. `reverse` (run-time, read
    only when BAND) numbers the blocks from the last."""
    pid = tl.program_id(0)
    # one division for both orders: pid = outer * inner + rest, where the inner count is the
    # blocks per head (head-major) or the batch-heads (block-major)
    inner = tl.where(block_major != 0, tl.num_programs(0) // num_blocks, num_blocks)
    outer = pid // inner
    rest = pid - outer * inner
    blk = tl.where(block_major != 0, outer, rest)
    bh = tl.where(block_major != 0, rest, outer)
    if BAND:
        blk = tl.where(reverse, num_blocks - 1 - blk, blk)
    return blk, (bh // heads).to(tl.int64), (bh % heads).to(tl.int64)


@triton.jit
def _sequence(CU, b, rows, max_len):
    """(first token, length) of sequence b on one side of a ragged batch, from that side's
    cu_seqlens (int32 [B+1], read on the device). The bound of seed 001: a side whose start
    is negative, whose end passes the `rows` tokens in storage, or whose length is negative
    or above max_len is taken as empty at token 0, so nothing is read or written for it.
    Uniform per program: two loads, four compares, two selects."""
    start = tl.load(CU + b)
    end = tl.load(CU + b + 1)
    n = end - start      # no overflow where it is used: start >= 0 and end <= rows there
    ok = (start >= 0) & (end <= rows) & (n >= 0) & (n <= max_len)
    return tl.where(ok, start, 0).to(tl.int64), tl.where(ok, n, 0)


@triton.jit
def _ragged(CU_Q, CU_KV, b, T_q, T_kv, S_q, S_kv, bottom_right):
    """Sequence b: (q first token, S_q_b, kv first token, S_kv_b, shift), the diagonal shift
    from the sequence's own lengths (bottom_right, a run-time 0 or 1: S_kv_b - S_q_b; else 0)."""
    tq, n_q = _sequence(CU_Q, b, T_q, S_q)
    tk, n_kv = _sequence(CU_KV, b, T_kv, S_kv)
    shift = tl.where(bottom_right != 0, n_kv - n_q, 0)
    return tq, n_q, tk, n_kv, shift


@triton.jit
def _row_dot(o, do):
    """Delta's rows: sum_d O[i, d] dO[i, d] in fp32, of an O tile and a dO tile."""
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)


@triton.jit(do_not_specialize=["o_off", "so_b", "so_h", "so_s", "so_d", "do_off", "sdo_b",
                               "sdo_h", "sdo_s", "sdo_d", "H_q", "S_q", "D_v", "T_q"])
def bwd_preprocess(O, DO, Delta, CU_Q,
                   o_off, so_b, so_h, so_s, so_d,
                   do_off, sdo_b, sdo_h, sdo_s, sdo_d,
                   H_q, S_q, D_v, T_q,
                   BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
                   VEC: tl.constexpr, WIDE: tl.constexpr, RAGGED: tl.constexpr):
    """Delta[b, h, i] = sum_d O[b,h,i,d] * dO[b,h,i,d] in fp32 (Delta is packed [B, H_q, S_q])."""
    pid_m, b, h = _block_batch_head(tl.cdiv(S_q, BLOCK_M), H_q, False, False, False)
    bq, n_q = b, S_q          # the q ports' "batch" index and the sequence length
    if RAGGED:                # sequence b's first token and its own length
        bq, n_q = _sequence(CU_Q, b, T_q, S_q)
    start_m = pid_m * BLOCK_M
    row0 = tl.cast(start_m, tl.int64)
    rm, _, _, rd = _ranges(BLOCK_M, 16, 16, BLOCK_DV, WIDE)
    m_ok = start_m + rm < n_q
    mask = m_ok[:, None] & (rd[None, :] < D_v * VEC)
    o = tl.load(_at(O, o_off, bq, so_b, h, so_h, row0, so_s, VEC)
                + _tile(rm, rd, so_s, so_d, VEC), mask=mask, other=0.0)
    do = tl.load(_at(DO, do_off, bq, sdo_b, h, sdo_h, row0, sdo_s, VEC)
                 + _tile(rm, rd, sdo_s, sdo_d, VEC), mask=mask, other=0.0)
    delta = _row_dot(o, do)
    tl.store(Delta + ((b * H_q + h) * S_q + row0) + rm, delta, mask=m_ok)


@triton.jit(do_not_specialize=_INPUT_INTS + _SIZE_INTS + _CHOICE_INTS + _RAGGED_INTS + _BIAS_INTS
            + _DROP_INTS + _DQA_INTS + [
    "H_grp", "dk_off", "sdk_b", "sdk_h", "sdk_s", "sdk_d", "dv_off", "sdv_b", "sdv_h", "sdv_s",
    "sdv_d"])
def bwd_dkdv(Q, K, V, DO, LSE, Delta, DK, DV, CU_Q, CU_KV,
             q_off, sq_b, sq_h, sq_s, sq_d,
             k_off, sk_b, sk_h, sk_s, sk_d,
             v_off, sv_b, sv_h, sv_s, sv_d,
             do_off, sdo_b, sdo_h, sdo_s, sdo_d,
             l_off, sl_b, sl_h, sl_s,
             dk_off, sdk_b, sdk_h, sdk_s, sdk_d,
             dv_off, sdv_b, sdv_h, sdv_s, sdv_d,
             H_q, H_grp, G_k, G_v, S_q, S_kv, D_qk, D_v,
             scale, shift, left, right, T_q, T_kv,
             BIAS, bias_off, sbias_b, sbias_h, sbias_i, sbias_j, softcap,
             DROP, drop_off, sdrop_b, sdrop_h, sdrop_i, sdrop_j, drop_scale,
             DQA, sqa_b, sqa_h, sqa_s, QD, DOD,
             HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, block_major, lone_bound,
             COMPUTE_DK: tl.constexpr, COMPUTE_DV: tl.constexpr,
             UPCAST: tl.constexpr, WIDE: tl.constexpr, VEC: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
             RAGGED: tl.constexpr, bottom_right, KV_SHARED: tl.constexpr,
             HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr,
             BLOCK_DQK2: tl.constexpr, BLOCK_DV2: tl.constexpr, ATOMIC_DQ: tl.constexpr,
             EVEN: tl.constexpr, TMA: tl.constexpr, DP_FIRST: tl.constexpr):
    """One program per (batch, group head g, KV block): dK and/or dV of that block.

    The group head is a K head when COMPUTE_DK (H_grp = H_k) and a V head when COMPUTE_DV
    (H_grp = H_v); both at once only when H_k == H_v. The program loops over the
    H_q / H_grp query heads of its group and their Q blocks, accumulating in registers:
    no atomics, so dK and dV are deterministic. KV_SHARED (H_k == H_v): every query head of
    the group has the group's K and V head, so a dK-only or dV-only pass (the launcher's
    split passes, BlockConfig.split_dkdv) loads both once, not per query head.
    BLOCK_DQK2 / BLOCK_DV2 > 0: the head dims in two column chunks (names ending in 2: the
    second chunk; see "Two chunks" above), else 0. EVEN: no tile crosses a sequence or head-dim
    end (launch.whole_tiles), so loads and stores are not masked. TMA: Q and dO through the
    descriptors QD and DOD (see "TMA" above). DP_FIRST (BlockConfig.dp_first): the dK pass
    multiplies dP^T right after S^T, not after dV.
    ATOMIC_DQ (the dK pass, one head-dim chunk): also dQ, as this block's scale dS K added
    with atomics into the fp32 scratch DQA (rows of BLOCK_DQK, padded past D_qk; strides
    sqa_* count such rows; the launcher copies it into dQ). Five matrix multiplies per block
    pair instead of seven, but the order of the additions, so dQ's last bits, changes from
    run to run.
    """
    # under a left bound alone the last KV blocks keep the most rows: they go first
    pid_n, b, g = _block_batch_head(tl.cdiv(S_kv, BLOCK_N), H_grp, block_major,
                                    lone_bound == 1, HAS_LEFT or HAS_RIGHT)
    # "batch" index of the q-side and kv-side ports, and the lengths masks and loops use
    bq, n_q, bk, n_kv = b, S_q, b, S_kv
    if RAGGED:
        bq, n_q, bk, n_kv, shift = _ragged(CU_Q, CU_KV, b, T_q, T_kv, S_q, S_kv, bottom_right)
    group = H_q // H_grp
    io = Q.dtype.element_ty
    qk_scale = scale * LOG2E
    d_qk = D_qk * VEC
    d_v = D_v * VEC
    z64 = tl.cast(0, tl.int64)   # row 0 of _at: keeps its sum 64-bit

    TWO: tl.constexpr = BLOCK_DQK2 > 0
    rm, rn, rdq, rdv = _ranges(BLOCK_M, BLOCK_N, BLOCK_DQK, BLOCK_DV, WIDE)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + rn
    col0 = tl.cast(start_n, tl.int64)
    kmask = _cols_ok(offs_n[:, None] < n_kv, rdq, d_qk, TWO)
    vmask = _cols_ok(offs_n[:, None] < n_kv, rdv, d_v, TWO)
    k_tile = _tile(rn, rdq, sk_s, sk_d, VEC)
    v_tile = _tile(rn, rdv, sv_s, sv_d, VEC)
    if TWO:
        rdq2 = _chunk_cols(BLOCK_DQK, BLOCK_DQK2, WIDE)
        rdv2 = _chunk_cols(BLOCK_DV, BLOCK_DV2, WIDE)
        kmask2 = _cols_ok(offs_n[:, None] < n_kv, rdq2, d_qk, False)
        vmask2 = _cols_ok(offs_n[:, None] < n_kv, rdv2, d_v, False)
        k_tile2 = _tile(rn, rdq2, sk_s, sk_d, VEC)
        v_tile2 = _tile(rn, rdv2, sv_s, sv_d, VEC)

    # Q rows that keep at least one key of this block: [lo, hi). Q blocks outside are skipped.
    lo = start_n * 0
    hi = n_q + lo
    n_last = tl.minimum(start_n + BLOCK_N, n_kv) - 1
    if HAS_RIGHT:   # j - i - shift <= right  =>  i >= start_n - shift - right
        lo = (tl.maximum(start_n - shift - right, 0) // BLOCK_M) * BLOCK_M
    if HAS_LEFT:    # i - j + shift < left    =>  i < n_last - shift + left
        hi = tl.minimum(n_last - shift + left, n_q)
    # Q blocks starting in [mid_lo, mid_hi) lie inside the band: they skip the mask. Q rows
    # past the sequence need none here (their dO loads as 0, so they add nothing) and KV rows
    # past it are never stored. The branch is uniform per program, so the loop stays one loop.
    mid_lo = lo
    mid_hi = hi
    if HAS_RIGHT:   # whole iff start_m >= start_n + BLOCK_N - 1 - shift - right
        mid_lo = lo + tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - shift - right - lo, 0),
                              BLOCK_M) * BLOCK_M
    if HAS_LEFT:    # whole iff start_m + BLOCK_M <= start_n - shift + left
        mid_hi = lo + (tl.maximum(start_n - shift + left - lo, 0) // BLOCK_M) * BLOCK_M

    # K and V of this block. With H_k == H_v (both computed) they serve the whole group;
    # in a dK-only pass V follows the query head, in a dV-only pass K does (reloaded below).
    h0 = g * group
    kp = _at(K, k_off, bk, sk_b, h0 // G_k, sk_h, col0, sk_s, VEC)
    k = _ld(kp + k_tile, kmask, EVEN)
    if TWO:
        k2 = tl.load(kp + k_tile2, mask=kmask2, other=0.0)
    if COMPUTE_DK:
        vp = _at(V, v_off, bk, sv_b, h0 // G_v, sv_h, col0, sv_s, VEC)
        v = _ld(vp + v_tile, vmask, EVEN)
        if TWO:
            v2 = tl.load(vp + v_tile2, mask=vmask2, other=0.0)

    dk = tl.zeros([BLOCK_N, BLOCK_DQK], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    if TWO:
        dk2 = tl.zeros([BLOCK_N, BLOCK_DQK2], dtype=tl.float32)
        dv2 = tl.zeros([BLOCK_N, BLOCK_DV2], dtype=tl.float32)
    # One flat loop over (query head of the group, Q block in [lo, hi)).
    n_m = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_M)
    if RAGGED:   # a block past its sequence's last key has nothing to do
        n_m = tl.where(start_n < n_kv, n_m, 0)
    for it in range(0, group * n_m):
        h = h0 + it // n_m
        start_m = lo + (it % n_m) * BLOCK_M
        if not COMPUTE_DV and not KV_SHARED:   # dK pass: the V head of query head h
            vp = _at(V, v_off, bk, sv_b, h // G_v, sv_h, col0, sv_s, VEC)
            v = _ld(vp + v_tile, vmask, EVEN)
            if TWO:
                v2 = tl.load(vp + v_tile2, mask=vmask2, other=0.0)
        if not COMPUTE_DK and not KV_SHARED:   # dV pass: the K head of query head h
            kp = _at(K, k_off, bk, sk_b, h // G_k, sk_h, col0, sk_s, VEC)
            k = _ld(kp + k_tile, kmask, EVEN)
            if TWO:
                k2 = tl.load(kp + k_tile2, mask=kmask2, other=0.0)
        row0 = tl.cast(start_m, tl.int64)
        offs_m = start_m + rm
        m_ok = offs_m < n_q
        # (each chunk's loads before any dot: the order the two-chunk kernels were timed in)
        # The Q and dO tiles' offsets count rows from the head's row 0 (launch.tile_span
        # bounds them): a tile of offsets that does not change with the block would be
        # hoisted out of the loop and kept in registers.
        if TMA:
            tl.static_assert(not TWO, "descriptor loads serve one head-dim chunk")
            q = _ld_desc(QD, bq, h, start_m, BLOCK_M, BLOCK_DQK)
            do = _ld_desc(DOD, bq, h, start_m, BLOCK_M, BLOCK_DV)
        else:
            qp = _at(Q, q_off, bq, sq_b, h, sq_h, z64, sq_s, VEC)
            q = _ld_rows(qp, offs_m, rdq, sq_s, sq_d, m_ok, d_qk, TWO, EVEN, VEC)
            if TWO:
                q2 = _ld_rows(qp, offs_m, rdq2, sq_s, sq_d, m_ok, d_qk, False, False, VEC)
            dop = _at(DO, do_off, bq, sdo_b, h, sdo_h, z64, sdo_s, VEC)
            do = _ld_rows(dop, offs_m, rdv, sdo_s, sdo_d, m_ok, d_v, TWO, EVEN, VEC)
            if TWO:
                do2 = _ld_rows(dop, offs_m, rdv2, sdo_s, sdo_d, m_ok, d_v, False, False, VEC)
        lse2 = _lse2(_ld(_at(LSE, l_off, bq, sl_b, h, sl_h, row0, sl_s, 1) + rm * sl_s, m_ok,
                         EVEN))
        # P^T [N, M] = exp2(K Q^T * scale * log2e - LSE * log2e); masked entries exp2(-inf) = 0
        sT = _dot(k, tl.trans(q), None, UPCAST)
        if TWO:
            sT = _dot(k2, tl.trans(q2), sT, UPCAST)
        if COMPUTE_DK and DP_FIRST:   # dP^T = V dO^T issued beside S^T, before the exp2
            dpT = _dot(v, tl.trans(do), None, UPCAST)
            if TWO:
                dpT = _dot(v2, tl.trans(do2), dpT, UPCAST)
        s2T = sT * qk_scale
        if SOFTCAP:    # cap * tanh(S / cap), in log2 units
            tT = _tanh(s2T / (softcap * LOG2E))
            s2T = tT * (softcap * LOG2E)
        if HAS_BIAS:   # bias[b, h, i, j] of query head h, as S^T
            s2T += _bias2(BIAS, bias_off, b, sbias_b, h, sbias_h, row0, sbias_i, col0, sbias_j,
                          rm, rn, (offs_n[:, None] < n_kv) & m_ok[None, :], True)
        if HAS_LEFT or HAS_RIGHT:
            # P first but in the two-chunk kernels (it made D 192 causal 0.73-0.75x there) and
            # a dV-only pass (it spilled 8-16 bytes in sm120's, engines/triton/resources.json)
            pT = _p_block(s2T, lse2[None, :], start_m, mid_lo, mid_hi, offs_m[None, :],
                          offs_n[:, None], n_q, n_kv, shift, left, right, HAS_LEFT, HAS_RIGHT,
                          EVEN, COMPUTE_DK and not TWO)
        else:
            pT = tl.exp2(s2T - lse2[None, :])
        pdT = pT
        if HAS_DROPOUT:   # keep / (1 - p), as P^T's transpose
            kT = _keep_scaled(DROP, drop_off, b, sdrop_b, h, sdrop_h, row0, sdrop_i, col0, sdrop_j,
                              rm, rn, (offs_n[:, None] < n_kv) & m_ok[None, :], drop_scale, True)
            pdT = pT * kT
        if COMPUTE_DV:
            dv = _dot(pdT.to(io), do, dv, UPCAST)           # dV += P_drop^T dO
            if TWO:
                dv2 = _dot(pdT.to(io), do2, dv2, UPCAST)
        if COMPUTE_DK:
            delta = _ld(Delta + ((b * H_q + h) * S_q + row0) + rm, m_ok, EVEN)
            if not DP_FIRST:
                dpT = _dot(v, tl.trans(do), None, UPCAST)   # dP^T = V dO^T
                if TWO:
                    dpT = _dot(v2, tl.trans(do2), dpT, UPCAST)
            if HAS_DROPOUT:                                 # dP^T = dP_drop^T keep / (1 - p)
                dpT = dpT * kT
            dsT = pT * (dpT - delta[None, :])               # dS^T = P^T (dP^T - Delta)
            if SOFTCAP:                                     # d(cap tanh(S / cap)) / dS
                dsT = dsT * (1.0 - tT * tT)
            dsT = dsT.to(io)
            dk = _dot(dsT, q, dk, UPCAST)                   # dK += dS^T Q
            if TWO:
                dk2 = _dot(dsT, q2, dk2, UPCAST)
            if ATOMIC_DQ:                                   # dQ += scale dS K
                tl.static_assert(not TWO, "atomic dQ serves one head-dim chunk")
                if not EVEN:   # KV rows past the sequence: P^T may be inf there, and K is 0
                    dsT = tl.where(offs_n[:, None] < n_kv, dsT, 0.0)
                # rows of BLOCK_DQK fp32: offsets the compiler knows are 16-byte aligned and
                # contiguous along the head dim, so the adds are vector reductions
                dqa = _at(DQA, 0, bq, sqa_b, h, sqa_h, row0, sqa_s, BLOCK_DQK)
                dq_part = _dot(tl.trans(dsT), k, None, UPCAST) * scale
                if EVEN:
                    tl.atomic_add(dqa + rm[:, None] * BLOCK_DQK + rdq[None, :], dq_part,
                                  sem="relaxed")
                else:
                    tl.atomic_add(dqa + rm[:, None] * BLOCK_DQK + rdq[None, :], dq_part,
                                  mask=m_ok[:, None], sem="relaxed")

    # The store masks are formed anew, not as kmask / vmask: kept live across the loop, the
    # loads' mask tiles cost registers the dot operands need (bench/compare_kernels.py).
    n_ok = rn[:, None] < n_kv - start_n
    if COMPUTE_DK:
        dkp = _at(DK, dk_off, bk, sdk_b, g, sdk_h, col0, sdk_s, VEC)
        _st(dkp + _tile(rn, rdq, sdk_s, sdk_d, VEC), (dk * scale).to(io),
            _cols_ok(n_ok, rdq, d_qk, TWO), EVEN)
        if TWO:
            tl.store(dkp + _tile(rn, rdq2, sdk_s, sdk_d, VEC), (dk2 * scale).to(io),
                     mask=_cols_ok(n_ok, rdq2, d_qk, False))
    if COMPUTE_DV:
        dvp = _at(DV, dv_off, bk, sdv_b, g, sdv_h, col0, sdv_s, VEC)
        _st(dvp + _tile(rn, rdv, sdv_s, sdv_d, VEC), dv.to(io), _cols_ok(n_ok, rdv, d_v, TWO),
            EVEN)
        if TWO:
            tl.store(dvp + _tile(rn, rdv2, sdv_s, sdv_d, VEC), dv2.to(io),
                     mask=_cols_ok(n_ok, rdv2, d_v, False))


@triton.jit(do_not_specialize=_INPUT_INTS + _SIZE_INTS + _CHOICE_INTS + _RAGGED_INTS + _BIAS_INTS + _DROP_INTS + [
    "dq_off", "sdq_b", "sdq_h", "sdq_s", "sdq_d"])
def bwd_dq(Q, K, V, DO, LSE, Delta, DQ, CU_Q, CU_KV,
           q_off, sq_b, sq_h, sq_s, sq_d,
           k_off, sk_b, sk_h, sk_s, sk_d,
           v_off, sv_b, sv_h, sv_s, sv_d,
           do_off, sdo_b, sdo_h, sdo_s, sdo_d,
           l_off, sl_b, sl_h, sl_s,
           dq_off, sdq_b, sdq_h, sdq_s, sdq_d,
           H_q, G_k, G_v, S_q, S_kv, D_qk, D_v,
           scale, shift, left, right, T_q, T_kv,
           BIAS, bias_off, sbias_b, sbias_h, sbias_i, sbias_j, softcap,
             DROP, drop_off, sdrop_b, sdrop_h, sdrop_i, sdrop_j, drop_scale, KD, VD,
           HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, block_major, lone_bound,
           UPCAST: tl.constexpr, WIDE: tl.constexpr, VEC: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
           RAGGED: tl.constexpr, bottom_right,
           HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr,
           BLOCK_DQK2: tl.constexpr, BLOCK_DV2: tl.constexpr, EVEN: tl.constexpr,
           TMA: tl.constexpr):
    """One program per (batch, query head, Q block): dQ = scale * sum_j dS K, fp32 in
    registers. BLOCK_DQK2 / BLOCK_DV2, EVEN: as bwd_dkdv's; TMA: K and V through the
    descriptors KD and VD."""
    # under a right bound alone (causal) the last Q blocks keep the most keys: they go first
    pid_m, b, h = _block_batch_head(tl.cdiv(S_q, BLOCK_M), H_q, block_major,
                                    lone_bound == 2, HAS_LEFT or HAS_RIGHT)
    # "batch" index of the q-side and kv-side ports, and the lengths masks and loops use
    bq, n_q, bk, n_kv = b, S_q, b, S_kv
    if RAGGED:
        bq, n_q, bk, n_kv, shift = _ragged(CU_Q, CU_KV, b, T_q, T_kv, S_q, S_kv, bottom_right)
    io = Q.dtype.element_ty
    qk_scale = scale * LOG2E
    d_qk = D_qk * VEC
    d_v = D_v * VEC
    z64 = tl.cast(0, tl.int64)   # row 0 of _at: keeps its sum 64-bit

    TWO: tl.constexpr = BLOCK_DQK2 > 0
    rm, rn, rdq, rdv = _ranges(BLOCK_M, BLOCK_N, BLOCK_DQK, BLOCK_DV, WIDE)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + rm
    row0 = tl.cast(start_m, tl.int64)
    m_ok = offs_m < n_q
    qp = _at(Q, q_off, bq, sq_b, h, sq_h, row0, sq_s, VEC)
    q = _ld_rows(qp, rm, rdq, sq_s, sq_d, m_ok, d_qk, TWO, EVEN, VEC)
    dop = _at(DO, do_off, bq, sdo_b, h, sdo_h, row0, sdo_s, VEC)
    do = _ld_rows(dop, rm, rdv, sdo_s, sdo_d, m_ok, d_v, TWO, EVEN, VEC)
    if TWO:
        rdq2 = _chunk_cols(BLOCK_DQK, BLOCK_DQK2, WIDE)
        rdv2 = _chunk_cols(BLOCK_DV, BLOCK_DV2, WIDE)
        q2 = _ld_rows(qp, rm, rdq2, sq_s, sq_d, m_ok, d_qk, False, False, VEC)
        do2 = _ld_rows(dop, rm, rdv2, sdo_s, sdo_d, m_ok, d_v, False, False, VEC)
    lse2 = _lse2(_ld(_at(LSE, l_off, bq, sl_b, h, sl_h, row0, sl_s, 1) + rm * sl_s, m_ok,
                     EVEN))
    delta = _ld(Delta + ((b * H_q + h) * S_q + row0) + rm, m_ok, EVEN)

    # Keys that at least one row of this block keeps: [lo, hi).
    lo = start_m * 0
    hi = n_kv + lo
    m_last = tl.minimum(start_m + BLOCK_M, n_q) - 1
    if HAS_LEFT:    # i - j + shift < left    =>  j >= start_m + shift - left + 1
        lo = (tl.maximum(start_m + shift - left + 1, 0) // BLOCK_N) * BLOCK_N
    if HAS_RIGHT:   # j - i - shift <= right  =>  j <= m_last + shift + right
        hi = tl.minimum(m_last + shift + right + 1, n_kv)
    if RAGGED:      # a block past its sequence's last row has nothing to do
        hi = tl.where(start_m < n_q, hi, lo)

    # K and V of this head, their tiles' offsets counting rows from row 0 (as bwd_dkdv's Q)
    kp = _at(K, k_off, bk, sk_b, h // G_k, sk_h, z64, sk_s, VEC)
    vp = _at(V, v_off, bk, sv_b, h // G_v, sv_h, z64, sv_s, VEC)
    dq = tl.zeros([BLOCK_M, BLOCK_DQK], dtype=tl.float32)
    if TWO:
        dq2 = tl.zeros([BLOCK_M, BLOCK_DQK2], dtype=tl.float32)
    # KV blocks starting in [mid_lo, mid_hi) lie inside the band and the sequence: they skip
    # the mask. A key past the sequence loads as 0, but its P = exp2(-LSE) may overflow to inf and
    # inf * 0 is NaN, so the tail block is masked even without a band.
    mid_lo = lo
    if HAS_LEFT:    # whole iff start_n >= start_m + BLOCK_M + shift - left
        mid_lo = lo + tl.cdiv(tl.maximum(start_m + BLOCK_M + shift - left - lo, 0),
                              BLOCK_N) * BLOCK_N
    whole_end = n_kv + lo * 0
    if HAS_RIGHT:   # whole iff start_n + BLOCK_N <= start_m + shift + right + 1
        whole_end = tl.minimum(whole_end, start_m + shift + right + 1)
    mid_hi = lo + (tl.maximum(whole_end - lo, 0) // BLOCK_N) * BLOCK_N
    for start_n in range(lo, hi, BLOCK_N):
        col0 = tl.cast(start_n, tl.int64)
        offs_n = start_n + rn
        n_ok = offs_n < n_kv
        if TMA:
            tl.static_assert(not TWO, "descriptor loads serve one head-dim chunk")
            k = _ld_desc(KD, bk, h // G_k, start_n, BLOCK_N, BLOCK_DQK)
            v = _ld_desc(VD, bk, h // G_v, start_n, BLOCK_N, BLOCK_DV)
        else:
            k = _ld_rows(kp, offs_n, rdq, sk_s, sk_d, n_ok, d_qk, TWO, EVEN, VEC)
            if TWO:
                k2 = _ld_rows(kp, offs_n, rdq2, sk_s, sk_d, n_ok, d_qk, False, False, VEC)
            v = _ld_rows(vp, offs_n, rdv, sv_s, sv_d, n_ok, d_v, TWO, EVEN, VEC)
            if TWO:
                v2 = _ld_rows(vp, offs_n, rdv2, sv_s, sv_d, n_ok, d_v, False, False, VEC)
        s = _dot(q, tl.trans(k), None, UPCAST)
        if TWO:
            s = _dot(q2, tl.trans(k2), s, UPCAST)
        s2 = s * qk_scale                                      # S [M, N], log2 units
        if SOFTCAP:    # cap * tanh(S / cap), in log2 units
            t = _tanh(s2 / (softcap * LOG2E))
            s2 = t * (softcap * LOG2E)
        if HAS_BIAS:   # bias[b, h, i, j]
            s2 += _bias2(BIAS, bias_off, b, sbias_b, h, sbias_h, row0, sbias_i, col0, sbias_j,
                         rm, rn, m_ok[:, None] & (offs_n[None, :] < n_kv), False)
        # With every block whole (EVEN, no band) the loop has no branch: the branch alone,
        # never taken, cost this kernel 5 % on the H200 (bench/results/h200/round20)
        if EVEN and not (HAS_LEFT or HAS_RIGHT):
            p = tl.exp2(s2 - lse2[:, None])
        else:   # P first but in the two-chunk kernels (as bwd_dkdv)
            p = _p_block(s2, lse2[:, None], start_n, mid_lo, mid_hi, offs_m[:, None],
                         offs_n[None, :], n_q, n_kv, shift, left, right, HAS_LEFT, HAS_RIGHT,
                         EVEN, not TWO)
        dp = _dot(do, tl.trans(v), None, UPCAST)             # dP = dO V^T
        if TWO:
            dp = _dot(do2, tl.trans(v2), dp, UPCAST)
        if HAS_DROPOUT:                                      # dP = dP_drop keep / (1 - p)
            dp = dp * _keep_scaled(DROP, drop_off, b, sdrop_b, h, sdrop_h, row0, sdrop_i, col0,
                                   sdrop_j, rm, rn, m_ok[:, None] & (offs_n[None, :] < n_kv),
                                   drop_scale, False)
        ds = p * (dp - delta[:, None])                       # dS = P (dP - Delta)
        if SOFTCAP:                                          # d(cap tanh(S / cap)) / dS
            ds = ds * (1.0 - t * t)
        ds = ds.to(io)
        dq = _dot(ds, k, dq, UPCAST)                         # dQ += dS K
        if TWO:
            dq2 = _dot(ds, k2, dq2, UPCAST)
    dqp = _at(DQ, dq_off, bq, sdq_b, h, sdq_h, row0, sdq_s, VEC)
    # (the store masks formed anew, as in bwd_dkdv)
    m_in = rm[:, None] < n_q - start_m
    _st(dqp + _tile(rm, rdq, sdq_s, sdq_d, VEC), (dq * scale).to(io),
        _cols_ok(m_in, rdq, d_qk, TWO), EVEN)
    if TWO:
        tl.store(dqp + _tile(rm, rdq2, sdq_s, sdq_d, VEC), (dq2 * scale).to(io),
                 mask=_cols_ok(m_in, rdq2, d_qk, False))


@triton.jit(do_not_specialize=_INPUT_INTS + _SIZE_INTS + _BIAS_INTS + [
    "dbias_off", "sdbias_b", "sdbias_h", "sdbias_i", "sdbias_j", "B_sum", "H_sum", "H_db"])
def bwd_dbias(Q, K, V, DO, LSE, Delta, BIAS, DBIAS,
              q_off, sq_b, sq_h, sq_s, sq_d,
              k_off, sk_b, sk_h, sk_s, sk_d,
              v_off, sv_b, sv_h, sv_s, sv_d,
              do_off, sdo_b, sdo_h, sdo_s, sdo_d,
              l_off, sl_b, sl_h, sl_s,
              bias_off, sbias_b, sbias_h, sbias_i, sbias_j,
              dbias_off, sdbias_b, sdbias_h, sdbias_i, sdbias_j,
              H_q, G_k, G_v, S_q, S_kv, D_qk, D_v,
              scale, shift, left, right, softcap, B_sum, H_sum, H_db,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
              UPCAST: tl.constexpr, WIDE: tl.constexpr, VEC: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CHUNK_QK: tl.constexpr, CHUNK_V: tl.constexpr):
    """One program per (dBias batch, dBias head, Q block, KV block): the dBias tile = dS =
    P (dP - Delta) (before the softcap factor), summed in a fixed order over the B_sum
    batches and H_sum query heads dBias is broadcast over (B_sum = B when dBias has one
    batch, else 1; likewise H_sum): deterministic, nothing but dBias written. A tile the band
    misses entirely skips the work and is written as zeros (masked entries have P = 0).
    S and dP are accumulated over head-dim chunks of CHUNK_QK / CHUNK_V columns: with Q, K,
    dO and V reloaded for every summed head, whole-head-dim tiles would hold four tiles of
    offsets across the loop (they spilled on sm120 at D 128 and 256)."""
    n_n = tl.cdiv(S_kv, BLOCK_N)
    n_m = tl.cdiv(S_q, BLOCK_M)
    pid = tl.program_id(0)
    pid_n = pid % n_n
    pid_m = (pid // n_n) % n_m
    bh = pid // (n_n * n_m)
    b0 = (bh // H_db).to(tl.int64)   # dBias's batch and head; b, h below the summed ones
    h0 = (bh % H_db).to(tl.int64)
    io = Q.dtype.element_ty
    qk_scale = scale * LOG2E
    d_qk = D_qk * VEC
    d_v = D_v * VEC

    rm, rn, rdq, rdv = _ranges(BLOCK_M, BLOCK_N, CHUNK_QK, CHUNK_V, WIDE)
    start_m = pid_m * BLOCK_M
    start_n = pid_n * BLOCK_N
    offs_m = start_m + rm
    offs_n = start_n + rn
    row0 = tl.cast(start_m, tl.int64)
    col0 = tl.cast(start_n, tl.int64)
    m_ok = offs_m < S_q
    n_ok = offs_n < S_kv
    inside = m_ok[:, None] & n_ok[None, :]

    n_it = B_sum * H_sum
    m_last = tl.minimum(start_m + BLOCK_M, S_q) - 1
    n_last = tl.minimum(start_n + BLOCK_N, S_kv) - 1
    if HAS_RIGHT:   # every (i, j) of the tile has j - i - shift > right
        n_it = tl.where(start_n - m_last - shift > right, 0, n_it)
    if HAS_LEFT:    # every (i, j) of the tile has i - j + shift >= left
        n_it = tl.where(start_m - n_last + shift >= left, 0, n_it)

    keep = _keep(offs_m[:, None], offs_n[None, :], S_q, S_kv, shift, left, right,
                 HAS_LEFT, HAS_RIGHT)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for it in range(0, n_it):
        b = b0 + it // H_sum
        h = h0 + it % H_sum
        # S from Q and K, then dP from dO and V, chunk by chunk of the head dims
        s2 = _dot_rows(_at(Q, q_off, b, sq_b, h, sq_h, row0, sq_s, VEC), rm, m_ok, sq_s, sq_d,
                       _at(K, k_off, b, sk_b, h // G_k, sk_h, col0, sk_s, VEC), rn, n_ok,
                       sk_s, sk_d, rdq, d_qk, BLOCK_M, BLOCK_N, CHUNK_QK, VEC, UPCAST)
        s2 = s2 * qk_scale
        if SOFTCAP:
            s2 = _tanh(s2 / (softcap * LOG2E)) * (softcap * LOG2E)
        s2 += _bias2(BIAS, bias_off, b, sbias_b, h, sbias_h, row0, sbias_i, col0, sbias_j,
                     rm, rn, inside, False)
        lse2 = _lse2(tl.load(_at(LSE, l_off, b, sl_b, h, sl_h, row0, sl_s, 1) + rm * sl_s,
                             mask=m_ok, other=0.0))
        p = _p(keep, s2, lse2[:, None])
        dp = _dot_rows(_at(DO, do_off, b, sdo_b, h, sdo_h, row0, sdo_s, VEC), rm, m_ok, sdo_s,
                       sdo_d, _at(V, v_off, b, sv_b, h // G_v, sv_h, col0, sv_s, VEC), rn, n_ok,
                       sv_s, sv_d, rdv, d_v, BLOCK_M, BLOCK_N, CHUNK_V, VEC, UPCAST)
        delta = tl.load(Delta + ((b * H_q + h) * S_q + row0) + rm, mask=m_ok, other=0.0)
        acc += p * (dp - delta[:, None])
    tl.store(DBIAS + (dbias_off + b0 * sdbias_b + h0 * sdbias_h + row0 * sdbias_i
                      + col0 * sdbias_j) + rm[:, None] * sdbias_i + rn[None, :] * sdbias_j,
             acc.to(io), mask=inside)


@triton.jit(do_not_specialize=["l_off", "sl_b", "sl_h", "sl_s", "sink_off", "s_sink",
                               "dsink_off", "s_dsink", "B", "H_q", "S_q"])
def bwd_dsinks(LSE, Delta, SINKS, DSINKS, l_off, sl_b, sl_h, sl_s, sink_off, s_sink,
               dsink_off, s_dsink, B, H_q, S_q, BLOCK: tl.constexpr):
    """One program per query head h: dSinks_h = -sum_{b,i} exp(sink_h - LSE_bhi) Delta_bhi,
    each lane summing its rows in order, then one tree sum: deterministic. A row whose LSE
    is -inf (no kept key, no sink in it) adds 0."""
    h = tl.program_id(0).to(tl.int64)
    sink2 = tl.load(SINKS + sink_off + h * s_sink) * LOG2E
    r = tl.arange(0, BLOCK).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    n_blk = tl.cdiv(S_q, BLOCK)
    for it in range(0, B * n_blk):
        b = (it // n_blk).to(tl.int64)
        rows = (it % n_blk) * BLOCK + r
        ok = rows < S_q
        lse2 = _lse2(tl.load(LSE + (l_off + b * sl_b + h * sl_h) + rows * sl_s, mask=ok,
                             other=float("-inf")))
        delta = tl.load(Delta + (b * H_q + h) * S_q + rows, mask=ok, other=0.0)
        acc += tl.exp2(sink2 - lse2) * delta
    tl.store(DSINKS + dsink_off + h * s_dsink, -tl.sum(acc, axis=0))
