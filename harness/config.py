"""An engine's configuration as the harness reads it (CONTRACTS "Engine TOML", "Claims"):
`<engine config dir>/engine.toml` ([[tolerance_overrides]]: hand-written engine-specific
rows, last match wins; [[test_skips]]: one row per defect, first match wins, scoped by arch
and by the library versions the defect was seen with) and `<engine config dir>/claims.json`,
with the bundle manifest of the run.

A case with no matching override row gets the numbers of its tolerance class from the
manifest (bundlegen.manifest)."""
from __future__ import annotations

import fnmatch
import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from bundlegen import safe_read, strict_json
from bundlegen.engine_toml import ENGINE_TOML_KEYS, META_KEYS, OVERRIDE_KEYS
from bundlegen.graph import Case, Graph
from bundlegen.harness.library_versions import (LIBRARIES, SPECIFIER_PATTERN, BadSpecifier, Specifier,
                                                parse_specifier, present_on, running_version)
from bundlegen.manifest import Manifest
from bundlegen.tolerance import Tolerance
from bundlegen.tolerance_bounds import tolerance_problem
from bundlegen.workspace import is_engine_name

FILTER_KEYS = ("plan", "tolerance_class", "dtype", "id", "group", "level", "item", "purpose", "feature")
GLOB_KEYS = frozenset({"id", "item"})
#: the keys of a [[test_skips]] row
SKIP_KEYS = ("ticket", "reason", "archs", "seen_with", "filters")


def _ports_differ_in_strides(graph: Graph, a: str, b: str) -> bool:
    return a in graph.tensors and b in graph.tensors and graph.tensors[a].strides != graph.tensors[b].strides


#: what a `feature` filter selects by: named properties of a case's graph (a defect that
#: follows a property rather than a list of cases is skipped by the property)
GRAPH_FEATURES: Mapping[str, Callable[[Graph], bool]] = {
    "do-strides-differ-from-o": lambda g: _ports_differ_in_strides(g, "do", "o"),
    "ragged": lambda g: g.ragged is not None,
    "bias": lambda g: "bias" in g.modifiers,
    "dbias": lambda g: "dbias" in g.modifiers,
    "sinks": lambda g: "sinks" in g.modifiers,
    "softcap": lambda g: "softcap" in g.modifiers,
}


class EngineConfigError(ValueError):
    """engine.toml or claims.json is malformed: names the file and the row."""


#: a filter: key -> a value, or several values any of which matches
Filter = Mapping[str, "str | tuple[str, ...]"]


@dataclass(frozen=True)
class OverrideRow:
    """rtol and atol replace the class's; k and floor (the statistical judge's) do when given,
    else the class's stay."""
    filters: Filter
    rtol: float
    atol: float
    index: int
    k: float | None = None
    floor: float | None = None


@dataclass(frozen=True)
class SkipRow:
    """One defect: a case any of `filters` selects is skipped, on `archs` (None: every arch)
    and where every library in `seen_with` runs at a version its specifier admits."""
    filters: tuple[Filter, ...]
    reason: str
    archs: tuple[str, ...] | None = None
    ticket: str | None = None
    seen_with: Mapping[str, Specifier] = field(default_factory=dict)   # library -> versions seen with

    @property
    def detail(self) -> str:
        """What a case it skips carries as its result's detail: the ticket, then the reason."""
        return self.reason if self.ticket is None else f"{self.ticket}: {self.reason}"

    def selects(self, case: Case, plan: "PlanNames") -> bool:
        return any(filters_match(f, case, plan) for f in self.filters)

    def in_scope(self, arch: str, version_of: Callable[[str], str | None]) -> bool:
        """Whether the row applies where a case runs on `arch` with `version_of(library)`
        (None: the library is absent): a library it names that is absent, or not at a
        version it was seen with, puts the row out of scope and the case runs."""
        if self.archs is not None and arch not in self.archs:
            return False
        return all(present_on(library, arch) and spec.admits(library, version_of(library))
                   for library, spec in self.seen_with.items())


#: the names a `plan` filter may give for the run's plan: its own, and in a workspace plan
#: that extends the built-in one, the built-in plan's too (plan_names)
PlanNames = "str | tuple[str, ...] | None"


def plan_names(manifest: Manifest | None) -> tuple[str, ...]:
    """What a `plan` filter matches under `manifest`: its plan, and the plan it extends
    (so `plan = "sdpa_bwd"`, CONTRACTS' example, still selects in an extension workspace)."""
    if manifest is None:
        return ()
    return (manifest.plan,) + ((manifest.extends.plan,) if manifest.extends is not None else ())


def filters_match(filters: Filter, case: Case, plan: PlanNames) -> bool:
    """Every key of the filter matches the case; a key given several values matches when
    any does. `id` and `item` take fnmatch globs, the rest compare exactly; `item` matches
    when any item the case traces to matches, `feature` when the case's graph has it
    (GRAPH_FEATURES), `plan` when it is one of `plan`'s names (plan_names)."""
    for key, want in filters.items():
        wants = (want,) if isinstance(want, str) else want
        if not any(_value_matches(key, one, case, plan) for one in wants):
            return False
    return True


def _value_matches(key: str, want: str, case: Case, plan: PlanNames) -> bool:
    if key == "plan":
        return want in ((plan,) if isinstance(plan, str) else (plan or ()))
    if key == "item":
        return any(fnmatch.fnmatchcase(item, want) for item in case.items)
    if key == "feature":
        return GRAPH_FEATURES[want](case.graph)
    have = _case_value(case, key)
    if have is None:
        return False
    return fnmatch.fnmatchcase(have, want) if key in GLOB_KEYS else have == want


def _case_value(case: Case, key: str) -> str | None:
    return {"tolerance_class": case.tolerance_class, "dtype": case.graph.dtype,
            "id": case.id, "group": case.group, "level": case.level,
            "purpose": case.purpose}[key]


@dataclass(frozen=True)
class EngineConfig:
    overrides: tuple[OverrideRow, ...] = ()
    skips: tuple[SkipRow, ...] = ()
    claims: Mapping[str, frozenset[str]] = field(default_factory=dict)  # arch -> case ids
    source: str = "(none)"
    manifest: Manifest | None = None    # the run's bundle manifest: tolerance classes, cost model
    stale_note: str = ""                # set by --allow-stale-tolerances: every tolerance records it

    @property
    def plan(self) -> tuple[str, ...]:
        """The names a `plan` filter selects the run's cases by (plan_names)."""
        return plan_names(self.manifest)

    def with_manifest(self, manifest: Manifest) -> "EngineConfig":
        return replace(self, manifest=manifest)

    def tolerance_for(self, case: Case) -> Tolerance:
        """The last matching override row, else the manifest's numbers for the case's class.
        Raises KeyError when neither gives one."""
        chosen = None
        for row in self.overrides:
            if filters_match(row.filters, case, self.plan):
                chosen = row
        numbers = self._class_numbers(case, required=chosen is None)
        if chosen is not None:
            inherited = (None, None) if numbers is None else (numbers.k, numbers.floor)
            return Tolerance(chosen.rtol, chosen.atol,
                             f"{self.source} tolerance_overrides[{chosen.index}]{self.stale_note}",
                             k=chosen.k if chosen.k is not None else inherited[0],
                             floor=chosen.floor if chosen.floor is not None else inherited[1])
        return Tolerance(numbers.rtol, numbers.atol, f"manifest class {case.tolerance_class}{self.stale_note}",
                         k=numbers.k, floor=numbers.floor)

    def _class_numbers(self, case: Case, required: bool) -> Tolerance | None:
        """The case's class in the manifest; when not `required` (an override row chose the
        numbers), None where there is none. Raises KeyError otherwise."""
        problem = None
        if case.tolerance_class is None:
            problem = "missing"
        elif self.manifest is None:
            problem = f"class {case.tolerance_class!r}: no bundle manifest loaded"
        else:
            numbers = self.manifest.tolerance_classes.get(case.tolerance_class)
            if numbers is not None:
                return numbers
            problem = (f"unknown tolerance class {case.tolerance_class!r} "
                       f"(manifest of plan {self.manifest.plan!r})")
        if required:
            raise KeyError(problem)
        return None

    def skip_reason(self, case: Case, arch: str, versions: Mapping[str, str] | None = None) -> str | None:
        """The detail of the first row that selects the case and is in scope, else None.
        `versions`: library -> version as run.json spells it; default this process's
        (library_versions.running_version), read only when a version-scoped row selects
        the case."""
        def version_of(library: str) -> str | None:
            return running_version(library, arch) if versions is None else versions.get(library)

        for row in self.skips:
            if row.archs is not None and arch not in row.archs:
                continue
            if row.selects(case, self.plan) and row.in_scope(arch, version_of):
                return row.detail
        return None

    def is_claimed(self, case_id: str, arch: str) -> bool:
        return case_id in self.claims.get(arch, frozenset())


# ----------------------------------------------------------------------------- judging numbers
def checked_for_run(config: EngineConfig, manifest: Manifest, allow_stale: bool = False) -> EngineConfig:
    """`config` with `manifest`, once the numbers that will judge the run are the plan's
    (bundlegen.tolerance_check): the tolerance TOML's classes against the plan's derivation
    (when the plan imports), every class and override row under the error model's
    ceilings, and the engine TOML's generated block against the tolerance TOML. Raises
    EngineConfigError (one line) for the first problem; a stale block passes only with
    `allow_stale`, and then every tolerance the run resolves records it."""
    from bundlegen import tolerance_check as TC

    file = manifest_tolerances_file(manifest)
    derived = TC.derived_classes(manifest.plan)
    if derived is not None:
        mismatches = TC.derivation_mismatches(manifest.tolerance_classes, derived, file)
        if mismatches:
            more = f" (and {len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
            raise EngineConfigError(mismatches[0] + more)
    limits = TC.ceilings(derived) if derived is not None else TC.builtin_ceilings()
    for name, tc in sorted(manifest.tolerance_classes.items()):
        problem = TC.ceiling_problem(tc.rtol, tc.atol, tc.dtype, limits)
        if problem:
            raise EngineConfigError(f"{file}: class {name}: {problem}")
    for row in config.overrides:
        dtype = row.filters.get("dtype")
        problem = TC.ceiling_problem(row.rtol, row.atol, dtype if isinstance(dtype, str) else None, limits)
        if problem:
            raise EngineConfigError(f"{config.source}: tolerance_overrides[{row.index}]: {problem}")
    config = config.with_manifest(manifest)
    stale = _stale_block(config, manifest)
    if stale is None:
        return config
    if not allow_stale:
        raise EngineConfigError(stale.message())
    return replace(config, stale_note=f" (stale tolerance block allowed: {stale.recorded or 'no digest'} "
                                      f"!= {stale.current})")


def manifest_tolerances_file(manifest: Manifest) -> str:
    from bundlegen.tolerances import tolerances_name

    return tolerances_name(manifest.plan)


def _stale_block(config: EngineConfig, manifest: Manifest):
    from bundlegen.tolerance_check import stale_block

    if not config.overrides or not os.path.lexists(config.source):
        return None
    try:
        text = safe_read.read_text(config.source)
    except (OSError, UnicodeDecodeError) as exc:
        raise EngineConfigError(f"{config.source}: {exc}") from None
    return stale_block(config.source, text, manifest.plan, manifest.tolerance_classes, manifest.tolerances_digest)


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
    if os.path.lexists(toml_path):     # a folder, FIFO or dangling link there is an error, not "absent"
        try:
            doc = tomllib.loads(safe_read.read_text(toml_path))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise EngineConfigError(f"{toml_path}: {exc}") from None
        _only_keys(toml_path, "", doc, ENGINE_TOML_KEYS)
        _meta(toml_path, doc.get("meta"))
        overrides = tuple(_override_row(toml_path, i, row)
                          for i, row in enumerate(_table_list(toml_path, doc, "tolerance_overrides")))
        skips = tuple(skip_row(toml_path, f"test_skips[{i}]", row)
                      for i, row in enumerate(_table_list(toml_path, doc, "test_skips")))
    claims = _load_claims(claims_path) if os.path.lexists(claims_path) else {}
    return EngineConfig(overrides=overrides, skips=skips, claims=claims, source=str(toml_path),
                        manifest=manifest)


def _only_keys(path: Path, where: str, table: dict, keys: tuple[str, ...]) -> None:
    """Refuse a key the table does not have: a misspelt one (`rtl`) would be ignored."""
    for key in table:
        if key not in keys:
            raise EngineConfigError(f"{path}: {where}{key}: unknown key (known: {', '.join(keys)})")


def _meta(path: Path, meta: Any) -> None:
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise EngineConfigError(f"{path}: meta: expected a table ([meta])")
    _only_keys(path, "meta.", meta, META_KEYS)
    name = meta.get("name")
    if name is not None and not is_engine_name(name):
        raise EngineConfigError(f"{path}: meta.name: expected an engine name (lower-case letters, digits "
                                f"and '-'), got {name!r}")


def _table_list(path: Path, doc: dict, key: str) -> list:
    rows = doc.get(key, [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise EngineConfigError(f"{path}: {key}: expected an array of tables ([[{key}]])")
    return rows


def _filters(path: Path, where: str, row: dict) -> Filter:
    raw = row.get("filters", {})
    if not isinstance(raw, dict):
        raise EngineConfigError(f"{path}: {where}.filters: expected a table")
    return _filter_table(path, f"{where}.filters", raw)


def _filter_table(path: Path, where: str, raw: dict) -> Filter:
    """One filter: each key a known one, each value a string or a non-empty list of them."""
    out: dict[str, str | tuple[str, ...]] = {}
    for key, value in raw.items():
        if key not in FILTER_KEYS:
            raise EngineConfigError(f"{path}: {where}.{key}: unknown filter key "
                                    f"(known: {', '.join(FILTER_KEYS)})")
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) and v for v in values):
            raise EngineConfigError(f"{path}: {where}.{key}: expected a string or a non-empty "
                                    f"list of strings, got {value!r}")
        if key == "feature":
            for name in values:
                if name not in GRAPH_FEATURES:
                    raise EngineConfigError(f"{path}: {where}.feature: unknown graph feature {name!r} "
                                            f"(known: {', '.join(GRAPH_FEATURES)})")
        out[key] = value if isinstance(value, str) else tuple(value)
    return out


def _number(path: Path, where: str, row: dict, key: str) -> float:
    problem = tolerance_problem(key, row.get(key))
    if problem is not None:
        raise EngineConfigError(f"{path}: {where}.{key}: {problem}")
    return float(row[key])


def _narrowing_filters(path: Path, where: str, row: dict) -> tuple[Filter, ...]:
    """A skip row's filters (one table, or an array of them any of which selects a case):
    at least one, none empty, and none a glob that matches everything (a row that skips
    every case would let a run go green having tested nothing)."""
    raw = row.get("filters")
    none_named = (f"{path}: {where}.filters: a skip must name the cases it skips "
                  "(id, item, feature, ...); an empty filter would skip every case")
    if raw is None or raw == {} or raw == []:
        raise EngineConfigError(none_named)
    if isinstance(raw, dict):
        tables = [(f"{where}.filters", raw)]
    elif isinstance(raw, list) and all(isinstance(t, dict) for t in raw):
        tables = [(f"{where}.filters[{j}]", t) for j, t in enumerate(raw)]
    else:
        raise EngineConfigError(f"{path}: {where}.filters: expected a table or an array of tables")
    filters = []
    for at, table in tables:
        if not table:
            raise EngineConfigError(none_named.replace(f"{where}.filters", at))
        one = _filter_table(path, at, table)
        for key, value in one.items():
            for glob in ((value,) if isinstance(value, str) else value):
                if key in GLOB_KEYS and not glob.strip("*?"):
                    raise EngineConfigError(f"{path}: {at}.{key}: {glob!r} matches every case")
        filters.append(one)
    return tuple(filters)


def _override_row(path: Path, i: int, row: dict) -> OverrideRow:
    where = f"tolerance_overrides[{i}]"
    _only_keys(path, f"{where}.", row, OVERRIDE_KEYS)
    optional = {key: _number(path, where, row, key) for key in ("k", "floor") if key in row}
    return OverrideRow(filters=_filters(path, where, row), rtol=_number(path, where, row, "rtol"),
                       atol=_number(path, where, row, "atol"), index=i, **optional)


def skip_row(path: Path, where: str, row: dict) -> SkipRow:
    """A [[test_skips]] row (or a row shaped like one, as lanes.yaml's skips are), checked:
    every error names `path` and the key under `where` ("test_skips[2].seen_with.cudnn")."""
    for key in row:
        if key not in SKIP_KEYS:
            raise EngineConfigError(f"{path}: {where}.{key}: unknown key (known: {', '.join(SKIP_KEYS)})")
    reason = row.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise EngineConfigError(f"{path}: {where}.reason: a skip needs a reason naming a ticket")
    ticket = row.get("ticket")
    if ticket is not None and (not isinstance(ticket, str) or not ticket.strip()):
        raise EngineConfigError(f"{path}: {where}.ticket: expected a non-empty string, got {ticket!r}")
    archs = row.get("archs")
    if archs is not None and (not isinstance(archs, list) or not archs
                              or not all(isinstance(a, str) and a for a in archs)):
        raise EngineConfigError(f"{path}: {where}.archs: expected a non-empty list of strings, got {archs!r}")
    return SkipRow(filters=_narrowing_filters(path, where, row), reason=reason,
                   archs=None if archs is None else tuple(archs), ticket=ticket,
                   seen_with=_seen_with(path, where, row.get("seen_with")))


def skip_row_schema() -> dict:
    """A JSON Schema (draft 2020-12) of one [[test_skips]] row as JSON holds it (TOML read
    into JSON), built from the tables skip_row checks by, so the two cannot name different
    keys, filters, features, libraries or specifier syntax."""
    def strings(item: dict) -> dict:
        return {"oneOf": [item, {"type": "array", "minItems": 1, "items": item}]}

    text = {"type": "string", "minLength": 1}
    narrowing = {**text, "not": {"pattern": "^[*?]+$"}}     # a glob matching every case
    values = {key: strings(narrowing if key in GLOB_KEYS else text) for key in FILTER_KEYS}
    values["feature"] = strings({"enum": list(GRAPH_FEATURES)})
    one_filter = {"type": "object", "minProperties": 1, "additionalProperties": False,
                  "properties": values}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "engine.toml [[test_skips]] row (bundlegen)",
        "type": "object", "additionalProperties": False, "required": ["reason", "filters"],
        "properties": {
            "ticket": {"type": "string", "pattern": "\\S"},
            "reason": {"type": "string", "pattern": "\\S"},
            "archs": {"type": "array", "minItems": 1, "items": text},
            "seen_with": {"type": "object", "minProperties": 1, "additionalProperties": False,
                          "properties": {lib: {"type": "string", "pattern": SPECIFIER_PATTERN}
                                         for lib in LIBRARIES}},
            "filters": {"oneOf": [{"$ref": "#/$defs/filter"},
                                  {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/filter"}}]},
        },
        "$defs": {"filter": one_filter},
    }


def _seen_with(path: Path, where: str, raw: Any) -> dict[str, Specifier]:
    """library -> the specifier of the versions a defect was seen with."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise EngineConfigError(f"{path}: {where}.seen_with: expected a table library -> versions "
                                f"(libraries: {', '.join(LIBRARIES)}), got {raw!r}")
    scope = {}
    for library, text in raw.items():
        if library not in LIBRARIES:
            raise EngineConfigError(f"{path}: {where}.seen_with.{library}: unknown library "
                                    f"(known: {', '.join(LIBRARIES)})")
        try:
            scope[library] = parse_specifier(text)
        except BadSpecifier as exc:
            raise EngineConfigError(f"{path}: {where}.seen_with.{library}: {exc}") from None
    return scope


def _load_claims(path: Path) -> dict[str, frozenset[str]]:
    try:
        raw: Any = strict_json.loads(safe_read.read_text(path))
    except (OSError, UnicodeDecodeError, strict_json.JSONError) as exc:
        raise EngineConfigError(f"{path}: {exc}") from None
    claims = raw.get("claims") if isinstance(raw, dict) else None
    if not isinstance(claims, dict) or not all(
            isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in claims.values()):
        raise EngineConfigError(f"{path}: claims: expected an object arch -> [case id, ...]")
    return {arch: frozenset(ids) for arch, ids in claims.items()}
