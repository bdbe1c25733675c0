"""Block-configuration sweep of the Triton engine's kernels on the local GPU.

The dK/dV kernel and the dQ kernel are timed separately (each has its own tiles, warps and
stages in a BlockConfig), per head-dim tier and mask kind, on the target shape family
(bf16, H=16, S=4096, B=4). Every candidate is first compiled in parallel by --jobs
processes (a launch on a tiny shape fills Triton's cache; a candidate that runs out of
shared memory or registers is dropped), then timed in this process with
triton.testing.do_bench. Each candidate's gradients are compared with the table config's,
so a tile choice that breaks the kernel shows up here before the harness runs it.

    python bench/tune_triton.py                          # D 64 128 256, causal and not
    python bench/tune_triton.py --d 128 --out tune.json
    python bench/tune_triton.py --orders                 # program order: head- vs block-major

The winners go into engines/triton/configs.py by hand; the harness then proves them.
"""
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bundlegen.engines.triton.configs import BlockConfig, config_for  # noqa: E402

ARCH = "sm90"
TILES = {   # padded head dim -> ((M, N) of dK/dV, (M, N) of dQ) candidates
    64: ([(32, 128), (64, 128), (64, 64), (128, 128), (32, 64)],
         [(128, 32), (128, 64), (64, 64), (128, 128), (64, 32)]),
    128: ([(32, 128), (64, 128), (16, 128), (64, 64), (32, 64)],
          [(128, 32), (128, 64), (64, 64), (64, 32), (128, 16)]),
    256: ([(32, 32), (32, 64), (16, 64), (64, 64), (16, 128), (32, 128)],
          [(64, 32), (32, 64), (64, 64), (128, 32), (64, 16), (32, 32)]),
}
WARPS = (4, 8)
STAGES = {64: (2, 3, 4), 128: (2, 3, 4), 256: (1, 2, 3)}
KERNELS = ("dkdv", "dq")


def candidates(d: int, kernel: str) -> list[BlockConfig]:
    base = config_for(ARCH, d, d)
    tiles = TILES[d][0 if kernel == "dkdv" else 1]
    out = []
    for (m, n), warps, stages in itertools.product(tiles, WARPS, STAGES[d]):
        if kernel == "dkdv":
            out.append(replace(base, block_m1=m, block_n1=n, num_warps=warps, num_stages=stages))
        else:
            out.append(replace(base, block_m2=m, block_n2=n, num_warps_dq=warps,
                               num_stages_dq=stages))
    return out


def shape(d: int, causal: bool, S: int = 4096, B: int = 4):
    from bench.engine_speed import Shape, graph_of
    return graph_of(Shape(B, 16, 16, S, d, "bf16", causal))


def tensors_for(graph, device: str, seed: int = 0) -> dict:
    import torch

    from bench.engine_speed import empty_as, reference_forward
    torch.manual_seed(seed)
    t = {p: empty_as(spec, device) for p, spec in graph.tensors.items()}
    for p in ("q", "k", "v", "do"):
        t[p].normal_()
    o, lse = reference_forward(t["q"], t["k"], t["v"], graph.attributes.attn_scale,
                               graph.attributes.right_bound is not None)
    t["o"].copy_(o)
    t["stats"].copy_(lse.unsqueeze(-1))
    return t


def _compile(jobs: list[tuple]) -> list[bool]:
    """Launch each (d, causal, kernel, cfg) once on a tiny shape; False when it cannot run."""
    import torch

    from bundlegen.engines.triton import launch as L
    ok = []
    for d, causal, kernel, cfg in jobs:
        graph = shape(d, causal, S=256, B=1)
        t = tensors_for(graph, "cuda")
        try:
            prepared = L.prepare(graph, t, cfg)
            L.run_preprocess(prepared)
            (L.run_dkdv if kernel == "dkdv" else L.run_dq)(prepared)
            torch.cuda.synchronize()
            ok.append(True)
        except Exception as exc:  # noqa: BLE001 - resource exhaustion or a compile error
            print(f"  drop D{d} {'causal' if causal else 'full'} {kernel} {cfg}: "
                  f"{type(exc).__name__}: {str(exc)[:120]}", flush=True)
            ok.append(False)
    return ok


def _time(graph, t, cfg, kernel: str) -> tuple[float, dict]:
    import torch
    import triton

    from bundlegen.engines.triton import launch as L
    prepared = L.prepare(graph, t, cfg)
    L.run_preprocess(prepared)
    fn = (lambda: L.run_dkdv(prepared)) if kernel == "dkdv" else (lambda: L.run_dq(prepared))
    for p in ("dq", "dk", "dv"):
        t[p].zero_()
    fn()
    torch.cuda.synchronize()
    outs = {p: t[p].clone() for p in (("dk", "dv") if kernel == "dkdv" else ("dq",))}
    return triton.testing.do_bench(fn, warmup=20, rep=80), outs


ORDER_SHAPES = [  # (B, H_q, H_kv, S, D, causal): MHA and GQA over the head-dim tiers and lengths
    *[(16 * 1024 // S, 16, 16, S, D, True) for D in (64, 128, 192, 256) for S in (1024, 4096, 16384)],
    *[(16 * 1024 // S, 16, 2, S, D, True) for D in (64, 128, 256) for S in (1024, 4096, 16384)],
    (4, 16, 4, 4096, 128, True), (4, 16, 8, 4096, 128, True), (4, 16, 16, 4096, 128, False)]


def compare_orders() -> list[dict]:
    """Time with the programs head-major and block-major (kernels._block_batch_head), table
    configs: the whole backward and the dK/dV and dQ kernels alone."""
    import triton

    from bench.engine_speed import Shape, graph_of
    from bundlegen.engines.triton import launch as L
    rows = []
    for B, H, H_kv, S, D, causal in ORDER_SHAPES:
        graph = graph_of(Shape(B, H, H_kv, S, D, "bf16", causal))
        t = tensors_for(graph, "cuda")
        cfg = config_for(ARCH, D, D)
        row = {"shape": f"B{B} H{H}:{H_kv} S{S} D{D} {'causal' if causal else 'non-causal'}",
               "default_block_major": L.block_major(graph)}
        for order in (False, True):
            p = L.prepare(graph, t, cfg, order=order)
            name = "block_major" if order else "head_major"

            def whole(p=p):
                L.run_preprocess(p)
                L.run_dkdv(p)
                L.run_dq(p)
            row[name] = triton.testing.do_bench(whole, warmup=20, rep=80)
            row[name + "_dkdv"] = triton.testing.do_bench(lambda p=p: L.run_dkdv(p), warmup=20, rep=80)
            row[name + "_dq"] = triton.testing.do_bench(lambda p=p: L.run_dq(p), warmup=20, rep=80)
        flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)

        def gain(part: str) -> str:
            return f"{row['head_major' + part] / row['block_major' + part] - 1:+6.1%}"
        print(f"{row['shape']:32s} head-major {flops / row['head_major'] / 1e9:4.0f} TFLOP/s  "
              f"block-major {flops / row['block_major'] / 1e9:4.0f}  block-major gain: whole {gain('')}  "
              f"dK/dV {gain('_dkdv')}  dQ {gain('_dq')}", flush=True)
        rows.append(row)
        del t
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--masks", nargs="+", default=["full", "causal"], choices=["full", "causal"])
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "tune_triton_h200.json"))
    parser.add_argument("--orders", action="store_true",
                        help="only compare the program orders (head- vs block-major)")
    args = parser.parse_args(argv)

    import torch
    if args.orders:
        rows = compare_orders()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "orders": rows},
                                             indent=1) + "\n")
        return 0
    jobs = [(d, mask == "causal", kernel, cfg) for d in args.d for mask in args.masks
            for kernel in KERNELS for cfg in candidates(d, kernel)]
    start = time.perf_counter()
    shards = [jobs[i::args.jobs] for i in range(args.jobs)]
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        ok_shards = pool.map(_compile, shards)
    ok = {}
    for shard, flags in zip(shards, ok_shards):
        for job, flag in zip(shard, flags):
            ok[(job[0], job[1], job[2], job[3])] = flag
    print(f"compiled {sum(ok.values())} of {len(jobs)} candidates in "
          f"{time.perf_counter() - start:.0f} s", flush=True)

    rows = []
    for d in args.d:
        for mask in args.masks:
            causal = mask == "causal"
            graph = shape(d, causal)
            t = tensors_for(graph, "cuda")
            table = config_for(ARCH, d, d)
            for kernel in KERNELS:
                ref_ms, ref_out = _time(graph, t, table, kernel)
                timed = []
                for cfg in candidates(d, kernel):
                    if not ok.get((d, causal, kernel, cfg)):
                        continue
                    ms, out = _time(graph, t, cfg, kernel)
                    diff = max(float((out[p].float() - ref_out[p].float()).abs().max()
                                     / ref_out[p].float().abs().max().clamp_min(1e-30))
                               for p in out)
                    timed.append((ms, cfg, diff))
                timed.sort(key=lambda r: r[0])
                print(f"\nD{d} {mask} {kernel}: table config {ref_ms:.3f} ms", flush=True)
                for ms, cfg, diff in timed[:6]:
                    c = asdict(cfg)
                    tiles = ((c["block_m1"], c["block_n1"], c["num_warps"], c["num_stages"])
                             if kernel == "dkdv" else
                             (c["block_m2"], c["block_n2"], c["num_warps_dq"], c["num_stages_dq"]))
                    print(f"  {ms:7.3f} ms  {ref_ms / ms:5.2f}x  (M, N, warps, stages) = {tiles}"
                          f"  max rel diff {diff:.1e}", flush=True)
                rows.append({"d": d, "mask": mask, "kernel": kernel, "table_ms": ref_ms,
                             "table": asdict(table),
                             "timed": [{"ms": ms, "cfg": asdict(cfg), "max_rel_diff": diff}
                                       for ms, cfg, diff in timed]})
            del t
            torch.cuda.empty_cache()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": __import__("triton").__version__, "shape": "B4 H16 S4096 bf16 (B*S = 16384)",
        "rows": rows}, indent=1) + "\n")
    print(f"\nwrote {args.out} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
