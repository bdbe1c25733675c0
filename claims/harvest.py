"""Results -> claims (DESIGN section 7).

A case becomes a claim (engine, arch, case id) when
- its purpose is `claim` or `regression` (valid graphs; probes never become claims),
- it appears in at least `min_runs` of the given results files, and
- in every file where it appears its verdict is `pass` with margin >= `min_margin`
  (the plan's, from the bundle manifest's `min_claim_margin`).
Claims only grow: existing claims are kept unless `prune`, which drops the claims of each
(engine, arch) the given runs cover that those runs do not support.

Alongside the claims, harvest keeps the latest decline reason of every case the engine
declined (what the support matrix shows as declined); a case that has since run, or is
claimed, is no longer listed as declined.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from bundlegen.results_file import read_results, results_file
from bundlegen.claims.store import ClaimSet

CLAIMABLE_PURPOSES = frozenset({"claim", "regression"})
DEFAULT_MIN_RUNS = 2
PASS, DECLINED, CLAIM_BROKEN, SKIPPED = "pass", "declined", "claim-broken", "skipped"
REQUIRED_KEYS = ("case_id", "engine", "arch", "verdict")


@dataclass(frozen=True, kw_only=True)
class HarvestRules:
    min_margin: float               # the manifest's min_claim_margin unless given
    min_runs: int = DEFAULT_MIN_RUNS


@dataclass(frozen=True)
class Observation:
    """One case's result in one run file (the last line for it, if the file repeats it)."""
    run: int
    engine: str
    arch: str
    case_id: str
    purpose: str
    verdict: str
    margin: float | None
    reason: str | None

    @property
    def is_decline(self) -> bool:
        # claim-broken keeps the decline reason when a claimed case was declined
        return self.verdict == DECLINED or (self.verdict == CLAIM_BROKEN and bool(self.reason))

    @property
    def ran(self) -> bool:
        return not self.is_decline and self.verdict != SKIPPED


@dataclass(frozen=True)
class Evidence:
    """What the given runs say about one (engine, arch)."""
    engine: str
    arch: str
    qualified: frozenset[str]               # cases that meet the claim rule
    ran: frozenset[str]                     # cases whose latest observation ran
    declined: Mapping[str, str]             # case -> reason, where the latest observation declined


@dataclass(frozen=True)
class ArchChange:
    engine: str
    arch: str
    added: int
    dropped: int
    total: int
    declines: int


def observations(runs: Sequence[Iterable[Mapping]]) -> tuple[list[Observation], int]:
    """Every usable record as an Observation, and how many records were unusable."""
    out: dict[tuple, Observation] = {}
    unusable = 0
    for index, records in enumerate(runs):
        for r in records:
            if not all(isinstance(r.get(k), str) and r.get(k) for k in REQUIRED_KEYS):
                unusable += 1
                continue
            margin = r.get("margin")
            obs = Observation(run=index, engine=r["engine"], arch=r["arch"], case_id=r["case_id"],
                              purpose=str(r.get("purpose") or ""), verdict=r["verdict"],
                              margin=float(margin) if isinstance(margin, (int, float)) else None,
                              reason=r.get("reason") if isinstance(r.get("reason"), str) else None)
            out[(index, obs.engine, obs.arch, obs.case_id)] = obs
    return list(out.values()), unusable


def gather(runs: Sequence[Iterable[Mapping]], rules: HarvestRules) -> dict[tuple[str, str], Evidence]:
    obs, _ = observations(runs)
    by_case: dict[tuple[str, str, str], list[Observation]] = defaultdict(list)
    for o in obs:
        by_case[(o.engine, o.arch, o.case_id)].append(o)
    qualified, ran, declined = defaultdict(set), defaultdict(set), defaultdict(dict)
    for (engine, arch, case_id), seen in by_case.items():
        key = (engine, arch)
        seen.sort(key=lambda o: o.run)
        if all(o.purpose in CLAIMABLE_PURPOSES for o in seen) and qualifies(seen, rules):
            qualified[key].add(case_id)
        latest = next((o for o in reversed(seen) if o.verdict != SKIPPED), None)
        if latest is None or latest.purpose not in CLAIMABLE_PURPOSES:
            continue
        if latest.is_decline:
            declined[key][case_id] = latest.reason or "declined"
        elif latest.ran:
            ran[key].add(case_id)
    keys = {(o.engine, o.arch) for o in obs}
    return {key: Evidence(engine=key[0], arch=key[1], qualified=frozenset(qualified[key]),
                          ran=frozenset(ran[key]), declined=dict(declined[key]))
            for key in sorted(keys)}


def qualifies(seen: Sequence[Observation], rules: HarvestRules) -> bool:
    """Passed with enough margin in every run it appears in, and in enough runs."""
    if len({o.run for o in seen}) < rules.min_runs:
        return False
    return all(o.verdict == PASS and o.margin is not None and o.margin >= rules.min_margin
               for o in seen)


def merge(existing: ClaimSet, evidence: Iterable[Evidence], prune: bool) -> ClaimSet:
    """The claim set after these runs: only the archs the evidence covers change."""
    claims = {arch: frozenset(ids) for arch, ids in existing.claims.items()}
    declines = {arch: dict(by_id) for arch, by_id in existing.declines.items()}
    for ev in evidence:
        kept = frozenset() if prune else claims.get(ev.arch, frozenset())
        claims[ev.arch] = kept | ev.qualified
        arch_declines = {} if prune else declines.get(ev.arch, {})
        arch_declines = {cid: why for cid, why in arch_declines.items() if cid not in ev.ran}
        arch_declines.update(ev.declined)
        declines[ev.arch] = {cid: why for cid, why in arch_declines.items()
                             if cid not in claims[ev.arch]}
    return ClaimSet(engine=existing.engine, claims=claims,
                    declines={arch: by_id for arch, by_id in declines.items() if by_id})


def harvest(runs: Sequence[Iterable[Mapping]], existing: Mapping[str, ClaimSet],
            rules: HarvestRules, prune: bool = False) -> tuple[dict[str, ClaimSet], list[ArchChange]]:
    """New claim sets for every engine the runs mention, and what changed per arch."""
    runs = [list(r) for r in runs]
    by_engine: dict[str, list[Evidence]] = defaultdict(list)
    for ev in gather(runs, rules).values():
        by_engine[ev.engine].append(ev)
    updated, changes = {}, []
    for engine, evidence in sorted(by_engine.items()):
        before = existing.get(engine) or ClaimSet(engine=engine)
        after = merge(before, evidence, prune)
        updated[engine] = after
        for ev in evidence:
            old, new = before.claimed(ev.arch), after.claimed(ev.arch)
            changes.append(ArchChange(engine, ev.arch, added=len(new - old), dropped=len(old - new),
                                      total=len(new), declines=len(after.declined(ev.arch))))
    return updated, changes


# ----------------------------------------------------------------------------- unclaimed support
@dataclass(frozen=True, order=True)
class UnclaimedCase:
    engine: str
    arch: str
    case_id: str
    margin: float | None = field(default=None, compare=False)


def unclaimed_support(results: Iterable[Mapping], claims: Mapping[str, Iterable[str]]) -> list[UnclaimedCase]:
    """Cases of one engine's results that passed but carry no claim on their arch (candidates
    for `bundlegen harvest`). `claims`: arch -> claimed ids, as bundlegen.claims.store.load_claims gives."""
    claimed = {arch: set(ids) for arch, ids in claims.items()}
    found = {}
    for r in results:
        if r.get("verdict") != PASS or r.get("purpose") not in CLAIMABLE_PURPOSES:
            continue
        arch, case_id = r.get("arch"), r.get("case_id")
        if case_id in claimed.get(arch, ()):
            continue
        found[(r.get("engine"), arch, case_id)] = UnclaimedCase(
            engine=str(r.get("engine")), arch=str(arch), case_id=str(case_id), margin=r.get("margin"))
    return sorted(found.values())


# ----------------------------------------------------------------------------- files
def read_run(path: Path | str) -> list[dict]:
    """The records of a results file (.jsonl, .jsonl.gz) or a run directory."""
    return read_results(results_file(path))
