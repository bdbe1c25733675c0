"""Compile, in parallel, every kernel variant some cases will need, so that the cases find
them in Triton's cache instead of compiling them one after the other on first use.

A variant depends only on constexprs (dtype, the band constexprs, head-dim tiles, VEC,
WIDE, the dK/dV passes, RAGGED, the score modifiers and the dBias / dSinks kernels): no
integer argument is specialised. So each case has a tiny twin with the same variant; the
twins are deduplicated, their launches recorded (not run), and each distinct kernel launch
(kernel, constexprs, compile options, argument kinds) compiled once, by --jobs processes
(Triton's `warmup`: compiled, not run). Twins share many kernels (the dQ kernel does not
depend on K/V head sharing, dBias or dSinks; preprocess on little): 564 twins launch 1423
distinct kernel launches (quick..full on sm90). Launches that differ only in integers Triton
does not specialise (a kernel's do_not_specialize: the kinds of sizes and strides, and the
run-time choices runtime_ints.CHOICE_INTS: the program order, a ragged batch's diagonal
alignment, a band's lone bound) are one kernel to Triton: they are compiled in one process,
so that all but the first find it in Triton's in-process cache (902 such groups of the
1423; 1217 while each band kind had kernels of its own, 1411 while the program order and
the diagonal alignment were constexprs). The groups go to the processes one at a time,
heaviest first, as each process becomes free.
A marker file per variant, kept in Triton's cache directory under a fingerprint of the
kernel sources and versions, lets a later run skip what was compiled without asking
Triton (clearing the cache clears the markers with it).

`TritonEngine.prepare` calls `compile_missing` before a run's first case; by hand:

    python -m bundlegen.engines.triton.warm --levels quick pr nightly full --jobs 16
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import hashlib
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Iterable

from bundlegen.graph import (Graph, dense_graph, load_bundle, ragged_graph,
                             with_modifiers)
from bundlegen.validate import GUARD_ELEMS, frontend_reason
from bundlegen.engines.triton import configs

SOURCES = ("kernels.py", "tile_ops.py", "dropout_draw.py", "launch.py", "configs.py")
MARKER_DIR = "bundlegen-variants"


def _vec(graph: Graph) -> int:
    """VEC the launcher will pick for this graph on the harness's (aligned) storages: every
    view starts GUARD_ELEMS canary elements (plus its declared offset) into its storage."""
    from bundlegen.engines.triton.addressing import IO_PORTS
    from bundlegen.engines.triton.tile_plan import VEC, rows_aligned
    from bundlegen.engines.triton.tile_plan import launched_view
    ragged = graph.ragged is not None
    specs = [graph.tensors[p] for p in IO_PORTS]
    return VEC if all(rows_aligned(*launched_view(t, ragged), GUARD_ELEMS + t.offset)
                      for t in specs) else 1


def _scores_aligned(graph: Graph) -> bool:
    """Whether the graph's bias and dropout mask (launch.SCORE_TILE_PORTS) have rows aligned
    as launch.score_vec asks, on the harness's storages (as _vec)."""
    from bundlegen.engines.triton.launch import SCORE_TILE_PORTS
    from bundlegen.engines.triton.tile_plan import rows_aligned
    return all(rows_aligned(t.dims, t.strides, GUARD_ELEMS + t.offset)
               for p, t in graph.tensors.items() if p in SCORE_TILE_PORTS)


def twin(graph: Graph, arch: str = "sm90", atomic_dq: bool = False) -> tuple | None:
    """Arguments of a tiny graph compiling the same kernels, or None for a WIDE case.
    `atomic_dq`: the engine's (TritonEngine.atomic_dq); its last element says whether this
    graph's launch adds dQ with atomics."""
    from bundlegen.engines.triton.engine import atomic_dq_serves, banded
    from bundlegen.engines.triton.launch import (STREAMED_PORTS, band_flags, head_tiles,
                                                 streams_take_descriptors, whole_tiles)
    from bundlegen.engines.triton.tile_plan import graph_needs_wide, launched_view
    atomic = atomic_dq and atomic_dq_serves(graph, arch)
    cfg = configs.config_for(arch, graph.D_qk, graph.D_v, banded(graph), atomic)
    ragged = graph.ragged is not None
    if graph_needs_wide(graph, cfg):
        return None
    a = graph.attributes
    bottom_right = ragged and a.diagonal_alignment == "BOTTOM_RIGHT"
    mods = tuple(m in graph.tensors for m in ("bias", "dbias", "dsinks")) + (a.softcap is not None,)
    # dropout: through the mask port, or drawn by the kernels (launch.modifier_flags)
    mods += (("port" if "dropout_mask" in graph.tensors else "drawn") if a.dropout_probability else None,)
    mods += ("alibi_slopes" in graph.tensors,)
    streams = streams_take_descriptors(launched_view(graph.tensors[p], ragged)
                                       for p in STREAMED_PORTS)   # (the rest is in the key)
    tiles = head_tiles(graph, cfg)
    flags = band_flags(graph, tiles)
    return (graph.dtype, graph.D_qk, graph.D_v, a.left_bound is not None,
            a.right_bound is not None, (flags["HAS_LEFT"], flags["HAS_RIGHT"]),
            graph.H_k == graph.H_v, graph.H_q > min(graph.H_k, graph.H_v), _vec(graph), ragged,
            graph.ragged.seqused_ports if ragged else (), bottom_right, mods, whole_tiles(graph, cfg, tiles), streams,
            _scores_aligned(graph) and not ragged, atomic)


def twin_graph(key: tuple) -> Graph:
    """The tiny graph of a twin key (launch.block_major follows the head grouping)."""
    (dtype, d_qk, d_v, has_left, has_right, _, same_kv_heads, grouped, vec, ragged, used, br,
     mods, even, streams, scores_aligned, _) = key
    sizes = dict(H_q=4 if grouped else 2, H_k=2, H_v=2 if same_kv_heads else 1, D_qk=d_qk,
                 D_v=d_v, dtype=dtype, left=4 if has_left else None,
                 right=0 if has_right else None, offsets={} if vec > 1 else {"q": 1})
    if not streams:   # K read through zero batch and head strides: no descriptor loads
        sizes["strides"] = {"k": (0, 0, d_qk, 1)}
    bias, dbias, dsinks, softcap, dropout, alibi = mods
    modifiers = dict(bias="full" if bias else None, dbias=dbias, sinks=dsinks, dsinks=dsinks,
                     softcap=1.0 if softcap else None, dropout=0.5 if dropout else None,
                     dropout_mask="full" if dropout == "port" else None,
                     alibi_slopes="head" if alibi else None)
    if ragged:
        lengths = {p: (7, 3) for p in used}   # within both sides' sequences (9, 7 and 12, 4)
        return with_modifiers(ragged_graph((0, 9, 16), (0, 12, 16), **sizes, **lengths,
                                           alignment="BOTTOM_RIGHT" if br else "TOP_LEFT"), **modifiers)
    # every tile whole at 256 rows (tiles have at most 128); none at 24 (tiles have at least
    # 16), whose bias and dropout mask rows are still 16-byte aligned (launch.score_vec),
    # unless the twin's graph has them unaligned (offset 1)
    graph = with_modifiers(dense_graph(B=1, S_q=256 if even else 24, **sizes), **modifiers)
    if scores_aligned:
        return graph
    return dataclasses.replace(graph, tensors={p: dataclasses.replace(t, offset=1) if p in ("bias", "dropout_mask")
                                               else t for p, t in graph.tensors.items()})


def variant_of(key: tuple) -> tuple:
    """The variant a twin key compiles: its head dims as the tiles they are padded to, its
    bounds as the band constexprs they launch with (launch.band_flags: most kernels serve
    every band kind)."""
    return (key[0], configs.block_d(key[1]), configs.block_d(key[2]),
            configs.two_chunk_tiles(key[1], key[2]), *key[5:])


def twin_keys(graphs: Iterable[Graph], arch: str = "sm90",
              atomic_dq: bool = False) -> tuple[list[tuple], int]:
    """One twin per distinct variant, and how many graphs are WIDE (no twin)."""
    found, wide = {}, 0
    for graph in graphs:
        key = twin(graph, arch, atomic_dq)
        if key is None:
            wide += 1
            continue
        found.setdefault(variant_of(key), key)
    return list(found.values()), wide


def level_graphs(levels: list[str], root: str = "bundles") -> list[Graph]:
    """The executed graphs of some levels' bundles (no probes, no frontend rejections)."""
    graphs = []
    for level in levels:
        for path in sorted(glob.glob(os.path.join(root, level, "sdpa_bwd", "*.json"))):
            bundle, _ = load_bundle(path)
            graphs += [c.graph for c in bundle.cases
                       if c.purpose != "probe" and frontend_reason(c.graph) is None]
    return graphs


def cache_dir() -> Path:
    try:
        from triton import knobs
        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):
        return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


@functools.lru_cache(maxsize=None)
def fingerprint(arch: str) -> str:
    """Changes whenever a compiled variant could: kernel sources, Triton, torch, the arch."""
    import torch
    import triton

    digest = hashlib.sha256(f"{arch} {triton.__version__} {torch.__version__}".encode())
    here = Path(__file__).parent
    for name in SOURCES:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:20]


def marker(arch: str, key: tuple) -> Path:
    """The marker of a twin key's variant (whichever twin stood for it)."""
    name = hashlib.sha256(repr(variant_of(key)).encode()).hexdigest()[:20]
    return cache_dir() / MARKER_DIR / fingerprint(arch) / name


def has_compiled(arch: str, graph: Graph, atomic_dq: bool = False) -> bool:
    """Whether the variant of `graph` has been compiled by compile_missing (its marker)."""
    key = twin(graph, arch, atomic_dq)
    return key is not None and marker(arch, key).exists()


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """A recorded launch's tensor argument: all its kernel specialises on is the dtype (the
    launcher passes storage base pointers, always aligned)."""
    dtype: str            # torch dtype name, e.g. "bfloat16"


@dataclasses.dataclass(frozen=True)
class _Descriptor:
    """A recorded launch's TMA tensor descriptor: Triton specialises on its dtype and block."""
    dtype: str            # torch dtype name
    block: tuple


def real_arg(arg, device: str):
    """A recorded argument as a compile-only launch takes it: a _Tensor as a one-element
    tensor of its dtype, a _Descriptor as a descriptor of one zero block; others as they are."""
    import torch

    if isinstance(arg, _Tensor):
        return torch.empty(1, dtype=getattr(torch, arg.dtype), device=device)
    if isinstance(arg, _Descriptor):
        from triton.tools.tensor_descriptor import TensorDescriptor

        block = torch.zeros(arg.block, dtype=getattr(torch, arg.dtype), device=device)
        return TensorDescriptor.from_tensor(block, list(arg.block))
    return arg


class _Site:
    def __init__(self, calls: list, name: str):
        self.calls, self.name = calls, name

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, args, kwargs))


class _Launches:
    """Stands in for the kernels module: records each launch instead of running it."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return _Site(self.calls, name)


def _recorded(arg):
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(arg, torch.Tensor):
        return _Tensor(str(arg.dtype).removeprefix("torch."))
    if isinstance(arg, TensorDescriptor):
        return _Descriptor(str(arg.base.dtype).removeprefix("torch."), tuple(arg.block_shape))
    return arg


def _arg_kind(arg):
    """What Triton specialises a positional (run-time) argument on: a tensor's dtype, a
    descriptor's dtype and block, an int's class (1, a multiple of 16, other), a float's
    type; None and bools as they are (constexprs)."""
    if isinstance(arg, (_Tensor, _Descriptor, bool)) or arg is None:
        return arg
    if isinstance(arg, int):
        return ("int", 1 if arg == 1 else 16 if arg % 16 == 0 else 0)
    if isinstance(arg, float):
        return ("float",)
    return ("other", repr(arg))


def twin_launches(keys: list[tuple], arch: str) -> dict[tuple, tuple]:
    """compile key -> (kernel name, args, kwargs) of one launch, for every distinct kernel
    launch the twins of `keys` make (tensors as _Tensor), recorded on meta tensors: nothing
    runs. Needs the kernels as compiled for a GPU (no TRITON_INTERPRET)."""
    from bundlegen.engines.triton import launch
    from bundlegen.engines.triton.engine import banded
    out: dict[tuple, tuple] = {}
    for key in keys:
        graph = twin_graph(key)
        tensors = launch.meta_tensors(graph)
        graph = graph.as_launched()
        atomic = key[-1]
        cfg = configs.config_for(arch, graph.D_qk, graph.D_v, banded(graph), atomic)
        recorder = _Launches()
        launch.run(dataclasses.replace(launch.prepare(graph, tensors, cfg, atomic_dq=atomic),
                                       kernels=recorder))
        for name, args, kwargs in recorder.calls:
            args = tuple(map(_recorded, args))
            kwargs = {k: _recorded(v) for k, v in kwargs.items()}
            out.setdefault(launch_key(name, args, kwargs), (name, args, kwargs))
    return out


def launch_key(name: str, args: tuple, kwargs: dict) -> tuple:
    """A recorded launch's compile key: never the same for two launches Triton compiles
    apart (tests/test_engine_prepare.py checks it against Triton's own key). Keyword
    arguments (constexprs, compile options, a few run-time integers): their values, exactly
    (compile_groups then merges what Triton does not specialise)."""
    return (name, tuple(map(_arg_kind, args)), tuple(sorted(kwargs.items())))


def _compile_launches(device: str, launches: list[tuple]) -> int:
    """Compile (not run) each recorded launch on `device` (Triton's warmup), its tensors
    one-element device tensors of their dtype; the compiled kernels land in Triton's cache."""
    import torch

    from bundlegen.engines.triton.launch import kernels_module
    kernels = kernels_module()
    if torch.device(device).index is not None:   # plain "cuda": the current device
        torch.cuda.set_device(torch.device(device))

    for name, args, kwargs in launches:
        getattr(kernels, name).warmup(*(real_arg(a, device) for a in args), grid=(1,),
                                      **{k: real_arg(v, device) for k, v in kwargs.items()})
    return len(launches)


def _compile_group(job: tuple[str, list[tuple]]) -> int:
    return _compile_launches(*job)


PROGRESS_EVERY_S = 10.0   # the compile's progress line, at most this often

#: relative compile cost of each kernel, to hand the heaviest groups out first
_COMPILE_WEIGHT = {"bwd_dkdv": 3.0, "bwd_dq": 2.0, "bwd_dbias": 2.0}


@functools.lru_cache(maxsize=None)
def _unspecialised(name: str) -> tuple[frozenset[int], frozenset[str]]:
    """Positions and names of the kernel's arguments Triton does not specialise
    (do_not_specialize)."""
    from bundlegen.engines.triton.launch import kernels_module
    fn = getattr(kernels_module(), name)
    listed = getattr(fn, "do_not_specialize", None)
    if listed is None:   # the interpreter's function keeps triton.jit's arguments as given
        listed = fn.kwargs.get("do_not_specialize") or ()
    positions = frozenset(a if isinstance(a, int) else fn.arg_names.index(a) for a in listed)
    return positions, frozenset(fn.arg_names[i] for i in positions)


def compile_groups(launches: list[tuple]) -> list[list[tuple]]:
    """The launches grouped by what Triton compiles apart as far as its specialisation shows
    (an integer argument of do_not_specialize, positional or by keyword, is one kernel for
    every value), heaviest group first. Should Triton compile two launches of a group apart
    after all, both are still compiled, in the same process."""
    groups: dict[tuple, list[tuple]] = {}
    for name, args, kwargs in launches:
        positions, names = _unspecialised(name)
        kinds = tuple("int" if i in positions and type(a) is int else _arg_kind(a)
                      for i, a in enumerate(args))
        named = tuple(sorted((k, "int" if k in names and type(v) is int else v)
                             for k, v in kwargs.items()))
        groups.setdefault((name, kinds, named), []).append((name, args, kwargs))
    return sorted(groups.values(), key=lambda g: -_COMPILE_WEIGHT.get(g[0][0], 0.5))


def default_jobs() -> int:
    """Every core: the parent only waits on the compile processes (Triton's compile of one
    kernel is single-threaded LLVM, then ptxas, in its process)."""
    return max(1, os.cpu_count() or 2)


#: the most kernel launches one twin records (preprocess, two dK/dV passes, dQ, dBias,
#: dSinks): the compile processes are started before the launches are counted
LAUNCHES_PER_TWIN = 6


def _start_compiler(device: str) -> None:
    """A compile process's start, while the parent still records the launches: Triton, the
    kernels module and the device's context, which every compile needs first. It never
    raises: a pool whose initializer fails starts processes without end; a failing step
    fails again, with its error, in the first compile (_compile_launches repeats them)."""
    try:
        import torch

        from bundlegen.engines.triton.launch import kernels_module
        kernels_module()
        if torch.device(device).type == "cuda":
            if torch.device(device).index is not None:
                torch.cuda.set_device(torch.device(device))
            torch.empty(1, device=device)
    except Exception:  # noqa: BLE001 - see the docstring
        pass


def compile_missing(device: str, arch: str, graphs: Iterable[Graph], jobs: int | None = None,
                    *, announce: bool = True, atomic_dq: bool = False) -> tuple[int, int, int]:
    """Compile the variants of `graphs` that have no marker yet, `jobs` processes at a time;
    (compiled, already there, WIDE graphs left to compile on use). `atomic_dq`: the
    engine's (TritonEngine.atomic_dq). The processes start before the launches are recorded
    (a few seconds of the parent's Python on a cold run), so that their imports and device
    contexts overlap it."""
    keys, wide = twin_keys(graphs, arch, atomic_dq)
    missing = [k for k in keys if not marker(arch, k).exists()]
    if missing:
        jobs = max(1, min(jobs or default_jobs(), LAUNCHES_PER_TWIN * len(missing)))
        with mp.get_context("spawn").Pool(jobs, initializer=_start_compiler, initargs=(device,)) as pool:
            launches = list(twin_launches(missing, arch).values())
            groups = compile_groups(launches)
            if announce:
                print(f"triton: compiling {len(missing)} kernel variant(s), {len(launches)} distinct "
                      f"kernel launches ({len(groups)} kernels to Triton), with {min(jobs, len(groups))} "
                      f"process(es) ({len(keys) - len(missing)} cached)", file=sys.stderr, flush=True)
            started, shown, done = time.monotonic(), time.monotonic(), 0
            for _ in pool.imap_unordered(_compile_group, [(device, g) for g in groups]):
                done += 1
                if announce and time.monotonic() - shown >= PROGRESS_EVERY_S:
                    shown = time.monotonic()
                    print(f"triton: {done}/{len(groups)} kernels compiled "
                          f"({shown - started:.0f} s)", file=sys.stderr, flush=True)
        for key in missing:
            path = marker(arch, key)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    return len(missing), len(keys) - len(missing), wide


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", nargs="+", default=["quick", "pr", "nightly", "full"])
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--bundles", default="bundles")
    args = parser.parse_args(argv)
    from bundlegen.engines.base import arch_of

    start = time.perf_counter()
    compiled, cached, wide = compile_missing(args.device, arch_of(args.device),
                                             level_graphs(args.levels, args.bundles), args.jobs)
    print(f"{compiled} variant(s) compiled, {cached} already cached ({wide} WIDE cases left to "
          f"compile on use) for {' '.join(args.levels)} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
