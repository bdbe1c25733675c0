"""Time kernels modules side by side on the local GPU: the engine's kernels and candidate
copies of them (a change to the kernels timed beside the current code in one process).

Each module is launched through the engine's launcher (engines/triton/launch.py), with the
given tiles (default: the table's, its banded config for the causal rows), at B4 H16 S4096
bf16 causal and not; the whole backward after the preprocess is timed (with --atomic-dq:
scratch zeroed, the dK/dV pass adding dQ, the copy into dQ), and each module's gradients
are compared with the first module's. --loads pointer times the streamed tiles loaded
through pointers where the config would use TMA descriptors (launch.descriptor_loads;
`tma pointer`: both, side by side).

    python bench/compare_kernels.py --modules bundlegen.engines.triton.kernels my.kernels \
        --tiles 64,128,8,3 32,128,8,3 --atomic-dq --d 128
    python bench/compare_kernels.py --d 64 128 256 --loads tma pointer
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.tune_triton import parse_tiles, shape, tensors_for, with_tiles  # noqa: E402
from bundlegen.engines.triton import launch as L  # noqa: E402
from bundlegen.engines.triton.configs import config_for  # noqa: E402


def timed(graph, t, cfg, module: str, atomic: bool, rep: tuple[int, int], tma: bool = True):
    import torch
    import triton
    prepared = L.prepare(graph, t, cfg, kernels=module, atomic_dq=atomic, tma=tma)
    L.run_preprocess(prepared)

    def backward():
        if atomic:
            prepared.dq_scratch.acc.zero_()
        L.run_dkdv(prepared)
        L.run_dq(prepared)
    backward()
    torch.cuda.synchronize()
    outs = {p: t[p].float().clone() for p in ("dq", "dk", "dv")}
    return triton.testing.do_bench(backward, warmup=rep[0], rep=rep[1]), outs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", nargs="+", default=[L.KERNELS])
    parser.add_argument("--tiles", type=parse_tiles, nargs="+", default=[],
                        help="M,N,warps,stages of the dK/dV kernel (default: the table's)")
    parser.add_argument("--d", type=int, nargs="+", default=[128])
    parser.add_argument("--atomic-dq", action="store_true")
    parser.add_argument("--loads", nargs="+", choices=("tma", "pointer"), default=["tma"],
                        help="tma: descriptors where the config and layout allow (the engine's "
                             "choice); pointer: never")
    parser.add_argument("--rep", type=int, nargs=2, default=[20, 100])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("compare_kernels: no CUDA device here; it times kernels on a GPU", file=sys.stderr)
        return 2
    rows = []
    for d in args.d:
        for causal in (False, True):
            graph = shape(d, causal)
            t = tensors_for(graph, "cuda")
            table = config_for("sm90", d, d, banded=causal, atomic_dq=args.atomic_dq)
            cfgs = [table] + [with_tiles(table, dkdv=tiles) for tiles in args.tiles]
            flops = 2.5 * 4 * 4 * 16 * 4096 * 4096 * d / (2 if causal else 1)
            ref = None
            for cfg in cfgs:
                tiles = (cfg.block_m1, cfg.block_n1, cfg.num_warps, cfg.num_stages)
                for module, loads in ((m, x) for m in args.modules for x in args.loads):
                    try:
                        ms, outs = timed(graph, t, cfg, module, args.atomic_dq, tuple(args.rep),
                                         tma=loads == "tma")
                    except Exception as exc:  # noqa: BLE001 - out of resources, compile error
                        print(f"D{d} {'causal' if causal else 'full':6s} {tiles} {module} "
                              f"{loads}: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                        continue
                    ref = ref or outs
                    diff = max(float((outs[p] - ref[p]).abs().max() / ref[p].abs().max()) for p in outs)
                    print(f"D{d} {'causal' if causal else 'full':6s} {tiles} {module:40s} "
                          f"{loads:7s} {ms:7.3f} ms {flops / ms / 1e9:5.0f} TFLOP/s  "
                          f"rel diff {diff:.1e}", flush=True)
                    rows.append(dict(d=d, causal=causal, tiles=tiles, module=module, loads=loads,
                                     ms=ms, max_rel_diff=diff))
            del t
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
