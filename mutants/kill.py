"""The kill matrix: every mutant run over a level's cases through the harness
(`bundlegen.harness.executor.CaseExecutor`, the path `bundlegen run` takes), stopping at the first case
that kills it.

A case kills a mutant when the mutant gets a failing verdict there (any `fail:*`,
`rejection-accepted`, `crashed`, `claim-broken`) and the correct engine does not: the
correct engine's verdict is asked only for killing cases, once per case, so a case that
fails for the engine itself never counts as a kill.

Cases are tried cheapest first (predicted seconds on the device; probes cost nothing, as
they are never executed), the mutant's `prefer` items before the rest.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from bundlegen.graph import Case
from bundlegen.harness import verdicts as V

KILLED = "killed"
SURVIVED = "survived"
NOT_APPLICABLE = "n/a"
BROKEN = "broken"          # the mutant engine could not be built

#: the check a failing verdict names
CHECK_OF_VERDICT = {
    V.FAIL_NUMERIC: "tolerance vs oracle",
    V.FAIL_STATISTICAL: "statistical judge vs io-precision reference",
    V.FAIL_NAN: "no NaN/Inf",
    V.FAIL_GUARD: "guard canaries",
    V.FAIL_INPUT_MODIFIED: "inputs untouched",
    V.FAIL_NONDETERMINISTIC: "determinism",
    V.FAIL_ESCAPED: "bad offsets contained",
    V.FAIL_CORRUPTED: "good sequences under bad offsets",
    V.REJECTION_ACCEPTED: "rejection probe",
    V.CRASHED: "engine raised",
    V.CLAIM_BROKEN: "claim",
}


def kills(verdict: str) -> bool:
    return verdict in CHECK_OF_VERDICT


@dataclass(frozen=True)
class Kill:
    case_id: str
    level: str
    group: str
    purpose: str
    items: tuple[str, ...]
    verdict: str
    detail: str

    @property
    def check(self) -> str:
        """The check that failed; for a claimed case, the one behind `claim-broken`."""
        if self.verdict == V.CLAIM_BROKEN:
            was = self.detail.partition(" but ")[2]
            behind = next((c for v, c in CHECK_OF_VERDICT.items() if was.startswith(v)), None)
            return f"{behind} (claimed case)" if behind else "claim (declined)"
        return CHECK_OF_VERDICT.get(self.verdict, self.verdict)

    @property
    def where(self) -> str:
        return f"{self.level}/{self.group}/{self.case_id}"

    def to_json(self) -> dict:
        return {"case_id": self.case_id, "level": self.level, "group": self.group,
                "purpose": self.purpose, "items": list(self.items), "verdict": self.verdict,
                "check": self.check, "detail": self.detail}


@dataclass(frozen=True)
class MutantResult:
    name: str
    kind: str
    defect_class: str
    status: str                          # killed | survived | n/a | broken
    kills: tuple[Kill, ...] = ()         # the first only, unless every case was run
    cases_run: int = 0
    wall_s: float = 0.0
    note: str = ""                       # why n/a or broken
    baseline_failures: tuple[str, ...] = ()   # killing cases the correct engine fails too
    #: the cases meeting the mutant's condition that the harness judged (passed or killed),
    #: and how many of them killed it: with every case run (not first_kill_only), the kill
    #: fraction is exercised_kills / exercised
    exercised: int = 0
    exercised_kills: int = 0

    @property
    def kill(self) -> Kill | None:
        return self.kills[0] if self.kills else None

    @property
    def kill_fraction(self) -> float | None:
        """The share of the exercised cases that killed it (with every case run)."""
        return self.exercised_kills / self.exercised if self.exercised else None

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "defect_class": self.defect_class,
                "status": self.status, "kill": self.kill.to_json() if self.kill else None,
                "kills": [k.to_json() for k in self.kills], "cases_run": self.cases_run,
                "wall_s": round(self.wall_s, 3), "note": self.note,
                "baseline_failures": list(self.baseline_failures), "exercised": self.exercised,
                "exercised_kills": self.exercised_kills, "kill_fraction": self.kill_fraction}


@dataclass(frozen=True)
class KillMatrix:
    engine: str
    device: str
    arch: str
    level: str
    pattern: str | None
    cases: int
    results: tuple[MutantResult, ...]
    wall_s: float
    first_kill_only: bool = True

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def applicable(self) -> int:
        return sum(r.status in (KILLED, SURVIVED, BROKEN) for r in self.results)

    @property
    def exit_code(self) -> int:
        """1 when a mutant survived (or could not be built), else 0."""
        return 1 if any(r.status in (SURVIVED, BROKEN) for r in self.results) else 0

    def to_json(self) -> dict:
        return {"version": 1, "engine": self.engine, "device": self.device, "arch": self.arch,
                "level": self.level, "pattern": self.pattern, "cases": self.cases,
                "first_kill_only": self.first_kill_only,
                "killed": self.count(KILLED), "survived": self.count(SURVIVED),
                "not_applicable": self.count(NOT_APPLICABLE), "broken": self.count(BROKEN),
                "wall_s": round(self.wall_s, 3), "mutants": [r.to_json() for r in self.results]}


# ----------------------------------------------------------------------------- cases
def load_cases(level: str, bundles: Path | str | None = None, pattern: str | None = None) -> list[Case]:
    """The level's cases (and every lower level's) matching `-k PATTERN`. Malformed bundle
    entries are `bundlegen run`'s to report; they kill nothing."""
    from bundlegen.harness import bundles as B
    from bundlegen.harness.selection import matches_pattern

    loaded = B.load_level(Path(bundles) if bundles else B.default_bundle_root(), level)
    return [c for c in loaded.cases if matches_pattern(c, pattern)]


def case_cost(case: Case, device: torch.device) -> float:
    """Predicted seconds of one case on `device`; a probe is never executed."""
    from bundlegen.harness.case import predicted_seconds

    if case.purpose == "probe":
        return 0.0
    predicted = predicted_seconds(case, device)
    return float(predicted if predicted is not None else case.cost.predicted_s)


def order_cases(cases: Sequence[Case], device: torch.device | str,
                prefer: Iterable[str] = ()) -> list[Case]:
    """Cases tracing to a `prefer` item glob first, each part cheapest first."""
    from bundlegen.harness.selection import matches_pattern

    device = torch.device(device)
    prefer = tuple(prefer)
    costs = {c.id: case_cost(c, device) for c in cases}

    def preferred(case: Case) -> bool:
        return any(matches_pattern(case, p) for p in prefer)

    return sorted(cases, key=lambda c: (not preferred(c), costs[c.id], c.level, c.group, c.id))


# ----------------------------------------------------------------------------- baseline
class Baseline:
    """The correct engine's verdicts, asked lazily (only for cases that kill a mutant)."""

    def __init__(self, engine: str, device: str, make_executor: Callable[[str], object]):
        self.engine, self.device = engine, device
        self._make = make_executor
        self._executor = None
        self._verdicts: dict[str, str] = {}

    def fails(self, case: Case) -> bool:
        if case.id not in self._verdicts:
            if self._executor is None:
                self._executor = self._make(self.engine)
            self._verdicts[case.id] = self._executor.execute(case).verdict
        return V.is_failing(self._verdicts[case.id])

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()


# ----------------------------------------------------------------------------- one mutant
def run_mutant(mutant, engine: str, cases: Sequence[Case], baseline: Baseline,
               make_executor: Callable[[str], object], *, first_kill_only: bool = True,
               on_case: Callable[[str, Case], None] | None = None) -> MutantResult:
    from bundlegen.engines.registry import engine_class
    from bundlegen.harness.workers.worker import WorkerStartError
    from bundlegen.mutants.catalog import engine_target

    def result(status, **kw) -> MutantResult:
        return MutantResult(mutant.name, mutant.kind, mutant.defect_class, status, **kw)

    reason = mutant.not_applicable(engine_class(engine), baseline.device)
    if reason:
        return result(NOT_APPLICABLE, note=reason)
    start = time.perf_counter()
    try:
        executor = make_executor(engine_target(engine, mutant.name))
    except (WorkerStartError, TypeError, ValueError, ImportError) as exc:
        return result(BROKEN, note=f"cannot build the mutant: {type(exc).__name__}: {exc}",
                      wall_s=time.perf_counter() - start)
    found: list[Kill] = []
    ignored: list[str] = []
    run = exercised = exercised_kills = 0
    try:
        for case in order_cases(cases, baseline.device, mutant.prefer):
            if on_case is not None:
                on_case(mutant.name, case)
            record = executor.execute(case)
            run += 1
            meets = mutant.condition is None or mutant.condition(case.graph)
            if not kills(record.verdict):
                exercised += record.verdict == V.PASS and meets
                continue
            if baseline.fails(case):
                ignored.append(case.id)
                continue
            exercised += meets
            exercised_kills += meets
            found.append(Kill(case.id, case.level, case.group, case.purpose, tuple(case.items),
                              record.verdict, record.detail))
            if first_kill_only:
                break
    finally:
        executor.close()
    return result(KILLED if found else SURVIVED, kills=tuple(found), cases_run=run,
                  wall_s=time.perf_counter() - start, baseline_failures=tuple(ignored),
                  exercised=exercised, exercised_kills=exercised_kills)


# ----------------------------------------------------------------------------- the matrix
def kill_matrix(mutants, engine: str, cases: Sequence[Case], *, level: str = "",
                device: str | None = None, pattern: str | None = None,
                first_kill_only: bool = True, repeat: int | None = None,
                isolation: bool = False, timeout_s: float | None = None, config=None,
                on_result: Callable[[MutantResult], None] | None = None,
                on_case: Callable[[str, Case], None] | None = None) -> KillMatrix:
    """Run each mutant of `engine` over `cases` (already selected) and collect the kills."""
    from bundlegen.engines.base import arch_of
    from bundlegen.engines.registry import engine_class
    from bundlegen.harness.config import load_engine_config
    from bundlegen.workspace import engine_config_dir
    from bundlegen.harness.executor import CaseExecutor
    from bundlegen.harness.workers.devices import default_device, default_timeout

    device = device or default_device()
    base = engine_class(engine)
    config = config if config is not None else load_engine_config(engine_config_dir(base.name))
    timeout = timeout_s if timeout_s is not None else default_timeout(device)

    def make_executor(target: str) -> CaseExecutor:
        return CaseExecutor(target, device, config=config, repeat=repeat, isolation=isolation,
                            timeout_s=timeout)

    start = time.perf_counter()
    baseline = Baseline(engine, device, make_executor)
    results = []
    try:
        for mutant in mutants:
            r = run_mutant(mutant, engine, cases, baseline, make_executor,
                           first_kill_only=first_kill_only, on_case=on_case)
            results.append(r)
            if on_result is not None:
                on_result(r)
    finally:
        baseline.close()
    return KillMatrix(engine=engine, device=str(device), arch=arch_of(device), level=level,
                      pattern=pattern, cases=len(cases), results=tuple(results),
                      wall_s=time.perf_counter() - start, first_kill_only=first_kill_only)


# ----------------------------------------------------------------------------- level by level
@dataclass(frozen=True)
class LevelKills:
    """Mutants run level by level: each level over its own new cases, only the mutants no
    lower level killed. `first_level(name)` is the level that first killed it (or None)."""
    levels: tuple[str, ...]
    matrices: tuple[KillMatrix, ...]        # one per level run (a level runs only if a mutant is left)

    def first_level(self, name: str) -> str | None:
        for matrix in self.matrices:
            if any(r.name == name and r.status == KILLED for r in matrix.results):
                return matrix.level
        return None

    def result(self, name: str) -> MutantResult:
        """The mutant's result at the level that killed it, else at the last level it ran."""
        found = None
        for matrix in self.matrices:
            for r in matrix.results:
                if r.name == name:
                    found = r
        return found

    def late(self, mutants) -> list[str]:
        """Mutants not killed by their `killed_by` level, where that level was run."""
        order = {level: i for i, level in enumerate(self.levels)}
        out = []
        for m in mutants:
            if m.killed_by not in order or self.result(m.name).status == NOT_APPLICABLE:
                continue
            first = self.first_level(m.name)
            if first is None or order[first] > order[m.killed_by]:
                out.append(m.name)
        return out

    def to_json(self, mutants) -> dict:
        return {"version": 1, "levels": list(self.levels),
                "mutants": [{"name": m.name, "boundary_class": m.boundary_class,
                             "killed_by": m.killed_by, "first_level": self.first_level(m.name),
                             "result": self.result(m.name).to_json()} for m in mutants],
                "late": self.late(mutants), "matrices": [x.to_json() for x in self.matrices]}


def kill_levels(mutants, engine: str, levels: Sequence[str],
                cases_of: Callable[[str, tuple[str, ...]], Sequence[Case]], **kwargs) -> LevelKills:
    """kill_matrix for each level in turn (lowest first): `cases_of(level, done)` gives the
    level's cases less those of the levels in `done` (already run); the mutants a level
    kills (or that are not applicable or broken) are not run again above it."""
    alive, done, matrices = list(mutants), (), []
    for level in levels:
        if not alive:
            break
        matrix = kill_matrix(alive, engine, cases_of(level, done), level=level, **kwargs)
        matrices.append(matrix)
        alive = [m for m, r in zip(alive, matrix.results) if r.status == SURVIVED]
        done = done + (level,)
    return LevelKills(tuple(levels), tuple(matrices))
