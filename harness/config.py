"""An engine's configuration as the harness reads it (CONTRACTS "Engine TOML", "Claims"):
`<engine config dir>/engine.toml` ([[tolerance_overrides]]: hand-written engine-specific
rows, last match wins; [[test_skips]]: first match wins, optional archs) and
`<engine config dir>/claims.json`, with the bundle manifest of the run.

A case with no matching override row gets the numbers of its tolerance class from the
manifest (bundlegen.manifest)."""
from __future__ import annotations

import fnmatch
import json
import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from bundlegen.graph import Case
from bundlegen.manifest import Manifest

FILTER_KEYS = ("plan", "tolerance_class", "dtype", "id", "group", "level", "item", "purpose")
GLOB_KEYS = frozenset({"id", "item"})


class EngineConfigError(ValueError):
    """engine.toml or claims.json is malformed: names the file and the row."""


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    source: str  # "<engine.toml path> tolerance_overrides[3]" or "manifest class bf16-r256"

    def to_json(self) -> dict:
        return {"rtol": self.rtol, "atol": self.atol, "source": self.source}


@dataclass(frozen=True)
class OverrideRow:
    filters: Mapping[str, str]
    rtol: float
    atol: float
    index: int


@dataclass(frozen=True)
class SkipRow:
    filters: Mapping[str, str]
    reason: str
    archs: tuple[str, ...] | None  # None: every arch


def filters_match(filters: Mapping[str, str], case: Case, plan: str | None) -> bool:
    """Every filter matches the case; `id` and `item` take fnmatch globs, the rest compare
    exactly; `item` matches when any item the case traces to matches."""
    for key, want in filters.items():
        if key == "item":
            if not any(fnmatch.fnmatchcase(item, want) for item in case.items):
                return False
            continue
        have = _case_value(case, key, plan)
        if have is None:
            return False
        if key in GLOB_KEYS:
            if not fnmatch.fnmatchcase(have, want):
                return False
        elif have != want:
            return False
    return True


def _case_value(case: Case, key: str, plan: str | None) -> str | None:
    return {"plan": plan, "tolerance_class": case.tolerance_class, "dtype": case.graph.dtype,
            "id": case.id, "group": case.group, "level": case.level,
            "purpose": case.purpose}[key]


@dataclass(frozen=True)
class EngineConfig:
    overrides: tuple[OverrideRow, ...] = ()
    skips: tuple[SkipRow, ...] = ()
    claims: Mapping[str, frozenset[str]] = field(default_factory=dict)  # arch -> case ids
    source: str = "(none)"
    manifest: Manifest | None = None    # the run's bundle manifest: tolerance classes, cost model

    @property
    def plan(self) -> str | None:
        return None if self.manifest is None else self.manifest.plan

    def with_manifest(self, manifest: Manifest) -> "EngineConfig":
        return replace(self, manifest=manifest)

    def tolerance_for(self, case: Case) -> Tolerance:
        """The last matching override row, else the manifest's numbers for the case's class.
        Raises KeyError when neither gives one."""
        chosen = None
        for row in self.overrides:
            if filters_match(row.filters, case, self.plan):
                chosen = row
        if chosen is not None:
            return Tolerance(chosen.rtol, chosen.atol,
                             f"{self.source} tolerance_overrides[{chosen.index}]")
        if case.tolerance_class is None:
            raise KeyError("missing")
        if self.manifest is None:
            raise KeyError(f"class {case.tolerance_class!r}: no bundle manifest loaded")
        numbers = self.manifest.tolerance_classes.get(case.tolerance_class)
        if numbers is None:
            raise KeyError(f"unknown tolerance class {case.tolerance_class!r} "
                           f"(manifest of plan {self.manifest.plan!r})")
        return Tolerance(numbers.rtol, numbers.atol, f"manifest class {case.tolerance_class}")

    def skip_reason(self, case: Case, arch: str) -> str | None:
        for row in self.skips:
            if row.archs is not None and arch not in row.archs:
                continue
            if filters_match(row.filters, case, self.plan):
                return row.reason
        return None

    def is_claimed(self, case_id: str, arch: str) -> bool:
        return case_id in self.claims.get(arch, frozenset())


# ----------------------------------------------------------------------------- loading
def load_engine_config(directory: Path | str | None, manifest: Manifest | None = None) -> EngineConfig:
    """Read engine.toml and claims.json from `directory` (either may be absent), beside the
    run's bundle manifest."""
    if directory is None:
        return EngineConfig(manifest=manifest)
    directory = Path(directory)
    toml_path, claims_path = directory / "engine.toml", directory / "claims.json"
    overrides: tuple[OverrideRow, ...] = ()
    skips: tuple[SkipRow, ...] = ()
    if toml_path.is_file():
        try:
            doc = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise EngineConfigError(f"{toml_path}: {exc}") from exc
        overrides = tuple(_override_row(toml_path, i, row)
                          for i, row in enumerate(_table_list(toml_path, doc, "tolerance_overrides")))
        skips = tuple(_skip_row(toml_path, i, row)
                      for i, row in enumerate(_table_list(toml_path, doc, "test_skips")))
    claims = _load_claims(claims_path) if claims_path.is_file() else {}
    return EngineConfig(overrides=overrides, skips=skips, claims=claims, source=str(toml_path),
                        manifest=manifest)


def _table_list(path: Path, doc: dict, key: str) -> list:
    rows = doc.get(key, [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise EngineConfigError(f"{path}: {key}: expected an array of tables ([[{key}]])")
    return rows


def _filters(path: Path, where: str, row: dict) -> dict[str, str]:
    raw = row.get("filters", {})
    if not isinstance(raw, dict):
        raise EngineConfigError(f"{path}: {where}.filters: expected a table")
    for key, value in raw.items():
        if key not in FILTER_KEYS:
            raise EngineConfigError(f"{path}: {where}.filters.{key}: unknown filter key "
                                    f"(known: {', '.join(FILTER_KEYS)})")
        if not isinstance(value, str):
            raise EngineConfigError(f"{path}: {where}.filters.{key}: expected a string")
    return dict(raw)


def _number(path: Path, where: str, row: dict, key: str) -> float:
    value = row.get(key)
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < 0):
        raise EngineConfigError(f"{path}: {where}.{key}: expected a finite number >= 0, got {value!r}")
    return float(value)


def _narrowing_filters(path: Path, where: str, row: dict) -> dict[str, str]:
    """A skip row's filters: at least one, and none a glob that matches everything (a row
    that skips every case would let a run go green having tested nothing)."""
    filters = _filters(path, where, row)
    if not filters:
        raise EngineConfigError(f"{path}: {where}.filters: a skip must name the cases it skips "
                                "(id, item, ...); an empty filter would skip every case")
    for key, value in filters.items():
        if key in GLOB_KEYS and not value.strip("*?"):
            raise EngineConfigError(f"{path}: {where}.filters.{key}: {value!r} matches every case")
    return filters


def _override_row(path: Path, i: int, row: dict) -> OverrideRow:
    where = f"tolerance_overrides[{i}]"
    return OverrideRow(filters=_filters(path, where, row), rtol=_number(path, where, row, "rtol"),
                       atol=_number(path, where, row, "atol"), index=i)


def _skip_row(path: Path, i: int, row: dict) -> SkipRow:
    where = f"test_skips[{i}]"
    reason = row.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise EngineConfigError(f"{path}: {where}.reason: a skip needs a reason naming a ticket")
    archs = row.get("archs")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise EngineConfigError(f"{path}: {where}.archs: expected a list of strings")
    return SkipRow(filters=_narrowing_filters(path, where, row), reason=reason,
                   archs=None if archs is None else tuple(archs))


def _load_claims(path: Path) -> dict[str, frozenset[str]]:
    try:
        raw: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineConfigError(f"{path}: {exc}") from exc
    claims = raw.get("claims") if isinstance(raw, dict) else None
    if not isinstance(claims, dict) or not all(
            isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in claims.values()):
        raise EngineConfigError(f"{path}: claims: expected an object arch -> [case id, ...]")
    return {arch: frozenset(ids) for arch, ids in claims.items()}
