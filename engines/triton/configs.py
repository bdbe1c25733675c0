"""Per-arch block configurations of the Triton backward kernels.

One table per arch, keyed by the padded head dim (BLOCK_D = next power of two >= max(16, D),
taken over D_qk and D_v). Starting points came from FlexAttention's defaults (sm90, sm120)
and aiter's gfx942 configs (see shared/notes/triton-backward.md); they were then trimmed
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

    def for_block_d(self, block_d: int) -> BlockConfig:
        for limit, cfg in self.tiers:
            if block_d <= limit:
                return cfg
        raise ValueError(f"{self.arch}: no config for BLOCK_D={block_d}")


def _amd(m1, n1, m2, n2, waves_per_eu=1, **kw) -> BlockConfig:
    return BlockConfig(m1, n1, m2, n2, **dict(dict(num_warps=4, num_stages=1), **kw),
                       waves_per_eu=waves_per_eu, matrix_instr_nonkdim=16)


ARCHS: dict[str, ArchConfigs] = {
    # Chosen from ptxas resource usage of the compiled kernels and their shared memory;
    # engines/triton/resources.json has every variant's (sm90 spills in its unaligned and
    # some aligned variants: resources.KNOWN_SPILLS).
    # sm90: the fastest of `python bench/tune_triton.py` on an H200 (bf16, B4 H16 S4096, the
    # dK/dV and dQ kernels timed apart, causal and not: one config wins or ties for both).
    "sm90": ArchConfigs("sm90", 232_448, (
        (64, BlockConfig(32, 128, 64, 64, num_warps=4, num_stages=3)),
        (128, BlockConfig(32, 64, 128, 64, num_warps=4, num_stages=3, num_warps_dq=8)),
        (256, BlockConfig(32, 32, 128, 32, num_warps=4, num_stages=3, num_warps_dq=8)),
    )),
    # sm120 and gfx942 are not run here: their rows are chosen from the compiled kernels'
    # resources (engines/triton/resources.json, `python bench/triton_resources.py`) over every
    # variant the launcher can choose; the worst variants are the unaligned (VEC=1) ones with
    # 64-bit tile offsets (WIDE), whose per-element offsets take the registers.
    # sm120: spills in 2 of 216 variants (8 bytes each, below). The rows before (issue 18) spilled in 103 of 216
    # variants: D<=64 (32, 64, 64, 32, 4 warps, 3 stages) up to 632 bytes (dK, VEC=1 WIDE),
    # D<=128 (64, 64, 64, 64, 8 warps, 2 stages) up to 1120 bytes (dK, VEC=1 WIDE; 16 bytes
    # aligned dK/dV), D<=256 (32, 32, 64, 32, 8 warps, 1 stage) up to 280 bytes (dQ, VEC=1).
    # Smaller dK/dV tiles and 32x32 / 16x32 dQ tiles fit 255 registers in 214 of
    # 216 variants. Not met: D<=128 dK-only, unaligned (VEC=1), dense, both orders
    # spill 8 bytes (one 64-bit value; listed in resources.KNOWN_SPILLS). Every D<=128 row
    # tried moves a small spill elsewhere (ptxas): (32, 32, 4 warps, 2 stages) 384 bytes in
    # VEC=1 dK; (32, 32, 8 warps) 184 in VEC=1 WIDE dK; (16, 32, 8 warps, 2 stages) 8-16 in
    # aligned dV; (16, 32, 8 warps, 1 stage) 8-16 in aligned dK; (16, 32, 4 warps, 1 stage)
    # below: 8 in VEC=1 dK only. 16x16 tiles would be next (untried: no sm120 to time them).
    "sm120": ArchConfigs("sm120", 101_376, (
        (64, BlockConfig(32, 32, 32, 32, num_warps=8, num_stages=3, num_warps_dq=4)),
        (128, BlockConfig(16, 32, 32, 32, num_warps=4, num_stages=1, num_warps_dq=8)),
        (256, BlockConfig(16, 32, 16, 32, num_warps=8, num_stages=1)),
    )),
    # gfx942: 2 waves per SIMD at D<=128 (waves_per_eu=2: at most 256 VGPRs incl. AGPRs).
    # Before (waves_per_eu=1, D<=64 (32, 128, 128, 32), D<=128 (32, 64, 64, 32)) every dK/dV
    # variant ran 1 wave per SIMD, up to 308 / 402 VGPRs. (32, 64) dK/dV tiles at D<=128 with
    # waves_per_eu=2 spilled 284 bytes of scratch (VEC=1 WIDE), (32, 32) with 4 warps 68:
    # 8 warps (two per SIMD) spread the tile; (64, 32) dQ tiles spilled 108 bytes (VEC=1),
    # (32, 32) do not. D<=256 keeps 1 wave per SIMD (its floor): its
    # variants need up to 400 VGPRs at (16, 32, 32, 16); two waves would need <= 256.
    "gfx942": ArchConfigs("gfx942", 65_536, (
        (64, _amd(32, 64, 128, 32, waves_per_eu=2)),
        (128, _amd(32, 32, 32, 32, waves_per_eu=2, num_warps=8, num_warps_dq=4)),
        (256, _amd(16, 32, 32, 16)),
    )),
    # The interpreter runs every program in Python over numpy tiles: its cost is the number
    # of programs and loop trips, so 64-wide tiles are about 3x faster than 32-wide ones.
    "cpu": ArchConfigs("cpu", 1 << 40, (
        (256, BlockConfig(64, 64, 64, 64, num_warps=4, num_stages=1)),
    )),
}


def block_d(d: int) -> int:
    """The padded head-dim tile: a power of two, at least 16."""
    p = MIN_BLOCK
    while p < d:
        p *= 2
    return p


def config_for(arch: str, d_qk: int, d_v: int) -> BlockConfig:
    return ARCHS[arch].for_block_d(block_d(max(d_qk, d_v)))


def shrink(cfg: BlockConfig) -> BlockConfig | None:
    """The next smaller config to try when a launch runs out of resources, or None."""
    if cfg.num_stages > 1 or (cfg.num_stages_dq or 1) > 1:
        return replace(cfg, num_stages=1, num_stages_dq=None)
    blocks = (cfg.block_m1, cfg.block_n1, cfg.block_m2, cfg.block_n2)
    if max(blocks) <= MIN_BLOCK:
        return None
    big = max(blocks)
    halved = [max(MIN_BLOCK, b // 2) if b == big else b for b in blocks]
    return replace(cfg, block_m1=halved[0], block_n1=halved[1], block_m2=halved[2],
                   block_n2=halved[3])
