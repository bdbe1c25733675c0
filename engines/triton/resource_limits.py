"""What a compiled Triton kernel variant may use on each target arch: the per-SM / per-CU limits,
the occupancy a variant's registers and shared memory allow, the spills accepted (and why),
and `check`, which names what is wrong with a measured variant (resource_measure.measure)
on its arch. engines/triton/resources.py enumerates the variants and writes the report.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class NvidiaLimits:
    """Per-SM limits of a CUDA compute capability. Source: CUDA C++ Programming Guide,
    "Technical Specifications per Compute Capability" (table 23 in 12.8: 9.0 and 12.0
    columns) and the CUDA occupancy calculator's allocation rules (registers are allocated
    per warp in units of 256; the driver reserves 1 KiB of shared memory per block)."""
    registers_per_sm: int = 65_536
    register_unit: int = 256           # per-warp allocation granularity
    max_registers_per_thread: int = 255
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    smem_per_sm: int = 233_472         # bytes the SM can give all its resident blocks
    smem_per_block: int = 232_448      # the most one block may have (configs.ARCHS smem_bytes)
    smem_reserved_per_block: int = 1_024
    #: floor on resident warps per SM (every tier); below it the check fails
    min_warps_per_sm: int = 4
    kind: str = "nvidia"


@dataclass(frozen=True)
class AmdLimits:
    """Per-CU / per-SIMD limits of a CDNA arch. Source for gfx942 (MI300): LLVM AMDGPUUsage
    ("gfx90a, gfx942: 512 VGPRs per SIMD lane, shared between ArchVGPRs and AccVGPRs,
    allocated in granules of 8"; GCNSubtarget: 8 waves per EU on gfx90a+, 800 SGPRs per
    SIMD, SGPR granule 16) and the CDNA3 ISA guide (64 KiB LDS per CU, 4 SIMDs per CU)."""
    vgprs_per_simd_lane: int = 512
    vgpr_granule: int = 8
    sgprs_per_simd: int = 800
    sgpr_granule: int = 16
    max_waves_per_simd: int = 8
    simds_per_cu: int = 4
    lds_per_cu: int = 65_536
    lds_per_workgroup: int = 65_536
    #: floor on waves per SIMD, per tier (largest BLOCK_D served -> floor)
    min_waves_per_simd: tuple[tuple[int, int], ...] = ()
    kind: str = "amd"


LIMITS: dict[str, NvidiaLimits | AmdLimits] = {
    # H100/H200: 228 KiB shared memory per SM, at most 227 KiB per block. Floor: one block
    # of 4 warps per SM; the sm90 rows are tuned on the H200 for time, not occupancy (the
    # D 128 dQ kernel runs one 8-warp block per SM, its fastest measured choice).
    "sm90": NvidiaLimits(min_warps_per_sm=4),
    # RTX 50 / RTX PRO 6000 Blackwell (CC 12.0): 48 warps and 100 KiB shared memory per SM,
    # at most 99 KiB per block. Floor: 4 warps per SM, as sm90.
    "sm120": NvidiaLimits(max_warps_per_sm=48, smem_per_sm=102_400, smem_per_block=101_376,
                          min_warps_per_sm=4),
    # MI300X: floor 2 waves per SIMD at D <= 128; at D 256 one wave (see the
    # gfx942 row of configs.py for why two do not fit there).
    "gfx942": AmdLimits(min_waves_per_simd=((128, 2), (256, 1))),
}

#: spills accepted on an arch whose configs are tuned on hardware: (arch, label glob) ->
#: (most spill bytes accepted, reason). Only sm90 has entries: its rows are the H200's
#: measured fastest (bench/tune_triton.py) and are not changed for the other variants' sake.
KNOWN_SPILLS: dict[tuple[str, str], tuple[int, str]] = {
    ("sm90", "*/vec1/*"): (3_584, "unaligned (VEC=1) layouts address every element with its own "
                                  "strides; the H200-tuned tiles (e.g. D<=256 dK/dV 32x32, 4 "
                                  "warps, 3 stages) spill up to 3.5 KB there (dV D256); the "
                                  "aligned layouts, which the timed shapes use, spill far less"),
    ("sm90", "*/vec8/*"): (544, "the H200's fastest tiles (bench/tune_triton.py) at 255 "
                                "registers: dK/dV and dK up to 536 bytes at D<=256, up to 256 "
                                "at D<=64 and 96 at D<=128 (64-bit offsets); kept for their "
                                "measured speed"),
    ("sm90", "*/d[0-9][0-9]/*vec8/*/mods*"): (872, "the H200-tuned tiles with the score modifiers (bias and "
                                      "softcap tiles on top of the plain kernels' 255 "
                                      "registers): dK/dV up to 872 bytes at D<=64; untimed"),
    ("sm90", "*/d256/*vec8/*/mods*"): (1408, "the split dK and dV passes' wide D<=256 tiles "
                                             "(128 rows, 8 warps; configs.py, sm90) with the "
                                             "bias and softcap tiles on top, at 2 stages "
                                             "(launch.SPLIT_MODIFIER_STAGES): dK/dV up to 1.4 "
                                             "KB; ran every D256 modifier case on the H200, "
                                             "untimed"),
    ("sm90", "*/d128/*vec8/wide/*/mods/tma"): (704, "D<=128's dK/dV tiles with TMA "
                                                     "descriptors (64 x 128, 8 warps: the "
                                                     "fastest measured on the H200) with the bias "
                                                     "and softcap tiles "
                                                     "and 64-bit offsets: dK/dV 680 bytes; "
                                                     "untimed"),
    ("sm90", "*/vec1/*/mods"): (3632, "as the plain unaligned variants, with the bias and "
                                      "softcap tiles on top: dV up to 3.6 KB at D<=256"),
    ("sm90", "dv/d256/*vec8/wide/*[ed]"): (648, "the dV-only pass of H_k != H_v at D<=256 (dV-pass "
                                             "tiles 64 x 128, 8 warps, 1 stage: the fastest "
                                             "measured dV pass) with 64-bit tile offsets, only "
                                             "for tiles spanning 2^31 elements or more"),
    ("sm90", "*/vec8/*/atomic-dq"): (1856, "atomic dQ (TritonAtomicDqEngine): the dK pass also "
                                           "holds this block's dQ share ([M, D] fp32): about 200 "
                                           "bytes in the plain dK/dV variant with its fastest "
                                           "measured tiles (64 x 128, 8 "
                                           "warps), up to 1 KB with the score modifiers and "
                                           "64-bit offsets; an opt-in engine, slower than the "
                                           "deterministic one on the H200"),
    ("sm90", "dv/d128/atomic-config/*vec8/wide/*/mods"): (584, "the dV-only pass (H_k != H_v) "
                                                               "with the atomic-dQ tiles, the "
                                                               "score modifiers and 64-bit offsets"),
    ("sm90", "*/vec8/*/mods/alibi*"): (960, "the modifier variants with ALiBi's term on top (ALiBi "
                                             "slopes, and every modifier on a ragged graph: "
                                             "resources.REPRESENTED): dK/dV up to 960 bytes at "
                                             "D<=64 with 64-bit offsets, 624 at D<=128 with TMA; "
                                             "untimed"),
    ("sm90", "d*-2c/d192/*vec8/wide/dense/mods"): (712, "the two head-dim chunks with the "
                                                        "bias and softcap tiles and 64-bit "
                                                        "tile offsets (only for tiles spanning "
                                                        "2^31 elements or more): dV up to 712 "
                                                        "bytes; untimed"),
}


def known_spill(arch: str, name: str, spill_bytes: int) -> str | None:
    """The reason a variant's spill is accepted, or None."""
    for (a, pattern), (most, reason) in KNOWN_SPILLS.items():
        if a == arch and fnmatch.fnmatchcase(name, pattern) and spill_bytes <= most:
            return reason
    return None


def _floor(limits, tier: int) -> int:
    if limits.kind == "nvidia":
        return limits.min_warps_per_sm
    return next(f for t, f in limits.min_waves_per_simd if tier <= t)


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def nvidia_occupancy(limits: NvidiaLimits, registers: int, shared: int, warps: int) -> dict:
    """Resident blocks and warps per SM, and which resource bounds them."""
    per_warp = _round_up(max(registers, 1) * 32, limits.register_unit)
    by = {"registers": (limits.registers_per_sm // per_warp) // warps,
          "shared": limits.smem_per_sm // (shared + limits.smem_reserved_per_block),
          "warps": limits.max_warps_per_sm // warps,
          "blocks": limits.max_blocks_per_sm}
    blocks = min(by.values())
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps,
            "limited_by": sorted(k for k, v in by.items() if v == blocks)}


def amd_occupancy(limits: AmdLimits, vgprs: int, sgprs: int, lds: int, waves: int) -> dict:
    """Waves per SIMD (EU) and which resource bounds them; a workgroup's waves spread over
    the CU's SIMDs."""
    per_simd = -(-waves // limits.simds_per_cu)
    groups = limits.lds_per_cu // lds if lds else 10 ** 9
    by = {"vgprs": limits.vgprs_per_simd_lane // _round_up(max(vgprs, 1), limits.vgpr_granule),
          "sgprs": limits.sgprs_per_simd // _round_up(max(sgprs, 1), limits.sgpr_granule),
          "lds": (groups * waves) // limits.simds_per_cu if groups * per_simd else 0,
          "waves": limits.max_waves_per_simd}
    w = min(by.values())
    return {"waves_per_simd": w, "limited_by": sorted(k for k, v in by.items() if v == w)}


def check(arch: str, name: str, entry: Mapping) -> list[str]:
    """What is wrong with a variant's resources on its arch: spills (unless KNOWN_SPILLS
    says why), shared memory / LDS past the per-block budget, occupancy under the floor."""
    limits = LIMITS[arch]
    tier = int(name.split("/")[1][1:])
    problems = []
    # AMD SGPR spills go to VGPR lanes (v_writelane / v_readlane), not to memory: reported
    # (sgpr_spill_count), not failed; memory spills show as ScratchSize or vgpr_spill_count
    spilled = entry["spill_bytes"] or entry.get("spill_stores") or entry.get("vgpr_spill_count")
    if spilled and known_spill(arch, name, entry["spill_bytes"]) is None:
        problems.append(f"spills ({entry['spill_bytes']} bytes)")
    budget = limits.smem_per_block if limits.kind == "nvidia" else limits.lds_per_workgroup
    if entry["shared_bytes"] > budget:
        problems.append(f"shared memory {entry['shared_bytes']} > {budget}")
    occ = entry["occupancy"]
    have = occ["warps_per_sm"] if limits.kind == "nvidia" else occ["waves_per_simd"]
    floor = _floor(limits, tier)
    if have < floor:
        unit = "warps per SM" if limits.kind == "nvidia" else "waves per SIMD"
        problems.append(f"occupancy {have} {unit} < floor {floor} (limited by "
                        f"{', '.join(occ['limited_by'])})")
    return problems
