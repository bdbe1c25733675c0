"""Time the engine's backward with and without the side stream, side by side on the local GPU.

`launch.run(L, overlap=True)` runs the dQ kernel (and a second dK/dV pass) on a side stream
beside the first dK/dV pass; `overlap=False` runs them one after the other on one stream.
Each shape (B4 H16 bf16, the table's config, causal and not) is timed in turns, the two
modes alternating `--rounds` times; each figure is the median of its rounds, and the
gradients of the two modes must be bitwise equal.

    python bench/overlap_probe.py --d 64 128 192 256 --seqs 4096 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.tune_triton import shape, tensors_for  # noqa: E402

MODES = {"one stream": False, "side stream": True}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[128])
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rep", type=int, nargs=2, default=[20, 100])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch
    import triton
    if not torch.cuda.is_available():
        print("overlap_probe: no CUDA device here; it times kernels on a GPU", file=sys.stderr)
        return 2
    from bundlegen.engines.triton import launch
    from bundlegen.engines.triton.engine import TritonEngine
    engine = TritonEngine(device="cuda")
    rows = []
    for seq in args.seqs:
        for d in args.d:
            for causal in (False, True):
                graph = shape(d, causal, S=seq)
                t = tensors_for(graph, "cuda")
                L = launch.prepare(graph, t, engine.config(graph))
                outs = {}
                for name, overlap in MODES.items():
                    launch.run(L, overlap=overlap)
                    torch.cuda.synchronize()
                    outs[name] = [t[p].clone() for p in ("dq", "dk", "dv")]
                equal = all(torch.equal(a, b) for a, b in zip(*outs.values()))
                times = {name: [] for name in MODES}
                for _ in range(args.rounds):
                    for name, overlap in MODES.items():
                        times[name].append(triton.testing.do_bench(
                            lambda: launch.run(L, overlap=overlap), warmup=args.rep[0],
                            rep=args.rep[1], return_mode="median"))
                ms = {name: statistics.median(v) for name, v in times.items()}
                ratios = [a / b for a, b in zip(times["one stream"], times["side stream"])]
                flops = 2.5 * 4 * graph.B * graph.H_q * seq * seq * d / (2 if causal else 1)
                label = f"S{seq} D{d} {'causal' if causal else 'full':6s}"
                print(f"{label} passes {len(launch.dkdv_passes(graph, L.cfg))}  one stream "
                      f"{ms['one stream']:7.3f} ms  side stream {ms['side stream']:7.3f} ms  "
                      f"speed-up {ms['one stream'] / ms['side stream']:.3f} (rounds "
                      f"{min(ratios):.3f}-{max(ratios):.3f})  "
                      f"{flops / ms['side stream'] / 1e9:4.0f} TFLOP/s  bitwise equal {equal}",
                      flush=True)
                rows.append(dict(seq=seq, d=d, causal=causal, ms=ms, rounds=times,
                                 bitwise_equal=equal))
                del t, L
    if args.out:
        Path(args.out).write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(),
                                                  torch=torch.__version__,
                                                  triton=triton.__version__, rows=rows),
                                             indent=1) + "\n")
    return 0 if all(r["bitwise_equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
