"""The Triton engine on score-modifier graphs with head dims in (128, 192]: the two column
chunks (kernels.py, "Two chunks") against the padded 256-wide tile they had before, in one
run, on the same inputs (an additive bias over heads and a softcap of 30; B4 H16 S4096).

    python bench/two_chunk_modifiers.py [--head-dims 160 192] [--out FILE]

Prints ms per backward and the speed-up of the chunked launch, per head dim, dtype and mask,
and the largest relative difference of the two launches' gradients (0 on the H200: the
padded tile's extra columns are zeros, and the chunks sum in the same order).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from bench.engine_speed import cuda_timer, make_tensors, max_rel_diff, outputs_of  # noqa: E402
from bundlegen.graph import dense_graph, with_modifiers  # noqa: E402


def engine_with(two_chunks: bool):
    from bundlegen.engines.triton.engine import TritonEngine

    class Engine(TritonEngine):
        def config(self, graph):
            return dataclasses.replace(super().config(graph), two_chunks=two_chunks)
    return Engine("cuda")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[160, 192])
    parser.add_argument("--dtypes", nargs="+", default=["bf16"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("two_chunk_modifiers: needs a GPU (written for an H200)", file=sys.stderr)
        return 2
    timer = cuda_timer(20, 100)
    chunked, padded = engine_with(True), engine_with(False)
    rows = []
    print(f"{'D':>4} {'dtype':>5} {'mask':>7} {'chunked ms':>11} {'padded ms':>10} {'speed-up':>9} "
          f"{'max rel diff':>13}")
    for d in args.head_dims:
        for dtype in args.dtypes:
            for causal in (False, True):
                base = dense_graph(B=4, H_q=16, S_q=4096, D_qk=d, dtype=dtype,
                                   right=0 if causal else None)
                graph = with_modifiers(base, bias="head", softcap=30.0)
                t = make_tensors(base, "cuda")
                spec = graph.tensors["bias"]   # broadcast over the batch: filled through its storage
                storage = (torch.randn(spec.storage_elements, device="cuda") * 0.5).to(t["q"].dtype)
                t["bias"] = storage.as_strided(spec.dims, spec.strides, spec.offset)
                times, grads = {}, {}
                for name, engine in (("chunked", chunked), ("padded", padded)):
                    assert engine.is_applicable(graph) is None, engine.is_applicable(graph)
                    times[name] = timer(lambda: engine.run(graph, t))
                    grads[name] = {p: x.clone() for p, x in outputs_of(t).items()}
                diff = max_rel_diff(grads["chunked"], grads["padded"])
                row = dict(D=d, dtype=dtype, causal=causal, chunked_ms=times["chunked"],
                           padded_ms=times["padded"], speedup=times["padded"] / times["chunked"],
                           max_rel_diff=diff)
                rows.append(row)
                print(f"{d:>4} {dtype:>5} {'causal' if causal else 'full':>7} {row['chunked_ms']:>11.3f} "
                      f"{row['padded_ms']:>10.3f} {row['speedup']:>8.2f}x {diff:>13.1e}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
