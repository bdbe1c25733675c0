"""Time dK/dV tiles and dQ tiles together, as the engine runs them: the dQ kernel on a side
stream beside the dK/dV pass (launch.run's overlap), on the local GPU.

The table's tiles were chosen with each kernel timed alone (bench/tune_triton.py); beside
each other the pair that finishes first may differ, and so may which kernel is launched
first (its programs take the SMs first). Every pair of --dkdv x --dq tiles, in both launch
orders, is timed in turns with the table's pair (`--rounds` times; each figure the median of
its rounds) at B4 H16 bf16, causal and not; each pair's gradients are compared with the
table's (`rel diff`: on an H200 they came out bitwise equal, round 13: the MMAs add 16 rows
at a time, in order, whatever the tile).

    python bench/pair_probe.py --d 128 --dkdv 64,128,8,3 32,64,4,4 --dq 128,64,8,3 64,64,4,3
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.tune_triton import parse_tiles, shape, tensors_for, with_tiles  # noqa: E402


def backward(launch, L, dq_first: bool) -> None:
    """launch.run with overlap, the dQ kernel launched first (on the current stream, the
    dK/dV pass beside it) when dq_first."""
    if not dq_first:
        launch.run(L, overlap=True)
        return
    launch.run_preprocess(L)
    launch.beside(launch.side_stream(L.delta.device), lambda: launch.run_dq(L),
                  lambda: launch.run_dkdv(L))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[128])
    parser.add_argument("--dkdv", type=parse_tiles, nargs="*", default=[], metavar="M,N,WARPS,STAGES")
    parser.add_argument("--dq", type=parse_tiles, nargs="*", default=[], metavar="M,N,WARPS,STAGES")
    parser.add_argument("--causal", choices=("both", "full", "causal"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep", type=int, nargs=2, default=[20, 100])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch
    import triton
    if not torch.cuda.is_available():
        print("pair_probe: no CUDA device here; it times kernels on a GPU", file=sys.stderr)
        return 2
    from bundlegen.engines.triton import launch
    from bundlegen.engines.triton.engine import TritonEngine
    engine = TritonEngine(device="cuda")
    modes = {"full": (False,), "causal": (True,), "both": (False, True)}[args.causal]
    rows = []
    for d, causal in itertools.product(args.d, modes):
        graph = shape(d, causal)
        t = tensors_for(graph, "cuda")
        table = engine.config(graph)
        label = f"D{d} {'causal' if causal else 'full':6s}"
        candidates = {("table", False): table}
        for dkdv, dq in itertools.product([None, *args.dkdv], [None, *args.dq]):
            for dq_first in (False, True):
                if dkdv is None and dq is None and not dq_first:
                    continue
                candidates[(f"dkdv {dkdv or 'table'} dq {dq or 'table'}", dq_first)] = \
                    with_tiles(table, dkdv, dq)
        prepared, ref = {}, None
        for key, cfg in candidates.items():
            try:
                L = launch.prepare(graph, t, cfg)
                backward(launch, L, key[1])
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - out of resources, compile error
                print(f"{label} {key[0]} dq first {key[1]}: {type(exc).__name__}: "
                      f"{str(exc)[:100]}", flush=True)
                continue
            outs = [t[p].float().clone() for p in ("dq", "dk", "dv")]
            ref = ref or outs
            diff = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(outs, ref))
            prepared[key] = (L, diff)
        times = {key: [] for key in prepared}
        for _ in range(args.rounds):
            for key, (L, _) in prepared.items():
                times[key].append(triton.testing.do_bench(
                    lambda: backward(launch, L, key[1]), warmup=args.rep[0], rep=args.rep[1],
                    return_mode="median"))
        base = statistics.median(times[("table", False)])
        flops = 2.5 * 4 * graph.B * graph.H_q * graph.S_q * graph.S_kv * d / (2 if causal else 1)
        for key in sorted(times, key=lambda k: statistics.median(times[k])):
            ms = statistics.median(times[key])
            print(f"{label} {key[0]:48s} dq first {key[1]!s:5s} {ms:7.3f} ms "
                  f"{flops / ms / 1e9:4.0f} TFLOP/s  x table {base / ms:.3f}  "
                  f"rel diff {prepared[key][1]:.1e}", flush=True)
            rows.append(dict(d=d, causal=causal, pair=key[0], dq_first=key[1], ms=ms,
                             rounds=times[key], speedup=base / ms, max_rel_diff=prepared[key][1]))
        del t, prepared
    if args.out:
        Path(args.out).write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(),
                                                  torch=torch.__version__,
                                                  triton=triton.__version__, rows=rows),
                                             indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
