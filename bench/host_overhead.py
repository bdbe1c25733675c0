"""How much of the triton engine's measured backward is host work: its run() timed as
bench/engine_speed.py times it (triton.testing.do_bench, which clears L2 before every call,
so the GPU waits while the host prepares), beside the same launches prepared once, and the
host's own time per step of run().

    python bench/host_overhead.py [--shapes target] [--rep-ms 200] [--out FILE]

Each row: B4 H16 S4096 D128 bf16 causal or not (the issue-18 targets). `run` is
engine.run(graph, tensors); `prepared` is launch.run(L) with L = the launch run() would make,
prepared once; their difference is what run()'s host work costs on the GPU's clock. The host
columns are perf_counter medians of each step alone, the GPU kept busy so that no launch
waits on a full queue.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.engine_speed import make_tensors, target_shapes, graph_of  # noqa: E402


def host_us(fn, repeats: int = 200) -> float:
    """Median host microseconds of fn() (nothing synchronised inside)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rep-ms", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("host_overhead: no CUDA device here; it times launches on a GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from bundlegen.engines.triton import launch
    from bundlegen.engines.triton.engine import TritonEngine

    engine = TritonEngine("cuda")
    rows = []
    for shape in target_shapes():
        graph = graph_of(shape)
        tensors = make_tensors(graph, "cuda")
        engine.run(graph, tensors)
        prepared = engine._prepare(launch, graph, tensors, engine.config(graph))
        torch.cuda.synchronize()
        bench = lambda fn: float(do_bench(fn, warmup=25, rep=args.rep_ms, return_mode="median"))
        rounds = [(bench(lambda: engine.run(graph, tensors)),
                   bench(lambda: launch.run(prepared))) for _ in range(args.rounds)]
        run_ms = statistics.median(r for r, _ in rounds)
        prepared_ms = statistics.median(p for _, p in rounds)
        # host steps, each alone, with a long kernel queued so that launches never block
        busy = torch.empty(1 << 28, device="cuda")
        steps = {}
        for name, fn in (
                ("is_applicable", lambda: engine.is_applicable(graph)),
                ("config", lambda: engine.config(graph)),
                ("prepare", lambda: engine._prepare(launch, graph, tensors, engine.config(graph))),
                ("launch.run", lambda: launch.run(prepared)),
                ("run", lambda: engine.run(graph, tensors))):
            for _ in range(20):
                busy.mul_(1.0)
            steps[name] = host_us(fn, repeats=50)
            torch.cuda.synchronize()
        row = dict(label=shape.label, run_ms=run_ms, prepared_ms=prepared_ms,
                   host_cost_ms=run_ms - prepared_ms, rounds=rounds, host_us=steps)
        rows.append(row)
        print(f"{shape.label}: run {run_ms:.3f} ms, prepared {prepared_ms:.3f} ms "
              f"(run/prepared {run_ms / prepared_ms:.3f}); host us: "
              + ", ".join(f"{k} {v:.0f}" for k, v in steps.items()), flush=True)
        del tensors, busy
    if args.out:
        env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
        Path(args.out).write_text(json.dumps(dict(environment=env, rows=rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
