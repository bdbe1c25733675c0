"""Fitting the cost model (a plan's COST_MODEL, e.g. plans/sdpa_bwd.py) to measured case times.

Each executed case of a run (a results.jsonl record whose engine ran) is joined by case id
with its graph from the bundles; `bundlegen.cost.terms(graph)` gives its features. Results
record each case's phases (materialize_s, oracle_s, engine_s, check_s) beside its wall_s,
so each phase's coefficients are fitted to that phase's own seconds (bundlegen.cost's
model), by non-negative least squares, each level weighted the same (a case counts
its level's cases / its level's measured total of that phase):

    materialize_s = io_bytes / bytes_per_s + touched_bytes / drawn_bytes_per_s + materialize_s
    oracle_s      = oracle_flops / oracle_flops_per_s + oracle_s
    engine_s      = engine_flops / engine_flops_per_s + tiles x tile_s + launches x launch_s
                    + programs x program_s + dbias_tiles x dbias_tile_s
                    + drawn_tiles x drawn_tile_s + requested x deterministic_s   (the set-up, once per case)
    check_s - (runs - 1) x fitted one run = runs x io_bytes / check_bytes_per_s
                                           + (runs - 1) x rerun_s + check_s
    wall_s - the four measured phases    = overhead_s

(runs: the engine runs the record made; a record from before they were recorded: the
class's runs.) A rate the data cannot resolve (its term explains under 0.1 % of its phase's
time, e.g. a feature collinear with the others) keeps the plan's value and the other terms
are refitted around it, so a written plan never holds an infinite rate. `probe_s` is not
fitted (probes are never executed); probes count in the per-level sums at `probe_s`.
The class's determinism runs are the most common runs its records made (kept when none
records them).

`run_start_s`, the once-per-run time around the cases, is the median `outside_cases_s` of
the given runs' run.json files (kept when none has one).

Several runs of the same cases (two orders, a cold and a warm cache) count each case once:
its phases each at their least over the runs (least_of_runs), as the level rows measure.

The plan text --write edits is calibrate_write's.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import torch

from bundlegen.cost import DEVICE_CLASSES, CostCoefficients, CostTerms, phases, seconds, terms
from bundlegen.graph import BundleError, Case, load_bundle
from bundlegen.results_file import read_results, read_run_times, results_file, run_json_of

#: the measured phases of a record, in the order a case goes through them
PHASES = ("materialize_s", "oracle_s", "engine_s", "check_s")
#: per phase: the coefficients its fit sets, rates first (fitted as their inverse)
PHASE_FIELDS = {
    "materialize_s": (("bytes_per_s", "drawn_bytes_per_s"), ("materialize_s",)),
    "oracle_s": (("oracle_flops_per_s",), ("oracle_s",)),
    "engine_s": (("engine_flops_per_s",), ("tile_s", "launch_s", "program_s", "dbias_tile_s",
                                           "drawn_tile_s", "deterministic_s")),
    "check_s": (("check_bytes_per_s",), ("rerun_s", "check_s")),
}
FITTED = tuple(f for rates, times in PHASE_FIELDS.values() for f in (*rates, *times)) + ("overhead_s",)
RATES = tuple(f for rates, _ in PHASE_FIELDS.values() for f in rates)
#: what --write puts into the plan: the fitted coefficients, the measured run start, the runs
WRITTEN = FITTED + ("run_start_s", "ordinary_runs", "requested_runs")
#: which device class a record's arch measures
DEVICE_CLASS_OF_ARCH = {"sm90": "h200", "cpu": "cpu"}
SIGNIFICANT_DIGITS = 3
#: a rate whose term explains less than this share of its phase's time is not resolved
NEGLIGIBLE_SHARE = 1e-3
#: the per-level error the plan aims for, and the per-case ratio 90 % of cases keep within
TARGET_ERROR = 0.25
CASE_RATIO = 2.0


class CalibrationError(ValueError):
    pass


# ----------------------------------------------------------------------------- samples
@dataclass(frozen=True)
class Sample:
    """One executed case: its cost-model features and its measured seconds."""
    case_id: str
    level: str
    terms: CostTerms
    wall_s: float
    phases: Mapping[str, float]     # PHASES -> measured seconds
    runs: int | None = None         # engine runs the record made (None: not recorded)


@dataclass(frozen=True)
class Timed:
    """A record the model does not fit but the level sums count (probes) or report."""
    case_id: str
    level: str
    wall_s: float


@dataclass(frozen=True)
class SampleSet:
    executed: tuple[Sample, ...]
    probes: tuple[Timed, ...]
    not_executed: tuple[Timed, ...]   # declined, skipped, crashed before the engine ran, ...
    unmatched: int                    # executed records whose case id no bundle holds
    other_device: int                 # records of another device class or engine


def device_and_engine(cost_class: str) -> tuple[str, str | None]:
    """'h200/torch-cudnn' -> ('h200', 'torch-cudnn'); 'cpu' -> ('cpu', None)."""
    device, _, engine = cost_class.partition("/")
    if device not in DEVICE_CLASSES:
        raise CalibrationError(f"cost class {cost_class!r}: its device class must be one of "
                               f"{', '.join(DEVICE_CLASSES)}")
    return device, engine or None


def read_records(paths: Iterable[Path | str]) -> list[dict]:
    records: list[dict] = []
    for p in paths:
        file = results_file(p)
        if not file.is_file():
            raise CalibrationError(f"no results file at {p}")
        records.extend(read_results(file))
    return records


def run_starts(paths: Iterable[Path | str], device_class: str) -> list[float]:
    """Seconds outside the cases (run.json outside_cases_s) of each given run of this device
    class that has a run.json."""
    device, engine = device_and_engine(device_class)
    starts = []
    for p in paths:
        times = read_run_times(run_json_of(p))
        if (times is not None and DEVICE_CLASS_OF_ARCH.get(times.arch) == device
                and (engine is None or times.engine == engine)):
            starts.append(times.outside_cases_s)
    return starts


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def fitted_run_start(starts: Sequence[float], prior: CostCoefficients) -> float:
    return round_significant(median(starts)) if starts else prior.run_start_s


def case_index(bundle_root: Path | str, plan: str) -> dict[str, Case]:
    """Every case of every level of `plan` under `bundle_root`, by id (a malformed case is
    left out: it has no measured time to fit)."""
    out: dict[str, Case] = {}
    for path in sorted(Path(bundle_root).glob(f"*/{plan}/*.json")):
        try:
            bundle, _errors = load_bundle(path)
        except BundleError:
            continue
        out.update((c.id, c) for c in bundle.cases)
    return out


def device_class_of(record: Mapping) -> str | None:
    return DEVICE_CLASS_OF_ARCH.get(str(record.get("arch", "")))


def collect(records: Iterable[Mapping], cases: Mapping[str, Case], device_class: str) -> SampleSet:
    """The records of `device_class` (a device class: every engine's; an engine's class
    such as 'cpu/torch-math': that engine's only)."""
    device, engine = device_and_engine(device_class)
    executed, probes, idle = [], [], []
    unmatched = other = 0
    for r in records:
        if device_class_of(r) != device or (engine is not None and r.get("engine") != engine):
            other += 1
            continue
        wall = float(r.get("wall_s") or 0.0)
        case_id, level = str(r.get("case_id", "")), str(r.get("level", ""))
        if r.get("purpose") == "probe":
            probes.append(Timed(case_id, level, wall))
        elif r.get("engine_s") is None:
            idle.append(Timed(case_id, level, wall))
        elif case_id not in cases:
            unmatched += 1
        else:
            runs = r.get("runs")
            executed.append(Sample(case_id, level, terms(cases[case_id].graph), wall,
                                   {p: float(r.get(p) or 0.0) for p in PHASES},
                                   int(runs) if isinstance(runs, int) and runs >= 1 else None))
    return SampleSet(tuple(least_of_runs(executed)), tuple(least_of_runs(probes)), tuple(idle), unmatched, other)


def least_of_runs(samples: list) -> list:
    """One sample per case: where several runs measured it, each phase (and wall_s) at its
    least over them. A cold compile inside a case, a loaded host or a shared GPU only add
    time, so the least of a case's runs is its cost."""
    by_case: dict[str, list] = {}
    for s in samples:
        by_case.setdefault(s.case_id, []).append(s)
    out = []
    for case_id in sorted(by_case):
        runs = by_case[case_id]
        first = min(runs, key=lambda s: s.wall_s)
        if isinstance(first, Sample) and len(runs) > 1:
            first = replace(first, phases={p: min(s.phases[p] for s in runs) for p in PHASES})
        out.append(first)
    return out


# ----------------------------------------------------------------------------- fit
def nnls(A: torch.Tensor, b: torch.Tensor, max_iter: int | None = None) -> torch.Tensor:
    """argmin ||A x - b|| subject to x >= 0 (Lawson-Hanson active set), float64.
    Columns are scaled to unit norm first, so features of very different size
    (FLOPs ~1e12, a constant 1) do not decide the tolerances."""
    A, b = A.to(torch.float64), b.to(torch.float64)
    norms = A.norm(dim=0)
    norms = torch.where(norms > 0, norms, torch.ones_like(norms))
    As = A / norms
    n = As.shape[1]
    x = torch.zeros(n, dtype=torch.float64)
    passive = torch.zeros(n, dtype=torch.bool)
    tol = 1e-12 * max(1.0, float(b.norm()))
    for _ in range(max_iter or 3 * n + 10):
        w = As.T @ (b - As @ x)
        w[passive] = -math.inf
        if passive.all() or float(w.max()) <= tol:
            break
        passive[int(w.argmax())] = True
        while True:
            s = torch.zeros(n, dtype=torch.float64)
            s[passive] = torch.linalg.lstsq(As[:, passive], b.unsqueeze(1)).solution.squeeze(1)
            if bool((s[passive] > 0).all()):
                x = s
                break
            blocking = passive & (s <= 0)
            gap = x[blocking] - s[blocking]
            alpha = float(torch.where(gap > 0, x[blocking] / gap, torch.zeros_like(gap)).min())
            x = x + alpha * (s - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x / norms


@dataclass(frozen=True)
class Fit:
    coefficients: CostCoefficients   # rounded to SIGNIFICANT_DIGITS, as written into the plan
    kept: tuple[str, ...]            # rates the data could not resolve: the prior's value
    samples: int


def runs_of(s: Sample, k: CostCoefficients) -> int:
    if s.runs is not None:
        return s.runs
    return k.runs.requested if s.terms.requested else k.runs.ordinary


def level_weights(samples: Sequence[Sample], measured: Callable[[Sample], float]) -> torch.Tensor:
    """A case of a level with n cases and measured total T counts n / T, so a level's
    relative error weighs by its number of cases times the same scale in every level.
    Unweighted, the few long cases of the upper levels would decide the fit and quick's
    short ones be left off; at sqrt(n) / T (each level's squared relative error the same
    for a misfit its cases share) the 85 cases of the H200 evidence's full level pulled the
    per-case rates off the thousands of the others (pr and nightly 5 to 8 % off, full 27 %)."""
    total: dict[str, float] = {}
    count: dict[str, int] = {}
    for s in samples:
        total[s.level] = total.get(s.level, 0.0) + max(measured(s), 0.0)
        count[s.level] = count.get(s.level, 0) + 1
    return torch.tensor([count[s.level] / total[s.level] if total[s.level] > 0 else 0.0
                         for s in samples], dtype=torch.float64)


def fit_linear(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, prior: list[float],
               rates: int) -> tuple[list[float], set[int]]:
    """theta >= 0 with X theta ~ y (weights w); columns below `rates` are inverse rates: one
    whose term explains under NEGLIGIBLE_SHARE of y keeps its prior and the rest are refitted."""
    total = float(y.clamp(min=0).sum())
    fixed: set[int] = set()
    while True:
        free = [j for j in range(X.shape[1]) if j not in fixed]
        target = y - sum((X[:, j] * prior[j] for j in fixed), torch.zeros_like(y))
        theta = list(prior)
        if free:
            for j, value in zip(free, nnls(X[:, free] * w[:, None], target * w).tolist()):
                theta[j] = value
        unresolved = {j for j in free if j < rates
                      and (total <= 0 or float(X[:, j].sum()) * theta[j] / total < NEGLIGIBLE_SHARE)}
        if not unresolved:
            return theta, fixed
        fixed |= unresolved


def phase_columns(phase: str, s: Sample, runs: int, engine_one: float) -> tuple[list[float], float]:
    """(features, target) of one sample for one phase's fit (the module docstring)."""
    t, y = s.terms, s.phases[phase]
    if phase == "materialize_s":
        return [float(t.io_bytes), float(t.touched_bytes), 1.0], y
    if phase == "oracle_s":
        return [float(t.oracle_flops), 1.0], y
    if phase == "engine_s":
        return [float(t.engine_flops), float(t.tiles), float(t.launches), float(t.programs),
                float(t.dbias_tiles), float(t.drawn_tiles), float(t.requested)], y
    return [float(runs * t.io_bytes), float(runs - 1), 1.0], y - (runs - 1) * engine_one


def fitted_runs(samples: Sequence[Sample], prior: CostCoefficients) -> dict[str, int]:
    """The class's determinism runs: the most common runs its records made, per kind."""
    out = {}
    for name, requested in (("ordinary_runs", False), ("requested_runs", True)):
        seen = Counter(s.runs for s in samples if s.runs is not None and s.terms.requested == requested)
        out[name] = seen.most_common(1)[0][0] if seen else getattr(prior, name)
    return out


def fit(samples: Sequence[Sample], prior: CostCoefficients) -> Fit:
    if len(samples) < 4:
        raise CalibrationError(f"{len(samples)} executed case(s); the fit needs at least 4")
    if sum(s.wall_s for s in samples) <= 0:
        raise CalibrationError("the measured cases took no time")
    values: dict[str, float] = dict(fitted_runs(samples, prior))
    runs_prior = replace(prior, **values)
    kept: list[str] = []
    engine_one: list[float] = [0.0] * len(samples)
    for phase, (rates, times) in PHASE_FIELDS.items():
        names = (*rates, *times)
        prior_theta = [1.0 / getattr(prior, f) for f in rates] + [getattr(prior, f) for f in times]
        rows = [phase_columns(phase, s, runs_of(s, runs_prior), engine_one[i]) for i, s in enumerate(samples)]
        X = torch.tensor([r[0] for r in rows], dtype=torch.float64)
        y = torch.tensor([r[1] for r in rows], dtype=torch.float64)
        theta, fixed = fit_linear(X, y, level_weights(samples, lambda s: s.phases[phase]), prior_theta, len(rates))
        values.update({f: (1.0 / theta[j] if j < len(rates) else theta[j]) for j, f in enumerate(names)})
        kept += [names[j] for j in sorted(fixed)]
        if phase == "engine_s":   # one run of the engine: all but the once-per-case set-up
            per_run = torch.tensor([0.0 if n == "deterministic_s" else v for n, v in zip(names, theta)],
                                   dtype=torch.float64)
            engine_one = (X @ per_run).tolist()
    rest = [s.wall_s - sum(s.phases.values()) for s in samples]
    w = level_weights(samples, lambda s: s.wall_s)
    values["overhead_s"] = max(0.0, float((w * torch.tensor(rest, dtype=torch.float64)).sum() / w.sum()))
    rounded = {f: (v if f.endswith("_runs") else round_significant(v)) for f, v in values.items()}
    return Fit(coefficients=replace(prior, **rounded), kept=tuple(kept), samples=len(samples))


# ----------------------------------------------------------------------------- fit report
@dataclass(frozen=True)
class LevelError:
    level: str
    cases: int
    measured_s: float
    before_s: float     # predicted with the plan's coefficients
    after_s: float      # predicted with the fitted coefficients

    @staticmethod
    def relative(predicted: float, measured: float) -> float:
        return (predicted - measured) / measured if measured > 0 else math.inf

    @property
    def before_error(self) -> float:
        return self.relative(self.before_s, self.measured_s)

    @property
    def after_error(self) -> float:
        return self.relative(self.after_s, self.measured_s)


def predicted(s: Sample, k: CostCoefficients) -> float:
    """A sample's predicted seconds with the engine runs it made."""
    return seconds(s.terms, k, s.runs)


def level_errors(samples: SampleSet, before: CostCoefficients, after: CostCoefficients,
                 levels: Sequence[str]) -> list[LevelError]:
    """Per level (its own cases: executed ones and probes), then a 'total' row."""
    rows = []
    for level in [*levels, None]:
        ex = [s for s in samples.executed if level is None or s.level == level]
        pr = [p for p in samples.probes if level is None or p.level == level]
        if not ex and not pr:
            continue
        rows.append(LevelError(
            level=level or "total", cases=len(ex) + len(pr),
            measured_s=sum(s.wall_s for s in ex) + sum(p.wall_s for p in pr),
            before_s=sum(predicted(s, before) for s in ex) + len(pr) * before.probe_s,
            after_s=sum(predicted(s, after) for s in ex) + len(pr) * after.probe_s))
    return rows


def phase_errors(samples: Sequence[Sample], k: CostCoefficients) -> dict[str, tuple[float, float]]:
    """phase -> (measured, predicted) seconds summed over the samples."""
    out = {}
    for phase in PHASES:
        out[phase] = (sum(s.phases[phase] for s in samples),
                      sum(getattr(phases(s.terms, k, s.runs), phase) for s in samples))
    return out


def case_ratios(samples: Sequence[Sample], k: CostCoefficients) -> list[tuple[float, Sample]]:
    """(measured / predicted, sample) of each executed case, the worst (farthest from 1 on a
    log scale) first."""
    pairs = [(s.wall_s / max(predicted(s, k), 1e-9), s) for s in samples if s.wall_s > 0]
    return sorted(pairs, key=lambda p: (-abs(math.log(p[0])), p[1].case_id))


def within_ratio(ratios: Sequence[tuple[float, Sample]], bound: float = CASE_RATIO) -> float:
    """The share of cases predicted within `bound` times of their measured seconds."""
    if not ratios:
        return 1.0
    return sum(1 for r, _ in ratios if 1 / bound <= r <= bound) / len(ratios)


# ----------------------------------------------------------------------------- plan text
def round_significant(x: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    return float(f"{x:.{digits - 1}e}")


def format_number(x: float) -> str:
    """A float literal with SIGNIFICANT_DIGITS digits, engineering exponent: 213e12, 2.05e9,
    0.0312."""
    x = round_significant(x)
    if x == 0.0:
        return "0.0"
    if 1e-3 <= abs(x) < 1e3:
        text = f"{x:.{SIGNIFICANT_DIGITS}g}"
    else:
        exp3 = 3 * math.floor(math.log10(abs(x)) / 3)
        text = f"{x / 10 ** exp3:.{SIGNIFICANT_DIGITS}g}e{exp3}"
    if not any(c in text for c in ".e"):
        text += ".0"
    return text
