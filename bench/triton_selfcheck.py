"""Self-check of the Triton engine on a few bigger shapes (the GPU smoke run).

    python bench/triton_selfcheck.py [--device cuda] [--no-bench] [--only PREFIX]

Each shape is laid out, filled and judged by the harness's own pieces
(bundlegen.harness.selfcheck: canary-guarded storages, the float64 oracle, the checks):
it prints each output's max error relative to max |reference|, whether a re-run gives the
same bits, the kernel time, and the launch's VEC, WIDE and block config. Then, on a GPU,
one training-sized shape timed in TFLOP/s, plain and with each score modifier.

Exit status 0 unless a shape was declined, failed a check or was not bitwise repeatable.
"""
from __future__ import annotations

import argparse
import time

import torch

from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.graph import LAYOUT_ORDERS, dense_graph, packed_strides, with_modifiers
from bundlegen.harness import selfcheck
from bundlegen.harness.config import Tolerance

SMOKE = {
    "causal-br-d128": dict(B=2, H_q=8, S_q=1000, S_kv=1024, D_qk=128, dtype="bf16", right=0,
                           alignment="BOTTOM_RIGHT"),
    "gqa-hk-ne-hv-192/128-window": dict(B=1, H_q=8, H_k=2, H_v=4, S_q=777, S_kv=1001,
                                        D_qk=192, D_v=128, dtype="bf16", left=200, right=0),
    "d256-fp16-tl-causal": dict(B=2, H_q=4, S_q=513, S_kv=300, D_qk=256, dtype="fp16", right=0),
    "mqa-d40/24-band": dict(B=3, H_q=6, H_k=1, S_q=129, S_kv=65, D_qk=40, D_v=24, dtype="fp16",
                            left=17, right=3, alignment="BOTTOM_RIGHT"),
    "bshd-d64-s1": dict(B=4, H_q=4, S_q=1, S_kv=2049, D_qk=64, dtype="bf16"),
    # K rows 2^26 + 64 elements apart: offsets past 2^31 (K's storage is 5.4 GB)
    "wide-k-rows-past-2^31": dict(B=1, H_q=2, H_k=1, S_q=40, S_kv=40, D_qk=64, dtype="bf16",
                                  right=0),
    # score modifiers (graph.with_modifiers arguments under "mods")
    "mods-all-causal-br-gqa-d128": dict(B=2, H_q=8, H_k=2, S_q=1000, S_kv=1024, D_qk=128,
                                        dtype="bf16", right=0, alignment="BOTTOM_RIGHT",
                                        mods=dict(bias="batch", dbias=True, sinks=True,
                                                  dsinks=True, softcap=30.0)),
    "mods-bias-both-window-d64": dict(B=3, H_q=4, S_q=513, S_kv=300, D_qk=64, dtype="fp16",
                                      left=100, right=0, mods=dict(bias="both", dbias=True)),
    "mods-softcap-d256": dict(B=1, H_q=4, H_k=1, S_q=333, S_kv=257, D_qk=256, dtype="bf16",
                              mods=dict(softcap=5.0, sinks=True, dsinks=True)),
}
WIDE_ROW = 2 ** 26 + 64
BENCH = dict(B=4, H_q=16, S_q=4096, D_qk=128, dtype="bf16")   # a training-sized shape, timed in TFLOP/s
#: the same shape with score modifiers (graph.with_modifiers), timed beside it
BENCH_MODS = {"softcap": dict(softcap=30.0), "bias": dict(bias="full"),
              "bias+dbias": dict(bias="full", dbias=True),
              "bias-both+dbias": dict(bias="both", dbias=True),
              "sinks+dsinks": dict(sinks=True, dsinks=True)}
SEED = 1
#: this smoke run's pass rule: every output within REL x max |reference| (a bound on the
#: whole output, not the harness's per-element tolerance, which the levels apply)
REL = 0.02
#: what judge's per-element figures are computed with; only their max |err| is read here
TOLERANCE = Tolerance(REL, 0.0, "triton selfcheck")


def _bshd(graph_args) -> dict:
    """dense_graph's strides and offsets: BSHD ports, Q and dQ 8 elements in."""
    graph = dense_graph(**graph_args)
    return dict(strides={p: packed_strides(t.dims, LAYOUT_ORDERS["bshd"])
                         for p, t in graph.tensors.items() if p != "stats"},
                offsets={"q": 8, "dq": 8})


def smoke_graph(name: str, args: dict):
    args = dict(args)
    mods = args.pop("mods", None)
    layout = _bshd(args) if name.startswith("bshd") else {}
    if name.startswith("wide"):
        layout = dict(strides={"k": (0, 0, WIDE_ROW, 1)})
    graph = dense_graph(**layout, **args)
    return with_modifiers(graph, **mods) if mods else graph


def failures(finding: selfcheck.Finding) -> list[str]:
    """What breaks this run's rule, inputs first (their whole storages, guards included),
    then each output's canaries, NaN, error."""
    out = [f"input {p} modified" for p in finding.modified_inputs]
    for p, error in finding.errors.items():
        if p in finding.wrote_outside:
            out.append(f"{p}: guard or gap written")
        if p in finding.nonfinite:
            out.append(f"{p}: NaN in output")
        bound = REL * max(finding.ref_max[p], 1e-4)
        if not error.max_abs_err <= bound:
            out.append(f"{p}: max err {error.max_abs_err:.3g} > {bound:.3g} "
                       f"(max |ref| {finding.ref_max[p]:.3g})")
    return out


def _timed(fn, device, reps: int = 5) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / reps


def main(argv=None) -> int:
    from bundlegen.engines.triton.engine import TritonEngine
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument("--only", default="", metavar="PREFIX",
                        help="only the smoke shapes whose name starts with PREFIX")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    engine = TritonEngine(device)   # off a GPU it selects the interpreter before Triton loads
    import triton

    from bundlegen.engines.triton.addressing import kernel_views, vec_for
    from bundlegen.engines.triton.tile_plan import needs_wide
    print(f"triton {triton.__version__} torch {torch.__version__} device {device} "
          f"arch {engine.arch}", flush=True)
    bad = 0
    for name, g in SMOKE.items():
        if not name.startswith(args.only):
            continue
        graph = smoke_graph(name, g)
        reason = engine.is_applicable(graph)
        if reason is not None:
            print(f"{name:28s} declined: {reason}")
            bad += 1
            continue
        m = selfcheck.prepare(graph, SEED, device, label=name)
        finding = selfcheck.run_and_judge(engine, m, TOLERANCE)
        failed = failures(finding)
        if failed:
            errors, seconds, status = {}, float("nan"), f"FAIL {failed[0]}"
            bad += 1
        else:
            errors = {p: finding.relative_error(p) for p in finding.errors}
            first = selfcheck.output_copies(m)
            seconds = _timed(lambda: engine.run(graph, m.tensors), device)
            same = selfcheck.same_bits(m, first)
            status = "ok" if same else "NONDETERMINISTIC"
            bad += not same
        errs = " ".join(f"{p}={e:.2e}" for p, e in errors.items())
        cfg = engine.config(graph)
        print(f"{name:28s} {status:5s} err/max|ref| {errs} {seconds * 1e3:8.2f} ms  "
              f"VEC={vec_for(m.tensors)} WIDE={needs_wide(kernel_views(graph, m.tensors), cfg)} {cfg}",
              flush=True)
    if not args.no_bench and device.type == "cuda":
        plain = None
        for label, mods in {"plain": {}, **BENCH_MODS}.items():
            graph = with_modifiers(dense_graph(**BENCH), **mods)
            views = {p: torch.randn(t.dims, device=device).to(TORCH_DTYPES[t.dtype])
                     .as_strided(t.dims, t.strides) for p, t in graph.tensors.items()}
            views["stats"] += 10.0   # keep exp2(s - lse) finite; speed does not depend on values
            seconds = _timed(lambda: engine.run(graph, views), device)
            plain = plain or seconds
            flops = 2.5 * 4 * graph.B * graph.H_q * graph.S_q * graph.S_kv * graph.D_qk
            print(f"bench {BENCH} {label:16s}: {seconds * 1e3:8.2f} ms, "
                  f"{flops / seconds / 1e12:6.1f} TFLOP/s, x{seconds / plain:.2f} of plain",
                  flush=True)
    print("selfcheck:", "FAIL" if bad else "ok")
    return int(bad > 0)


if __name__ == "__main__":
    raise SystemExit(main())
