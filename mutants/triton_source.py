"""Source mutants of the Triton engine: one defect class put back by editing the text of one
of its modules (the launcher or the kernels), never by a switch inside them.

A `Patch` names the module (`launch` or `kernels` of bundlegen.engines.triton) and its
edits; each edit's original snippet must occur exactly `count` times in today's source, so a
refactor that moves a mutant's target fails loudly (tests/test_mutants_triton_source.py)
instead of leaving a mutant that mutates nothing. Applied, the patched source is written to
a file in a per-user folder of the temporary directory (Triton's @jit reads a function's
source from its file), named by a hash of that source, and importable under that name.

The mutant engine is `Patched(engine, patch)`: a plain wrapper of the correct engine, which
it tells to launch that module instead of its own (`TritonEngine.launch_module` /
`kernels_module`, the engine's seam for other modules). The engine's prepare warms only
the package's own modules (warm.py), so a mutant's variants compile on use, and the
product's compile markers are neither written nor read for it.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bundlegen.mutants.wrappers import WholeEngineWrapper

PACKAGE = "bundlegen.engines.triton"
MODULE_PREFIX = "bundlegen_mutant_"
CACHE_PREFIX = "bundlegen-mutants-"


class PatchError(ValueError):
    """A patch's original snippet is not in the source the expected number of times."""


@dataclass(frozen=True)
class Edit:
    old: str
    new: str
    count: int = 1     # occurrences of `old` in the source; every one is replaced


@dataclass(frozen=True)
class Patch:
    """Edits of one module of the Triton engine (put into an engine by `Patched`)."""
    module: str                  # launch | kernels
    edits: tuple[Edit, ...]

    def source(self) -> str:
        """The module's source with the edits applied; PatchError where one does not fit."""
        spec = importlib.util.find_spec(f"{PACKAGE}.{self.module}")
        text = Path(spec.origin).read_text(encoding="utf-8")
        for edit in self.edits:
            found = text.count(edit.old)
            if found != edit.count:
                raise PatchError(f"{PACKAGE}.{self.module}: expected {edit.count} occurrence(s) of "
                                 f"{edit.old!r}, found {found}")
            text = text.replace(edit.old, edit.new)
        return text

    def load(self) -> str:
        """Write the patched module to the cache (once) and return its name: importable from
        then on (Triton is imported when the engine first launches it, as for the product)."""
        text = self.source()
        name = f"{MODULE_PREFIX}{self.module}_{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        path = cache_dir() / f"{name}.py"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, path)
        _install_finder()
        return name

    @property
    def attr(self) -> str:
        """The engine's attribute naming the module this patch edits."""
        return f"{self.module}_module"


class Patched(WholeEngineWrapper):
    """`inner` launching the patched module instead of its own: the defect is in the
    engine's own code, so it is the whole engine (everything it serves) otherwise."""

    def __init__(self, inner, patch: Patch):
        if not hasattr(inner, patch.attr):
            raise TypeError(f"{type(inner).__name__} has no {patch.attr} to patch")
        super().__init__(inner)
        self.patch = patch
        setattr(inner, patch.attr, patch.load())


def cache_dir() -> Path:
    """Per user, outside the package and the repository; no Triton import needed."""
    return Path(tempfile.gettempdir()) / f"{CACHE_PREFIX}{os.getuid()}"


class _Finder(importlib.abc.MetaPathFinder):
    """Finds patched modules by name in the cache (so importlib.reload works on them too)."""

    def find_spec(self, name, path=None, target=None):
        if path is not None or not name.startswith(MODULE_PREFIX):
            return None
        file = cache_dir() / f"{name}.py"
        return importlib.util.spec_from_file_location(name, file) if file.exists() else None


def _install_finder() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


# ----------------------------------------------------------------------------- launcher
STATS_PACKED = Patch("launch", (Edit(
    '    ports["stats"] = stats_addr(tensors["stats"])\n',
    '    stats = tensors["stats"]   # strides derived from its dims: packed [B, H_q, S_q, 1]\n'
    '    _, H, S, _ = stats.shape\n'
    '    ports["stats"] = stats_addr(stats.as_strided(stats.shape, (H * S, S, 1, 1),\n'
    '                                                 stats.storage_offset()))\n'),))

TOP_LEFT = Patch("launch", (
    Edit("    shift = diagonal_shift(graph.S_q, graph.S_kv, a.diagonal_alignment)\n",
         "    shift = 0\n"),
    # a ragged batch's per-sequence shift likewise
    Edit('bottom_right=int(ragged and graph.attributes.diagonal_alignment == "BOTTOM_RIGHT"))',
         "bottom_right=0)"),
))

LEFT_OFF_BY_ONE = Patch("launch", (Edit(
    "    left = min(a.left_bound, far) if a.left_bound is not None else far\n",
    "    left = min(a.left_bound, far) + 1 if a.left_bound is not None else far\n"),))

# ----------------------------------------------------------------------------- kernels
#: input tiles (O, dO, Q, K, V; outputs keep tile_offsets) read through _tile_early
ROW_PITCH_EARLY = Patch("kernels", (
    Edit("@triton.jit\ndef _ld_rows(",
         "@triton.jit\n"
         "def _tile_early(rows, cols, s_row, s_col, VEC: tl.constexpr):\n"
         "    tile = tile_offsets(rows, cols, s_row, s_col, VEC)\n"
         "    return tile - ((rows % 2) * ((s_row * VEC) % 2))[:, None]\n\n\n"
         "@triton.jit\ndef _ld_rows("),
    Edit("tile_offsets(rm, rd, so_s,", "_tile_early(rm, rd, so_s,"),
    Edit("tile_offsets(rm, rd, sdo_s,", "_tile_early(rm, rd, sdo_s,"),
    # Q, dO (both kernels) and the dQ kernel's K, V: the pointer loads of _ld_rows
    Edit("    return load_tile(base + tile_offsets(rows, cols, s_row, s_col, VEC),\n",
         "    return load_tile(base + _tile_early(rows, cols, s_row, s_col, VEC),\n"),
    Edit("tile_offsets(rn, rdq, sk_s,", "_tile_early(rn, rdq, sk_s,"),
    Edit("tile_offsets(rn, rdv, sv_s,", "_tile_early(rn, rdv, sv_s,"),
))

DELTA_WRONG_DTYPE = Patch("kernels", (Edit(
    "    return tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)\n",
    "    return tl.sum(o.to(tl.float16, bitcast=True).to(tl.float32) * do.to(tl.float32),"
    " axis=1)\n"),))

# LSE kept at -inf, and P masked after the exp2: by _p (exp2 of the masked S, then - LSE), and
# where _p_block forms P before its branch, by a multiply (inf x 0)
MASKED_ROWS_NAN = Patch("kernels", (
    Edit('    return tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)\n',
         "    return lse * LOG2E\n"),
    Edit('    return tl.exp2(tl.where(keep, s2 - lse2, float("-inf")))\n',
         '    return tl.exp2(tl.where(keep, s2, float("-inf")) - lse2)\n'),
    Edit("""            p = tl.where(keep_mask(i, j, S_q, S_kv, shift, left, right, HAS_LEFT, HAS_RIGHT,
                                   EVEN), p, 0.0)""",
         """            p = p * keep_mask(i, j, S_q, S_kv, shift, left, right, HAS_LEFT, HAS_RIGHT,
                              EVEN).to(tl.float32)"""),
))

DROP_TAIL = Patch("kernels", (
    Edit("    n_m = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_M)\n",
         "    n_m = tl.maximum(hi - lo, 0) // BLOCK_M\n"),
    Edit("    dq = tl.zeros([BLOCK_M, BLOCK_DQK], dtype=tl.float32)\n",
         "    dq = tl.zeros([BLOCK_M, BLOCK_DQK], dtype=tl.float32)\n"
         "    hi = lo + (tl.maximum(hi - lo, 0) // BLOCK_N) * BLOCK_N\n"),
))

NO_SCALE_DK = Patch("kernels", (Edit("(dk * scale).to(io)", "dk.to(io)"),
                                Edit("(dk2 * scale).to(io)", "dk2.to(io)")))

DQ_FP16 = Patch("kernels", (Edit(
    "        dq = dot_acc(ds, k, dq, UPCAST)",
    "        dq = dot_acc(ds, k, dq, UPCAST).to(tl.float16).to(tl.float32)"),))

NO_GROUP_REDUCE = Patch("kernels", (Edit(
    "    for it in range(0, group * n_m):\n", "    for it in range(0, n_m):\n"),))

# ragged batches (kernels' RAGGED variants)
#: seed 001's defect: the first token of a sequence taken from cu_seqlens as it is, unbounded
#: (a start before the storage or an end past it is read and written there)
RAGGED_UNBOUNDED = Patch("kernels", (Edit(
    "    return tl.where(ok, start, 0).to(tl.int64), tl.where(ok, n, 0)\n",
    "    return start.to(tl.int64), n\n"),))

#: element offsets formed in 32 bits: the offset of a tile's first element (batch, head and
#: row base, or a ragged sequence's first token times the token stride) wraps once it
#: passes 2^31 elements (only storages that large, so only on a GPU, can tell)
OFFSETS_32 = Patch("kernels", (Edit(
    "    return X + (off + b * s_b + h * s_h + row0 * s_s) * VEC\n",
    "    return X + ((off + b * s_b + h * s_h + row0 * s_s) * VEC).to(tl.int32)\n"),))

# ----------------------------------------------------------------------------- boundary classes
# Each of these is correct everywhere but on one boundary class of the plan (BND-*): a size,
# offset or count just off a tile multiple. Block names are the kernel's own (BLOCK_M/N of
# the kernel edited; configs.py: M1/N1 the dK/dV kernel's, M2/N2 the dQ kernel's).

#: BND-SQ-TAIL: the dQ store's "is this block full" test off by one (start_m + BLOCK_M - 1
#: <= S_q): a Q tail one row short of a full block (S_q mod BLOCK_M2 == BLOCK_M2 - 1) is
#: stored as a full block, one row past the sequence's end (the next head's row 0, or the
#: storage past the tensor)
SQ_TAIL_AS_FULL = Patch("kernels", (Edit(
    "    m_in = rm[:, None] < n_q - start_m\n",
    "    m_in = (offs_m < tl.where(start_m + BLOCK_M - 1 <= n_q, start_m + BLOCK_M, n_q))[:, None]\n"),))

#: BND-SKV-TAIL: the dQ kernel's count of key blocks rounded up with BLOCK_N - 2 instead of
#: BLOCK_N - 1: a last key block holding a single key (S_kv mod BLOCK_N2 == 1) is skipped
SKV_ONE_KEY_TAIL = Patch("kernels", (Edit(
    "    for start_n in range(lo, hi, BLOCK_N):\n",
    "    for start_n in range(lo, lo + ((hi - lo + BLOCK_N - 2) // BLOCK_N) * BLOCK_N, BLOCK_N):\n"),))

#: BND-BR-OFFSET: the bottom-right shift S_kv - S_q rounded down to a multiple of the dQ
#: kernel's key block (a causal offset kept in whole blocks): wrong when it is not one
BR_SHIFT_BLOCKS = Patch("launch", (Edit(
    "        shift, left, right = _bounds(g)\n",
    "        shift, left, right = _bounds(g)\n"
    "        shift = (shift // self.cfg.block_n2) * self.cfg.block_n2\n"),))

#: BND-WINDOW-LEFT: whole-block tests written for an inclusive left bound (i - j + shift <=
#: left, FlashAttention's window_size convention) beside the exclusive element mask: when
#: left - shift == -1 (mod the block) an edge block keeping all but one corner key runs unmasked
WINDOW_LEFT_INCLUSIVE = Patch("kernels", (
    Edit("mid_lo = lo + tl.cdiv(tl.maximum(start_m + BLOCK_M + shift - left - lo, 0),",
         "mid_lo = lo + tl.cdiv(tl.maximum(start_m + BLOCK_M - 1 + shift - left - lo, 0),"),
    Edit("mid_hi = lo + (tl.maximum(start_n - shift + left - lo, 0) // BLOCK_M) * BLOCK_M",
         "mid_hi = lo + (tl.maximum(start_n - shift + left + 1 - lo, 0) // BLOCK_M) * BLOCK_M"),
))

#: BND-WINDOW-RIGHT: the dK/dV kernel's first query row taken with an exclusive right bound
#: (j - i - shift < right): when right + shift == 1 (mod BLOCK_M1) the row whose band ends on
#: the key block's first key starts the skipped query block
WINDOW_RIGHT_EXCLUSIVE = Patch("kernels", (Edit(
    "        lo = (tl.maximum(start_n - shift - right, 0) // BLOCK_M) * BLOCK_M\n",
    "        lo = (tl.maximum(start_n - shift - right + 1, 0) // BLOCK_M) * BLOCK_M\n"),))

#: BND-HEAD-DIM: the Q/K head dim cut to a multiple of 16 (the MMA granule): tail columns
#: neither read nor written when D_qk is not a multiple of 16 (dK/dV, dQ and dBias kernels)
HEAD_DIM_16 = Patch("kernels", (Edit(
    "    d_qk = D_qk * VEC\n", "    d_qk = (D_qk * VEC) // 16 * 16\n", 3),))

#: BND-GROUP: the dK/dV kernel's group size taken as the largest power of two it holds (a
#: kernel written for power-of-two ratios, its group a shift): ratios 3, 5, 6, 7 lose heads
GROUP_POW2 = Patch("kernels", (Edit(
    "    group = H_q // H_grp\n",
    "    group = H_q // H_grp\n"
    "    pow2 = group | (group >> 1)\n"
    "    pow2 = pow2 | (pow2 >> 2)\n"
    "    pow2 = pow2 | (pow2 >> 4)\n"
    "    pow2 = pow2 | (pow2 >> 8)\n"
    "    pow2 = pow2 | (pow2 >> 16)\n"
    "    group = pow2 - (pow2 >> 1)\n"),))

#: BND-GRID: the dQ launch capped at 1024 programs (the per-block thread limit taken for a
#: grid limit): programs past it never run, their dQ rows never written
GRID_CAP_1024 = Patch("launch", (Edit(
    "    L.kernels.bwd_dq[(grid,)](\n        *L.pointers, dq[0],",
    "    L.kernels.bwd_dq[(min(grid, 1024),)](\n        *L.pointers, dq[0],"),))

# ----------------------------------------------------------------------------- score modifiers
#: the softcap's gradient factor (1 - t^2) left out of dS in both kernels: dQ and dK taken as
#: if the cap were the identity on the backward (a forward-only softcap)
SOFTCAP_GRAD_DROPPED = Patch("kernels", (
    Edit("            ds = ds * (1.0 - t * t)\n", "            ds = ds\n"),
    Edit("                dsT = dsT * (1.0 - tT * tT)\n", "                dsT = dsT\n"),
))

#: dBias written only by the tiles the band reaches: tiles the mask drops entirely (which
#: the loops skip) keep whatever the output held instead of zeros
DBIAS_SKIPPED_TILES_UNWRITTEN = Patch("kernels", (Edit(
    "             acc.to(io), mask=inside)\n",
    "             acc.to(io), mask=inside & (offs_m[:, None] * 0 + n_it > 0))\n"),))

#: dSinks with its sign flipped (d LSE / d sink taken as +exp(sink - LSE) times +Delta)
DSINKS_SIGN = Patch("kernels", (Edit(
    "    tl.store(DSINKS + dsink_off + h * s_dsink, -tl.sum(acc, axis=0))\n",
    "    tl.store(DSINKS + dsink_off + h * s_dsink, tl.sum(acc, axis=0))\n"),))

#: the bias of the dK/dV kernel indexed by the group's K head instead of the query head:
#: right for MHA and for a head-broadcast bias, wrong under GQA / MQA with a per-head bias
BIAS_KV_HEAD = Patch("kernels", (Edit(
    "            s2T += bias_tile(BIAS, bias_off, b, sbias_b, h, sbias_h,",
    "            s2T += bias_tile(BIAS, bias_off, b, sbias_b, g, sbias_h,"),))

#: the dQ kernel draws its dropout mask one Philox offset on from the dK/dV kernel's (and the
#: mask the engine tells): the two passes of one backward disagree on which entries are kept
DROPOUT_DQ_OFFSET_SHIFTED = Patch("kernels", (Edit(
    "drop_scale, False, DRAWN_DROPOUT, drop_seed, drop_offset, H_q, drop_p)",
    "drop_scale, False, DRAWN_DROPOUT, drop_seed, drop_offset + 1, H_q, drop_p)"),))
