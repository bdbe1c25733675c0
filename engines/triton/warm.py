"""Compile, in parallel, every kernel variant the bundles of some levels will need, so that a
following `bundlegen run --engine triton` on the same machine finds them in Triton's cache.

A variant depends only on constexprs (dtype, mask kinds, head-dim tiles, VEC, WIDE, the
dK/dV passes): no integer argument is specialised. So each case has a tiny twin with the
same variant; the twins are deduplicated and run on the device by --jobs processes.

    python -m engines.triton.warm --levels quick pr nightly full --jobs 16
"""
from __future__ import annotations

import argparse
import glob
import multiprocessing as mp
import os
import time

from bundlegen.graph import Graph, load_bundle
from bundlegen.validate import frontend_reason
from engines.triton import configs
from engines.triton.selfcheck import Layout, make_graph

HARNESS_GUARD = 512  # harness/materialize.py: guard elements before every view (a multiple of 8)


def _vec(graph: Graph) -> int:
    """VEC the launcher will pick for this graph on the harness's (aligned) storages."""
    from engines.triton.launch import IO_PORTS, VEC, rows_aligned
    specs = [graph.tensors[p] for p in IO_PORTS]
    return VEC if all(rows_aligned(t.dims, t.strides, HARNESS_GUARD + t.offset)
                      for t in specs) else 1


def twin(graph: Graph) -> tuple | None:
    """Arguments of a tiny graph compiling the same kernels, or None for a WIDE case."""
    cfg = configs.config_for("sm90", graph.D_qk, graph.D_v)
    rows = max(cfg.block_m1, cfg.block_n1, cfg.block_m2, cfg.block_n2)
    if any((rows - 1) * t.strides[2] + (t.dims[3] - 1) * t.strides[3] >= 2 ** 31
           for t in graph.tensors.values()):
        return None
    a = graph.attributes
    return (graph.dtype, graph.D_qk, graph.D_v, a.left_bound is not None,
            a.right_bound is not None, graph.H_k == graph.H_v, _vec(graph))


def twins(levels: list[str], root: str = "bundles") -> tuple[list[tuple], int]:
    found, wide = {}, 0
    for level in levels:
        for path in sorted(glob.glob(os.path.join(root, level, "sdpa_bwd", "*.json"))):
            bundle, _ = load_bundle(path)
            for case in bundle.cases:
                if case.purpose == "probe" or frontend_reason(case.graph) is not None:
                    continue
                key = twin(case.graph)
                if key is None:
                    wide += 1
                    continue
                tiles = (key[0], configs.block_d(key[1]), configs.block_d(key[2]), *key[3:])
                found.setdefault(tiles, key)
    return list(found.values()), wide


def _run_twins(device: str, keys: list[tuple]) -> int:
    import torch

    from engines.triton.engine import TritonEngine
    from engines.triton.selfcheck import TORCH_DTYPES
    engine = TritonEngine(device)
    for dtype, d_qk, d_v, has_left, has_right, same_kv_heads, vec in keys:
        args = dict(B=1, H_q=2, H_k=2, H_v=2 if same_kv_heads else 1, S_q=16, D_qk=d_qk,
                    D_v=d_v, dtype=dtype, left=4 if has_left else None,
                    right=0 if has_right else None)
        graph = make_graph(layout=Layout(offsets={} if vec > 1 else {"q": 1}), **args)
        tensors = {}
        for port, spec in graph.tensors.items():
            storage = torch.zeros(spec.storage_elements, device=device,
                                  dtype=torch.float32 if port == "stats" else TORCH_DTYPES[dtype])
            tensors[port] = storage.as_strided(spec.dims, spec.strides, spec.offset)
        if engine.is_applicable(graph) is None:
            engine.run(graph, tensors)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return len(keys)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", nargs="+", default=["quick", "pr", "nightly", "full"])
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--bundles", default="bundles")
    args = parser.parse_args(argv)
    keys, wide = twins(args.levels, args.bundles)
    start = time.perf_counter()
    shards = [keys[i::args.jobs] for i in range(args.jobs) if keys[i::args.jobs]]
    with mp.get_context("spawn").Pool(len(shards)) as pool:
        done = sum(pool.starmap(_run_twins, [(args.device, s) for s in shards]))
    print(f"warmed {done} variants ({wide} WIDE cases left to compile on use) for "
          f"{' '.join(args.levels)} in {time.perf_counter() - start:.1f} s with {len(shards)} jobs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
