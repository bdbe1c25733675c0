"""Results -> claims (DESIGN section 7).

A case becomes a claim (engine, arch, case id) when
- its purpose is `claim` or `regression` (valid graphs; probes never become claims),
- it appears in at least `min_runs` of the given results files,
- in every file where it appears its verdict is `pass` with margin >= `min_margin`
  (the plan's, from the bundle manifest's `min_claim_margin`) against the bound and against
  the statistical judge (claim_margin), and
- those files ran it in at least `min_orders` different case orders (a verdict that holds
  only in one order may depend on the case run before it). A run's order is the `order`
  its run.json records (`bundlegen run --shuffle`); a run that records none (not shuffled,
  or no run.json) ran in the plan's natural order, so unshuffled runs count as one order.
Cases whose verdict differs between the given runs are reported as order-dependent, each
with the case run just before it in the two runs that disagree (order_dependent).
Claims only grow: existing claims are kept unless `prune`, which drops the claims of each
(engine, arch) the given runs cover that those runs do not support.

Alongside the claims, harvest keeps the latest decline reason of every case the engine
declined (what the support matrix shows as declined), and why each case the engine
accepted is not claimed (`unclaimed`: skipped with its ticket, failed, too few runs, too
little margin); a case that has since run, or is claimed, is no longer listed. It also
records the evidence: which results files (path, sha256, what their run.json says: level,
completeness, selection, versions) each arch's claims came from and the rule used, so
`bundlegen matrix --check` can re-derive them (bundlegen.claims.integrity).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from bundlegen.results_file import RUN_NAME, RESULTS_NAME, read_results, results_file, run_json_of  # noqa: F401 (re-exported)
from bundlegen.claims.store import UNKNOWN, VERSION_KEYS, ArchEvidence, ClaimSet, RunSource
from bundlegen.harness.verdicts import CLAIM_BROKEN, DECLINED, PASS, SKIPPED

CLAIMABLE_PURPOSES = frozenset({"claim", "regression"})
DEFAULT_MIN_RUNS = 2
# Two orders: a verdict seen in one order only may hang on its neighbour. Evidence harvested
# before runs recorded their order holds 1 (store.LEGACY_MIN_ORDERS), and is checked so.
DEFAULT_MIN_ORDERS = 2
NATURAL_ORDER: tuple[str, ...] = ()       # the order of a run that records none
REQUIRED_KEYS = ("case_id", "engine", "arch", "verdict")
# why an accepted case is not claimed: "<kind>: <detail>" (the matrix groups by kind)
WHY_SKIPPED, WHY_FAILED, WHY_FEW_RUNS, WHY_MARGIN = "skipped", "failed", "too few runs", "margin"
WHY_FEW_ORDERS = "too few orders"


def why_kind(why: str) -> str:
    return why.split(":", 1)[0].strip()


@dataclass(frozen=True, kw_only=True)
class HarvestRules:
    min_margin: float               # the manifest's min_claim_margin unless given
    min_runs: int = DEFAULT_MIN_RUNS
    min_orders: int = DEFAULT_MIN_ORDERS   # distinct case orders among the runs it passed in


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
    detail: str = ""

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
    unclaimed: Mapping[str, str] = field(default_factory=dict)   # case -> why, accepted but not qualified
    runs: frozenset[int] = frozenset()      # indexes of the runs holding this (engine, arch)


@dataclass(frozen=True)
class ArchChange:
    engine: str
    arch: str
    added: int
    dropped: int
    total: int
    declines: int
    unclaimed: int = 0


def observations(runs: Sequence[Iterable[Mapping]]) -> tuple[list[Observation], int]:
    """Every usable record as an Observation, and how many records were unusable."""
    out: dict[tuple, Observation] = {}
    unusable = 0
    for index, records in enumerate(runs):
        for r in records:
            if not all(isinstance(r.get(k), str) and r.get(k) for k in REQUIRED_KEYS):
                unusable += 1
                continue
            margin = claim_margin(r)
            obs = Observation(run=index, engine=r["engine"], arch=r["arch"], case_id=r["case_id"],
                              purpose=str(r.get("purpose") or ""), verdict=r["verdict"],
                              margin=margin,
                              reason=r.get("reason") if isinstance(r.get("reason"), str) else None,
                              detail=str(r.get("detail") or ""))
            out[(index, obs.engine, obs.arch, obs.case_id)] = obs
    return list(out.values()), unusable


def claim_margin(record: Mapping) -> float | None:
    """The margin a claim needs: the least of the record's margin against the bound and its
    statistical margin (a record written before the statistical judge has only the first;
    a device probe's has only the first); None when it has none."""
    bound, statistical = (_number(record.get(key)) for key in ("margin", "statistical_margin"))
    if bound is None or statistical is None:
        return bound
    return min(bound, statistical)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def order_classes(orders: Sequence[Sequence[str] | None], count: int) -> list[int]:
    """For each of `count` runs, a number naming its order: equal numbers, the same order.
    `orders` (aligned with the runs; missing or empty entries: NATURAL_ORDER)."""
    seen: dict[tuple[str, ...], int] = {}
    padded = [*orders, *([None] * (count - len(orders)))][:count]
    return [seen.setdefault(tuple(order or NATURAL_ORDER), len(seen)) for order in padded]


def gather(runs: Sequence[Iterable[Mapping]], rules: HarvestRules,
           orders: Sequence[Sequence[str] | None] = ()) -> dict[tuple[str, str], Evidence]:
    """What the runs say per (engine, arch); `orders`: each run's recorded case order
    (aligned with `runs`; absent or empty: NATURAL_ORDER)."""
    obs, _ = observations(runs)
    order_of = order_classes(orders, len(runs))
    by_case: dict[tuple[str, str, str], list[Observation]] = defaultdict(list)
    for o in obs:
        by_case[(o.engine, o.arch, o.case_id)].append(o)
    qualified, ran, declined, unclaimed = defaultdict(set), defaultdict(set), defaultdict(dict), defaultdict(dict)
    for (engine, arch, case_id), seen in by_case.items():
        key = (engine, arch)
        seen.sort(key=lambda o: o.run)
        if not all(o.purpose in CLAIMABLE_PURPOSES for o in seen):
            continue
        why = unqualified_reason(seen, rules, order_of)
        if why is None:
            qualified[key].add(case_id)
        latest = next((o for o in reversed(seen) if o.verdict != SKIPPED), None)
        if latest is not None and latest.is_decline:
            declined[key][case_id] = latest.reason or DECLINED
            continue
        if latest is not None and latest.ran:
            ran[key].add(case_id)
        if why is not None:
            unclaimed[key][case_id] = why
    runs = defaultdict(set)
    for o in obs:
        runs[(o.engine, o.arch)].add(o.run)
    return {key: Evidence(engine=key[0], arch=key[1], qualified=frozenset(qualified[key]),
                          ran=frozenset(ran[key]), declined=dict(declined[key]),
                          unclaimed=dict(unclaimed[key]), runs=frozenset(runs[key]))
            for key in sorted(runs)}


def unqualified_reason(seen: Sequence[Observation], rules: HarvestRules,
                       order_of: Sequence[int] | None = None) -> str | None:
    """None when the case qualifies: passed with enough margin in every run it appears in,
    in enough runs and enough orders; else why not ("<kind>: <detail>", the latest problem).
    `order_of`: run index -> order class (order_classes); None: every run in one order."""
    for o in reversed(seen):
        if o.verdict == SKIPPED:
            return f"{WHY_SKIPPED}: {o.detail or 'no ticket given'}"
        if o.verdict != PASS:
            detail = o.reason or o.detail
            return f"{WHY_FAILED}: {o.verdict}{f' ({detail})' if detail else ''} in run {o.run + 1}"
    for o in reversed(seen):
        if o.margin is None or o.margin < rules.min_margin:
            shown = "none" if o.margin is None else f"{o.margin:.3g}"
            return f"{WHY_MARGIN}: {shown} < {rules.min_margin:g} in run {o.run + 1}"
    runs = len({o.run for o in seen})
    if runs < rules.min_runs:
        return f"{WHY_FEW_RUNS}: passed in {runs} of the {rules.min_runs} runs needed"
    orders = len({order_of[o.run] if order_of is not None else 0 for o in seen})
    if orders < rules.min_orders:
        return f"{WHY_FEW_ORDERS}: passed in {orders} of the {rules.min_orders} case orders needed"
    return None


def qualifies(seen: Sequence[Observation], rules: HarvestRules, order_of: Sequence[int] | None = None) -> bool:
    return unqualified_reason(seen, rules, order_of) is None


def merge(existing: ClaimSet, evidence: Iterable[Evidence], prune: bool, rules: HarvestRules | None = None,
          sources: Sequence[RunSource | None] = ()) -> ClaimSet:
    """The claim set after these runs: only the archs the evidence covers change. `sources`
    (one per run, None where unknown) are added to each covered arch's evidence."""
    claims = {arch: frozenset(ids) for arch, ids in existing.claims.items()}
    declines = {arch: dict(by_id) for arch, by_id in existing.declines.items()}
    unclaimed = {arch: dict(by_id) for arch, by_id in existing.unclaimed.items()}
    cited = dict(existing.evidence)
    for ev in evidence:
        kept = frozenset() if prune else claims.get(ev.arch, frozenset())
        claims[ev.arch] = kept | ev.qualified
        seen_now = ev.ran | set(ev.declined) | set(ev.unclaimed) | ev.qualified
        arch_declines = {} if prune else declines.get(ev.arch, {})
        arch_declines = {cid: why for cid, why in arch_declines.items() if cid not in ev.ran}
        arch_declines.update(ev.declined)
        declines[ev.arch] = {cid: why for cid, why in arch_declines.items()
                             if cid not in claims[ev.arch]}
        arch_unclaimed = {} if prune else unclaimed.get(ev.arch, {})
        arch_unclaimed = {cid: why for cid, why in arch_unclaimed.items() if cid not in seen_now}
        arch_unclaimed.update(ev.unclaimed)
        unclaimed[ev.arch] = {cid: why for cid, why in arch_unclaimed.items()
                              if cid not in claims[ev.arch] and cid not in declines[ev.arch]}
        if rules is not None:
            new = {s.path: s for i, s in enumerate(sources) if s is not None and i in ev.runs}
            old = {} if prune or ev.arch not in cited else {s.path: s for s in cited[ev.arch].results}
            cited[ev.arch] = ArchEvidence(min_runs=rules.min_runs, min_margin=rules.min_margin,
                                          min_orders=rules.min_orders,
                                          results=tuple(sorted({**old, **new}.values(), key=lambda s: s.path)))
    return ClaimSet(engine=existing.engine, claims=claims,
                    declines={arch: by_id for arch, by_id in declines.items() if by_id},
                    unclaimed={arch: by_id for arch, by_id in unclaimed.items() if by_id},
                    evidence=cited)


def harvest(runs: Sequence[Iterable[Mapping]], existing: Mapping[str, ClaimSet],
            rules: HarvestRules, prune: bool = False,
            sources: Sequence[RunSource | None] = (),
            orders: Sequence[Sequence[str] | None] = ()) -> tuple[dict[str, ClaimSet], list[ArchChange]]:
    """New claim sets for every engine the runs mention, and what changed per arch;
    `sources` (aligned with `runs`) become the claims' recorded evidence; `orders` (aligned
    with `runs`) are their recorded case orders (gather)."""
    runs = [list(r) for r in runs]
    by_engine: dict[str, list[Evidence]] = defaultdict(list)
    for ev in gather(runs, rules, orders).values():
        by_engine[ev.engine].append(ev)
    updated, changes = {}, []
    for engine, evidence in sorted(by_engine.items()):
        before = existing.get(engine) or ClaimSet(engine=engine)
        after = merge(before, evidence, prune, rules, sources)
        updated[engine] = after
        for ev in evidence:
            old, new = before.claimed(ev.arch), after.claimed(ev.arch)
            changes.append(ArchChange(engine, ev.arch, added=len(new - old), dropped=len(old - new),
                                      total=len(new), declines=len(after.declined(ev.arch)),
                                      unclaimed=len(after.not_claimed(ev.arch))))
    return updated, changes


# ----------------------------------------------------------------------------- order-dependent verdicts
@dataclass(frozen=True)
class RunVerdict:
    """One case's verdict in one run, and the case that run ran just before it (None: first)."""
    run: int
    verdict: str
    neighbour: str | None


@dataclass(frozen=True)
class OrderDependence:
    """A case whose verdict differs between two runs: the first run's verdict and the first
    later run that gave another, each with its neighbour."""
    engine: str
    arch: str
    case_id: str
    first: RunVerdict
    other: RunVerdict

    def line(self) -> str:
        def said(v: RunVerdict) -> str:
            after = f"after {v.neighbour}" if v.neighbour else "run first"
            return f"{v.verdict} in run {v.run + 1} ({after})"
        return (f"order-dependent: {self.engine} {self.arch} {self.case_id}: "
                f"{said(self.first)}, {said(self.other)}")


def run_sequence(records: Iterable[Mapping], order: Sequence[str] | None) -> dict[tuple[str, str], list[str]]:
    """(engine, arch) -> case ids in the order one run ran them: its recorded `order` when
    it holds every case of the file (a resumed run records only its last invocation's), else
    the order of its records in the results file (each case at its last record, as harvest
    reads it), which is the run's order for a single worker."""
    by_key: dict[tuple[str, str], dict[str, None]] = defaultdict(dict)
    for r in records:
        if all(isinstance(r.get(k), str) and r.get(k) for k in REQUIRED_KEYS):
            ids = by_key[(r["engine"], r["arch"])]
            ids.pop(r["case_id"], None)
            ids[r["case_id"]] = None
    ranked = {c: i for i, c in enumerate(order or ())}
    return {key: sorted(ids, key=ranked.__getitem__) if ranked and all(c in ranked for c in ids) else list(ids)
            for key, ids in by_key.items()}


def order_dependent(runs: Sequence[Iterable[Mapping]],
                    orders: Sequence[Sequence[str] | None] = ()) -> list[OrderDependence]:
    """Every case (any purpose) whose verdict differs between the runs it was judged in
    (skipped is no verdict), with the neighbour that preceded it in each disagreeing run."""
    runs = [list(r) for r in runs]
    obs, _ = observations(runs)
    by_case: dict[tuple[str, str, str], list[Observation]] = defaultdict(list)
    for o in obs:
        if o.verdict != SKIPPED:
            by_case[(o.engine, o.arch, o.case_id)].append(o)
    padded = [*orders, *([None] * (len(runs) - len(orders)))]
    sequences: dict[int, dict[tuple[str, str], list[str]]] = {}

    def neighbour(o: Observation) -> str | None:
        if o.run not in sequences:
            sequences[o.run] = run_sequence(runs[o.run], padded[o.run])
        ids = sequences[o.run].get((o.engine, o.arch), [])
        at = ids.index(o.case_id) if o.case_id in ids else 0
        return ids[at - 1] if at > 0 else None

    found = []
    for (engine, arch, case_id), seen in sorted(by_case.items()):
        seen.sort(key=lambda o: o.run)
        other = next((o for o in seen if o.verdict != seen[0].verdict), None)
        if other is not None:
            found.append(OrderDependence(engine, arch, case_id,
                                         RunVerdict(seen[0].run, seen[0].verdict, neighbour(seen[0])),
                                         RunVerdict(other.run, other.verdict, neighbour(other))))
    return found


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


def sha256_of(path: Path | str) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_order(results: Path | str) -> tuple[str, ...]:
    """The case order the run.json beside a results file records (`bundlegen run --shuffle`);
    NATURAL_ORDER when it records none or cannot be read."""
    import json

    from bundlegen import safe_read

    try:
        run = json.loads(safe_read.read_text(run_json_of(results)))
    except (OSError, ValueError):
        return NATURAL_ORDER
    order = run.get("order") if isinstance(run, dict) else None
    if isinstance(order, list) and all(isinstance(c, str) for c in order):
        return tuple(order)
    return NATURAL_ORDER


def run_source(results: Path | str, root: Path | str | None = None) -> RunSource:
    """What harvest records about one results file: its path (relative to `root` when inside
    it), sha256, and from its run.json (when present) level, complete, selection and
    `versions: {"torch", "triton", "cudnn", "driver"}` (each "unknown" when not given)."""
    import json

    path = results_file(results)
    shown = path.resolve()
    if root is not None:
        try:
            shown = shown.relative_to(Path(root).resolve())
        except ValueError:
            pass
    try:
        run = json.loads(run_json_of(path).read_text(encoding="utf-8"))
        run = run if isinstance(run, dict) else {}
    except (OSError, ValueError):
        run = {}
    versions = run.get("versions") if isinstance(run.get("versions"), dict) else {}
    return RunSource(path=shown.as_posix(), sha256=sha256_of(path), level=str(run.get("level") or ""),
                     complete=bool(run) and run.get("complete", True) is True, selection=str(run.get("selection") or ""),
                     versions={k: str(versions.get(k) or UNKNOWN) for k in VERSION_KEYS})
