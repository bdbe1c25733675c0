"""Skips that can be re-examined (`--run-skipped` on `run` and `repro`, as pytest's
--runxfail): the cases an engine config's [[test_skips]] rows would skip are run, and a row
whose cases all pass now is reported as stale (its defect may be fixed: an upgraded library,
a mended engine). Which row skips a case is the config's own rule (EngineConfig.skip_reason,
first matching row in scope), asked one row at a time."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping

from bundlegen.graph import Case
from bundlegen.harness import verdicts as V
from bundlegen.harness.config import EngineConfig


@dataclass(frozen=True)
class StaleSkip:
    """A skip row whose cases all passed when run."""
    index: int          # its place among the config's skip rows (engine.toml's test_skips[i])
    detail: str         # its ticket and reason
    cases: int          # how many cases it would have skipped, all of which passed

    def to_json(self) -> dict:
        return {"row": self.index, "detail": self.detail, "cases": self.cases}

    def line(self, source: str) -> str:
        return (f"stale skip: {source} test_skips[{self.index}] ({self.detail}): "
                f"its {self.cases} case(s) all pass now")


def without_skips(config: EngineConfig) -> EngineConfig:
    """The config a --run-skipped run judges with: every skip row left out."""
    return dataclasses.replace(config, skips=())


def skipping_row(config: EngineConfig, case: Case, arch: str,
                 versions: Mapping[str, str] | None = None) -> int | None:
    """The index of the skip row that skips `case` under `config`, or None."""
    for index, row in enumerate(config.skips):
        alone = dataclasses.replace(config, skips=(row,))
        if alone.skip_reason(case, arch, versions) is not None:
            return index
    return None


def stale_skips(config: EngineConfig, cases: Iterable[Case], verdicts: Mapping[str, str], arch: str,
                versions: Mapping[str, str] | None = None) -> tuple[StaleSkip, ...]:
    """The rows of `config` that skip at least one of `cases` and whose every such case has a
    `pass` in `verdicts` (case id -> verdict of the run that ran them anyway)."""
    skipped: dict[int, list[str]] = {}
    for case in cases:
        index = skipping_row(config, case, arch, versions)
        if index is not None:
            skipped.setdefault(index, []).append(case.id)
    return tuple(StaleSkip(index, config.skips[index].detail, len(ids))
                 for index, ids in sorted(skipped.items())
                 if all(verdicts.get(case_id) == V.PASS for case_id in ids))
