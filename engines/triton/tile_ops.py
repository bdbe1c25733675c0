"""The tile operations the backward kernels (kernels.py) are built from: index ranges, masks,
loads and stores of [rows, head-dim columns] tiles, products with fp32 accumulation, the
band's keep mask, the softcap's tanh and the bias tile, and the order of a kernel's programs.
Each is a @triton.jit function, inlined into the kernels that call it.

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

Mask (bundlegen/mask.py): keep (i, j) iff (not HAS_LEFT or i - j + shift < left) and
(not HAS_RIGHT or j - i - shift <= right). Loops cover only the blocks the band reaches,
and blocks the band keeps whole skip the mask. Each formula holds unchanged for a bound
past every |j - i - shift|, so the launcher serves every band kind with the kernel of both
bounds where it can (launch.band_flags).
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E)
TWO_LOG2E = tl.constexpr(2.8853900817779268)


@triton.jit
def tile_offsets(rows, cols, s_row, s_col, VEC: tl.constexpr):
    """Element offsets of a [rows, cols] tile (cols along the head dim)."""
    if VEC > 1:   # head-dim stride 1, row stride a multiple of VEC
        return rows[:, None] * (s_row * VEC) + cols[None, :]
    return rows[:, None] * s_row + cols[None, :] * s_col


@triton.jit
def tile_ranges(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr,
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
def keep_mask(i, j, S_q, S_kv, shift, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
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
def dot_acc(a, b, acc, UPCAST: tl.constexpr):
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
def dot_rows(a_at, ra, a_ok, sa_s, sa_d, b_at, rb, b_ok, sb_s, sb_d, rd, d,
             M: tl.constexpr, N: tl.constexpr, CHUNK: tl.constexpr, VEC: tl.constexpr,
             UPCAST: tl.constexpr):
    """A B^T [M, N], fp32, of the rows ra (M of them) of A and rb (N) of B, at a_at and b_at
    (rows not ok load as 0), over their d head-dim columns, CHUNK columns (rd) at a time."""
    acc = tl.zeros([M, N], dtype=tl.float32)
    for d0 in range(0, d, CHUNK):
        cols = d0 + rd
        a = tl.load(a_at + tile_offsets(ra, cols, sa_s, sa_d, VEC),
                    mask=a_ok[:, None] & (cols[None, :] < d), other=0.0)
        b = tl.load(b_at + tile_offsets(rb, cols, sb_s, sb_d, VEC),
                    mask=b_ok[:, None] & (cols[None, :] < d), other=0.0)
        acc = dot_acc(a, tl.trans(b), acc, UPCAST)
    return acc


@triton.jit
def tanh_exp2(x):
    """tanh(x) from exp2 (every backend and the interpreter have it; no libdevice):
    sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) <= 1, so nothing overflows."""
    e = tl.exp2(tl.abs(x) * -TWO_LOG2E)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def score_tile(X, off, b, s_b, h, s_h, i0, s_i, j0, s_j, ri, rj, ok, TRANS: tl.constexpr,
               VEC: tl.constexpr, EVEN: tl.constexpr):
    """X[b, h, i0 + ri, j0 + rj] of a [B, H, S_q, S_kv] port (the bias, the dropout mask) in
    its own dtype, 0 where not ok; a [len(ri), len(rj)] tile, or its transpose [len(rj),
    len(ri)] when TRANS (the dK/dV kernel's S^T; ok is in the tile's orientation). The tile
    base is 64-bit (b, h, i0, j0 are int64).
    VEC > 1 (the kernels' SCORE_VEC, launch.score_vec: the port's rows VEC-aligned, j stride
    1; its offset and strides come divided by VEC): read row by row along j, the contiguous axis, whatever TRANS, in
    16-byte vectors, and transposed in registers; EVEN (launch.whole_tiles) drops the mask.
    Read along i, as the transposed pointer tile below does, each element is a 2-byte load
    of its own with a 64-bit pointer of its own (sm90's D 128 modifier dK/dV kernel spilled
    536 bytes that way, 192 this way; its dQ kernel 48 and 0). VEC = 1: any strides, element
    by element in the orientation asked, always masked."""
    if VEC > 1:   # j0, a tile's first column, is a multiple of VEC; s_j is 1 (passed as 0)
        base = X + (off + b * s_b + h * s_h + i0 * s_i) * VEC + (j0 // VEC) * VEC
        ij_ok = ok
        if TRANS and not EVEN:
            ij_ok = tl.trans(ok.to(tl.int8)) != 0
        x = load_tile(base + ri[:, None] * (s_i * VEC) + rj[None, :], ij_ok, EVEN)
        if TRANS:   # in the port's dtype: half the bytes through shared memory of an fp32 tile
            x = tl.trans(x)
    else:
        base = X + (off + b * s_b + h * s_h + i0 * s_i + j0 * s_j)
        if TRANS:
            x = tl.load(base + rj[:, None] * s_j + ri[None, :] * s_i, mask=ok, other=0.0)
        else:
            x = tl.load(base + ri[:, None] * s_i + rj[None, :] * s_j, mask=ok, other=0.0)
    return x


@triton.jit
def bias_tile(BIAS, off, b, s_b, h, s_h, i0, s_i, j0, s_j, ri, rj, ok, TRANS: tl.constexpr,
              VEC: tl.constexpr = 1, EVEN: tl.constexpr = False):
    """The bias tile (score_tile) in log2 units, fp32."""
    return score_tile(BIAS, off, b, s_b, h, s_h, i0, s_i, j0, s_j, ri, rj, ok, TRANS, VEC,
                      EVEN).to(tl.float32) * LOG2E


@triton.jit
def alibi_tile(ALIBI, off, b, s_b, h, s_h, i, j, shift):
    """ALiBi of query head h in log2 units, fp32: -slope[b, h] * |i - j + shift| for the
    broadcast row indices i and column indices j (either orientation: the dK/dV kernel's
    S^T passes them transposed). The slope is the query head's ([H_q] slopes: s_b = 0)."""
    slope = tl.load(ALIBI + (off + b * s_b + h * s_h)).to(tl.float32)
    return -(slope * LOG2E) * tl.abs(i - j + shift).to(tl.float32)


@triton.jit
def keep_scaled_tile(DROP, off, b, s_b, h, s_h, i0, s_i, j0, s_j, ri, rj, ok, VEC: tl.constexpr,
                     EVEN: tl.constexpr, drop_scale, TRANS: tl.constexpr):
    """keep[b, h, i0 + ri, j0 + rj] * drop_scale, fp32, 0 where not ok: a tile of the dropout
    mask (score_tile, as the bias's; TRANS: the dK/dV kernel's transpose)."""
    return score_tile(DROP, off, b, s_b, h, s_h, i0, s_i, j0, s_j, ri, rj, ok, TRANS, VEC,
                      EVEN).to(tl.float32) * drop_scale


@triton.jit
def cols_ok(rows_ok, cols, d, WHOLE: tl.constexpr):
    """Load/store mask of a [rows, head-dim columns] tile: rows_ok [R, 1] and cols [C] < d.
    WHOLE (the first chunk of a two-chunk launch, every column inside the head dim): the
    rows alone, as the loads need no head-dim mask there."""
    if WHOLE:   # a constexpr branch: only the taken one is compiled (one return type)
        ok = rows_ok
    else:
        ok = rows_ok & (cols[None, :] < d)
    return ok


@triton.jit
def load_tile(ptrs, mask, EVEN: tl.constexpr):
    """Load a tile; masked (0 outside) unless EVEN (every tile whole: the launcher's
    launch.whole_tiles), where the masks are left out, so no predicate tile is kept live."""
    if EVEN:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    return x


@triton.jit
def load_desc(desc, b, h, row, ROWS: tl.constexpr, COLS: tl.constexpr):
    """The [ROWS, COLS] tile at (b, h, row, 0) of a [B, H, S, D] port, through its tensor
    descriptor (block [1, 1, ROWS, COLS]); rows past S and columns past D read as 0."""
    return desc.load([b.to(tl.int32), h.to(tl.int32), row, 0]).reshape(ROWS, COLS)


@triton.jit
def store_tile(ptrs, x, mask, EVEN: tl.constexpr):
    """Store a tile; masked unless EVEN (as load_tile)."""
    if EVEN:
        tl.store(ptrs, x)
    else:
        tl.store(ptrs, x, mask=mask)


@triton.jit
def chunk_cols(BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, WIDE: tl.constexpr):
    """Column indices of a second chunk: BLOCK_A + [0, BLOCK_B), 64-bit when WIDE."""
    c = BLOCK_A + tl.arange(0, BLOCK_B)
    if WIDE:
        c = c.to(tl.int64)
    return c


@triton.jit
def block_batch_head(num_blocks, heads, block_major, reverse, BAND: tl.constexpr):
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
