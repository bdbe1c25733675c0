"""The cost model: FLOPs and bytes of a case for the engine and the float64 oracle, and
the predicted seconds per device class. The coefficients are a plan's (its COST_MODEL,
copied into the bundle manifest); the generator assigns levels with them, the harness
predicts CPU times with the manifest's copy, `bundlegen calibrate` refits them.

predicted_s = engine_flops / engine rate + oracle_flops / oracle rate
              + io_bytes / host rate (materialize: fill, copies, snapshots, guard checks)
              + a fixed per-case overhead.
Cost.flops is engine + oracle FLOPs; Cost.bytes is the case's peak footprint (io storages
in their dtypes plus the oracle's float64 tensors), which the level ceilings limit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from bundlegen.graph import Cost, Graph

ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
FLOAT64 = 8
ORACLE_ROW_CHUNK = 512       # query rows of one float64 score block in the chunked oracle
DEVICE_CLASSES = ("h200", "cpu")
#: runs of a case whose graph asks for a deterministic backward (FlashAttention's own
#: determinism tests re-run 50 and 250 times); the harness runs such a case this many times
DETERMINISTIC_MODE_RUNS = 50


@dataclass(frozen=True)
class CostCoefficients:
    """One device class's rates and fixed times."""
    engine_flops_per_s: float
    oracle_flops_per_s: float
    bytes_per_s: float
    overhead_s: float
    probe_s: float = 0.001       # a probe is validated and offered to engines, never run
    run_start_s: float = 0.0     # once per `bundlegen run`: worker start, engine warm-up and
                                 # prepare on a warm cache, reports (run.json outside_cases_s)


COEFFICIENT_FIELDS = tuple(CostCoefficients.__dataclass_fields__)


@dataclass(frozen=True)
class CostTerms:
    engine_flops: int
    oracle_flops: int
    io_bytes: int
    oracle_bytes: int
    #: engine runs: each repeats the engine's FLOPs (counted in engine_flops) and is priced
    #: at the case's fixed overhead (a re-run resets, copies and compares the outputs)
    runs: int = 1


def runs_of(graph: Graph) -> int:
    return DETERMINISTIC_MODE_RUNS if graph.attributes.deterministic_algorithm else 1


def score_elements(graph: Graph) -> int:
    """Score elements of one head: B x S_q x S_kv, or a ragged graph's sum over its
    sequences of S_q_b x S_kv_b (each length clipped to [0, max_seqlen], as a bounded engine
    and the oracle see it; the max_seqlen bounds when its offsets are not known)."""
    rag = graph.ragged
    if rag is None or rag.cu_seqlens_q is None or len(rag.cu_seqlens_q) != len(rag.cu_seqlens_kv):
        return graph.B * graph.S_q * graph.S_kv
    clip = lambda n, bound: min(max(n, 0), bound)
    return sum(clip(a, rag.max_seqlen_q) * clip(b, rag.max_seqlen_kv)
               for a, b in zip(rag.lengths_q, rag.lengths_kv))


def terms(graph: Graph) -> CostTerms:
    g = graph
    scores = g.H_q * score_elements(g)
    # engine: recompute S = QK^T, then dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q
    runs = runs_of(g)
    engine = runs * 2 * scores * (3 * g.D_qk + 2 * g.D_v)
    # oracle: forward (QK^T, PV), the same five backward products, four magnitude products
    oracle = 2 * scores * (6 * g.D_qk + 5 * g.D_v)
    io = sum(spec.storage_elements * ITEMSIZE.get(spec.dtype, 4) for spec in g.tensors.values())
    q_rows, kv_rows = (g.T_q, g.T_kv) if g.ragged else (g.B * g.S_q, g.B * g.S_kv)
    q_like = q_rows * g.H_q
    logical = (2 * q_like * g.D_qk + 2 * q_like * g.D_v + q_like            # q, dq, o, do, stats
               + 2 * kv_rows * (g.H_k * g.D_qk + g.H_v * g.D_v))            # k, dk, v, dv
    oracle_bytes = FLOAT64 * (2 * logical + 3 * g.H_q * min(g.S_q, ORACLE_ROW_CHUNK) * g.S_kv)
    return CostTerms(engine, oracle, io, oracle_bytes, runs)


def seconds(t: CostTerms, k: CostCoefficients) -> float:
    return (t.engine_flops / k.engine_flops_per_s + t.oracle_flops / k.oracle_flops_per_s
            + t.io_bytes / k.bytes_per_s + k.overhead_s * t.runs)


def predict(graph: Graph, device_class: str, model: Mapping[str, CostCoefficients],
            *, probe: bool = False) -> Cost:
    """The predicted cost of running `graph` once on `device_class` ('h200' or 'cpu');
    a probe (never executed) costs only the model's `probe_s`."""
    return predict_terms(terms(graph), device_class, model, probe=probe)


def predict_terms(t: CostTerms, device_class: str, model: Mapping[str, CostCoefficients],
                  *, probe: bool = False) -> Cost:
    if device_class not in model:
        raise KeyError(f"unknown device class {device_class!r} (known: {', '.join(sorted(model))})")
    if probe:
        return Cost(flops=0, bytes=0, predicted_s=model[device_class].probe_s)
    return Cost(flops=t.engine_flops + t.oracle_flops, bytes=t.io_bytes + t.oracle_bytes,
                predicted_s=round(seconds(t, model[device_class]), 6))


def size_text(n: int) -> str:
    """Bytes for people: 16 MiB, 1.4 GiB, 512 B."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"
