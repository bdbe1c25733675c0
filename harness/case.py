"""One case, start to verdict (DESIGN section 5): the frontend's and the engine's answers
(decline, reject, skip), materialize with the oracle, the engine's run, the checks and the
verdict. `run_case` gives a small `CaseOutcome`; it runs wherever the engine lives (the
worker process under isolation). Nothing here knows about processes, workers or levels."""
from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping

from bundlegen import validate
from bundlegen.cost import CPU_RUNS, GPU_RUNS, cost_class, phases, predict, size_text, terms
from bundlegen.graph import Case, Graph
from bundlegen.manifest import Manifest
from bundlegen.reasons import (DETERMINISM_NOT_SERVED, MODIFIER_NOT_SERVED, RAGGED_NOT_SERVED, SEQUSED_NOT_SERVED,
                               RAGGED_OFFSETS, code_of)
from bundlegen.harness import verdicts as V
from bundlegen.harness.bundles import manifest_of
from bundlegen.harness.config import EngineConfig

if TYPE_CHECKING:
    import torch

# torch (and materialize and checks, which import it) are imported where a case runs (the
# worker), not at module level: a run's parent process never needs torch, so its workers
# start while it is still loading.


def device_type(device: "str | torch.device") -> str:
    """'cuda' for 'cuda:1' or torch.device('cuda', 1), without importing torch."""
    return str(device).split(":", 1)[0]


@dataclass(frozen=True)
class CaseOutcome:
    """What one case gave, small enough to send back from a worker process."""
    verdict: str
    detail: str = ""
    reason: str | None = None
    tolerance: Mapping[str, Any] | None = None
    outputs: Mapping[str, Any] = field(default_factory=dict)
    margin: float | None = None
    oracle_s: float | None = None        # float64 oracle forward + backward (synchronised)
    materialize_s: float | None = None   # the rest of materialize: fill, layout, copies
    engine_s: float | None = None        # the engine's first run
    check_s: float | None = None         # guards, inputs, tolerance, determinism re-run
    statistical_margin: float | None = None   # the statistical judge's least margin
    io_reference_s: float | None = None  # the part of oracle_s the io-precision reference took
    runs: int | None = None              # engine runs made (the first and its re-runs)


# ----------------------------------------------------------------------------- cost rule
def cpu_prediction(graph: Graph, manifest: Manifest, engine: str = "") -> float:
    """Predicted seconds of the case on the CPU, by the manifest's cost model: the engine's
    own cpu class when the manifest has one, else the cpu class."""
    return float(predict(graph, cost_class("cpu", engine, manifest.cost_model), manifest.cost_model).predicted_s)


def too_large_for_cpu(graph: Graph, manifest: Manifest, engine: str = "") -> bool:
    return cpu_prediction(graph, manifest, engine) > manifest.cpu_case_limit_s


def memory_ceiling_breach(case: Case, manifest: Manifest) -> str | None:
    """Why the case may not allocate what it needs, or None: its peak footprint (io storages
    and the oracle's float64 tensors, bundlegen.cost) against its level's per-case byte
    ceiling (a case of no known level: the largest level's). Checked before allocating."""
    limits = {lv.name: lv for lv in manifest.levels}
    level = limits.get(case.level) or manifest.levels[-1]
    t = terms(case.graph)
    need = t.io_bytes + t.oracle_bytes
    if need <= level.per_case_bytes:
        return None
    return (f"{V.TOO_LARGE}: needs {size_text(need)} at its peak, the {level.name} level allows "
            f"{size_text(level.per_case_bytes)} per case")


#: the device class of a GPU device (the only GPU class the cost model has)
GPU_CLASS = "h200"


def predicted_phases(case: Case, device: "str | torch.device", manifest: Manifest, engine: str,
                     runs: int | None) -> dict[str, float] | None:
    """The case's predicted seconds per phase (bundlegen.cost.Phases, with the engine runs
    it made), as the summary sets them beside the measured ones; None for a case that did not
    run its engine."""
    if runs is None:
        return None
    device_class = "cpu" if device_type(device) == "cpu" else GPU_CLASS
    name = cost_class(device_class, engine, manifest.cost_model)
    p = phases(terms(case.graph), manifest.cost_model[name], runs)
    return {f: round(getattr(p, f), 6) for f in ("materialize_s", "oracle_s", "engine_s", "check_s")}


def predicted_seconds(case: Case, device: "str | torch.device", manifest: Manifest | None = None,
                      engine: str = "") -> float | None:
    """The case's predicted seconds on this device for `engine` (bundlegen.cost.cost_class:
    its own class, else the device's), with the manifest's coefficients (default: the
    manifest of the default bundle root). None for a graph the frontend refuses: it is never
    executed, and its sizes may not be numbers."""
    if validate.frontend_reason(case.graph) is not None:
        return None
    if manifest is None:
        manifest = manifest_of()
    if device_type(device) == "cpu":
        return cpu_prediction(case.graph, manifest, engine)
    probe = case.expected_rejection is not None and case.expected_rejection.by != "device"
    return float(predict(case.graph, cost_class(GPU_CLASS, engine, manifest.cost_model), manifest.cost_model,
                         probe=probe).predicted_s)


# ----------------------------------------------------------------------------- one case
class StepRaised(Exception):
    """An exception from one step of a case (engine code, or materialize), as a crash detail."""

    def __init__(self, stage: str, exc: BaseException):
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        super().__init__(f"{stage} raised {type(exc).__name__}: {exc}{where}")


class ContractBroken(StepRaised):
    """Engine code answered outside its contract (a crash, charged to the engine)."""

    def __init__(self, stage: str, answer: str):
        Exception.__init__(self, f"{stage} {answer}")


def guarded(stage: str, fn: Callable, *args):
    try:
        return fn(*args)
    except Exception as exc:  # engine code may raise anything; KeyboardInterrupt passes
        raise StepRaised(stage, exc) from exc


def sync_device(device: "torch.device") -> None:
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)


def repeat_count(engine, repeat: int | None, graph: Graph | None = None) -> int:
    """Runs per case: the engine's determinism_runs() for its device (Engine; an engine
    without one: the GPU's count, or the CPU's on a CPU): `requested` when the graph asks
    for a deterministic backward, else `ordinary` for a deterministic engine and once for a
    nondeterministic one. `repeat` overrides either."""
    declared = getattr(engine, "determinism_runs", None)
    runs = declared() if declared is not None else (CPU_RUNS if engine.device.type == "cpu" else GPU_RUNS)
    if graph is not None and graph.attributes.deterministic_algorithm:
        return runs.requested if repeat is None else max(1, repeat)
    if not engine.deterministic:
        return 1
    return runs.ordinary if repeat is None else max(1, repeat)


def run_case(case: Case, engine, config: EngineConfig, repeat: int | None = None) -> CaseOutcome:
    """One case's flow, in-process. Never raises for engine faults: they become `crashed`."""
    try:
        outcome = judge_case(case, engine, config, repeat)
    except StepRaised as exc:
        outcome = CaseOutcome(V.CRASHED, detail=str(exc))
    if outcome.verdict in V.CLAIM_BREAKING and config.is_claimed(case.id, engine.arch):
        was = f"declined ({outcome.reason})" if outcome.verdict == V.DECLINED else outcome.verdict
        detail = f"claimed on {engine.arch} but {was}" + (f": {outcome.detail}" if outcome.detail else "")
        outcome = dataclasses.replace(outcome, verdict=V.CLAIM_BROKEN, detail=detail)
    return outcome


def judge_case(case: Case, engine, config: EngineConfig, repeat: int | None) -> CaseOutcome:
    """The case's verdict before the claims are looked at; engine faults raise StepRaised."""
    graph, expected = case.graph, case.expected_rejection
    device_probe = expected is not None and expected.by == "device"
    finding = validate.frontend_finding(graph, offsets_on_device=device_probe)
    frontend = None if finding is None else finding.reason
    if expected is not None and expected.by == "frontend":
        if frontend == expected.reason:
            return offer_to_engine(engine, graph, frontend)
        said = f"returned {frontend!r}" if frontend else "accepted the graph"
        return CaseOutcome(V.REJECTION_ACCEPTED, reason=frontend,
                           detail=f"frontend {said}; expected {expected.reason!r}")
    if frontend is not None:
        return CaseOutcome(V.ERROR_BUNDLE, reason=frontend,
                           detail=f"field {finding.field}: fails frontend validation ({frontend}) "
                                  "but the case is not a frontend probe")
    if device_probe:
        broken = validate.ragged_offsets_finding(graph) if graph.ragged is not None else None
        if broken is None or broken.reason != expected.reason:
            return CaseOutcome(V.ERROR_BUNDLE, detail=(
                f"field expected_rejection.reason: a device probe's offsets must break "
                f"{expected.reason!r}; they break {broken.reason if broken else 'no rule'}"))
    elif expected is not None:  # an engine probe: asked, never executed
        reason = decline_reason(engine, graph)
        if not reason:
            return CaseOutcome(V.REJECTION_ACCEPTED,
                               detail=f"engine accepted a graph it must decline ({expected.reason})")
        code = code_of(reason)
        note = "" if code == expected.reason else f"declined with {code!r}, probe names {expected.reason!r}"
        return CaseOutcome(V.REJECTED, reason=reason, detail=note)

    skip = config.skip_reason(case, engine.arch)
    if skip:
        return CaseOutcome(V.SKIPPED, detail=skip)
    if config.manifest is not None:
        breach = memory_ceiling_breach(case, config.manifest)
        if breach:
            return CaseOutcome(V.SKIPPED, detail=breach)
    if engine.device.type == "cpu":
        if config.manifest is None:
            return CaseOutcome(V.ERROR_BUNDLE, detail="field manifest: no bundle manifest loaded, "
                                                      "so no CPU cost prediction")
        if too_large_for_cpu(graph, config.manifest, getattr(engine, "name", "")):
            return CaseOutcome(V.SKIPPED, detail=V.TOO_LARGE_FOR_CPU)
    reason = decline_reason(engine, graph)
    if reason:
        return CaseOutcome(V.REJECTED if device_probe else V.DECLINED, reason=reason)
    try:
        tol = config.tolerance_for(case)
    except KeyError as exc:
        return CaseOutcome(V.ERROR_BUNDLE, detail=f"field tolerance_class: {exc.args[0]}")
    if device_probe:
        return execute_case(case, engine, tol, 1, device_probe=True)
    return execute_case(case, engine, tol, repeat_count(engine, repeat, graph))


def offer_to_engine(engine, graph: Graph, frontend: str) -> CaseOutcome:
    """A graph the frontend rejected, offered to the engine as well: an engine whose own
    checks accept an invalid graph is charged (`rejection-accepted`). Bad ragged offsets
    (their values or their count) are the exception: an engine is handed the offsets only
    as device tensors, and the device probes judge what it does with bad ones."""
    if graph.ragged is not None and frontend in RAGGED_OFFSETS:
        return CaseOutcome(V.REJECTED, reason=frontend)
    said = decline_reason(engine, graph)
    if not said:
        return CaseOutcome(V.REJECTION_ACCEPTED, reason=frontend,
                           detail=f"the frontend rejects the graph ({frontend}) but the engine "
                                  "accepted it")
    return CaseOutcome(V.REJECTED, reason=frontend, detail=f"engine declined it too: {said}")


def modifiers_held(graph: Graph) -> frozenset[str]:
    """The score modifiers whose ports or attributes a graph holds: Graph.modifiers, and
    sinks for a dsinks port without its sinks (a frontend probe's graph). An engine that does
    not list one of them is never offered the graph (decline_reason), probes included."""
    return graph.modifiers | (frozenset({"sinks"}) if "dsinks" in graph.tensors else frozenset())


def decline_reason(engine, graph: Graph) -> str | None:
    """engine.is_applicable's answer for the graph as launched, held to its contract: None
    or a reason string. A ragged graph is declined for an engine that does not say it
    serves them (Engine.ragged), a score modifier for one that does not list it
    (Engine.score_modifiers)."""
    if graph.ragged is not None and not getattr(engine, "ragged", False):
        return f"{RAGGED_NOT_SERVED}: the engine does not set ragged = True"
    if graph.ragged is not None and graph.ragged.seqused_ports and not getattr(engine, "seqused", False):
        return (f"{SEQUSED_NOT_SERVED}: {', '.join(graph.ragged.seqused_ports)} (the engine does not set "
                "seqused = True)")
    unlisted = modifiers_held(graph) - frozenset(getattr(engine, "score_modifiers", ()))
    if unlisted:
        return (f"{MODIFIER_NOT_SERVED}: {', '.join(sorted(unlisted))} "
                "(not in the engine's score_modifiers)")
    if graph.attributes.deterministic_algorithm and not (
            getattr(engine, "deterministic", False) or getattr(engine, "deterministic_mode", False)):
        return f"{DETERMINISM_NOT_SERVED}: the engine has no deterministic mode (deterministic_mode)"
    reason = guarded("engine.is_applicable", engine.is_applicable, graph.as_launched())
    if reason is not None and not (isinstance(reason, str) and reason.strip()):
        raise ContractBroken("engine.is_applicable",
                             f"returned {reason!r}: expected None or a non-empty reason string")
    return reason


def run_engine(stage: str, engine, graph: Graph, tensors: Mapping[str, "torch.Tensor"]) -> None:
    """engine.run on a read-only copy of the port map: the outputs are judged through the
    harness's own views, so an engine must write into them, not replace them."""
    guarded(stage, engine.run, graph.as_launched(), MappingProxyType(dict(tensors)))
    sync_device(engine.device)


def execute_case(case: Case, engine, tol, runs: int, device_probe: bool = False) -> CaseOutcome:
    """A case the engine takes: materialize (with the oracle), `runs` runs of the engine,
    every check, and the verdict with its timings. `device_probe`: the case's offsets are
    bad on purpose, and the verdict says whether the engine contained them."""
    from bundlegen.harness import checks, drawn_dropout, materialize as M   # torch: see the top of this module

    start = time.perf_counter()
    try:
        m = guarded("materialize", drawn_dropout.materialized, case, engine)   # M.materialize, + drawn masks
    except StepRaised as exc:
        if isinstance(exc.__cause__, M.MaterializeError):
            return CaseOutcome(V.ERROR_BUNDLE, detail=f"field graph: {exc.__cause__}")
        raise
    materialize_s = max(0.0, time.perf_counter() - start - m.oracle_s)

    start = time.perf_counter()
    run_engine("engine.run", engine, case.graph, m.tensors)
    engine_s = time.perf_counter() - start

    check_start = time.perf_counter()
    timing = {"tolerance": tol.to_json(), "oracle_s": m.oracle_s, "materialize_s": materialize_s,
              "engine_s": engine_s, "io_reference_s": m.io_reference_s}
    made = [1]   # engine runs so far

    def outcome(verdict: str, **fields) -> CaseOutcome:
        return CaseOutcome(verdict, check_s=time.perf_counter() - check_start, runs=made[0], **timing, **fields)

    drawn_mask_problem = drawn_dropout.problem_after_run(m, engine)   # engine-drawn dropout masks
    if drawn_mask_problem is not None:
        return outcome(V.FAIL_NUMERIC, detail=drawn_mask_problem)
    # every check of the first run computed on the device, then read back at once
    guard, modified = M.guard_flags(m), M.modified_flags(m)
    outputs, reference = M.judged_outputs(m)
    errors = checks.PendingErrors(checks.output_pairs(outputs, reference), tol)
    slices = pending_slices(m, outputs, reference, tol)
    read = checks.read_back([checks.stacked(guard), checks.stacked(modified), *errors.tensors,
                             *(slices.tensors if slices else [])])
    memory = checks.judge_memory(checks.set_ports(guard, read[0]), checks.set_ports(modified, read[1]))
    if memory is not None:
        if device_probe:
            return outcome(V.FAIL_ESCAPED, detail=f"bad offsets ({case.expected_rejection.reason}): "
                                                  f"{memory[1]}")
        return outcome(memory[0], detail=memory[1])
    n_errors = len(errors.tensors)
    judgement = checks.judge_errors(errors.resolve(read[2:2 + n_errors]), tol,
                                    slices.resolve(read[2 + n_errors:]) if slices else None)
    result = dict(outputs=judgement.outputs_json(), margin=judgement.margin,
                  statistical_margin=judgement.statistical_margin)
    if device_probe:
        if judgement.verdict != V.PASS:
            return outcome(V.FAIL_CORRUPTED, detail=f"good sequences wrong under bad offsets "
                                                    f"({case.expected_rejection.reason}): "
                                                    f"{judgement.detail}", **result)
        return outcome(V.CONTAINED, reason=case.expected_rejection.reason, **result)
    if judgement.verdict != V.PASS:
        return outcome(judgement.verdict, detail=judgement.detail, **result)

    if runs > 1:
        first = {p: m.storages[p].clone() for p in case.graph.output_ports}
        differ = checks.DifferingElements(first)
    for again in range(2, runs + 1):
        M.reset_outputs(m)
        run_engine(f"engine.run (repeat {again})", engine, case.graph, m.tensors)
        made[0] = again
        # inputs and canaries are judged after every run, before its outputs are compared:
        # a write there is that fault on whichever run it happens, never nondeterminism
        memory = memory_after_run(m)
        if memory is not None:
            return outcome(memory[0], detail=f"{memory[1]} (run {again} of {runs})", **result)
        differ.add(again, m.storages)
        # an ordinary re-run stops at the first difference; a case that asked for the
        # deterministic mode runs them all and counts every element that ever differed
        if differ.any() and not case.graph.attributes.deterministic_algorithm:
            break
    if runs > 1 and differ.any():
        return outcome(V.FAIL_NONDETERMINISTIC, detail=differ.describe(), **result)
    return outcome(V.PASS, **result)


def pending_slices(m, outputs, reference, tol):
    """The statistical judge's pending terms (harness/statistical.py), or None for a case
    it does not judge: a device probe (no io-precision reference; its verdict is about
    containment) or numbers without k (a hand-made Tolerance, never a plan's class)."""
    from bundlegen.harness import statistical   # torch: see the top of this module
    from bundlegen.harness.io_reference import judged_honest

    honest = judged_honest(m)
    if honest is None or tol.k is None:
        return None
    return statistical.PendingSlices(outputs, reference, honest, m.sequence_rows, tol)


def memory_after_run(m) -> tuple[str, str] | None:
    """The guard bands and the inputs of a materialized case after an engine run, read back
    at once: checks.judge_memory's (verdict, detail), or None when both hold."""
    from bundlegen.harness import checks, materialize as M   # torch: see the top of this module

    guard, modified = M.guard_flags(m), M.modified_flags(m)
    read = checks.read_back([checks.stacked(guard), checks.stacked(modified)])
    return checks.judge_memory(checks.set_ports(guard, read[0]), checks.set_ports(modified, read[1]))
