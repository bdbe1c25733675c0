"""bench/kernel_profile.py without a GPU: the bound rule on recorded timings, the FLOP and byte
counts behind it, the launch-by-launch timing proxy, and the profile a speed_batch row writes
(on the interpreter, tiny shapes)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench import kernel_profile as KP  # noqa: E402

# B4 H16 S4096 D128, full: pairs = 4 * 16 * 4096^2
WORK = KP.Work(pairs=4 * 16 * 4096 ** 2, D_qk=128, D_v=128, q_elems=4 * 16 * 4096,
               bias_elems=4 * 16 * 4096 ** 2)


def _p(kernel, ms, **kw):
    return KP.LaunchProfile(kernel=kernel, ms=ms, grid=1, **kw)


def test_flops_count_each_kernels_gemms():
    gemm = 2.0 * WORK.pairs * 128
    assert KP.flops("bwd_dkdv", WORK) == 4 * gemm
    assert KP.flops("bwd_dq", WORK) == 3 * gemm
    assert KP.flops("bwd_dkdv/dv", WORK) == 2 * gemm
    assert KP.flops("bwd_preprocess", WORK) is None
    # the whole backward: 4 + 3 GEMMs of the 5 the PERFORMANCE FLOP count (2.5 x 4) holds
    assert KP.flops("bwd_dkdv", WORK) + KP.flops("bwd_dq", WORK) == pytest.approx(1.4 * 10 * WORK.pairs * 128)
    assert KP.bytes_moved("bwd_dbias", WORK) == 4 * WORK.bias_elems


def test_the_longest_launch_bounds_the_row_with_its_occupancy():
    launches = [_p("bwd_preprocess", 0.1, gbps=2000.0),
                _p("bwd_dkdv", 3.0, registers=255, ctas_per_sm=1, limited_by=("registers",), tflops=480.0,
                   spill_bytes=192),
                _p("bwd_dq", 1.9, registers=168, ctas_per_sm=1, limited_by=("registers",), tflops=450.0)]
    assert KP.bound(launches, "NVIDIA H100 80GB HBM3") == (
        "bwd_dkdv 60 % of the time at 1 CTA/SM (registers 255), 480 TFLOP/s (49 % of peak), spills 192 B")


def test_a_memory_kernel_that_dominates_is_memory_bound():
    launches = [_p("bwd_dkdv", 3.0, tflops=480.0), _p("bwd_dbias", 7.0, tflops=100.0, gbps=2900.0)]
    assert KP.bound(launches, "NVIDIA H100 80GB HBM3") == (
        "bwd_dbias 70 % of the time, memory-bound at 2900 GB/s (87 % of peak)")
    # the same kernel far from the bandwidth but nearer the compute peak: compute-side
    launches[1] = _p("bwd_dbias", 7.0, tflops=600.0, gbps=300.0)
    assert KP.bound(launches, "NVIDIA H100 80GB HBM3").startswith("bwd_dbias 70 % of the time, 600 TFLOP/s")


def test_an_unknown_gpu_gives_the_figures_without_a_peak():
    assert KP.bound([_p("bwd_dq", 1.0, tflops=300.0)], "cpu") == "bwd_dq 100 % of the time, 300 TFLOP/s"
    assert KP.bound([], "cpu") == "no launch timed"


class _Kernel:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def __getitem__(self, grid):
        return lambda *a, **kw: self.log.append((self.name, grid, kw)) or f"compiled {self.name}"


class _Module:
    def __init__(self):
        self.log = []

    def __getattr__(self, name):
        return _Kernel(self.log, name)


def test_timed_kernels_times_each_launch_and_names_a_dk_pass():
    ticks = iter(range(100))
    module = _Module()
    timed = KP.TimedKernels(module, clock=lambda: next(ticks), elapsed_ms=lambda s, e: float(e - s))
    assert timed.bwd_dkdv[(8,)](1, COMPUTE_DK=True, COMPUTE_DV=False) == "compiled bwd_dkdv"
    timed.bwd_dq[(4,)](2)
    assert [c[0] for c in module.log] == ["bwd_dkdv", "bwd_dq"]    # the real kernels ran
    assert timed.durations() == [("bwd_dkdv/dk", 8, 1.0, "compiled bwd_dkdv"), ("bwd_dq", 4, 1.0, "compiled bwd_dq")]


def test_profile_record_shares_add_up_and_say_the_rule():
    rec = KP.profile_record([_p("bwd_dkdv", 3.0), _p("bwd_dq", 1.0)], "NVIDIA H200")
    assert [p["share"] for p in rec["launches"]] == [0.75, 0.25]
    assert rec["serial_ms"] == 4.0 and rec["rule"] == KP.BOUND_RULE
    assert rec["bound"].startswith("bwd_dkdv 75 % of the time")
    json.dumps(rec)   # JSON as it is written


def test_a_row_profile_on_the_interpreter_splits_the_backward(tmp_path, monkeypatch):
    """speed_batch's profile of a tiny bias-with-dBias row on the interpreter: every launch of
    the backward in order, the dBias pass among them, written to the record at once."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import torch

    from bench import speed_batch as SB
    case = SB.Case("d64-bias-dbias", D=64, mod="bias-dbias", B=1, H_q=2, H_kv=2, S=32)
    graph = SB.graph_for(case)
    tensors = SB.tensors_for(case, graph, torch.device("cpu"))
    prepared, _ = SB.triton_stages(graph, tensors, SB.table_config(case, graph))
    rec = SB.Record(tmp_path / "r.json", {"gpu": "cpu"}, {}, None)
    SB.profile_row(case, prepared, torch.device("cpu"), rec)
    saved = json.loads((tmp_path / "r.json").read_text())["profiles"]["d64-bias-dbias"]
    assert [p["kernel"] for p in saved["launches"]] == ["bwd_preprocess", "bwd_dkdv", "bwd_dq", "bwd_dbias"]
    assert all(p["ms"] > 0 and p["registers"] is None for p in saved["launches"])
    assert saved["bound"].split()[0] in {"bwd_dkdv", "bwd_dq", "bwd_dbias", "bwd_preprocess"}


class _Compiled:
    """A compiled kernel as Triton's launch returns it, without a cubin to read."""
    asm: dict = {}
    n_regs, n_spills = 168, 0

    class metadata:  # noqa: N801 - Triton's attribute name
        shared, num_warps = 73728, 8


def test_without_a_readable_cubin_the_drivers_figures_give_the_occupancy():
    res = KP.resources_of(_Compiled(), "sm90")
    # 168 registers x 32 lanes on 8 warps: 43008 of 65536 registers, one CTA (shared: 3)
    assert {k: res[k] for k in ("registers", "spill_bytes", "ctas_per_sm", "limited_by")} == {
        "registers": 168, "spill_bytes": 0, "ctas_per_sm": 1, "limited_by": ("registers",)}
    assert res["error"].startswith("cubin not read")
    assert KP.resources_of(None, "sm90") == {}
