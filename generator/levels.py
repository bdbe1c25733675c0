"""Level assignment and the trim rule.

Each case goes to the lowest level at or above its plan entry's level whose per-case
ceilings it fits (h200 seconds, bytes, and for quick the cpu seconds). Then, level by
level from quick up, while the cumulative predicted time of the level and every lower
one exceeds budget x (1 - reserve), the level's most expensive case (ties: smaller id
first) moves up one level, skipping cases that are the only cover of some coverage unit
of that level (an axis value at quick, a pair later); those move only when nothing else
can. A case that fits no level is an error naming its plan entry.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping

from bundlegen import cost as cost_model
from bundlegen.graph import Cost
from bundlegen.generator.errors import PlanError
from bundlegen.plans.records import Level


@dataclass(frozen=True)
class Costed:
    key: str            # case id
    entry: str          # plan entry, for errors
    min_level: str
    seconds: float      # h200 prediction
    bytes: int
    cpu_seconds: float
    cpu_run_seconds: float | None = None   # one engine run of it (None: cpu_seconds)
    run_seconds: float | None = None       # one engine run of it on h200 (None: seconds)


def costed(case_id: str, entry: str, min_level: str, graph, probe: bool,
           cost_table: Mapping) -> tuple[Costed, Cost]:
    """A case's predictions for levelling (on the H200 and the CPU, of the whole case and of
    one engine run of it: a deterministic-mode case runs its engine more than once), and the
    H200 prediction the case records."""
    terms = cost_model.terms(graph)

    def predict(device, runs=None):
        return cost_model.predict_terms(terms, device, cost_table, probe=probe, runs=runs)
    h200 = predict("h200")
    return Costed(case_id, entry, min_level, h200.predicted_s, h200.bytes, predict("cpu").predicted_s,
                  predict("cpu", 1).predicted_s, predict("h200", 1).predicted_s), h200


def cpu_run_wall(seconds: list[float], level: Level, start_s: float) -> float:
    """The wall time of a CPU run of these case seconds: spread over the level's workers
    (no shorter than its longest case), plus the run's start."""
    return max(sum(seconds) / level.cpu_workers, max(seconds, default=0.0)) + start_s


def fits(level: Level, c: Costed) -> bool:
    """The per-case ceilings bound a case's size: one engine run of it (a deterministic-mode
    case's re-runs count in the level's budgets instead)."""
    one = c.seconds if c.run_seconds is None else c.run_seconds
    one_cpu = c.cpu_seconds if c.cpu_run_seconds is None else c.cpu_run_seconds
    return (one <= level.per_case_seconds and c.bytes <= level.per_case_bytes
            and (level.per_case_cpu_seconds is None or one_cpu <= level.per_case_cpu_seconds))


def assign(cases: list[Costed], levels: tuple[Level, ...],
           units_for: Callable[[str], Mapping[str, frozenset]] | None = None) -> dict[str, str]:
    """Case key -> level name. `units_for(level)[key]` are the coverage units the case
    gives that level (absent: none); it is only called for a level that needs trimming."""
    names = [lv.name for lv in levels]
    placed: dict[str, int] = {}
    for c in cases:
        start = names.index(c.min_level)
        fitting = [i for i in range(start, len(levels)) if fits(levels[i], c)]
        if not fitting:
            raise PlanError(f"{c.entry}: fits no level at or above '{c.min_level}' "
                            f"({c.seconds:.3f} s, {c.bytes} bytes on h200, {c.cpu_seconds:.3f} s on cpu)")
        placed[c.key] = fitting[0]
    by_key = {c.key: c for c in cases}
    for i, level in enumerate(levels):
        limit = level.budget_seconds * (1.0 - level.reserve)
        total = sum(by_key[k].seconds for k, lv in placed.items() if lv <= i)
        if total <= limit:
            continue
        gives = units_for(level.name) if units_for else {}
        counts = Counter(u for k, lv in placed.items() if lv <= i for u in gives.get(k, ()))
        remaining = sorted((k for k, lv in placed.items() if lv == i), key=lambda k: (-by_key[k].seconds, k))
        while total > limit and remaining:
            k = next((k for k in remaining if all(counts[u] > 1 for u in gives.get(k, ()))), remaining[0])
            remaining.remove(k)
            if i + 1 == len(levels) or not fits(levels[i + 1], by_key[k]):
                raise PlanError(f"{by_key[k].entry}: level '{level.name}' is over its budget and the "
                                f"case cannot move up")
            placed[k] = i + 1
            total -= by_key[k].seconds
            counts.subtract(gives.get(k, ()))
        if total > limit:
            raise PlanError(f"level '{level.name}': {total:.1f} s of cases at lower levels exceed "
                            f"its budget of {limit:.1f} s")
    return {k: names[i] for k, i in placed.items()}
