"""The resource report (engines/triton/resources.json) covers every kernel variant the launcher
can choose, on every target arch, and passes the check (no spill, shared memory / LDS within
budget, occupancy at or above the arch's floor); a few variants per arch are recompiled here
(no GPU: Triton targets the arch ahead of time) and must match the report, so a config that
spills, or any config change without a re-run of `python bench/triton_resources.py`, fails."""
import dataclasses
import fnmatch
import json
import os
import subprocess
import sys

import pytest

from bundlegen.engines.triton import aot, configs
from bundlegen.engines.triton import resources as R
from bundlegen.engines.triton.aot import compile_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = R.load_report()

#: recompiled in CI, per arch: the dK/dV kernel at the two tiers where sm120 used to spill,
#: the variants with the most registers (64-bit offsets, unaligned, ragged), and with the
#: score modifiers the dK/dV and dBias kernels (aligned: gfx942 serves no unaligned modifier
#: variant), and with dropout the dK pass and the dQ kernel drawing their mask
CI_SUBSET = ("dkdv/d64/vec8/narrow/dense",
             "dk/d128/vec1/wide/dense/mods/drawn",
             "dq/d128/vec1/wide/dense/mods/drawn",
             "dkdv/d128/vec8/narrow/dense",
             "dk/d128/vec1/wide/ragged",
             "dq/d256/vec1/wide/ragged",
             "dkdv/d128/vec8/wide/dense/mods",
             "dbias/d64/vec8/wide/dense")
#: and per arch, what only that arch compiles (sm90's TMA descriptor loads, both kernels,
#: and its banded D<=128 config)
CI_SUBSET_OF = {"sm90": ("dkdv/d128/vec8/narrow/dense/tma",
                         "dq/d128/banded/vec8/narrow/dense/tma",
                         "dk/d128/banded/vec1/wide/ragged")}


def _in_subprocess(code: str, cache_dir=None, args=(), **env):
    """Triton is imported in one mode per process and the engine tests import it under the
    interpreter: enumerating and compiling for a GPU target needs a process of its own.
    `cache_dir`: Triton's cache there (an empty folder: a compile, not a cache hit); `args`:
    its sys.argv[1:]; `env`: more of its environment."""
    out = subprocess.run([sys.executable, "-c", code, *args], env=dict(compile_env(cache_dir), **env),
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_report_is_canonical_and_made_with_the_current_configs():
    with open(R.REPORT) as f:
        assert f.read() == R.report_text(REPORT)
    assert set(REPORT["archs"]) == set(R.ARCHS)
    assert REPORT["io_dtype"] == R.IO and REPORT["triton_version"]
    for arch in R.ARCHS:
        header = {k: v for k, v in REPORT["archs"][arch].items() if k != "variants"}
        assert header == R.json_form(R.arch_header(arch)), (
            f"{arch}: configs, limits or known spills changed since the report was made: "
            "run python bench/triton_resources.py")


@pytest.mark.parametrize("arch", R.ARCHS)
def test_every_reported_variant_passes_the_check(arch):
    variants = REPORT["archs"][arch]["variants"]
    failing = {n: R.check(arch, n, e) for n, e in variants.items() if R.check(arch, n, e)}
    assert not failing, failing
    assert all(e["problems"] == [] for e in variants.values())


@pytest.mark.parametrize("arch", R.ARCHS)
def test_report_covers_the_launcher_and_matches_a_fresh_compile(arch):
    """Every variant launch.py chooses (probe grid and every bundle's graphs) is in the
    report with the same constexprs and options, and nothing else is; the CI subset,
    each variant compiled alone as the sweep compiles it (`measure_alone`), has the reported
    resources (exactly, with the report's Triton version) and passes the check."""
    code = ("import json; from bundlegen.engines.triton import resources as R; "
            f"v = R.sweep_variants({arch!r}, R.launcher_choices({arch!r}, R.bundle_graphs())); "
            "print(json.dumps({'variants': v, 'triton': R.triton_version()}))")
    got = _in_subprocess(code)
    # where an arch's config stores dBias in the dK pass (sm90's D 128 modifiers config),
    # its modifier dK/dV variants are the fused ones
    subset = tuple(n if n in got["variants"] else f"{n}/fused-dbias"
                   for n in CI_SUBSET + CI_SUBSET_OF.get(arch, ()))
    reported = REPORT["archs"][arch]["variants"]
    assert R.uncovered(got["variants"], reported) == []
    assert set(reported) == set(got["variants"]), "the report has variants the launcher never chooses"
    measured = {n: R.measure_alone(arch, got["variants"][n]) for n in subset}
    failing = {n: R.check(arch, n, e) for n, e in measured.items() if R.check(arch, n, e)}
    assert not failing, failing
    for name, fresh in measured.items():
        if got["triton"] == REPORT["triton_version"]:
            stored = {k: reported[name][k] for k in fresh}
            assert fresh == stored, (name, fresh, stored)


@pytest.mark.parametrize("arch", ["sm90", "gfx942"])
def test_figures_do_not_depend_on_where_the_checkout_is(arch, tmp_path):
    """The kernel source's path is in a binary's debug sections (line info), so the file grows
    with the checkout's folder: compiled with line info and without, a variant's figures are
    the same, though its binary is not (CI's checkout sits in another folder than the one the
    report was made in). The variant as the report has it (the test above checks it is the
    launcher's): enumerating the launcher's choices in each of its two processes would be most
    of its time."""
    var = {k: REPORT["archs"][arch]["variants"]["dkdv/d64/vec8/narrow/dense"][k]
           for k in ("kernel", "constexprs", "options", "io")}
    code = ("import json, sys; from bundlegen.engines.triton import resources as R; "
            f"k = R.compile_variant({arch!r}, json.loads(sys.argv[1])); "
            f"print(json.dumps([R.measure({arch!r}, None, k), len(k.asm[{'cubin' if arch.startswith('sm') else 'hsaco'!r}])]))")
    (with_lines, with_size), (without_lines, without_size) = (
        _in_subprocess(code, cache_dir=tmp_path / f"cache-{off}", args=[json.dumps(var)],
                       TRITON_DISABLE_LINE_INFO=off)
        for off in ("0", "1"))
    assert with_size > without_size, "no debug sections: the check below proves nothing"
    assert with_lines == without_lines


def test_code_bytes_refuses_what_is_not_a_64_bit_elf():
    with pytest.raises(ValueError, match="64-bit little-endian ELF"):
        R.code_bytes(b"\x7fELF\x01\x01" + bytes(58))   # a 32-bit one


def _choice(**overrides) -> R.Choice:
    cfg = configs.ARCHS["sm120"].for_block_d(128)
    cons = dict(HAS_LEFT=False, HAS_RIGHT=True, COMPUTE_DK=True,
                COMPUTE_DV=True, UPCAST=False, WIDE=False, VEC=8, BLOCK_M=cfg.block_m1,
                BLOCK_N=cfg.block_n1, BLOCK_DQK=64, BLOCK_DV=64, RAGGED=False,
                CU_Q=None, CU_KV=None, T_q=None, T_kv=None, KV_SHARED=True,
                HAS_BIAS=False, SOFTCAP=False, BLOCK_DQK2=0, BLOCK_DV2=0, EVEN=False,
                DP_FIRST=cfg.dp_first, **{a: None for a in R.MODIFIER_ARGS}, **aot.NO_ATOMIC_DQ,
                **aot.no_tma("bwd_dkdv"))
    cons.update(overrides)
    return R.Choice("bwd_dkdv", tuple(sorted(cons.items())),
                    tuple(sorted(cfg.launch_kwargs().items())), "fp16", 128)


def test_a_choice_the_report_lacks_is_found():
    """The coverage check fails on a launch the sweep does not compile: a constexpr value
    it never saw (VEC=4), and a constexpr it has no rule for (refused outright)."""
    reported = REPORT["archs"]["sm120"]["variants"]
    name, var = R.variant_of("sm120", _choice())
    assert name == "dkdv/d128/vec8/narrow/dense"
    assert var["constexprs"]["HAS_LEFT"] and var["io"] == "bf16"   # represented by the band
    fresh = {name: var}
    if R.uncovered(fresh, reported):   # the configs may have moved on; the rule has not
        pytest.fail(f"{R.uncovered(fresh, reported)}")
    n4, v4 = R.variant_of("sm120", _choice(VEC=4))
    assert R.uncovered({n4: v4}, reported) == [n4]
    changed = dict(var, options=dict(var["options"], num_warps=2))
    assert R.uncovered({name: changed}, reported) == [name]
    with pytest.raises(ValueError, match="NEW_FLAG"):
        R.variant_of("sm120", _choice(NEW_FLAG=True))


def _runtime(choice: R.Choice, names) -> R.Choice:
    """`choice` with the arguments `names` passed at run time (not constexprs)."""
    return dataclasses.replace(choice, constexprs=tuple(
        (k, v) for k, v in choice.constexprs if k not in names))


def test_any_modifier_maps_to_the_variant_with_all_of_them():
    """A softcap alone or a bias alone compiles as the bias-and-softcap variant (the stand-in
    with the code of each): the arguments of the one it lacks taken at run time there."""
    softcap_only = _runtime(_choice(SOFTCAP=True), ("softcap",))
    bias_only = _runtime(_choice(HAS_BIAS=True), R.MODIFIER_ARGS[:-1])
    names = {R.variant_of("sm120", c)[0] for c in (softcap_only, bias_only)}
    assert names == {"dkdv/d128/vec8/narrow/dense/mods"}
    for choice in (softcap_only, bias_only):
        cons = R.variant_of("sm120", choice)[1]["constexprs"]
        assert cons["HAS_BIAS"] and cons["SOFTCAP"]
        assert not set(R.MODIFIER_ARGS) & set(cons)
    plain, var = R.variant_of("sm120", _choice())
    assert not plain.endswith("/mods") and not var["constexprs"]["HAS_BIAS"]


def test_check_fails_on_a_spill_on_shared_memory_and_on_occupancy():
    name = "dkdv/d128/vec8/narrow/dense"
    for arch in R.ARCHS:
        good = REPORT["archs"][arch]["variants"][name]
        assert R.check(arch, name, good) == []
        assert "spills" in R.check(arch, name, dict(good, spill_bytes=10 ** 6))[0]
        lim = R.LIMITS[arch]
        budget = lim.smem_per_block if lim.kind == "nvidia" else lim.lds_per_workgroup
        assert "shared memory" in R.check(arch, name, dict(good, shared_bytes=budget + 1))[0]
        key = "warps_per_sm" if lim.kind == "nvidia" else "waves_per_simd"
        low = dict(good, occupancy=dict(good["occupancy"], **{key: 1}))
        assert "occupancy" in R.check(arch, name, low)[0]
    # sm90's known spills (configs tuned on the H200) are reported, not failed, up to their
    # declared bytes; each declared pattern matches some spilling variant
    assert {arch for arch, _ in R.KNOWN_SPILLS} <= {"sm90", "sm120"}
    assert all(most <= 8 for (arch, _), (most, _) in R.KNOWN_SPILLS.items() if arch == "sm120")
    for (arch, pattern), (most, _) in R.KNOWN_SPILLS.items():
        variants = REPORT["archs"][arch]["variants"]
        hits = {n: e for n, e in variants.items() if fnmatch.fnmatchcase(n, pattern)}
        assert any(e["spill_bytes"] for e in hits.values()), pattern
        name, entry = next((n, e) for n, e in hits.items() if e["spill_bytes"])
        assert R.check(arch, name, entry) == []
        assert "spills" in R.check(arch, name, dict(entry, spill_bytes=most + 1))[0]


def test_occupancy_arithmetic():
    sm90, sm120, gfx = R.LIMITS["sm90"], R.LIMITS["sm120"], R.LIMITS["gfx942"]
    # 252 registers: 8064 per warp, 8 warps' worth of 65536; 82432 + 1024 bytes: 2 blocks
    assert R.nvidia_occupancy(sm90, 252, 82432, 4)["warps_per_sm"] == 8
    assert R.nvidia_occupancy(sm90, 128, 0, 4)["warps_per_sm"] == 16          # 4096 per warp
    assert R.nvidia_occupancy(sm90, 24, 0, 4)["limited_by"] == ["warps"]      # 64 warps
    assert R.nvidia_occupancy(sm120, 32, 0, 4)["limited_by"] == ["warps"]     # 48 warps
    assert R.nvidia_occupancy(sm120, 255, 74240, 8)["blocks_per_sm"] == 1
    assert R.amd_occupancy(gfx, 270, 101, 16384, 4)["waves_per_simd"] == 1   # VGPRs
    assert R.amd_occupancy(gfx, 256, 101, 16384, 4)["waves_per_simd"] == 2
    assert R.amd_occupancy(gfx, 128, 101, 40000, 4) == {"waves_per_simd": 1, "limited_by": ["lds"]}
    assert R.amd_occupancy(gfx, 64, 96, 0, 4)["waves_per_simd"] == 8
    assert dataclasses.asdict(sm90)["smem_per_block"] == configs.ARCHS["sm90"].smem_bytes
    assert sm120.smem_per_block == configs.ARCHS["sm120"].smem_bytes
    assert gfx.lds_per_workgroup == configs.ARCHS["gfx942"].smem_bytes
