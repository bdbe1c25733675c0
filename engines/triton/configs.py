"""Per-arch block configurations of the Triton backward kernels.

One table per arch, keyed by the padded head dim (BLOCK_D = next power of two >= max(16, D),
taken over D_qk and D_v). Starting points came from FlexAttention's defaults (sm90, sm120)
and aiter's gfx942 configs (docs/DESIGN.md section 11); they were then trimmed
with the compiled kernels' register and shared-memory usage (engines/triton/aot.py
compiles for every arch without a GPU and checks each tier against `smem_bytes`).

Names: M1/N1 are the Q/KV tile of the dK/dV kernel, M2/N2 those of the dQ kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

MIN_BLOCK = 16  # tl.dot needs every dimension >= 16


@dataclass(frozen=True)
class BlockConfig:
    block_m1: int
    block_n1: int
    block_m2: int
    block_n2: int
    num_warps: int = 4
    num_stages: int = 1
    waves_per_eu: int | None = None           # gfx942 only
    matrix_instr_nonkdim: int | None = None   # gfx942 only
    num_warps_dq: int | None = None           # the dQ kernel's, when they differ
    num_stages_dq: int | None = None
    #: dK and dV in two passes (a dK-only and a dV-only program) even when H_k == H_v: each
    #: holds one [N, D] accumulator, so wide head dims fit 64-row tiles (wgmma needs 64 rows
    #: per warpgroup) for the cost of recomputing P in both passes
    split_dkdv: bool = False
    #: head dims in (CHUNK, 192] as a 128-column chunk plus a narrower one (kernels.py, "Two chunks"),
    #: not padded to 256 (two_chunk_tiles)
    two_chunks: bool = False
    #: (M1, N1, warps, stages) of a dV-only pass (split_dkdv, or H_k != H_v), when they differ
    #: from the dK/dV ones: it holds neither V nor dP, so it fits other tiles
    dv_pass: tuple[int, int, int, int] | None = None
    #: stages of a dK-only or dV-only pass that reloads K or V per query head (H_k != H_v):
    #: each stage holds one more [N, D] tile, past the shared memory of wide tiles
    unshared_stages: int | None = None
    #: the config of graphs with a band (a left or right bound: causal, windows), when it
    #: differs (config_for(..., banded=True))
    banded: "BlockConfig | None" = None
    #: the config of an atomic-dQ launch (config_for(..., atomic_dq=True)), when it differs:
    #: its dK/dV kernel also forms dQ, so other tiles fit it best
    atomic_dq: "BlockConfig | None" = None
    #: the streamed tiles (Q, dO in the dK/dV kernel; K, V in the dQ kernel) loaded through
    #: TMA tensor descriptors where launch.descriptor_loads allows (tile_ops.py, "TMA")
    tma: bool = False
    #: the config of a launch that loads through pointers after all (descriptor_loads
    #: false: ragged, unaligned, ...), when it differs: without descriptors the offset and mask
    #: tiles take registers that larger tiles need (launch.prepare switches to it)
    pointer_loads: "BlockConfig | None" = None
    #: the dK pass multiplies dP^T = V dO^T right after S^T = K Q^T, before the exp2 and dV
    #: (kernels.bwd_dkdv DP_FIRST), not after them: faster with some tiles, slower with others
    #: (never with score modifiers: launch.dp_first)
    dp_first: bool = False
    #: the bias and dropout-mask tiles read row by row in 16-byte vectors where their rows are
    #: aligned (kernels' SCORE_VEC, launch.score_vec), not element by element: sm90's D 128
    #: modifier dK/dV kernel spilled 536 bytes reading S^T's bias tile along its rows, 192 so
    #: (`python bench/speed_batch.py --resources`); on sm90 and the interpreter only: the
    #: other archs' variants were not compiled so
    score_rows: bool = False
    #: the config of a launch with score modifiers (a bias, a softcap, ALiBi slopes) and no
    #: dropout, when it differs (launch.prepare switches to it, for_scores): the modifiers'
    #: tiles take registers the plain kernels' larger tiles need
    modifiers: "BlockConfig | None" = None
    #: the config of a launch with dropout through the dropout_mask port, and of one whose
    #: kernels draw the mask (drawn_dropout), when they differ: the mask tile (or the draw's
    #: Philox state) on top of the modifiers' made the plain tiles spill (for_scores)
    dropout: "BlockConfig | None" = None
    drawn_dropout: "BlockConfig | None" = None
    #: (BLOCK_M, BLOCK_N, warps) of the dBias kernel, when they differ from launch.dbias_tiles'
    #: rule (the dQ kernel's tiles, at most DBIAS_TILE, on its warps): bench/speed_batch.py's
    #: dBias candidates set it; a tier that adopts one names it here
    dbias_tiles: tuple[int, int, int] | None = None
    #: dBias stored by the dK/dV kernel's dK pass as it forms dS (kernels.bwd_dkdv
    #: FUSED_DBIAS) where launch.fuses_dbias allows, not by bwd_dbias's pass: a candidate of
    #: bench/speed_batch.py; a tier that adopts it sets it here
    fused_dbias: bool = False

    def for_scores(self, modified: bool, dropout: str | None) -> "BlockConfig":
        """The config a launch runs: its dropout form's ("port" | "drawn") where it has one,
        else, with score modifiers and no dropout, `modifiers` where it has one, else this."""
        if dropout is not None:
            sub = self.dropout if dropout == "port" else self.drawn_dropout
        else:
            sub = self.modifiers if modified else None
        return self if sub is None else sub

    def switches(self) -> tuple["BlockConfig", ...]:
        """This config and every one launch.prepare may switch to from it (for_scores, then
        pointer_loads): what a launch with this table config runs without shrinking."""
        subs = (self, self.modifiers, self.dropout, self.drawn_dropout)
        out = [c for c in subs if c is not None]
        out += [c.pointer_loads for c in out if c.pointer_loads is not None]
        return tuple(dict.fromkeys(out))

    @property
    def most_rows(self) -> int:
        """The most rows of any tile of any kernel (64-bit tile offsets are needed from it)."""
        return max(self.block_m1, self.block_n1, self.block_m2, self.block_n2,
                   *(self.dv_pass[:2] if self.dv_pass else ()))

    def launch_kwargs(self, dq: bool = False) -> dict:
        warps = self.num_warps_dq if dq and self.num_warps_dq is not None else self.num_warps
        stages = self.num_stages_dq if dq and self.num_stages_dq is not None else self.num_stages
        kw = {"num_warps": warps, "num_stages": stages}
        if self.waves_per_eu is not None:
            kw["waves_per_eu"] = self.waves_per_eu
        if self.matrix_instr_nonkdim is not None:
            kw["matrix_instr_nonkdim"] = self.matrix_instr_nonkdim
        return kw


@dataclass(frozen=True)
class ArchConfigs:
    arch: str
    smem_bytes: int                                  # per-block shared memory / LDS budget
    tiers: tuple[tuple[int, BlockConfig], ...]       # (largest BLOCK_D served, config), ascending
    #: an atomic-dQ engine adds dQ with atomics here (engine.atomic_dq_serves). Not on sm120
    #: and gfx942: their dK passes spilled 16-136 bytes with the scratch's tile (resources.py)
    atomic_dq: bool = False

    def for_block_d(self, block_d: int) -> BlockConfig:
        return dict(self.tiers)[self.tier_of(block_d)]

    def tier_of(self, block_d: int) -> int:
        """The tier (its largest BLOCK_D) whose config serves `block_d`."""
        for limit, _ in self.tiers:
            if block_d <= limit:
                return limit
        raise ValueError(f"{self.arch}: no config for BLOCK_D={block_d}")


def _amd(m1, n1, m2, n2, waves_per_eu=1, **kw) -> BlockConfig:
    return BlockConfig(m1, n1, m2, n2, **dict(dict(num_warps=4, num_stages=1), **kw),
                       waves_per_eu=waves_per_eu, matrix_instr_nonkdim=16)


#: the fastest atomic-dQ tiles measured at D 128 on an H200 (`python bench/tune_triton.py
#: --atomic-dq` times them); a dK pass that reloads V per query head has room for one stage
_SM90_ATOMIC_D128 = BlockConfig(64, 128, 128, 64, num_warps=8, num_stages=3, unshared_stages=1, score_rows=True)

#: sm90's dropout configs (BlockConfig.dropout, drawn_dropout), chosen from the compiled
#: kernels' sm90 resources (`python bench/speed_batch.py --resources --only drop`, and
#: `python bench/triton_resources.py --arch sm90` for every variant) and their speed on an
#: H100 (`python bench/device_check.py`: bf16, B4 H16 S4096 non-causal). The tuned tiles with
#: dropout spilled (dK/dV at D 128, 64 x 128 on 8 warps: 392 bytes with the mask port, 896
#: drawn; the drawn dQ's 128 x 64: 240, the mask port's 536-792 where it reads the mask element
#: by element (rows not 16-byte aligned) or with 64-bit offsets; D 64's dK/dV 32 x 128: 816
#: drawn). D 64: dK/dV 32 x 64 on 4 warps (216 / 255 registers, no spill where the mask tile is
#: read in vectors) with the tier's dQ. D 128, mask port and drawn alike: dK/dV 32 x 64 on 4
#: warps, 3.320 ms with the mask port and 5.270 drawn against 7.638 for 32 x 64 on 8 warps and
#: 15.027 for the drawn 16 x 64 on 8 warps (the zero-spill tiles: 2.30x and 2.85x), though it
#: spills where those did not: 8 bytes with the mask port read in vectors, 232-448 in the other
#: aligned variants (drawn, 64-bit offsets, the mask read element by element; up to 272 in the
#: dK-only and dV-only passes), within the aligned layouts' known spills (resources.KNOWN_SPILLS,
#: engines/triton/resources.json; 272-776 unaligned); dQ 64 x 32 on 4 warps, drawn 5.820 ms
#: against 6.529 for 128 x 32 on 8 warps (16 bytes where it reads the mask element by element;
#: 64 x 64 on 8 warps spilled 288 there). The dQ kernel runs one stage with dropout
#: (launch.DQ_MODIFIER_STAGES).
_SM90_DROP_D64 = BlockConfig(32, 64, 64, 64, score_rows=True, num_warps=4, num_stages=3, num_stages_dq=1, tma=True)
_SM90_DROP_D128 = BlockConfig(32, 64, 64, 32, score_rows=True, num_warps=4, num_stages=3, num_warps_dq=4,
                              num_stages_dq=1, tma=True)
#: D 192 and 256 (`python bench/speed_batch.py --resources --only drop`, the aligned dense
#: variants): the tier's tiles spilled 344 (D 192, mask port) to 640 bytes (drawn; its dQ 72),
#: D 256's split passes 16-40 with the mask port and 312-624 drawn (its dQ 192). With dropout
#: both tiers run split dK and dV passes, the dV pass on 64 x 64 tiles (8 warps; 202-245
#: registers, where its 64 x 128 spilled 96-624 drawn). The dK pass: D 192 16 x 128 on 8 warps
#: (240 registers); D 256 with the mask port 32 x 64 on 4 warps (255), drawn 16 x 32 on 4 warps
#: (241: 16 x 64 and 16 x 128 spilled 48, 32 x 32 56). dQ: with the mask port 64 x 32 on 4
#: warps (D 192 242 registers; D 256 16 bytes spilled; its other variants 8-600, within the
#: known spills like those of D 256's 32 x 64 dK pass), drawn 128 x 16 on 8 warps (234-252
#: registers: 128 x 32 spilled 72-192, 64 x 32 160-320). On an H100 (`python bench/speed_batch.py
#: --cases d192-drop-port d192-drop-drawn d256-drop-port d256-drop-drawn`, bf16 B4 H16 S4096),
#: each kernel against the other zero-spill candidates: D 256's mask-port dK pass 1.18x the
#: 16 x 128 tiles, the mask port's dQ 1.80-1.88x 128 x 16; the tiers' own spilling tiles are
#: faster still (dK/dV 1.58-2.21x, dQ 1.23-1.59x; PERFORMANCE table 7), not adopted: they
#: spill past the known spills (552-1432 bytes in the GQA and 64-bit-offset variants)
_SM90_DRAWN_D192 = BlockConfig(16, 128, 128, 16, score_rows=True, num_warps=8, num_stages=2, num_warps_dq=8,
                               num_stages_dq=1, two_chunks=True, split_dkdv=True, dv_pass=(64, 64, 8, 2),
                               unshared_stages=1, tma=True)
_SM90_DROP_D192 = replace(_SM90_DRAWN_D192, block_m2=64, block_n2=32, num_warps_dq=4)
_SM90_DROP_D256 = replace(_SM90_DROP_D192, two_chunks=False, block_m1=32, block_n1=64, num_warps=4)
_SM90_DRAWN_D256 = replace(_SM90_DRAWN_D192, two_chunks=False, block_n1=32, num_warps=4)
_SM90_DROPOUT = {64: dict(dropout=_SM90_DROP_D64, drawn_dropout=_SM90_DROP_D64),
                 128: dict(dropout=_SM90_DROP_D128, drawn_dropout=_SM90_DROP_D128),
                 192: dict(dropout=_SM90_DROP_D192, drawn_dropout=_SM90_DRAWN_D192),
                 256: dict(dropout=_SM90_DROP_D256, drawn_dropout=_SM90_DRAWN_D256)}

ARCHS: dict[str, ArchConfigs] = {
    # Chosen from ptxas resource usage of the compiled kernels and their shared memory;
    # engines/triton/resources.json has every variant's (sm90 spills in its unaligned and
    # some aligned variants: resources.KNOWN_SPILLS).
    # sm90: the fastest of `python bench/tune_triton.py` on an H200 (bf16, B4 H16 S4096, the
    # dK/dV and dQ kernels timed apart, causal and not: one config wins or ties for both at
    # D <= 128). D 192 and 256, where the goal is torch-flash's speed or better: the
    # one-pass dK/dV kernel needs 32-row KV tiles there (two [N, D] fp32 accumulators), which
    # Triton runs on mma.sync, not wgmma (64 rows per warpgroup); split into a dK pass and a
    # dV pass, 128-row tiles on 8 warps run wgmma: D256 dK/dV 10.4 -> 6.5 ms non-causal and
    # 5.9 -> 3.9 ms causal. D 129..192 runs the two-chunk kernels (128 + 64 columns, not 256):
    # split 10.4 -> 5.4 ms non-causal (the one-pass kernel with dp_first is faster still,
    # below); under a band the one-pass kernel with 32 x 128 tiles is faster there (2.75 ms
    # against 2.93 split, causal). The dK pass keeps 32-row Q tiles:
    # with 64 (3.0 against 3.2 ms at D 192) Triton 3.9 needs more shared memory than an SM
    # has when V is reloaded per query head (H_k != H_v); such passes run 1 stage.
    # Every tier loads the streamed tiles through TMA descriptors where the launch allows (tma;
    # `python bench/compare_kernels.py --loads tma pointer`): the dK/dV kernel 7-14 % and the dQ
    # kernel 3-7 % faster at D 64, 128 and 256 (B4 H16 S4096 bf16). With descriptors D 128's dK/dV
    # kernel runs 64 x 128 tiles on 8 warps (2.17-2.18 against 2.21-2.29 ms non-causal); through
    # pointers those tiles are slower (2.65 against 2.42 ms), so such launches keep 32 x 64
    # (pointer_loads). Atomic-dQ launches keep pointer loads (launch.prepare; untimed with
    # descriptors).
    # dp_first (`python bench/tune_triton.py --d 64 128 192 256`): the dK pass's dP^T multiplied
    # beside S^T is faster with some tiles and slower with others, so each config says. D 64: 32 x
    # 128 tiles on 4 stages 1.185 against 1.232 ms (3 stages, dP^T after dV) non-causal; under a
    # band 64 x 64 tiles 0.727 against 0.826 ms (the table's 32 x 128). D 128: 2.10 against 2.17 ms
    # non-causal; under a band neutral (1.270 against 1.277 ms) with the band's exp2 in each branch;
    # with the select-only edge branch the band config takes it (below). D 192 non-causal: the
    # one-pass kernel (32 x 128, 2 stages) 4.82 ms against 5.08 split, where dP^T after dV runs it
    # in 5.62; under a band it is slower (2.74 against 2.52 ms), left off. D 256 (split): within 2 %
    # either way, off.
    "sm90": ArchConfigs("sm90", 232_448, atomic_dq=True, tiers=(
        (64, BlockConfig(32, 128, 64, 64, score_rows=True, num_warps=4, num_stages=4, num_stages_dq=3, tma=True,
                         dp_first=True, **_SM90_DROPOUT[64],
                         # under a band the mask port's dropout runs the band's own tiles
                         # (dK/dV 1.336 against 1.794 ms for the dropout config's 32 x 64, D 64
                         # causal, `python bench/device_check.py --speed-profile`, H100); a
                         # drawn mask keeps the dropout config
                         banded=BlockConfig(64, 64, 64, 64, score_rows=True, num_warps=4, num_stages=3, tma=True,
                                            dp_first=True, drawn_dropout=_SM90_DROP_D64))),
        (128, BlockConfig(64, 128, 128, 64, score_rows=True, num_warps=8, num_stages=3, num_warps_dq=8, tma=True,
                          dp_first=True, **_SM90_DROPOUT[128],
                          # score modifiers (no dropout): dK/dV 32 x 64 on 4 warps, 1.02-1.13x
                          # the tiles above with a bias, dBias, ALiBi slopes or a softcap on an
                          # H100 (`python bench/speed_batch.py`, B4 H16 S4096 bf16 non-causal),
                          # no spill where they spilled 192 bytes with the bias. dQ 64 x 64 on
                          # 4 warps, 1.14-1.19x the tiles above (128 x 64 on 8 warps) on every
                          # modifier row there (`python bench/device_check.py`: 2.948 against
                          # 3.401 ms with a bias, 2.013 against 2.392 with ALiBi slopes, 2.420
                          # against 2.882 with a softcap); it spills nothing with the bias read
                          # in vectors, 104-472 bytes in the other aligned variants (ALiBi, 64-bit
                          # offsets), within their known spills
                          # dBias stored by the dK pass as it forms dS (fused_dbias), not by
                          # a pass of its own recomputing S and dP: the bias-with-dBias backward
                          # 8.951 against 33.895 ms (3.79x; `python bench/device_check.py
                          # --speed-profile`, H100), 208 bytes spilled (its dK/dV kernel at 255
                          # registers), within the aligned variants' known spills
                          modifiers=BlockConfig(32, 64, 64, 64, score_rows=True, num_warps=4, num_stages=3,
                                                num_warps_dq=4, num_stages_dq=1, tma=True, fused_dbias=True),
                          # a dK pass reloading V per query head (H_k != H_v) with the
                          # score modifiers' tiles needs more shared memory than 3 stages leave
                          unshared_stages=2,
                          pointer_loads=BlockConfig(32, 64, 128, 64, score_rows=True, num_warps=4, num_stages=3,
                                                    num_warps_dq=8),
                          # under a band 32 x 64 tiles; 3 stages and dp_first, which with
                          # the select-only edge branch ran 1.03x 4 stages without dp_first
                          # at D 128 causal
                          banded=BlockConfig(32, 64, 128, 64, score_rows=True, num_warps=4, num_stages=3,
                                             num_warps_dq=8, num_stages_dq=3, tma=True,
                                             dp_first=True, atomic_dq=_SM90_ATOMIC_D128,
                                             **_SM90_DROPOUT[128]),
                          atomic_dq=_SM90_ATOMIC_D128)),
        (192, BlockConfig(32, 128, 128, 32, score_rows=True, num_warps=8, num_stages=2, num_warps_dq=8,
                          num_stages_dq=3, two_chunks=True, dp_first=True,
                          dv_pass=(64, 128, 8, 2), unshared_stages=1, tma=True, **_SM90_DROPOUT[192],
                          banded=BlockConfig(32, 128, 128, 32, score_rows=True, num_warps=8, num_stages=2,
                                             num_warps_dq=8, num_stages_dq=3, two_chunks=True,
                                             unshared_stages=1, tma=True, **_SM90_DROPOUT[192]))),
        (256, BlockConfig(32, 128, 128, 32, score_rows=True, num_warps=8, num_stages=3, num_warps_dq=8,
                          num_stages_dq=3, split_dkdv=True, dv_pass=(64, 128, 8, 2),
                          unshared_stages=1, tma=True, **_SM90_DROPOUT[256])),
    )),
    # sm120 and gfx942 are not run here: their rows are chosen from the compiled kernels'
    # resources (engines/triton/resources.json, `python bench/triton_resources.py`) over every
    # variant the launcher can choose; the worst variants are the unaligned (VEC=1) ones with
    # 64-bit tile offsets (WIDE), whose per-element offsets take the registers.
    # sm120: no spills in any variant. D<=64 runs 2 stages and D<=128 2 stages (3 and 1 spilled
    # 8 bytes in a few ragged and 64-bit-offset variants once the kernels held no mask tiles
    # across their loops), D<=256 16 x 16 dQ tiles (16 x 32 spilled 24 bytes with the score
    # modifiers' one stage). These larger rows spilled in 103 of 216
    # variants: D<=64 (32, 64, 64, 32, 4 warps, 3 stages) up to 632 bytes (dK, VEC=1 WIDE),
    # D<=128 (64, 64, 64, 64, 8 warps, 2 stages) up to 1120 bytes (dK, VEC=1 WIDE; 16 bytes
    # aligned dK/dV), D<=256 (32, 32, 64, 32, 8 warps, 1 stage) up to 280 bytes (dQ, VEC=1).
    # Smaller dK/dV tiles and 32x32 / 16x32 dQ tiles fit 255 registers. Small spills move
    # from variant to variant with the stages and warps (ptxas): at D<=128, (32, 32, 4 warps,
    # 2 stages) spilled 384 bytes in VEC=1 dK and (32, 32, 8 warps) 184 in VEC=1 WIDE dK.
    # Untimed: no sm120 here.
    "sm120": ArchConfigs("sm120", 101_376, (
        (64, BlockConfig(32, 32, 32, 32, num_warps=8, num_stages=2, num_warps_dq=4)),
        (128, BlockConfig(16, 32, 32, 32, num_warps=4, num_stages=2, num_warps_dq=8)),
        (256, BlockConfig(16, 32, 16, 16, num_warps=8, num_stages=1)),
    )),
    # gfx942: 2 waves per SIMD at D<=128 (waves_per_eu=2: at most 256 VGPRs incl. AGPRs).
    # Before (waves_per_eu=1, D<=64 (32, 128, 128, 32), D<=128 (32, 64, 64, 32)) every dK/dV
    # variant ran 1 wave per SIMD, up to 308 / 402 VGPRs. (32, 64) dK/dV tiles at D<=128 with
    # waves_per_eu=2 spilled 284 bytes of scratch (VEC=1 WIDE), (32, 32) with 4 warps 68:
    # 8 warps (two per SIMD) spread the tile; (64, 32) dQ tiles spilled 108 bytes (VEC=1),
    # (32, 32) do not. D<=256 keeps 1 wave per SIMD (its floor): its
    # variants need up to 400 VGPRs at (16, 32, 32, 16); two waves would need <= 256.
    "gfx942": ArchConfigs("gfx942", 65_536, (
        # with dropout the dQ kernel's 128-row tiles spilled 104 bytes where ALiBi slopes
        # join the mask (`python bench/triton_resources.py --arch gfx942`): 64 rows there
        (64, _amd(32, 64, 128, 32, waves_per_eu=2, dropout=_amd(32, 64, 64, 32, waves_per_eu=2),
                  drawn_dropout=_amd(32, 64, 64, 32, waves_per_eu=2))),
        (128, _amd(32, 32, 32, 32, waves_per_eu=2, num_warps=8, num_warps_dq=4)),
        (256, _amd(16, 32, 32, 16)),
    )),
    # The interpreter runs every program in Python over numpy tiles: its cost is the number
    # of programs and loop trips, so 64-wide tiles are about 3x faster than 32-wide ones.
    # Its 192 row runs the two-chunk kernels (D in (128, 192]), so that the CPU tests run them.
    # Descriptor loads (tma) as on sm90, so that the CPU tests run both kinds of loads: the
    # aligned padded graphs through descriptors, the others through pointers. dp_first at
    # D <= 128 only, so that they run both orders of the dK pass's products.
    "cpu": ArchConfigs("cpu", 1 << 40, atomic_dq=True, tiers=(
        (128, BlockConfig(64, 64, 64, 64, score_rows=True, num_warps=4, num_stages=1, tma=True, dp_first=True)),
        (192, BlockConfig(64, 64, 64, 64, score_rows=True, num_warps=4, num_stages=1, two_chunks=True,
                          tma=True)),
        (256, BlockConfig(64, 64, 64, 64, score_rows=True, num_warps=4, num_stages=1, tma=True)),
    )),
}


def block_d(d: int) -> int:
    """The padded head-dim tile: a power of two, at least 16."""
    p = MIN_BLOCK
    while p < d:
        p *= 2
    return p


CHUNK = 128   # the first column chunk of the two-chunk kernels (kernels.py, "Two chunks")


def two_chunk_tiles(d_qk: int, d_v: int) -> tuple[int, int] | None:
    """(BLOCK_DQK2, BLOCK_DV2): the second chunks' tiles where both head dims pass one
    CHUNK and CHUNK plus the wider second chunk is narrower than one padded tile (e.g. 64
    for D 192: 128 + 64 columns, not 256); None otherwise."""
    if min(d_qk, d_v) <= CHUNK:
        return None
    tiles = (block_d(d_qk - CHUNK), block_d(d_v - CHUNK))
    return tiles if CHUNK + max(tiles) < block_d(max(d_qk, d_v)) else None


def tier_key(d_qk: int, d_v: int) -> int:
    """The width a tier is chosen by: CHUNK plus the wider second chunk where
    two_chunk_tiles applies (an arch with no tier for it gets its next, padded one), else the
    padded head-dim tile."""
    tiles = two_chunk_tiles(d_qk, d_v)
    return CHUNK + max(tiles) if tiles else block_d(max(d_qk, d_v))


def config_for(arch: str, d_qk: int, d_v: int, banded: bool = False,
               atomic_dq: bool = False) -> BlockConfig:
    """The tier's config for these head dims; its `banded` one for a graph with a band, its
    `atomic_dq` one for an atomic-dQ launch."""
    cfg = ARCHS[arch].for_block_d(tier_key(d_qk, d_v))
    cfg = cfg.banded if banded and cfg.banded is not None else cfg
    return cfg.atomic_dq if atomic_dq and cfg.atomic_dq is not None else cfg


def shrink(cfg: BlockConfig) -> BlockConfig | None:
    """The next smaller config to try when a launch runs out of resources, or None."""
    if (cfg.num_stages > 1 or (cfg.num_stages_dq or 1) > 1 or cfg.dv_pass is not None
            or cfg.banded is not None or cfg.atomic_dq is not None
            or cfg.pointer_loads is not None or cfg.switches() != (cfg,)):
        return replace(cfg, num_stages=1, num_stages_dq=None, dv_pass=None, banded=None,
                       atomic_dq=None, pointer_loads=None, modifiers=None, dropout=None,
                       drawn_dropout=None)
    blocks = (cfg.block_m1, cfg.block_n1, cfg.block_m2, cfg.block_n2)
    if max(blocks) <= MIN_BLOCK:
        return None
    big = max(blocks)
    halved = [max(MIN_BLOCK, b // 2) if b == big else b for b in blocks]
    return replace(cfg, block_m1=halved[0], block_n1=halved[1], block_m2=halved[2],
                   block_n2=halved[3])
