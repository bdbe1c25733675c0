"""Backward TFLOP/s of the `triton` engine against PyTorch's SDPA backward kernels
(torch-flash, torch-cudnn, torch-efficient) on the same inputs, in one run.

Grid: bf16 and fp16, D in {64, 128, 192, 256}, S in {1024, 4096, 8192, 16384}, causal and
not, H=16 and B*S = 16384 (so B*H*S is constant: B=4 at S=4096), plus GQA 8:1 and a
strided (BSHD) layout at the target shape B=4 H=16 S=4096 D=128 bf16.
FLOPs = 2.5 x 4 B H S_q S_kv D, halved for causal.

Each engine is timed through its `run(graph, tensors)` (triton.testing.do_bench, median).
--rounds N times every engine N times per shape, in turns, each round starting one engine
later than the round before (triton, peer 1, peer 2; peer 1, peer 2, triton; ...), so that
neither a drift of the GPU's clocks during the run nor an engine's place in the turn favours
one engine (two copies of the same Triton engine read 1.00-1.04x apart on the D 128 rows
when the first was always timed first, 0.99-1.02x with the turns, on an H200).
A cell is the median of its rounds, and the target lines give the spread of the per-round
ratios.
The torch peers' runs include their adapter's copies (O into the op's layout, LSE, the
gradients into the declared outputs), so the peers are also timed on their aten op alone
with the arguments their adapter built; the ratios use that op time (the strict basis).
A declined shape shows the engine's reason in its cell; an exception is recorded, not fatal.

    python bench/engine_speed.py                 # the whole grid, ~3-4 min on an H200
    python bench/engine_speed.py --quick         # the target rows only
    python bench/engine_speed.py --quick --rounds 7   # the target rows, engines in turns
    python bench/engine_speed.py --quick --atomic-dq   # and the engine with atomic dQ
    python bench/engine_speed.py --device cpu    # smoke test, tiny shapes (TRITON_INTERPRET=1
                                                 # for the triton engine)
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from bundlegen.dtypes import TORCH_DTYPES  # noqa: E402
from bundlegen.graph import Graph, TensorSpec, dense_graph  # noqa: E402

TRITON = "triton"
#: the engine with atomic dQ (not a built-in name yet: reached by its class; --atomic-dq)
ATOMIC_DQ = "bundlegen.engines.triton.engine:TritonAtomicDqEngine"
PEERS = ("torch-flash", "torch-cudnn", "torch-efficient")
CPU_PEERS = ("torch-math", "torch-flash")
DTYPES = ("bf16", "fp16")
TOKENS_PER_HEAD_BATCH = 4 * 4096        # B * S, so B * H * S stays 64 * 4096 at H = 16
TARGET_RATIOS = {"torch-flash": 1.0, "torch-cudnn": 0.75}  # triton / peer: at least, goal
#: the wide head dims' goal: triton / torch-flash >= 1.0 on these head dims at these lengths
#: (both dtypes, causal and not, MHA, BHSD), where torch-cudnn serves no peer to compare with
WIDE_HEAD_TARGET = ((192, 256), (4096, 16384), 1.0)
#: measurements land under out/, which git ignores: the figures worth keeping are in
#: docs/PERFORMANCE.md, each with the command that measures it again
RESULTS_DIR = REPO_ROOT / "out"


# ----------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shape:
    B: int
    H_q: int
    H_kv: int
    S: int
    D: int
    dtype: str
    causal: bool
    layout: str = "bhsd"

    @property
    def label(self) -> str:
        heads = f"H{self.H_q}" if self.H_kv == self.H_q else f"H{self.H_q}:{self.H_kv}"
        mask = "causal" if self.causal else "non-causal"
        layout = "" if self.layout == "bhsd" else f" {self.layout.upper()}"
        return f"B{self.B} {heads} S{self.S} D{self.D} {self.dtype} {mask}{layout}"

    @property
    def flops(self) -> float:
        full = 2.5 * 4 * self.B * self.H_q * self.S * self.S * self.D
        return full / 2 if self.causal else full


def target_shapes() -> list[Shape]:
    return [Shape(4, 16, 16, 4096, 128, "bf16", causal) for causal in (False, True)]


def grid_shapes(dtypes, head_dims, seqs) -> list[Shape]:
    shapes = [Shape(max(1, TOKENS_PER_HEAD_BATCH // S), 16, 16, S, D, dtype, causal)
              for dtype in dtypes for D in head_dims for S in seqs for causal in (False, True)]
    for causal in (False, True):
        shapes.append(Shape(4, 16, 2, 4096, 128, "bf16", causal))               # GQA 8:1
        shapes.append(Shape(4, 16, 16, 4096, 128, "bf16", causal, layout="bshd"))
    return shapes


def cpu_shapes() -> list[Shape]:
    return [Shape(1, 2, 2, 64, 32, "bf16", causal) for causal in (False, True)] + \
           [Shape(1, 4, 2, 64, 32, "fp16", False), Shape(1, 2, 2, 64, 32, "bf16", False, layout="bshd")]


# ----------------------------------------------------------------------------- graph, tensors
def graph_of(shape: Shape) -> Graph:
    s = shape
    return dense_graph(B=s.B, H_q=s.H_q, H_k=s.H_kv, S_q=s.S, D_qk=s.D, dtype=s.dtype,
                       layout=s.layout, alignment="BOTTOM_RIGHT", right=0 if s.causal else None)


def empty_as(spec: TensorSpec, device) -> torch.Tensor:
    return torch.empty_strided(spec.dims, spec.strides, dtype=TORCH_DTYPES[spec.dtype], device=device)


def reference_forward(q, k, v, scale: float, causal: bool, rows: int = 1024):
    """O (io dtype) and natural-log LSE [B, H, S] fp32, in float32, chunked over heads and
    query rows (never a whole S x S matrix per batch)."""
    B, H, S, _ = q.shape
    group = H // k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty((B, H, S), dtype=torch.float32, device=q.device)
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, h // group].float(), v[b, h // group].float()
            for r0 in range(0, S, rows):
                r1 = min(S, r0 + rows)
                scores = (q[b, h, r0:r1].float() @ kh.T) * scale
                if causal:
                    i = torch.arange(r0, r1, device=q.device)[:, None]
                    j = torch.arange(S, device=q.device)[None, :]
                    scores.masked_fill_(j > i, -math.inf)
                row_lse = torch.logsumexp(scores, dim=-1)
                o[b, h, r0:r1] = (torch.exp(scores - row_lse[:, None]) @ vh).to(q.dtype)
                lse[b, h, r0:r1] = row_lse
    return o, lse


def make_tensors(graph: Graph, device, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    t = {port: empty_as(spec, device) for port, spec in graph.tensors.items()}
    for port in ("q", "k", "v", "do"):
        t[port].copy_(torch.randn(t[port].shape, device=device))
    o, lse = reference_forward(t["q"], t["k"], t["v"], graph.attributes.attn_scale,
                               graph.attributes.right_bound == 0)
    t["o"].copy_(o)
    t["stats"].copy_(lse.unsqueeze(-1))
    for port in ("dq", "dk", "dv"):
        t[port].zero_()
    return t


# ----------------------------------------------------------------------------- timing
Timer = Callable[[Callable[[], object]], float]   # fn -> milliseconds


def cuda_timer(warmup_ms: int, rep_ms: int) -> Timer:
    from triton.testing import do_bench

    def time_ms(fn) -> float:
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return time_ms


def cpu_timer(repeats: int = 2) -> Timer:
    def time_ms(fn) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[len(times) // 2]
    return time_ms


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- one cell
@dataclass(frozen=True)
class Cell:
    """One engine on one shape: its run() time, and for a torch peer its aten op's alone."""
    engine: str
    run_ms: float | None = None
    op_ms: float | None = None
    first_call_s: float | None = None    # includes compilation / autotuning, if any
    note: str = ""                        # decline reason or error
    max_rel_diff: float | None = None     # vs triton's outputs: max |a - b| / max |b|
    #: (run_ms, op_ms) of each round (--rounds); run_ms and op_ms are their medians
    rounds: tuple[tuple[float, float | None], ...] = ()

    @property
    def ms(self) -> float | None:
        """The time ratios use: the op alone where measured, else run()."""
        return self.op_ms if self.op_ms is not None else self.run_ms


def tflops(shape: Shape, ms: float | None) -> float | None:
    return None if not ms else shape.flops / (ms * 1e-3) / 1e12


def captured_op_call(engine, graph: Graph, tensors: Mapping[str, torch.Tensor]):
    """(call, op, values): the aten call a torch-SDPA engine's adapter makes, captured from
    one run() with the arguments it built; None for an engine without that adapter."""
    module = sys.modules.get(type(engine).__module__)
    call = getattr(module, "call_by_schema", None)
    if call is None:
        return None
    seen = []

    def capture(op, values):
        seen.append((op, dict(values)))
        return call(op, values)

    module.call_by_schema = capture
    try:
        engine.run(graph, tensors)
    finally:
        module.call_by_schema = call
    return (call, *seen[0]) if seen else None


def short_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"error: {type(exc).__name__}: {text[:160]}"


def timed_calls(engine, graph: Graph, tensors, timer: Timer) -> tuple[float, float | None]:
    """(run() ms, the captured aten op's ms or None) of one round."""
    run_ms = timer(lambda: engine.run(graph, tensors))
    captured = captured_op_call(engine, graph, tensors)
    if captured is None:
        return run_ms, None
    call, op, values = captured
    return run_ms, timer(lambda: call(op, values))


def with_rounds(cell: Cell, rounds: list[tuple[float, float | None]]) -> Cell:
    """The cell's times as the medians of its rounds."""
    ops = [op for _, op in rounds if op is not None]
    return Cell(**{**asdict(cell), "rounds": tuple(rounds),
                   "run_ms": statistics.median(run for run, _ in rounds),
                   "op_ms": statistics.median(ops) if ops else None})


def measure(name: str, engine, graph: Graph, tensors, timer: Timer, device) -> Cell:
    try:
        reason = engine.is_applicable(graph)
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        return Cell(name, note=short_error(exc))
    if reason:
        return Cell(name, note=f"declined: {reason}")
    try:
        start = time.perf_counter()
        engine.run(graph, tensors)
        synchronize(device)
        first = time.perf_counter() - start
        run_ms, op_ms = timed_calls(engine, graph, tensors, timer)
        return Cell(name, run_ms=run_ms, op_ms=op_ms, first_call_s=first,
                    rounds=((run_ms, op_ms),))
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        return Cell(name, note=short_error(exc))


def max_rel_diff(ours: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor]) -> float:
    worst = 0.0
    for port in ("dq", "dk", "dv"):
        a, b = ours[port].float(), theirs[port].float()
        worst = max(worst, float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30))
    return worst


def outputs_of(tensors) -> dict[str, torch.Tensor]:
    return {p: tensors[p].clone() for p in ("dq", "dk", "dv")}


@dataclass(frozen=True)
class Row:
    shape: Shape
    cells: Mapping[str, Cell]
    seconds: float = 0.0

    def ratio(self, peer: str, ours: str = TRITON) -> float | None:
        """peer's time over `ours`' (above 1: ours is faster)."""
        mine, theirs = self.cells[ours].ms, self.cells[peer].ms
        return theirs / mine if mine and theirs else None

    def round_ratios(self, peer: str, ours: str = TRITON) -> list[float]:
        """ratio's value in each round, from the times of that round alone."""
        pick = lambda r: r[1] if r[1] is not None else r[0]
        return [pick(t) / pick(m) for m, t in zip(self.cells[ours].rounds,
                                                   self.cells[peer].rounds)]

    def to_json(self) -> dict:
        return {"shape": asdict(self.shape), "label": self.shape.label, "flops": self.shape.flops,
                "seconds": round(self.seconds, 2),
                "cells": {n: {**asdict(c), "tflops": tflops(self.shape, c.ms),
                              "run_tflops": tflops(self.shape, c.run_ms)} for n, c in self.cells.items()},
                "triton_over": {p: self.ratio(p) for p in self.cells if p != TRITON}}


def measure_shape(shape: Shape, engines: Mapping[str, object], timer: Timer, device,
                  rounds: int = 1) -> Row:
    start = time.perf_counter()
    graph = graph_of(shape)
    cells: dict[str, Cell] = {}
    try:
        tensors = make_tensors(graph, device)
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory: the row says so
        return Row(shape, {n: Cell(n, note=short_error(exc)) for n in engines},
                   time.perf_counter() - start)
    reference = None
    for name, engine in engines.items():
        if isinstance(engine, Exception):
            cells[name] = Cell(name, note=short_error(engine))
            continue
        cell = measure(name, engine, graph, tensors, timer, device)
        if cell.run_ms is not None:
            if name == TRITON:
                reference = outputs_of(tensors)
            elif reference is not None:
                cell = Cell(**{**asdict(cell), "max_rel_diff": max_rel_diff(reference, tensors)})
        cells[name] = cell
    timed = {name: list(cell.rounds) for name, cell in cells.items() if cell.rounds}
    names = list(timed)
    for r in range(1, rounds):   # the engines in turns again, from the r-th (see --rounds)
        for name in names[r % len(names):] + names[:r % len(names)]:
            timed[name].append(timed_calls(engines[name], graph, tensors, timer))
    if rounds > 1:
        cells.update({name: with_rounds(cells[name], times) for name, times in timed.items()})
    del tensors, reference
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return Row(shape, cells, time.perf_counter() - start)


# ----------------------------------------------------------------------------- output
def fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def cell_text(row: Row, name: str) -> str:
    """TFLOP/s, or the decline code ('declined: code: detail' -> 'code'), or 'ERROR'; the
    full reasons are listed under the table."""
    cell = row.cells[name]
    if cell.ms is not None:
        return fmt(tflops(row.shape, cell.ms), ".3g")
    if cell.note.startswith("declined: "):
        return cell.note[len("declined: "):].split(":", 1)[0].strip()
    return "ERROR"


def short(name: str) -> str:
    """An engine's column name (the atomic-dQ engine is named by its class path)."""
    return "triton-atomic-dq" if name == ATOMIC_DQ else name


def print_table(rows: list[Row], names: list[str]) -> None:
    peers = [n for n in names if n != TRITON]
    head = f"{'shape':44s}" + "".join(f"{short(n):>19s}" for n in names) + "".join(
        f"{'t/' + short(p).removeprefix('torch-')[:8]:>11s}" for p in peers)
    print(head)
    for row in rows:
        line = f"{row.shape.label:44s}" + "".join(f"{cell_text(row, n)[:18]:>19s}" for n in names)
        line += "".join(f"{fmt(row.ratio(p), '.2f'):>11s}" for p in peers)
        print(line)
    notes = sorted({(n, c.note) for row in rows for n, c in row.cells.items() if c.note})
    if notes:
        print("\nreasons and errors:")
        for name, note in notes:
            print(f"  {name}: {note}")
    drift = [(row.shape.label, n, c.max_rel_diff) for row in rows for n, c in row.cells.items()
             if c.max_rel_diff is not None and c.max_rel_diff > 0.05]
    for label, name, diff in drift:
        print(f"WARNING: {label}: triton's gradients differ from {name}'s by {diff:.3f} (max rel)")


def target_lines(rows: list[Row]) -> list[str]:
    lines = []
    for row in rows:
        s = row.shape
        if (s.B, s.H_q, s.H_kv, s.S, s.D, s.dtype, s.layout) != (4, 16, 16, 4096, 128, "bf16", "bhsd"):
            continue
        mask = "causal" if s.causal else "non-causal"
        for peer, target in TARGET_RATIOS.items():
            if peer not in row.cells:
                continue
            ratio = row.ratio(peer)
            run_basis = None
            ours, theirs = row.cells[TRITON].run_ms, row.cells[peer].run_ms
            if ours and theirs:
                run_basis = theirs / ours
            kind = "target" if peer == "torch-flash" else "goal"
            met = "-" if ratio is None else ("met" if ratio >= target else "NOT met")
            per_round = row.round_ratios(peer)
            spread = (f"; {len(per_round)} rounds: {min(per_round):.3f}-{max(per_round):.3f}, "
                      f"{sum(r >= target for r in per_round)} at or over"
                      if len(per_round) > 1 else "")
            lines.append(f"triton / {peer} at B4 H16 S4096 D128 bf16 {mask}: {fmt(ratio, '.2f')} "
                         f"({kind} >= {target:g}: {met}; on run() incl. adapter copies: "
                         f"{fmt(run_basis, '.2f')}{spread})")
            if ATOMIC_DQ in row.cells:
                ratio = row.ratio(peer, ATOMIC_DQ)
                met = "-" if ratio is None else ("met" if ratio >= target else "NOT met")
                lines.append(f"  with atomic dQ (not deterministic) / {peer}: {fmt(ratio, '.2f')} "
                             f"({kind} >= {target:g}: {met})")
    dims, seqs, target = WIDE_HEAD_TARGET
    for row in rows:
        s = row.shape
        if s.D not in dims or s.S not in seqs or s.H_kv != s.H_q or s.layout != "bhsd":
            continue
        ratio = row.ratio("torch-flash") if "torch-flash" in row.cells else None
        met = "-" if ratio is None else ("met" if ratio >= target else "NOT met")
        lines.append(f"triton / torch-flash at {s.label}: {fmt(ratio, '.2f')} "
                     f"(target >= {target:g}: {met})")
    return lines


def environment(device: torch.device) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device)}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["capability"] = list(torch.cuda.get_device_capability(device))
        env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return env


def default_out(device: torch.device) -> Path:
    if device.type != "cuda":
        return RESULTS_DIR / "engine_speed_cpu.json"
    name = torch.cuda.get_device_name(device)
    tag = "h200" if "H200" in name else "sm{}{}".format(*torch.cuda.get_device_capability(device))
    return RESULTS_DIR / f"engine_speed_{tag}.json"


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- main
def build_engines(names, device) -> dict[str, object]:
    from bundlegen.engines.registry import engine_class

    engines = {}
    for name in names:
        try:
            engines[name] = engine_class(name)(device)
        except Exception as exc:  # noqa: BLE001 - the engine's column shows the error
            engines[name] = exc
    return engines


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the target rows (B4 H16 S4096 D128 bf16)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test, tiny shapes)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default out/engine_speed_h200.json on an H200)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128, 192, 256])
    parser.add_argument("--seqs", nargs="+", type=int, default=[1024, 4096, 8192, 16384])
    parser.add_argument("--peers", nargs="+", default=None,
                        help=f"engines to compare with (default {' '.join(PEERS)}; on cpu {' '.join(CPU_PEERS)})")
    parser.add_argument("--atomic-dq", action="store_true",
                        help="also time the engine with atomic dQ (TritonAtomicDqEngine)")
    parser.add_argument("--warmup-ms", type=int, default=20)
    parser.add_argument("--rep-ms", type=int, default=60, help="do_bench rep (the median is reported)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time the engines this many times per shape, in turns; each cell "
                             "is the median of its rounds")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected 1 or more")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("engine_speed: no CUDA device here. This benchmark needs a GPU (it was written for "
              "an H200); for a smoke test of the code path run with --device cpu.", file=sys.stderr)
        return 2
    if device.type == "cpu":
        shapes, timer = cpu_shapes(), cpu_timer()
        peers = args.peers or list(CPU_PEERS)
    else:
        shapes = target_shapes() if args.quick else grid_shapes(args.dtypes, args.head_dims, args.seqs)
        timer = cuda_timer(args.warmup_ms, args.rep_ms)
        peers = args.peers or list(PEERS)
    names = [TRITON, *peers] + ([ATOMIC_DQ] if args.atomic_dq else [])
    out = args.out or default_out(device)
    engines = build_engines(names, device)
    env = environment(device)
    print(f"engine_speed: {len(shapes)} shapes x {len(names)} engines on {env.get('gpu', device)}; "
          f"torch {env['torch']}, triton {env['triton']}; TFLOP/s (peers: aten op alone)", flush=True)

    started = time.perf_counter()
    rows: list[Row] = []
    for i, shape in enumerate(shapes, 1):
        row = measure_shape(shape, engines, timer, device, args.rounds)
        rows.append(row)
        summary = "  ".join(f"{short(n)}={cell_text(row, n)}" for n in names)
        print(f"[{i}/{len(shapes)} {row.seconds:5.1f}s] {shape.label}: {summary}", flush=True)
        # written after every row, so a run that dies keeps what it measured
        write_json(out, {"environment": env, "settings": vars(args) | {"out": str(out)},
                         "flops": "2.5 x 4 B H_q S_q S_kv D, halved for causal",
                         "rows": [r.to_json() for r in rows], "targets": target_lines(rows),
                         "elapsed_s": round(time.perf_counter() - started, 1)})
    print()
    print_table(rows, names)
    print()
    for line in target_lines(rows):
        print(line)
    print(f"\n{len(rows)} shapes in {time.perf_counter() - started:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
