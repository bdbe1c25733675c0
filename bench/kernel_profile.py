"""Where one backward of the Triton engine goes, launch by launch: each kernel's time (CUDA
events around its launch, the launches run one after the other), its compiled resources
(registers, spills, shared memory and the CTAs per SM they allow on sm90, read from the
kernel the launch compiled), its achieved TFLOP/s or GB/s, and one `bound` line derived from
those numbers by BOUND_RULE. bench/speed_batch.py records one profile per row.

The FLOPs of a kernel are its GEMMs over the row's visible (query, key) pairs: the dK/dV
kernel recomputes S = Q K^T and dP = dO V^T and forms dV and dK (4 GEMMs; a dK pass alone 3,
a dV pass alone 2), the dQ kernel S, dP and dQ (3), the dBias kernel S and dP again (2: dBias
is a pass of its own that recomputes them per dBias tile, not a reduction of the dK/dV
kernel's dS). Bytes: preprocess reads O and dO and writes Delta; the dBias kernel writes dBias
and reads the bias.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Callable

#: the GPU's dense bf16 tensor-core peak (TFLOP/s) and HBM bandwidth (GB/s) by name: the
#: public SXM figures (the denominators of the `% of peak` in a bound line)
PEAKS = {"H200": (989.0, 4800.0), "H100": (989.0, 3350.0)}
#: GEMMs per visible (query, key) pair of each kernel; a dK/dV launch by its passes
GEMMS = {"bwd_dkdv": 4, "bwd_dkdv/dk": 3, "bwd_dkdv/dv": 2, "bwd_dq": 3, "bwd_dbias": 2}
BOUND_RULE = ("the launch with the largest share of the serial time bounds the row; it is "
              "memory-bound when its share of peak bandwidth exceeds its share of peak TFLOP/s, "
              "else compute-side, qualified by its CTAs per SM (and what limits them) and its spills")


@dataclass(frozen=True)
class Work:
    """What one backward of a row computes: the visible (query, key) pairs summed over batch
    and query heads, the head dims, and the element counts the memory kernels move."""
    pairs: float
    D_qk: int
    D_v: int
    q_elems: int          # B x H_q x S_q (rows of O, dO, Delta)
    bias_elems: int = 0   # elements of the bias and of dBias


@dataclass(frozen=True)
class LaunchProfile:
    """One launch of a backward: its kernel (a dK/dV pass as bwd_dkdv/dk or /dv), median ms,
    and its resources (None where nothing was compiled: the interpreter)."""
    kernel: str
    ms: float
    grid: int
    registers: int | None = None
    spill_bytes: int | None = None
    shared_bytes: int | None = None
    num_warps: int | None = None
    ctas_per_sm: int | None = None
    limited_by: tuple[str, ...] = ()
    tflops: float | None = None
    gbps: float | None = None
    note: str = ""        # why a compiled kernel has no resource figures


def flops(kernel: str, work: Work) -> float | None:
    gemms = GEMMS.get(kernel)
    return None if gemms is None else 2.0 * work.pairs * (work.D_qk + work.D_v) / 2 * gemms


def bytes_moved(kernel: str, work: Work) -> float | None:
    if kernel == "bwd_preprocess":   # O and dO in bf16, Delta in fp32
        return work.q_elems * (2 * work.D_v * 2 + 4)
    if kernel == "bwd_dbias":        # bias read, dBias written (bf16)
        return work.bias_elems * 2 * 2
    return None


def kernel_name(name: str, kwargs: dict) -> str:
    """The launch's name in a profile: a dK/dV pass that computes one of dK, dV is /dk or /dv."""
    if name == "bwd_dkdv" and kwargs.get("COMPUTE_DK", True) != kwargs.get("COMPUTE_DV", True):
        return f"{name}/{'dk' if kwargs.get('COMPUTE_DK') else 'dv'}"
    return name


def resources_of(compiled, arch: str) -> dict:
    """Registers, spills, shared memory and occupancy of the kernel a launch returned
    (resource_measure.measure reads them from its cubin, as resources.json has them; where
    that fails, the driver's figures of the loaded kernel); {} without one (the interpreter)."""
    if compiled is None or not hasattr(compiled, "asm"):
        return {}
    from bundlegen.engines.triton.resource_measure import measure
    try:
        e = measure(arch, {}, kernel=compiled)
    except Exception as exc:  # noqa: BLE001 - the time still counts; say why there are no figures
        e = driver_resources(compiled, arch)
        e["error"] = f"cubin not read ({type(exc).__name__}: {str(exc)[:100]}); the driver's figures"
    occ = e.get("occupancy", {})
    return {"registers": e.get("registers"), "spill_bytes": e.get("spill_bytes"),
            "shared_bytes": e.get("shared_bytes"), "num_warps": e.get("num_warps"),
            "ctas_per_sm": occ.get("blocks_per_sm"), "limited_by": tuple(occ.get("limited_by", ())),
            **({"error": e["error"]} if "error" in e else {})}


def driver_resources(compiled, arch: str) -> dict:
    """measure's fields from what Triton's launch read from the driver (n_regs, n_spills: local
    bytes per thread) and the kernel's metadata; {} where it has none."""
    from bundlegen.engines.triton.resource_limits import LIMITS, nvidia_occupancy
    regs, spills = getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None)
    meta = getattr(compiled, "metadata", None)
    if regs is None or meta is None:
        return {}
    shared, warps = int(meta.shared), int(meta.num_warps)
    return {"registers": int(regs), "spill_bytes": spills, "shared_bytes": shared, "num_warps": warps,
            "occupancy": nvidia_occupancy(LIMITS[arch], int(regs), shared, warps)}


class TimedKernels:
    """Stands in for a Launch's kernels module: each `kernel[grid](...)` runs between two
    CUDA events (or perf_counter on the CPU) and is recorded with the kernel it returned."""

    def __init__(self, kernels, clock: Callable[[], object], elapsed_ms: Callable[[object, object], float]):
        self.kernels, self.clock, self.elapsed_ms = kernels, clock, elapsed_ms
        self.calls: list[tuple[str, int, object, object, object]] = []   # name, grid, start, end, compiled

    def __getattr__(self, name):
        kernel = getattr(self.kernels, name)
        timed = self

        class _Site:
            def __getitem__(self, grid):
                def call(*args, **kwargs):
                    start = timed.clock()
                    compiled = kernel[grid](*args, **kwargs)
                    timed.calls.append((kernel_name(name, kwargs), int(grid[0]), start, timed.clock(), compiled))
                    return compiled
                return call
        return _Site()

    def durations(self) -> list[tuple[str, int, float, object]]:
        return [(name, grid, self.elapsed_ms(s, e), c) for name, grid, s, e, c in self.calls]


def clocks(device) -> tuple[Callable[[], object], Callable[[object, object], float], Callable[[], None]]:
    """(mark, ms between two marks, wait for the marks): CUDA events on a GPU, else perf_counter."""
    import time

    import torch
    if device.type == "cuda":
        def mark():
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return mark, lambda s, e: s.elapsed_time(e), torch.cuda.synchronize
    return time.perf_counter, lambda s, e: (e - s) * 1e3, lambda: None


def profile_launch(prepared, work: Work, device, arch: str = "sm90", repeats: int = 5) -> list[LaunchProfile]:
    """Run the prepared backward `repeats` times with its launches one after the other (no
    side stream: each kernel's own time) and profile each launch: median ms, resources,
    TFLOP/s or GB/s."""
    from dataclasses import replace

    from bundlegen.engines.triton import launch as L
    mark, elapsed, wait = clocks(device)
    runs = []
    for _ in range(repeats):
        timed = TimedKernels(prepared.kernels, mark, elapsed)
        L.run(replace(prepared, kernels=timed), overlap=False)
        wait()
        runs.append(timed.durations())
    out = []
    for i, (name, grid, _, compiled) in enumerate(runs[-1]):
        ms = statistics.median(r[i][2] for r in runs)
        res = resources_of(compiled, arch)
        f, b = flops(name, work), bytes_moved(name, work)
        out.append(LaunchProfile(
            kernel=name, ms=round(ms, 4), grid=grid,
            **{k: v for k, v in res.items() if k != "error"}, note=res.get("error", ""),
            tflops=None if f is None or ms <= 0 else round(f / ms / 1e9, 1),
            gbps=None if b is None or ms <= 0 else round(b / ms / 1e6, 1)))
    return out


def peaks(gpu_name: str) -> tuple[float, float] | None:
    return next((p for key, p in PEAKS.items() if key in gpu_name), None)


def bound(launches: list[LaunchProfile], gpu_name: str) -> str:
    """BOUND_RULE as one line, e.g. "bwd_dq 41 % of the time at 1 CTA/SM (registers 255),
    310 TFLOP/s (31 % of peak)" or "bwd_dbias 62 % of the time, memory-bound at 2900 GB/s
    (87 % of peak)"."""
    total = sum(p.ms for p in launches)
    if not launches or total <= 0:
        return "no launch timed"
    top = max(launches, key=lambda p: p.ms)
    share = f"{top.kernel} {100 * top.ms / total:.0f} % of the time"
    peak = peaks(gpu_name)
    compute = top.tflops / peak[0] if peak and top.tflops else None
    memory = top.gbps / peak[1] if peak and top.gbps else None
    if memory is not None and (compute is None or memory > compute):
        return f"{share}, memory-bound at {top.gbps:.0f} GB/s ({100 * memory:.0f} % of peak)"
    parts = [share]
    if top.ctas_per_sm is not None:
        limit = ", ".join(f"{k} {_limit_value(top, k)}" for k in top.limited_by)
        parts.append(f" at {top.ctas_per_sm} CTA/SM ({limit})")
    if top.tflops is not None:
        parts.append(f", {top.tflops:.0f} TFLOP/s" + (f" ({100 * compute:.0f} % of peak)" if compute else ""))
    if top.spill_bytes:
        parts.append(f", spills {top.spill_bytes} B")
    return "".join(parts)


def _limit_value(p: LaunchProfile, limiter: str):
    return {"registers": p.registers, "shared": p.shared_bytes, "warps": p.num_warps}.get(limiter, "")


def profile_record(launches: list[LaunchProfile], gpu_name: str) -> dict:
    """The JSON of a row's profile: each launch, its share of the serial time, the bound."""
    total = sum(p.ms for p in launches)
    return {"launches": [dict(asdict(p), share=round(p.ms / total, 3) if total > 0 else None) for p in launches],
            "serial_ms": round(total, 4), "bound": bound(launches, gpu_name), "rule": BOUND_RULE}
