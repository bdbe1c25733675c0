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


def _amd(m1, n1, m2, n2) -> BlockConfig:
    return BlockConfig(m1, n1, m2, n2, num_warps=4, num_stages=1, waves_per_eu=1,
                       matrix_instr_nonkdim=16)


ARCHS: dict[str, ArchConfigs] = {
    # Chosen from ptxas resource usage of the compiled kernels (no register spills on sm90)
    # and their shared memory; `python -m bundlegen.engines.triton.aot` re-checks every arch and tier.
    # sm90: the fastest of `python bench/tune_triton.py` on an H200 (bf16, B4 H16 S4096, the
    # dK/dV and dQ kernels timed apart, causal and not: one config wins or ties for both).
    "sm90": ArchConfigs("sm90", 232_448, (
        (64, BlockConfig(32, 128, 64, 64, num_warps=4, num_stages=3)),
        (128, BlockConfig(32, 64, 128, 64, num_warps=4, num_stages=3, num_warps_dq=8)),
        (256, BlockConfig(32, 32, 128, 32, num_warps=4, num_stages=3, num_warps_dq=8)),
    )),
    "sm120": ArchConfigs("sm120", 101_376, (
        (64, BlockConfig(32, 64, 64, 32, num_warps=4, num_stages=3)),
        (128, BlockConfig(64, 64, 64, 64, num_warps=8, num_stages=2)),
        (256, BlockConfig(32, 32, 64, 32, num_warps=8, num_stages=1)),
    )),
    "gfx942": ArchConfigs("gfx942", 65_536, (
        (64, _amd(32, 128, 128, 32)),
        (128, _amd(32, 64, 64, 32)),
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
