"""Claims integrity (`bundlegen matrix --check`): every claim is backed by the results files
its claims.json cites, and comes from a complete run of its level.

For each engine and arch holding claims:
- the arch's `evidence` names results files; each must exist (paths relative to the
  workspace root) with the sha256 recorded at harvest;
- harvesting those files again with the recorded rule (min runs, min margin) must
  qualify every claimed case (bundlegen.claims.harvest.gather: the one claim rule);
- every claimed case must be in the bundles;
- for every level holding a claimed case, one cited file must cover the level: hold a
  record for every case of it and of each lower level, or (a `-k`/`--shard` run) say in
  its run.json that it ran that level or a higher one to the end over a declared selection,
  or (a whole run of bundles that have grown since) say in its run.json that it ran that
  level or a higher one to the end over every case and hold a record of each of the cases
  it counted. Cases added to the plan after a cited run hold no claim on that arch until a
  run of them is harvested (the matrix counts only the cases its runs saw).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from bundlegen.claims.cases import BundleCases
import json

from bundlegen.claims.harvest import HarvestRules, gather, read_run, run_json_of, sha256_of
from bundlegen.claims.store import ClaimSet, RunSource

SHOWN_IDS = 5


@dataclass(frozen=True)
class Problem:
    engine: str
    arch: str
    text: str

    def __str__(self) -> str:
        return f"{self.engine} {self.arch}: {self.text}"


def _ids(ids: Iterable[str]) -> str:
    ids = sorted(ids)
    more = f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else ""
    return ", ".join(ids[:SHOWN_IDS]) + more


def source_path(source: RunSource, root: Path | str) -> Path:
    path = Path(source.path)
    return path if path.is_absolute() else Path(root) / path


def cases_counted(results: Path) -> int | None:
    """How many cases the run.json beside a results file says the run selected; None when
    there is no readable run.json or it holds no count."""
    try:
        run = json.loads(run_json_of(results).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    count = run.get("cases") if isinstance(run, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def covers(source: RunSource, held: frozenset[str], level: str, cases: BundleCases,
           counted: int | None = None) -> bool:
    """Whether one cited run is a complete run of `level` (see the module docstring);
    `counted`: the number of cases its run.json says it selected."""
    if cases.upto(level) <= held:
        return True
    names = [name for name, _ in cases.levels]
    if not (source.complete and source.level in names and names.index(source.level) >= names.index(level)):
        return False
    if source.selection not in ("", "all"):
        return True
    # A whole run of older bundles: complete when it holds a record of every case it counted.
    return counted is not None and counted == len(held)


def verify(claim_set: ClaimSet, cases: BundleCases, root: Path | str) -> list[Problem]:
    problems: list[Problem] = []
    engine = claim_set.engine
    for arch, claimed in sorted(claim_set.claims.items()):
        if not claimed:
            continue
        say = lambda text: problems.append(Problem(engine, arch, text))  # noqa: E731
        evidence = claim_set.evidence.get(arch)
        if evidence is None or not evidence.results:
            say(f"{len(claimed)} claims cite no results file (harvest them again)")
            continue
        runs, held = [], []
        for source in evidence.results:
            path = source_path(source, root)
            if not path.is_file():
                say(f"cites {source.path}, which is missing")
                continue
            if sha256_of(path) != source.sha256:
                say(f"cites {source.path}, which has changed since the harvest (sha256)")
                continue
            records = [r for r in read_run(path) if r.get("engine") == engine and r.get("arch") == arch]
            runs.append(records)
            held.append((source, frozenset(str(r.get("case_id")) for r in records), cases_counted(path)))
        rules = HarvestRules(min_runs=evidence.min_runs, min_margin=evidence.min_margin)
        found = gather(runs, rules).get((engine, arch))
        unbacked = claimed - (found.qualified if found is not None else frozenset())
        if unbacked:
            say(f"{len(unbacked)} claims not backed by the cited results "
                f"(min runs {rules.min_runs}, min margin {rules.min_margin:g}): {_ids(unbacked)}")
        unknown = {c for c in claimed if cases.level_of(c) is None}
        if unknown:
            say(f"{len(unknown)} claims name cases not in the bundles: {_ids(unknown)}")
        for level in sorted({cases.level_of(c) for c in claimed} - {None},
                            key=[name for name, _ in cases.levels].index):
            if not any(covers(source, ids, level, cases, counted) for source, ids, counted in held):
                say(f"claims {level} cases but no cited results file is a complete run of {level}")
    return problems
