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

Addressing, masked and whole (EVEN) loads, descriptor (TMA) loads and the band mask:
tile_ops.py, whose functions the kernels are built from.

Ragged batches (RAGGED), two column chunks (BLOCK_DQK2 / BLOCK_DV2) and the score modifiers'
constexprs (SOFTCAP, HAS_BIAS, dBias, sinks, HAS_DROPOUT, HAS_ALIBI): docs/DESIGN.md section 6;
the mask the kernels draw themselves (DRAWN_DROPOUT): dropout_draw.py.
"""
import triton
import triton.language as tl

from bundlegen.engines.triton.dropout_draw import dropout_scale_tile, keep_mask_kernel  # noqa: F401
from bundlegen.engines.triton.runtime_ints import (ALIBI_INTS, BIAS_INTS, CHOICE_INTS, DQA_INTS, DROP_INTS,
                                                   INPUT_INTS, RAGGED_INTS, SIZE_INTS)
from bundlegen.engines.triton.tile_ops import (LOG2E, alibi_tile, bias_tile, block_batch_head, chunk_cols,
                                               cols_ok, dot_acc, dot_rows, keep_mask, load_desc,
                                               load_tile, store_tile, tanh_exp2, tile_offsets, tile_ranges)


@triton.jit
def _at(X, off, b, s_b, h, s_h, row0, s_s, VEC: tl.constexpr):
    """Pointer to element (b, h, row0, 0) of a tensor; 64-bit (b, h, row0 are int64)."""
    return X + (off + b * s_b + h * s_h + row0 * s_s) * VEC


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
    """P of the block starting at `start` along the loop, masked by keep_mask unless the block
    starts in [mid_lo, mid_hi) (whole: inside the band and the sequences; uniform per
    program). P_FIRST: P before the branch, which holds only the select; else an exp2 in each
    branch (_p on an edge block). The launch sites say where it is off."""
    if P_FIRST:
        p = tl.exp2(s2 - lse2)
        if (start < mid_lo) | (start >= mid_hi):
            p = tl.where(keep_mask(i, j, S_q, S_kv, shift, left, right, HAS_LEFT, HAS_RIGHT,
                                   EVEN), p, 0.0)
    else:
        if (start < mid_lo) | (start >= mid_hi):
            p = _p(keep_mask(i, j, S_q, S_kv, shift, left, right, HAS_LEFT, HAS_RIGHT, EVEN),
                   s2, lse2)
        else:
            p = tl.exp2(s2 - lse2)
    return p


@triton.jit
def _ld_rows(base, rows, cols, s_row, s_col, rows_ok, d, WHOLE: tl.constexpr, EVEN: tl.constexpr,
             VEC: tl.constexpr):
    """The tile of `rows` x `cols` at `base` through pointers: rows where rows_ok is false and
    columns past d read as 0 (WHOLE and EVEN as cols_ok's and load_tile's)."""
    return load_tile(base + tile_offsets(rows, cols, s_row, s_col, VEC),
                     cols_ok(rows_ok[:, None], cols, d, WHOLE), EVEN)


@triton.jit
def _sequence(CU, b, rows, max_len, USED, HAS_USED: tl.constexpr):
    """(first token, length) of sequence b on one side of a ragged batch, from that side's
    cu_seqlens (int32 [B+1], read on the device), or its used length USED[b] (HAS_USED: a
    padded batch). The bound of seed 001: a side whose start is negative, whose end passes
    the `rows` tokens in storage, whose length is negative or above max_len, or whose used
    length is below 0 or past its range is taken as empty at token 0: nothing read or written."""
    start = tl.load(CU + b)
    end = tl.load(CU + b + 1)
    n = end - start      # no overflow where it is used: start >= 0 and end <= rows there
    ok = (start >= 0) & (end <= rows) & (n >= 0) & (n <= max_len)
    if HAS_USED:
        used = tl.load(USED + b)
        ok, n = ok & (used >= 0) & (used <= n), used
    return tl.where(ok, start, 0).to(tl.int64), tl.where(ok, n, 0)


@triton.jit
def _ragged(CU_Q, CU_KV, b, T_q, T_kv, S_q, S_kv, bottom_right, USED_Q, USED_KV, HAS_USED_Q: tl.constexpr,
            HAS_USED_KV: tl.constexpr):
    """Sequence b: (q first token, S_q_b, kv first token, S_kv_b, shift), the diagonal shift
    from the sequence's own (used) lengths (bottom_right, a run-time 0 or 1: S_kv_b - S_q_b; else 0)."""
    tq, n_q = _sequence(CU_Q, b, T_q, S_q, USED_Q, HAS_USED_Q)
    tk, n_kv = _sequence(CU_KV, b, T_kv, S_kv, USED_KV, HAS_USED_KV)
    shift = tl.where(bottom_right != 0, n_kv - n_q, 0)
    return tq, n_q, tk, n_kv, shift


@triton.jit
def _row_dot(o, do):
    """Delta's rows: sum_d O[i, d] dO[i, d] in fp32, of an O tile and a dO tile."""
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)


@triton.jit(do_not_specialize=["o_off", "so_b", "so_h", "so_s", "so_d", "do_off", "sdo_b",
                               "sdo_h", "sdo_s", "sdo_d", "H_q", "S_q", "D_v", "T_q"])
def bwd_preprocess(O, DO, Delta, CU_Q, o_off, so_b, so_h, so_s, so_d, do_off, sdo_b, sdo_h, sdo_s,
                   sdo_d, H_q, S_q, D_v, T_q, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
                   VEC: tl.constexpr, WIDE: tl.constexpr, RAGGED: tl.constexpr, HAS_USED_Q: tl.constexpr = False, USED_Q=None):
    """Delta[b, h, i] = sum_d O[b,h,i,d] * dO[b,h,i,d] in fp32 (Delta is packed [B, H_q, S_q])."""
    pid_m, b, h = block_batch_head(tl.cdiv(S_q, BLOCK_M), H_q, False, False, False)
    bq, n_q = b, S_q          # the q ports' "batch" index and the sequence length
    if RAGGED:                # sequence b's first token and its own length
        bq, n_q = _sequence(CU_Q, b, T_q, S_q, USED_Q, HAS_USED_Q)
    start_m = pid_m * BLOCK_M
    row0 = tl.cast(start_m, tl.int64)
    rm, _, _, rd = tile_ranges(BLOCK_M, 16, 16, BLOCK_DV, WIDE)
    m_ok = start_m + rm < n_q
    mask = m_ok[:, None] & (rd[None, :] < D_v * VEC)
    o = tl.load(_at(O, o_off, bq, so_b, h, so_h, row0, so_s, VEC)
                + tile_offsets(rm, rd, so_s, so_d, VEC), mask=mask, other=0.0)
    do = tl.load(_at(DO, do_off, bq, sdo_b, h, sdo_h, row0, sdo_s, VEC)
                 + tile_offsets(rm, rd, sdo_s, sdo_d, VEC), mask=mask, other=0.0)
    delta = _row_dot(o, do)
    tl.store(Delta + ((b * H_q + h) * S_q + row0) + rm, delta, mask=m_ok)


@triton.jit(do_not_specialize=INPUT_INTS + SIZE_INTS + CHOICE_INTS + RAGGED_INTS + BIAS_INTS
            + DROP_INTS + ALIBI_INTS + DQA_INTS + [
    "H_grp", "dk_off", "sdk_b", "sdk_h", "sdk_s", "sdk_d", "dv_off", "sdv_b", "sdv_h", "sdv_s",
    "sdv_d"])
def bwd_dkdv(Q, K, V, DO, LSE, Delta, DK, DV, CU_Q, CU_KV, q_off, sq_b, sq_h, sq_s, sq_d, k_off,
             sk_b, sk_h, sk_s, sk_d, v_off, sv_b, sv_h, sv_s, sv_d, do_off, sdo_b, sdo_h, sdo_s,
             sdo_d, l_off, sl_b, sl_h, sl_s, dk_off, sdk_b, sdk_h, sdk_s, sdk_d, dv_off, sdv_b,
             sdv_h, sdv_s, sdv_d, H_q, H_grp, G_k, G_v, S_q, S_kv, D_qk, D_v, scale, shift, left,
             right, T_q, T_kv, BIAS, bias_off, sbias_b, sbias_h, sbias_i, sbias_j, softcap, DROP,
             drop_off, sdrop_b, sdrop_h, sdrop_i, sdrop_j, drop_scale, drop_seed, drop_offset, drop_p,
             ALIBI, alibi_off, salibi_b, salibi_h, DQA, sqa_b, sqa_h, sqa_s, QD, DOD, HAS_LEFT: tl.constexpr,
             HAS_RIGHT: tl.constexpr,
             block_major, lone_bound, COMPUTE_DK: tl.constexpr, COMPUTE_DV: tl.constexpr,
             UPCAST: tl.constexpr, WIDE: tl.constexpr, VEC: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
             RAGGED: tl.constexpr, bottom_right, KV_SHARED: tl.constexpr, HAS_BIAS: tl.constexpr,
             SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr, DRAWN_DROPOUT: tl.constexpr,
             BLOCK_DQK2: tl.constexpr, BLOCK_DV2: tl.constexpr, ATOMIC_DQ: tl.constexpr, EVEN: tl.constexpr,
             TMA: tl.constexpr, DP_FIRST: tl.constexpr, HAS_ALIBI: tl.constexpr = False,
             HAS_USED_Q: tl.constexpr = False, HAS_USED_KV: tl.constexpr = False, USED_Q=None, USED_KV=None,
             SCORE_VEC: tl.constexpr = 1, DBS=None, dbs_off=None, sdbs_b=None, sdbs_h=None,
             sdbs_i=None, sdbs_j=None, FUSED_DBIAS: tl.constexpr = False):
    """One program per (batch, group head g, KV block): dK and/or dV of that block.

    The group head is a K head when COMPUTE_DK (H_grp = H_k) and a V head when COMPUTE_DV
    (H_grp = H_v); both at once only when H_k == H_v. The program loops over the
    H_q / H_grp query heads of its group and their Q blocks, accumulating in registers:
    no atomics, so dK and dV are deterministic. SCORE_VEC: the bias and dropout-mask tiles'
    addressing (tile_ops.score_tile; launch.score_vec). KV_SHARED (H_k == H_v): every query head of
    the group has the group's K and V head, so a dK-only or dV-only pass (the launcher's
    split passes, BlockConfig.split_dkdv) loads both once, not per query head.
    BLOCK_DQK2 / BLOCK_DV2 > 0: the head dims in two column chunks (names ending in 2: the
    second chunk; "Two chunks" above), else 0. EVEN: no tile crosses a sequence or head-dim
    end (launch.whole_tiles), so loads and stores are not masked. TMA: Q and dO through the
    descriptors QD and DOD (tile_ops.py, "TMA"). DP_FIRST (BlockConfig.dp_first): the dK pass
    multiplies dP^T right after S^T, not after dV.
    ATOMIC_DQ (the dK pass, one head-dim chunk): also dQ, as this block's scale dS K added
    with atomics into the fp32 scratch DQA (rows of BLOCK_DQK, padded past D_qk; strides
    sqa_* count such rows; the launcher copies it into dQ). Five matrix multiplies per block
    pair instead of seven, but the order of the additions, so dQ's last bits, changes from
    run to run.
    FUSED_DBIAS (the dK pass; launch.fuses_dbias: dBias [B, H_q, S_q, S_kv], no band): also
    dBias (DBS, names apart from bwd_dbias's: resources.ADDED_OFF holds both), each (query head, Q block)'s dS^T tile stored as it is formed (dS before the
    softcap factor, as bwd_dbias forms it), instead of bwd_dbias's pass recomputing S and dP.
    """
    # under a left bound alone the last KV blocks keep the most rows: they go first
    pid_n, b, g = block_batch_head(tl.cdiv(S_kv, BLOCK_N), H_grp, block_major,
                                   lone_bound == 1, HAS_LEFT or HAS_RIGHT)
    # "batch" index of the q-side and kv-side ports, and the lengths masks and loops use
    bq, n_q, bk, n_kv = b, S_q, b, S_kv
    if RAGGED:
        bq, n_q, bk, n_kv, shift = _ragged(CU_Q, CU_KV, b, T_q, T_kv, S_q, S_kv, bottom_right,
                                           USED_Q, USED_KV, HAS_USED_Q, HAS_USED_KV)
    group = H_q // H_grp
    io = Q.dtype.element_ty
    qk_scale = scale * LOG2E
    d_qk = D_qk * VEC
    d_v = D_v * VEC
    z64 = tl.cast(0, tl.int64)   # row 0 of _at: keeps its sum 64-bit

    TWO: tl.constexpr = BLOCK_DQK2 > 0   # the invariants "Two chunks" above relies on:
    tl.static_assert((BLOCK_DV2 > 0) == TWO and (not TWO or (BLOCK_DQK == 128 and BLOCK_DV == 128
                     and not EVEN)), "two chunks: both head dims, 128 + a masked second chunk")
    rm, rn, rdq, rdv = tile_ranges(BLOCK_M, BLOCK_N, BLOCK_DQK, BLOCK_DV, WIDE)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + rn
    col0 = tl.cast(start_n, tl.int64)
    kmask = cols_ok(offs_n[:, None] < n_kv, rdq, d_qk, TWO)
    vmask = cols_ok(offs_n[:, None] < n_kv, rdv, d_v, TWO)
    k_tile = tile_offsets(rn, rdq, sk_s, sk_d, VEC)
    v_tile = tile_offsets(rn, rdv, sv_s, sv_d, VEC)
    if TWO:
        rdq2 = chunk_cols(BLOCK_DQK, BLOCK_DQK2, WIDE)
        rdv2 = chunk_cols(BLOCK_DV, BLOCK_DV2, WIDE)
        kmask2 = cols_ok(offs_n[:, None] < n_kv, rdq2, d_qk, False)
        vmask2 = cols_ok(offs_n[:, None] < n_kv, rdv2, d_v, False)
        k_tile2 = tile_offsets(rn, rdq2, sk_s, sk_d, VEC)
        v_tile2 = tile_offsets(rn, rdv2, sv_s, sv_d, VEC)

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
    k = load_tile(kp + k_tile, kmask, EVEN)
    if TWO:
        k2 = tl.load(kp + k_tile2, mask=kmask2, other=0.0)
    if COMPUTE_DK:
        vp = _at(V, v_off, bk, sv_b, h0 // G_v, sv_h, col0, sv_s, VEC)
        v = load_tile(vp + v_tile, vmask, EVEN)
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
            v = load_tile(vp + v_tile, vmask, EVEN)
            if TWO:
                v2 = tl.load(vp + v_tile2, mask=vmask2, other=0.0)
        if not COMPUTE_DK and not KV_SHARED:   # dV pass: the K head of query head h
            kp = _at(K, k_off, bk, sk_b, h // G_k, sk_h, col0, sk_s, VEC)
            k = load_tile(kp + k_tile, kmask, EVEN)
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
            q = load_desc(QD, bq, h, start_m, BLOCK_M, BLOCK_DQK)
            do = load_desc(DOD, bq, h, start_m, BLOCK_M, BLOCK_DV)
        else:
            qp = _at(Q, q_off, bq, sq_b, h, sq_h, z64, sq_s, VEC)
            q = _ld_rows(qp, offs_m, rdq, sq_s, sq_d, m_ok, d_qk, TWO, EVEN, VEC)
            if TWO:
                q2 = _ld_rows(qp, offs_m, rdq2, sq_s, sq_d, m_ok, d_qk, False, False, VEC)
            dop = _at(DO, do_off, bq, sdo_b, h, sdo_h, z64, sdo_s, VEC)
            do = _ld_rows(dop, offs_m, rdv, sdo_s, sdo_d, m_ok, d_v, TWO, EVEN, VEC)
            if TWO:
                do2 = _ld_rows(dop, offs_m, rdv2, sdo_s, sdo_d, m_ok, d_v, False, False, VEC)
        lse2 = _lse2(load_tile(_at(LSE, l_off, bq, sl_b, h, sl_h, row0, sl_s, 1) + rm * sl_s,
                               m_ok, EVEN))
        # P^T [N, M] = exp2(K Q^T * scale * log2e - LSE * log2e); masked entries exp2(-inf) = 0
        sT = dot_acc(k, tl.trans(q), None, UPCAST)
        if TWO:
            sT = dot_acc(k2, tl.trans(q2), sT, UPCAST)
        if COMPUTE_DK and DP_FIRST:   # dP^T = V dO^T issued beside S^T, before the exp2
            dpT = dot_acc(v, tl.trans(do), None, UPCAST)
            if TWO:
                dpT = dot_acc(v2, tl.trans(do2), dpT, UPCAST)
        s2T = sT * qk_scale
        if SOFTCAP:    # cap * tanh(S / cap), in log2 units
            tT = tanh_exp2(s2T / (softcap * LOG2E))
            s2T = tT * (softcap * LOG2E)
        if HAS_BIAS:   # bias[b, h, i, j] of query head h, as S^T
            s2T += bias_tile(BIAS, bias_off, b, sbias_b, h, sbias_h, row0, sbias_i, col0, sbias_j,
                             rm, rn, (offs_n[:, None] < n_kv) & m_ok[None, :], True, SCORE_VEC, EVEN)
        if HAS_ALIBI:  # query head h's slope (not its K head's), as S^T
            s2T += alibi_tile(ALIBI, alibi_off, b, salibi_b, h, salibi_h, offs_m[None, :], offs_n[:, None], shift)
        if HAS_LEFT or HAS_RIGHT:
            # P first but in the two-chunk kernels (it made D 192 causal 0.73-0.75x there) and
            # a dV-only pass (it spilled 8-16 bytes in sm120's, engines/triton/resources.json)
            pT = _p_block(s2T, lse2[None, :], start_m, mid_lo, mid_hi, offs_m[None, :],
                          offs_n[:, None], n_q, n_kv, shift, left, right, HAS_LEFT, HAS_RIGHT,
                          EVEN, COMPUTE_DK and not TWO)
        else:
            pT = tl.exp2(s2T - lse2[None, :])
        pdT = pT
        if HAS_DROPOUT:   # keep / (1 - p), as P^T's transpose (the port's, or drawn here)
            kT = dropout_scale_tile(DROP, drop_off, b, sdrop_b, h, sdrop_h, row0, sdrop_i, col0,
                                    sdrop_j, rm, rn, (offs_n[:, None] < n_kv) & m_ok[None, :], SCORE_VEC, EVEN,
                                    drop_scale, True, DRAWN_DROPOUT, drop_seed, drop_offset, H_q, drop_p)
            pdT = pT * kT
        if COMPUTE_DV:
            dv = dot_acc(pdT.to(io), do, dv, UPCAST)           # dV += P_drop^T dO
            if TWO:
                dv2 = dot_acc(pdT.to(io), do2, dv2, UPCAST)
        if COMPUTE_DK:
            delta = load_tile(Delta + ((b * H_q + h) * S_q + row0) + rm, m_ok, EVEN)
            if not DP_FIRST:
                dpT = dot_acc(v, tl.trans(do), None, UPCAST)   # dP^T = V dO^T
                if TWO:
                    dpT = dot_acc(v2, tl.trans(do2), dpT, UPCAST)
            if HAS_DROPOUT:                                 # dP^T = dP_drop^T keep / (1 - p)
                dpT = dpT * kT
            dsT = pT * (dpT - delta[None, :])               # dS^T = P^T (dP^T - Delta)
            if FUSED_DBIAS:   # dBias[b, h, i, j] = dS[i, j]: every tile once (no band)
                dbp = _at(DBS, dbs_off, b, sdbs_b, h, sdbs_h, row0, sdbs_i, 1) + col0 * sdbs_j
                tl.store(dbp + rm[None, :] * sdbs_i + rn[:, None] * sdbs_j, dsT.to(io),
                         mask=(offs_n[:, None] < n_kv) & m_ok[None, :])
            if SOFTCAP:                                     # d(cap tanh(S / cap)) / dS
                dsT = dsT * (1.0 - tT * tT)
            dsT = dsT.to(io)
            dk = dot_acc(dsT, q, dk, UPCAST)                   # dK += dS^T Q
            if TWO:
                dk2 = dot_acc(dsT, q2, dk2, UPCAST)
            if ATOMIC_DQ:                                   # dQ += scale dS K
                tl.static_assert(not TWO, "atomic dQ serves one head-dim chunk")
                if not EVEN:   # KV rows past the sequence: P^T may be inf there, and K is 0
                    dsT = tl.where(offs_n[:, None] < n_kv, dsT, 0.0)
                # rows of BLOCK_DQK fp32: offsets the compiler knows are 16-byte aligned and
                # contiguous along the head dim, so the adds are vector reductions
                dqa = _at(DQA, 0, bq, sqa_b, h, sqa_h, row0, sqa_s, BLOCK_DQK)
                dq_part = dot_acc(tl.trans(dsT), k, None, UPCAST) * scale
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
        store_tile(dkp + tile_offsets(rn, rdq, sdk_s, sdk_d, VEC), (dk * scale).to(io),
                   cols_ok(n_ok, rdq, d_qk, TWO), EVEN)
        if TWO:
            tl.store(dkp + tile_offsets(rn, rdq2, sdk_s, sdk_d, VEC), (dk2 * scale).to(io),
                     mask=cols_ok(n_ok, rdq2, d_qk, False))
    if COMPUTE_DV:
        dvp = _at(DV, dv_off, bk, sdv_b, g, sdv_h, col0, sdv_s, VEC)
        store_tile(dvp + tile_offsets(rn, rdv, sdv_s, sdv_d, VEC), dv.to(io),
                   cols_ok(n_ok, rdv, d_v, TWO), EVEN)
        if TWO:
            tl.store(dvp + tile_offsets(rn, rdv2, sdv_s, sdv_d, VEC), dv2.to(io),
                     mask=cols_ok(n_ok, rdv2, d_v, False))


@triton.jit(do_not_specialize=INPUT_INTS + SIZE_INTS + CHOICE_INTS + RAGGED_INTS + BIAS_INTS + DROP_INTS
            + ALIBI_INTS + ["dq_off", "sdq_b", "sdq_h", "sdq_s", "sdq_d"])
def bwd_dq(Q, K, V, DO, LSE, Delta, DQ, CU_Q, CU_KV, q_off, sq_b, sq_h, sq_s, sq_d, k_off, sk_b,
           sk_h, sk_s, sk_d, v_off, sv_b, sv_h, sv_s, sv_d, do_off, sdo_b, sdo_h, sdo_s, sdo_d,
           l_off, sl_b, sl_h, sl_s, dq_off, sdq_b, sdq_h, sdq_s, sdq_d, H_q, G_k, G_v, S_q, S_kv,
           D_qk, D_v, scale, shift, left, right, T_q, T_kv, BIAS, bias_off, sbias_b, sbias_h,
           sbias_i, sbias_j, softcap, DROP, drop_off, sdrop_b, sdrop_h, sdrop_i,
           sdrop_j, drop_scale, drop_seed, drop_offset, drop_p, ALIBI, alibi_off, salibi_b, salibi_h, KD, VD,
           HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
           block_major, lone_bound, UPCAST: tl.constexpr, WIDE: tl.constexpr, VEC: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr,
           BLOCK_DV: tl.constexpr, RAGGED: tl.constexpr, bottom_right, HAS_BIAS: tl.constexpr,
           SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr, DRAWN_DROPOUT: tl.constexpr,
           BLOCK_DQK2: tl.constexpr, BLOCK_DV2: tl.constexpr, EVEN: tl.constexpr, TMA: tl.constexpr,
           HAS_ALIBI: tl.constexpr = False, HAS_USED_Q: tl.constexpr = False, HAS_USED_KV: tl.constexpr = False,
           USED_Q=None, USED_KV=None, SCORE_VEC: tl.constexpr = 1):
    """One program per (batch, query head, Q block): dQ = scale * sum_j dS K, fp32 in
    registers. BLOCK_DQK2 / BLOCK_DV2, EVEN, SCORE_VEC: as bwd_dkdv's; TMA: K and V through
    the descriptors KD and VD."""
    # under a right bound alone (causal) the last Q blocks keep the most keys: they go first
    pid_m, b, h = block_batch_head(tl.cdiv(S_q, BLOCK_M), H_q, block_major,
                                   lone_bound == 2, HAS_LEFT or HAS_RIGHT)
    # "batch" index of the q-side and kv-side ports, and the lengths masks and loops use
    bq, n_q, bk, n_kv = b, S_q, b, S_kv
    if RAGGED:
        bq, n_q, bk, n_kv, shift = _ragged(CU_Q, CU_KV, b, T_q, T_kv, S_q, S_kv, bottom_right,
                                           USED_Q, USED_KV, HAS_USED_Q, HAS_USED_KV)
    io = Q.dtype.element_ty
    qk_scale = scale * LOG2E
    d_qk = D_qk * VEC
    d_v = D_v * VEC
    z64 = tl.cast(0, tl.int64)   # row 0 of _at: keeps its sum 64-bit

    TWO: tl.constexpr = BLOCK_DQK2 > 0   # the invariants "Two chunks" above relies on:
    tl.static_assert((BLOCK_DV2 > 0) == TWO and (not TWO or (BLOCK_DQK == 128 and BLOCK_DV == 128
                     and not EVEN)), "two chunks: both head dims, 128 + a masked second chunk")
    rm, rn, rdq, rdv = tile_ranges(BLOCK_M, BLOCK_N, BLOCK_DQK, BLOCK_DV, WIDE)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + rm
    row0 = tl.cast(start_m, tl.int64)
    m_ok = offs_m < n_q
    qp = _at(Q, q_off, bq, sq_b, h, sq_h, row0, sq_s, VEC)
    q = _ld_rows(qp, rm, rdq, sq_s, sq_d, m_ok, d_qk, TWO, EVEN, VEC)
    dop = _at(DO, do_off, bq, sdo_b, h, sdo_h, row0, sdo_s, VEC)
    do = _ld_rows(dop, rm, rdv, sdo_s, sdo_d, m_ok, d_v, TWO, EVEN, VEC)
    if TWO:
        rdq2 = chunk_cols(BLOCK_DQK, BLOCK_DQK2, WIDE)
        rdv2 = chunk_cols(BLOCK_DV, BLOCK_DV2, WIDE)
        q2 = _ld_rows(qp, rm, rdq2, sq_s, sq_d, m_ok, d_qk, False, False, VEC)
        do2 = _ld_rows(dop, rm, rdv2, sdo_s, sdo_d, m_ok, d_v, False, False, VEC)
    lse2 = _lse2(load_tile(_at(LSE, l_off, bq, sl_b, h, sl_h, row0, sl_s, 1) + rm * sl_s, m_ok,
                           EVEN))
    delta = load_tile(Delta + ((b * H_q + h) * S_q + row0) + rm, m_ok, EVEN)

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
            k = load_desc(KD, bk, h // G_k, start_n, BLOCK_N, BLOCK_DQK)
            v = load_desc(VD, bk, h // G_v, start_n, BLOCK_N, BLOCK_DV)
        else:
            k = _ld_rows(kp, offs_n, rdq, sk_s, sk_d, n_ok, d_qk, TWO, EVEN, VEC)
            if TWO:
                k2 = _ld_rows(kp, offs_n, rdq2, sk_s, sk_d, n_ok, d_qk, False, False, VEC)
            v = _ld_rows(vp, offs_n, rdv, sv_s, sv_d, n_ok, d_v, TWO, EVEN, VEC)
            if TWO:
                v2 = _ld_rows(vp, offs_n, rdv2, sv_s, sv_d, n_ok, d_v, False, False, VEC)
        s = dot_acc(q, tl.trans(k), None, UPCAST)
        if TWO:
            s = dot_acc(q2, tl.trans(k2), s, UPCAST)
        s2 = s * qk_scale                                      # S [M, N], log2 units
        if SOFTCAP:    # cap * tanh(S / cap), in log2 units
            t = tanh_exp2(s2 / (softcap * LOG2E))
            s2 = t * (softcap * LOG2E)
        if HAS_BIAS:   # bias[b, h, i, j]
            s2 += bias_tile(BIAS, bias_off, b, sbias_b, h, sbias_h, row0, sbias_i, col0, sbias_j,
                            rm, rn, m_ok[:, None] & (offs_n[None, :] < n_kv), False, SCORE_VEC, EVEN)
        if HAS_ALIBI:  # -slope[b, h] |i - j + shift|
            s2 += alibi_tile(ALIBI, alibi_off, b, salibi_b, h, salibi_h, offs_m[:, None], offs_n[None, :], shift)
        # With every block whole (EVEN, no band) the loop has no branch (one never taken slows it)
        if EVEN and not (HAS_LEFT or HAS_RIGHT):
            p = tl.exp2(s2 - lse2[:, None])
        else:   # P first but in the two-chunk kernels (as bwd_dkdv)
            p = _p_block(s2, lse2[:, None], start_n, mid_lo, mid_hi, offs_m[:, None],
                         offs_n[None, :], n_q, n_kv, shift, left, right, HAS_LEFT, HAS_RIGHT,
                         EVEN, not TWO)
        dp = dot_acc(do, tl.trans(v), None, UPCAST)             # dP = dO V^T
        if TWO:
            dp = dot_acc(do2, tl.trans(v2), dp, UPCAST)
        if HAS_DROPOUT:                                      # dP = dP_drop keep / (1 - p)
            dp = dp * dropout_scale_tile(DROP, drop_off, b, sdrop_b, h, sdrop_h, row0, sdrop_i,
                                         col0, sdrop_j, rm, rn, m_ok[:, None] & (offs_n[None, :] < n_kv),
                                         SCORE_VEC, EVEN, drop_scale, False, DRAWN_DROPOUT, drop_seed, drop_offset, H_q, drop_p)
        ds = p * (dp - delta[:, None])                       # dS = P (dP - Delta)
        if SOFTCAP:                                          # d(cap tanh(S / cap)) / dS
            ds = ds * (1.0 - t * t)
        ds = ds.to(io)
        dq = dot_acc(ds, k, dq, UPCAST)                         # dQ += dS K
        if TWO:
            dq2 = dot_acc(ds, k2, dq2, UPCAST)
    dqp = _at(DQ, dq_off, bq, sdq_b, h, sdq_h, row0, sdq_s, VEC)
    # (the store masks formed anew, as in bwd_dkdv)
    m_in = rm[:, None] < n_q - start_m
    store_tile(dqp + tile_offsets(rm, rdq, sdq_s, sdq_d, VEC), (dq * scale).to(io),
               cols_ok(m_in, rdq, d_qk, TWO), EVEN)
    if TWO:
        tl.store(dqp + tile_offsets(rm, rdq2, sdq_s, sdq_d, VEC), (dq2 * scale).to(io),
                 mask=cols_ok(m_in, rdq2, d_qk, False))


@triton.jit(do_not_specialize=INPUT_INTS + SIZE_INTS + BIAS_INTS + ALIBI_INTS + [
    "dbias_off", "sdbias_b", "sdbias_h", "sdbias_i", "sdbias_j", "B_sum", "H_sum", "H_db"])
def bwd_dbias(Q, K, V, DO, LSE, Delta, BIAS, DBIAS, q_off, sq_b, sq_h, sq_s, sq_d, k_off, sk_b,
              sk_h, sk_s, sk_d, v_off, sv_b, sv_h, sv_s, sv_d, do_off, sdo_b, sdo_h, sdo_s, sdo_d,
              l_off, sl_b, sl_h, sl_s, bias_off, sbias_b, sbias_h, sbias_i, sbias_j, dbias_off,
              sdbias_b, sdbias_h, sdbias_i, sdbias_j, H_q, G_k, G_v, S_q, S_kv, D_qk, D_v, scale,
              shift, left, right, softcap, B_sum, H_sum, H_db, HAS_LEFT: tl.constexpr,
              HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr,
              WIDE: tl.constexpr, VEC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CHUNK_QK: tl.constexpr, CHUNK_V: tl.constexpr, ALIBI=None, alibi_off=None, salibi_b=None,
              salibi_h=None, HAS_ALIBI: tl.constexpr = False, CU_Q=None, CU_KV=None, T_q=None, T_kv=None, bottom_right=0,
              RAGGED_DB: tl.constexpr = False, USED_Q=None, USED_KV=None, HAS_USED_Q: tl.constexpr = False,
              HAS_USED_KV: tl.constexpr = False):
    """One program per (dBias batch, dBias head, Q block, KV block): the dBias tile = dS =
    P (dP - Delta) (before the softcap factor), summed in a fixed order over the B_sum
    batches and H_sum query heads dBias is broadcast over (B_sum = B when dBias has one
    batch, else 1; likewise H_sum): deterministic, nothing but dBias written. A tile the band
    misses entirely skips the work and is written as zeros (masked entries have P = 0).
    S and dP are accumulated over head-dim chunks of CHUNK_QK / CHUNK_V columns: with Q, K,
    dO and V reloaded for every summed head, whole-head-dim tiles would hold four tiles of
    offsets across the loop (they spilled on sm120 at D 128 and 256). RAGGED_DB: dBias is the
    padded [B|1, H_q|1, max_S_q, max_S_kv]; each sequence adds its block [:S_q_b, :S_kv_b]."""
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

    rm, rn, rdq, rdv = tile_ranges(BLOCK_M, BLOCK_N, CHUNK_QK, CHUNK_V, WIDE)
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
    if HAS_RIGHT and not RAGGED_DB:   # every (i, j) of the tile has j - i - shift > right
        n_it = tl.where(start_n - m_last - shift > right, 0, n_it)
    if HAS_LEFT and not RAGGED_DB:    # every (i, j) of the tile has i - j + shift >= left
        n_it = tl.where(start_m - n_last + shift >= left, 0, n_it)

    keep = keep_mask(offs_m[:, None], offs_n[None, :], S_q, S_kv, shift, left, right, HAS_LEFT, HAS_RIGHT)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for it in range(0, n_it):
        b = b0 + it // H_sum
        h = h0 + it % H_sum
        bq, bk, bias_ok = b, b, inside   # q-side and kv-side "batch" index: a sequence's first token
        if RAGGED_DB:   # sequence b's block: its lengths, first tokens and shift
            bq, n_q, bk, n_kv, shift = _ragged(CU_Q, CU_KV, b, T_q, T_kv, S_q, S_kv, bottom_right, USED_Q, USED_KV,
                                               HAS_USED_Q, HAS_USED_KV)
            m_ok, n_ok = offs_m < n_q, offs_n < n_kv
            bias_ok = m_ok[:, None] & n_ok[None, :]
            keep = keep_mask(offs_m[:, None], offs_n[None, :], n_q, n_kv, shift, left, right, HAS_LEFT, HAS_RIGHT)
        # S from Q and K, then dP from dO and V, chunk by chunk of the head dims
        s2 = dot_rows(_at(Q, q_off, bq, sq_b, h, sq_h, row0, sq_s, VEC), rm, m_ok, sq_s, sq_d, _at(K, k_off, bk, sk_b,
                      h // G_k, sk_h, col0, sk_s, VEC), rn, n_ok, sk_s, sk_d, rdq, d_qk, BLOCK_M, BLOCK_N, CHUNK_QK, VEC, UPCAST)
        s2 = s2 * qk_scale
        if SOFTCAP:
            s2 = tanh_exp2(s2 / (softcap * LOG2E)) * (softcap * LOG2E)
        s2 += bias_tile(BIAS, bias_off, b, sbias_b, h, sbias_h, row0, sbias_i, col0, sbias_j, rm, rn, bias_ok, False)
        if HAS_ALIBI:
            s2 += alibi_tile(ALIBI, alibi_off, b, salibi_b, h, salibi_h, offs_m[:, None], offs_n[None, :], shift)
        lse2 = _lse2(tl.load(_at(LSE, l_off, bq, sl_b, h, sl_h, row0, sl_s, 1) + rm * sl_s, mask=m_ok, other=0.0))
        p = _p(keep, s2, lse2[:, None])
        dp = dot_rows(_at(DO, do_off, bq, sdo_b, h, sdo_h, row0, sdo_s, VEC), rm, m_ok, sdo_s, sdo_d, _at(V, v_off,
                      bk, sv_b, h // G_v, sv_h, col0, sv_s, VEC), rn, n_ok, sv_s, sv_d, rdv, d_v, BLOCK_M, BLOCK_N, CHUNK_V, VEC, UPCAST)
        delta = tl.load(Delta + ((b * H_q + h) * S_q + row0) + rm, mask=m_ok, other=0.0)
        acc += p * (dp - delta[:, None])
    tl.store(DBIAS + (dbias_off + b0 * sdbias_b + h0 * sdbias_h + row0 * sdbias_i
                      + col0 * sdbias_j) + rm[:, None] * sdbias_i + rn[None, :] * sdbias_j,
             acc.to(io), mask=inside)


@triton.jit(do_not_specialize=["l_off", "sl_b", "sl_h", "sl_s", "sink_off", "s_sink",
                               "dsink_off", "s_dsink", "B", "H_q", "S_q"])
def bwd_dsinks(LSE, Delta, SINKS, DSINKS, l_off, sl_b, sl_h, sl_s, sink_off, s_sink, dsink_off,
               s_dsink, B, H_q, S_q, BLOCK: tl.constexpr, CU_Q=None, T_q=None, RAGGED_DS: tl.constexpr = False,
               USED_Q=None, HAS_USED_Q: tl.constexpr = False):
    """One program per query head h: dSinks_h = -sum_{b,i} exp(sink_h - LSE_bhi) Delta_bhi,
    each lane summing its rows in order, then one tree sum: deterministic. A row whose LSE
    is -inf (no kept key, no sink in it) adds 0. RAGGED_DS: sequence b's own S_q_b rows only."""
    h = tl.program_id(0).to(tl.int64)
    sink2 = tl.load(SINKS + sink_off + h * s_sink) * LOG2E
    r = tl.arange(0, BLOCK).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    n_blk = tl.cdiv(S_q, BLOCK)
    for it in range(0, B * n_blk):
        b = (it // n_blk).to(tl.int64)
        rows = (it % n_blk) * BLOCK + r
        bq, n_q = _sequence(CU_Q, b, T_q, S_q, USED_Q, HAS_USED_Q) if RAGGED_DS else (b, S_q)
        ok = rows < n_q
        lse2 = _lse2(tl.load(LSE + (l_off + bq * sl_b + h * sl_h) + rows * sl_s, mask=ok,
                             other=float("-inf")))
        delta = tl.load(Delta + (b * H_q + h) * S_q + rows, mask=ok, other=0.0)
        acc += tl.exp2(sink2 - lse2) * delta
    tl.store(DSINKS + dsink_off + h * s_dsink, -tl.sum(acc, axis=0))
