"""Time the engine's backward with and without the side stream, side by side on the local GPU.

`launch.run(L, overlap=True)` runs the dQ kernel (and a second dK/dV pass) on a side stream
beside the first dK/dV pass; `overlap=False` runs them one after the other on one stream.
Each shape (B4 H16 bf16, the table's config, causal and not) is timed in turns, the two
modes alternating `--rounds` times; each figure is the median of its rounds, and the
gradients of the two modes must be bitwise equal. `--priorities` adds two modes: the side
stream at a higher priority than the current one ("side high"), and the current stream at a
higher priority than the side one ("main high"); under a band the two kernels' programs
differ in work, and the priority decides whose programs take the SMs first.

    python bench/overlap_probe.py --d 64 128 192 256 --seqs 4096 --rounds 5 [--priorities]
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

MODES = ("one stream", "side stream")
PRIORITY_MODES = ("side high", "main high")


def mode_runner(mode: str, L, launch, torch):
    """A call of launch.run(L) in `mode` (MODES, PRIORITY_MODES)."""
    if mode in MODES:
        return lambda: launch.run(L, overlap=mode == "side stream")
    device = L.delta.device
    high = torch.cuda.Stream(device, priority=torch.cuda.Stream.priority_range()[1])
    if mode == "side high":
        def run_side_high():
            normal = launch._SIDE_STREAMS.get(device)
            launch._SIDE_STREAMS[device] = high
            try:
                launch.run(L)
            finally:
                launch._SIDE_STREAMS[device] = normal
        return run_side_high

    def run_main_high():
        outer = torch.cuda.current_stream(device)
        high.wait_stream(outer)
        with torch.cuda.stream(high):
            launch.run(L)
        outer.wait_stream(high)
    return run_main_high


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[128])
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rep", type=int, nargs=2, default=[20, 100])
    parser.add_argument("--priorities", action="store_true",
                        help="also time the side stream and the current one at a higher priority")
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
    modes = MODES + (PRIORITY_MODES if args.priorities else ())
    rows = []
    for seq in args.seqs:
        for d in args.d:
            for causal in (False, True):
                graph = shape(d, causal, S=seq)
                t = tensors_for(graph, "cuda")
                L = launch.prepare(graph, t, engine.config(graph))
                runners = {name: mode_runner(name, L, launch, torch) for name in modes}
                outs = {}
                for name, fn in runners.items():
                    fn()
                    torch.cuda.synchronize()
                    outs[name] = [t[p].clone() for p in ("dq", "dk", "dv")]
                first = outs["one stream"]
                equal = all(torch.equal(a, b) for out in outs.values() for a, b in zip(first, out))
                times = {name: [] for name in modes}
                for _ in range(args.rounds):
                    for name, fn in runners.items():
                        times[name].append(triton.testing.do_bench(
                            fn, warmup=args.rep[0], rep=args.rep[1], return_mode="median"))
                ms = {name: statistics.median(v) for name, v in times.items()}
                ratios = [a / b for a, b in zip(times["one stream"], times["side stream"])]
                flops = 2.5 * 4 * graph.B * graph.H_q * seq * seq * d / (2 if causal else 1)
                label = f"S{seq} D{d} {'causal' if causal else 'full':6s}"
                print(f"{label} passes {len(launch.dkdv_passes(graph, L.cfg))}  one stream "
                      f"{ms['one stream']:7.3f} ms  side stream {ms['side stream']:7.3f} ms  "
                      f"speed-up {ms['one stream'] / ms['side stream']:.3f} (rounds "
                      f"{min(ratios):.3f}-{max(ratios):.3f})  "
                      f"{flops / ms['side stream'] / 1e9:4.0f} TFLOP/s  bitwise equal {equal}"
                      + "".join(f"  {name} {ms[name]:7.3f} ms ({ms['side stream'] / ms[name]:.3f}x)"
                                for name in modes[len(MODES):]),
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
