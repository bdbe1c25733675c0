"""The cost model: what a case costs, phase by phase, per cost class. The coefficients are a
plan's (its COST_MODEL, copied into the bundle manifest); the generator assigns levels with
them, the harness predicts times and the progress ETA with the manifest's copy, and
`bundlegen calibrate` fits them to the per-phase seconds results files record.

A cost class is a device class ("h200", "cpu"), or one engine on it ("cpu/torch-math",
"h200/torch-cudnn"); an engine without a class of its own is priced by its device's.
Per case (CostTerms holds the features, Phases the predicted seconds):

    materialize = io_bytes / bytes_per_s + touched_bytes / drawn_bytes_per_s + materialize_s
    oracle      = oracle_flops / oracle_flops_per_s + oracle_s     (every reference it computes)
    one run     = engine_flops / engine_flops_per_s + tiles x tile_s + launches x launch_s
                  + programs x program_s + dbias_tiles x dbias_tile_s
                  + drawn_tiles x drawn_tile_s
    engine      = one run + requested x deterministic_s             (set up once per case)
    check       = (runs - 1) x (one run + rerun_s) + check_s       (runs: DeterminismRuns)
                  + runs x io_bytes / check_bytes_per_s          (guards and outputs, per run)
    wall        = the four + overhead_s                            (the worker's round trip)

`tiles` counts the (query block, key block) pairs one engine run visits over all its passes
(dK/dV, dQ: the pairs holding an element the mask keeps; the dBias and dSinks reductions), the cost of a kernel that runs one
program at a time in the interpreter; `launches` the kernels a run launches; `programs` the
kernels' programs, per batch up to the length bounds the grids are sized by (the
interpreter's per-program set-up). Materializing fills every storage (`io_bytes`, from
offset 0: a view at an int64 offset fills gigabytes before it) and draws the addressed
elements (`touched_bytes`), which costs far more per byte where the inputs are drawn on the
host and the storages filled on a GPU. `dbias_tiles` the dBias reduction's own tiles, which
cost more than a pass's (a broadcast bias sums each over heads and batches), `drawn_tiles`
the pass tiles of a graph whose engine draws its own dropout mask (random numbers per tile), and `requested`
whether the graph asks for a deterministic backward (an engine may switch to a slower path
and set it up for the case).
Cost.flops is engine + oracle FLOPs; Cost.bytes is the case's peak footprint (io storages
in their dtypes plus the oracle's float64 tensors), which the level ceilings limit.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from bundlegen.graph import Attributes, Cost, Graph
from bundlegen.mask import diagonal_shift, is_masked

ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
FLOAT64 = 8
ORACLE_ROW_CHUNK = 512       # query rows of one float64 score block in the chunked oracle
DEVICE_CLASSES = ("h200", "cpu")


@dataclass(frozen=True)
class DeterminismRuns:
    """How many times the harness runs an engine on one case (DESIGN section 13): `ordinary`
    for any case of a deterministic engine (1: no re-run), `requested` for a case whose graph
    asks for a deterministic backward. A property of the engine and its device
    (Engine.determinism_runs), priced by the cost classes that measure that engine there."""
    ordinary: int
    requested: int

    def of(self, graph: Graph) -> int:
        return self.requested if graph.attributes.deterministic_algorithm else self.ordinary


#: a GPU kernel: the order of atomic adds, split reductions and scheduling can change from
#: run to run, and a race may show once in many runs (FlashAttention's own determinism tests
#: re-run 50 and 250 times)
GPU_RUNS = DeterminismRuns(ordinary=2, requested=50)
#: a CPU engine: its threads split the work the same way every run, so a few runs show
#: what can differ (a thread-count-dependent split, state carried between runs)
CPU_RUNS = DeterminismRuns(ordinary=2, requested=3)
#: a serial interpreter (Triton's, on the CPU): one program after another in grid order,
#: atomics applied in that order, so the arithmetic repeats exactly; only state carried from
#: one run to the next (scratch not reset) can change its bits, which one re-run shows
SERIAL_RUNS = DeterminismRuns(ordinary=1, requested=2)


#: the tile edge `tiles` counts in (the interpreter's and most GPU tables' 64)
TILE = 64


@dataclass(frozen=True)
class CostCoefficients:
    """One cost class's rates and fixed times (the module docstring's model)."""
    engine_flops_per_s: float
    oracle_flops_per_s: float
    bytes_per_s: float
    overhead_s: float
    probe_s: float = 0.001       # a probe is validated and offered to engines, never run
    run_start_s: float = 0.0     # once per `bundlegen run`: worker start, engine warm-up and
                                 # prepare on a warm cache, reports (run.json outside_cases_s)
    tile_s: float = 0.0          # per tile pair of one engine run
    launch_s: float = 0.0        # per kernel launch of one engine run
    program_s: float = 0.0       # per program (a query or key block of a head) of one run
    drawn_bytes_per_s: float = 1e15   # drawing the addressed elements, beyond filling
                                      # their storages at bytes_per_s
    dbias_tile_s: float = 0.0    # per dBias reduction tile of one run, beyond its tile_s
    drawn_tile_s: float = 0.0    # per pass tile that draws a dropout mask, beyond its tile_s
    deterministic_s: float = 0.0  # once per case that asks for a deterministic backward
    oracle_s: float = 0.0        # fixed oracle time per case
    materialize_s: float = 0.0   # fixed materialize time per case
    rerun_s: float = 0.0         # per re-run beyond the engine's own: reset, guards, compare
    check_s: float = 0.0         # fixed check time per case
    check_bytes_per_s: float = 1e12   # guards, inputs, outputs compared: io bytes per run
    ordinary_runs: int = 2       # DeterminismRuns of the engine and device the class measures
    requested_runs: int = 50

    @property
    def runs(self) -> DeterminismRuns:
        return DeterminismRuns(int(self.ordinary_runs), int(self.requested_runs))


COEFFICIENT_FIELDS = tuple(CostCoefficients.__dataclass_fields__)
#: the fields every manifest's entries hold (the rest default: manifests written before them)
REQUIRED_FIELDS = COEFFICIENT_FIELDS[:6]


@dataclass(frozen=True)
class Measured:
    """What the last calibration of a cost class measured (`bundlegen calibrate --write`):
    per level, the cases the engine ran there, their summed wall seconds in `source` (each
    case at its least over the runs given) and what the written coefficients predict for
    those same cases; the dry-run report sets them beside the level's prediction."""
    source: str                                          # the results files, as given to calibrate
    levels: tuple[tuple[str, int, float, float], ...]    # (level, cases, measured s, predicted s)


def cost_class(device_class: str, engine: str, model: Mapping[str, CostCoefficients]) -> str:
    """The class that prices `engine` on `device_class`: its own, else the device's."""
    own = f"{device_class}/{engine}"
    return own if own in model else device_class


@dataclass(frozen=True)
class CostTerms:
    engine_flops: int       # one engine run
    oracle_flops: int
    io_bytes: int
    oracle_bytes: int
    tiles: int = 0          # one engine run's tile pairs over its passes
    launches: int = 3       # one engine run's kernels
    requested: bool = False  # the graph asks for a deterministic backward
    programs: int = 0       # one engine run's programs: per head, its query and key blocks
    dbias_tiles: int = 0    # one engine run's dBias reduction tiles (in `tiles` too)
    drawn_tiles: int = 0    # one engine run's pass tiles that draw a dropout mask (in `tiles`)
    touched_bytes: int = 0  # the io tensors' addressed elements in their dtypes


@dataclass(frozen=True)
class Phases:
    """Predicted seconds of one case, phase by phase (results records' *_s fields)."""
    materialize_s: float
    oracle_s: float
    engine_s: float
    check_s: float
    overhead_s: float

    @property
    def total(self) -> float:
        return self.materialize_s + self.oracle_s + self.engine_s + self.check_s + self.overhead_s


def score_elements(graph: Graph) -> int:
    """Score elements of one head: B x S_q x S_kv, or a ragged graph's sum over its
    sequences of S_q_b x S_kv_b (each length clipped to [0, max_seqlen], as a bounded engine
    and the oracle see it; the max_seqlen bounds when its offsets are not known)."""
    return sum(q * kv for q, kv in sequence_lengths(graph))


def kept_columns(S_q: int, S_kv: int, attrs: Attributes, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row i of `rows`, the first and last column the mask keeps (bundlegen.mask's rule,
    solved for j); last < first where a row keeps none."""
    shift = diagonal_shift(S_q, S_kv, attrs.diagonal_alignment)
    reach = S_q + S_kv   # a bound past this keeps its whole side (and stays in int64)
    first = np.zeros_like(rows)
    last = np.full_like(rows, S_kv - 1)
    if attrs.left_bound is not None:
        first = np.maximum(first, rows + shift - min(attrs.left_bound, reach) + 1)
    if attrs.right_bound is not None:
        last = np.minimum(last, rows + shift + min(attrs.right_bound, reach))
    return first, last


def kept_elements(S_q: int, S_kv: int, attrs: Attributes) -> int:
    """Score elements of one S_q x S_kv block the mask keeps (all without a mask)."""
    if not is_masked(attrs) or S_q <= 0 or S_kv <= 0:
        return max(S_q, 0) * max(S_kv, 0)
    first, last = kept_columns(S_q, S_kv, attrs, np.arange(S_q, dtype=np.int64))
    return int(np.maximum(last - first + 1, 0).sum())


def visited_blocks(S_q: int, S_kv: int, attrs: Attributes) -> int:
    """(query block, key block) TILE pairs of one S_q x S_kv block that hold a kept element:
    the pairs a kernel that skips what its band leaves out visits (all without a mask)."""
    if not is_masked(attrs) or S_q <= 0 or S_kv <= 0:
        return blocks(S_q) * blocks(S_kv)
    starts = np.arange(0, S_q, TILE, dtype=np.int64)
    # a query block's rows keep columns from its first row's first to its last row's last
    first, _ = kept_columns(S_q, S_kv, attrs, starts)
    _, last = kept_columns(S_q, S_kv, attrs, np.minimum(starts + TILE, S_q) - 1)
    first, last = np.maximum(first, 0), np.minimum(last, S_kv - 1)
    return int(np.where(last >= first, last // TILE - first // TILE + 1, 0).sum())


def _per_sequence(graph: Graph, count) -> int:
    """`count(S_q, S_kv, attrs)` summed over the graph's sequences (equal ones counted once)."""
    seen = Counter(sequence_lengths(graph))
    return sum(n * count(q, kv, graph.attributes) for (q, kv), n in seen.items())


def sequence_lengths(graph: Graph) -> list[tuple[int, int]]:
    """(S_q, S_kv) of each sequence: B times the padded pair, or a ragged graph's own."""
    rag = graph.ragged
    if rag is None or rag.cu_seqlens_q is None or len(rag.cu_seqlens_q) != len(rag.cu_seqlens_kv):
        return [(graph.S_q, graph.S_kv)] * graph.B
    clip = lambda n, bound: min(max(n, 0), bound)
    return [(clip(a, rag.max_seqlen_q), clip(b, rag.max_seqlen_kv))
            for a, b in zip(rag.lengths_q, rag.lengths_kv)]


def blocks(n: int) -> int:
    return -(-n // TILE)


#: the dBias reduction's tile edge (the Triton engine's launch.DBIAS_TILE: the dQ kernel's
#: tiles, at most this), which `tiles` counts its pass in
DBIAS_TILE = 32


def passes(graph: Graph) -> tuple[int, int]:
    """(tile passes, kernel launches) of one engine run: dK/dV and dQ each visit every tile
    pair; a dBias reduction visits its own tiles (tiles()); dSinks walks the rows (counted
    in tiles by tiles()); a preprocessing launch forms Delta."""
    dbias = "dbias" in graph.tensors
    dsinks = "dsinks" in graph.tensors
    return 2, 3 + int(dbias) + int(dsinks)


def dbias_tiles(graph: Graph) -> int:
    """Tiles the dBias reduction visits, per query head: its DBIAS_TILE tiles of every
    batch's [S_q, S_kv] block (a ragged graph's padded max_seqlen block: the kernel walks
    each sequence's whole padded block), each summed over the heads and batches the bias
    broadcasts over; 0 without a dBias port."""
    if "dbias" not in graph.tensors:
        return 0
    edge = lambda n: -(-n // DBIAS_TILE)   # noqa: E731
    return graph.B * edge(graph.S_q) * edge(graph.S_kv)


#: the head-dim width one tile pair's products cover (the interpreter's time per pair grows
#: with the head's width in these steps); a wider head takes a pair per chunk
HEAD_DIM_CHUNK = 64


def head_dim_chunks(graph: Graph) -> int:
    return -(-max(graph.D_qk, graph.D_v) // HEAD_DIM_CHUNK)


def pass_tiles(graph: Graph) -> int:
    """Tile pairs the dK/dV and dQ passes visit: per query head, per sequence, the (query
    block, key block) pairs holding a kept score, times the passes and the head-dim chunks."""
    return graph.H_q * passes(graph)[0] * _per_sequence(graph, visited_blocks) * head_dim_chunks(graph)


def tiles(graph: Graph) -> int:
    """Tile pairs one engine run visits: its passes' (pass_tiles), the dBias reduction's
    tiles, plus one per query block for a dSinks reduction."""
    rows = sum(blocks(q) for q, _ in sequence_lengths(graph)) if "dsinks" in graph.tensors else 0
    return pass_tiles(graph) + graph.H_q * (dbias_tiles(graph) + rows)


def drawn_tiles(graph: Graph) -> int:
    """The pass tiles of a graph whose dropout mask the engine draws itself (no mask port);
    0 otherwise."""
    if not graph.attributes.dropout_probability or "dropout_mask" in graph.tensors:
        return 0
    return pass_tiles(graph)


def terms(graph: Graph) -> CostTerms:
    g = graph
    scores = g.H_q * score_elements(g)
    # engine: recompute S = QK^T, then dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, over
    # the elements its mask keeps (a banded kernel skips the rest)
    engine = 2 * g.H_q * _per_sequence(g, kept_elements) * (3 * g.D_qk + 2 * g.D_v)
    # oracle: forward (QK^T, PV), the same five backward products, four magnitude products,
    # dense (the float64 oracle masks after its products)
    oracle = 2 * scores * (6 * g.D_qk + 5 * g.D_v)
    io = sum(spec.storage_elements * ITEMSIZE.get(spec.dtype, 4) for spec in g.tensors.values())
    touched = sum(math.prod(spec.dims) * ITEMSIZE.get(spec.dtype, 4) for spec in g.tensors.values())
    q_rows, kv_rows = (g.T_q, g.T_kv) if g.ragged else (g.B * g.S_q, g.B * g.S_kv)
    q_like = q_rows * g.H_q
    logical = (2 * q_like * g.D_qk + 2 * q_like * g.D_v + q_like            # q, dq, o, do, stats
               + 2 * kv_rows * (g.H_k * g.D_qk + g.H_v * g.D_v))            # k, dk, v, dv
    oracle_bytes = FLOAT64 * (2 * logical + 3 * g.H_q * min(g.S_q, ORACLE_ROW_CHUNK) * g.S_kv)
    # the kernels' grids are sized by the bounds (a ragged graph's max_seqlen), not by the
    # sequences: a program past its sequence's end still starts, then finds nothing to do.
    # Delta and dQ take a program per query head and block, dK/dV one per K/V head and block
    # (looping over its query heads), or per K head and per V head where they differ
    kv_heads = g.H_k if g.H_k == g.H_v else g.H_k + g.H_v
    programs = g.B * (2 * g.H_q * blocks(g.S_q) + kv_heads * blocks(g.S_kv))
    return CostTerms(engine, oracle, io, oracle_bytes, tiles(g), passes(g)[1],
                     bool(g.attributes.deterministic_algorithm), programs,
                     g.H_q * dbias_tiles(g), drawn_tiles(g), touched)


def runs_of(t: CostTerms, k: CostCoefficients) -> int:
    return k.runs.requested if t.requested else k.runs.ordinary


def phases(t: CostTerms, k: CostCoefficients, runs: int | None = None) -> Phases:
    """The predicted seconds of each phase; `runs`: the engine runs (default: the class's)."""
    runs = runs_of(t, k) if runs is None else runs
    one_run = (t.engine_flops / k.engine_flops_per_s + t.tiles * k.tile_s + t.launches * k.launch_s
               + t.programs * k.program_s + t.dbias_tiles * k.dbias_tile_s
               + t.drawn_tiles * k.drawn_tile_s)
    return Phases(materialize_s=(t.io_bytes / k.bytes_per_s + t.touched_bytes / k.drawn_bytes_per_s
                                 + k.materialize_s),
                  oracle_s=t.oracle_flops / k.oracle_flops_per_s + k.oracle_s,
                  engine_s=one_run + t.requested * k.deterministic_s,
                  check_s=((runs - 1) * (one_run + k.rerun_s) + k.check_s
                                                    + runs * t.io_bytes / k.check_bytes_per_s),
                  overhead_s=k.overhead_s)


def seconds(t: CostTerms, k: CostCoefficients, runs: int | None = None) -> float:
    return phases(t, k, runs).total


def predict(graph: Graph, device_class: str, model: Mapping[str, CostCoefficients],
            *, probe: bool = False) -> Cost:
    """The predicted cost of running `graph` once on cost class `device_class` ('h200',
    'cpu', or an engine's own such as 'cpu/torch-math'); a probe (never executed) costs only
    the model's `probe_s`."""
    return predict_terms(terms(graph), device_class, model, probe=probe)


def predict_terms(t: CostTerms, device_class: str, model: Mapping[str, CostCoefficients],
                  *, probe: bool = False, runs: int | None = None) -> Cost:
    if device_class not in model:
        raise KeyError(f"unknown device class {device_class!r} (known: {', '.join(sorted(model))})")
    if probe:
        return Cost(flops=0, bytes=0, predicted_s=model[device_class].probe_s)
    runs = runs_of(t, model[device_class]) if runs is None else runs
    # FLOPs: the engine's once, or times its runs for a deterministic-mode case
    return Cost(flops=(runs if t.requested else 1) * t.engine_flops + t.oracle_flops, bytes=t.io_bytes + t.oracle_bytes,
                predicted_s=round(seconds(t, model[device_class], runs), 6))


def size_text(n: int) -> str:
    """Bytes for people: 16 MiB, 1.4 GiB, 512 B."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"
