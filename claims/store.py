"""<engine config dir>/claims.json (CONTRACTS "Claims"), the one reader and writer. An
engine's config folder comes from the workspace (bundlegen.workspace).

Canonical JSON (bundlegen.graph.canonical_json):
    {"version": 1, "engine": "triton",
     "claims":    {"sm90": ["<case id>", ...]},            # ids sorted
     "declines":  {"sm90": {"<case id>": "<reason>"}},     # what the matrix shows as declined
     "unclaimed": {"sm90": {"<case id>": "<why>"}},        # accepted, not claimed: skipped, failed, ...
     "evidence":  {"sm90": {"min_runs": 1, "min_margin": 1.5, "min_orders": 2,
                            "results": [{"path": "...", "sha256": "...", "level": "full",
                                         "complete": true, "selection": "all",
                                         "versions": {"torch": "...", "triton": "...",
                                                      "cudnn": "...", "driver": "..."}}]}}}
An arch key present in `claims` or `declines` means the engine was run there (an empty
list is "run, nothing claimed"); an arch in neither is "not run". `evidence` names the
results files each arch's claims were harvested from and the rule they were harvested
with: `bundlegen matrix --check` re-derives the claims from them. `min_orders` (the case
orders a claim must have passed in) is absent from evidence harvested before runs recorded
their order: such evidence was harvested with 1 and is checked with 1 (LEGACY_MIN_ORDERS).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from bundlegen import safe_write
from bundlegen.graph import canonical_json
from bundlegen.workspace import Workspace, builtin_engine_dir, engine_dir_name, find_workspace

CLAIMS_VERSION = 1
CLAIMS_NAME = "claims.json"
VERSION_KEYS = ("torch", "triton", "cudnn", "driver")    # run.json "versions"
UNKNOWN = "unknown"
LEGACY_MIN_ORDERS = 1     # evidence without "min_orders" asked for one case order


class ClaimsError(ValueError):
    """A malformed claims.json: names the file and the field."""


@dataclass(frozen=True)
class RunSource:
    """One results file claims were harvested from: where (relative to the workspace root
    when inside it), its sha256, and what its run.json said (absent: level "", complete
    False, versions unknown)."""
    path: str
    sha256: str
    level: str = ""
    complete: bool = False
    selection: str = ""
    versions: Mapping[str, str] = field(default_factory=lambda: {k: UNKNOWN for k in VERSION_KEYS})

    def to_json(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "level": self.level, "complete": self.complete,
                "selection": self.selection, "versions": {k: self.versions.get(k, UNKNOWN) for k in VERSION_KEYS}}


@dataclass(frozen=True)
class ArchEvidence:
    """The harvest rule an arch's claims were made with and the files they came from."""
    min_runs: int
    min_margin: float
    results: tuple[RunSource, ...] = ()
    min_orders: int = LEGACY_MIN_ORDERS

    def to_json(self) -> dict:
        # written only when it is not the legacy rule, so evidence harvested under that rule
        # reads back (and rewrites) as it was harvested
        orders = {} if self.min_orders == LEGACY_MIN_ORDERS else {"min_orders": self.min_orders}
        return {"min_runs": self.min_runs, "min_margin": self.min_margin, **orders,
                "results": [r.to_json() for r in sorted(self.results, key=lambda r: r.path)]}


@dataclass(frozen=True)
class ClaimSet:
    engine: str
    claims: Mapping[str, frozenset[str]] = field(default_factory=dict)           # arch -> ids
    declines: Mapping[str, Mapping[str, str]] = field(default_factory=dict)      # arch -> id -> reason
    unclaimed: Mapping[str, Mapping[str, str]] = field(default_factory=dict)     # arch -> id -> why
    evidence: Mapping[str, ArchEvidence] = field(default_factory=dict)           # arch -> evidence

    @property
    def archs_run(self) -> frozenset[str]:
        return frozenset(self.claims) | frozenset(self.declines)

    def claimed(self, arch: str) -> frozenset[str]:
        return self.claims.get(arch, frozenset())

    def declined(self, arch: str) -> Mapping[str, str]:
        return self.declines.get(arch, {})

    def not_claimed(self, arch: str) -> Mapping[str, str]:
        return self.unclaimed.get(arch, {})

    def held_in(self, known) -> ClaimSet:
        """This claim set without the claims, declines and unclaimed notes of cases for which
        `known(case_id)` is false (cases a changed plan retired: ids are content hashes, so a
        case still in the bundles is the case its evidence ran)."""
        def keep(by_arch):
            return {arch: {c: v for c, v in by_id.items() if known(c)} for arch, by_id in by_arch.items()}
        return replace(self, claims={arch: frozenset(c for c in ids if known(c)) for arch, ids in self.claims.items()},
                       declines=keep(self.declines), unclaimed=keep(self.unclaimed))

    def to_json(self) -> dict:
        out = {"version": CLAIMS_VERSION, "engine": self.engine,
               "claims": {arch: sorted(ids) for arch, ids in sorted(self.claims.items())},
               "declines": {arch: dict(sorted(by_id.items()))
                            for arch, by_id in sorted(self.declines.items()) if by_id}}
        unclaimed = {arch: dict(sorted(by_id.items())) for arch, by_id in sorted(self.unclaimed.items()) if by_id}
        if unclaimed:
            out["unclaimed"] = unclaimed
        if self.evidence:
            out["evidence"] = {arch: ev.to_json() for arch, ev in sorted(self.evidence.items())}
        return out


def claims_path(engine: str, root: Path | str | None = None, workspace: Workspace | None = None) -> Path:
    """<root>/<engine dir>/claims.json when `root` is given (tests, other checkouts); else the
    engine's config folder in `workspace` (default: the current one); outside a workspace
    the built-in engine's (read only: writers take a workspace)."""
    if root is not None:
        return Path(root) / engine_dir_name(engine) / CLAIMS_NAME
    workspace = workspace if workspace is not None else find_workspace()
    if workspace is not None:
        return workspace.engine_config_dir(engine) / CLAIMS_NAME
    return builtin_engine_dir(engine) / CLAIMS_NAME


def read_claim_set(path: Path | str, engine: str) -> ClaimSet:
    """The claims in `path`; an absent file is an empty set (the engine never harvested)."""
    path = Path(path)
    if not path.is_file():
        return ClaimSet(engine=engine)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ClaimsError(f"{path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ClaimsError(f"{path}: top level is not an object")
    if raw.get("version", CLAIMS_VERSION) != CLAIMS_VERSION:
        raise ClaimsError(f"{path}: version: unsupported {raw.get('version')!r}")
    claims = raw.get("claims", {})
    if not isinstance(claims, dict) or not all(
            isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in claims.values()):
        raise ClaimsError(f"{path}: claims: expected an object arch -> [case id, ...]")
    return ClaimSet(engine=str(raw.get("engine", engine)),
                    claims={arch: frozenset(ids) for arch, ids in claims.items()},
                    declines=_read_by_id(path, raw, "declines", "reason"),
                    unclaimed=_read_by_id(path, raw, "unclaimed", "why"),
                    evidence=_read_evidence(path, raw.get("evidence", {})))


def _read_by_id(path: Path, raw: dict, key: str, what: str) -> dict[str, dict[str, str]]:
    """An object arch -> {case id: text}."""
    value = raw.get(key, {})
    if not isinstance(value, dict) or not all(
            isinstance(by_id, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in by_id.items())
            for by_id in value.values()):
        raise ClaimsError(f"{path}: {key}: expected an object arch -> {{case id: {what}}}")
    return {arch: dict(by_id) for arch, by_id in value.items()}


def _read_evidence(path: Path, raw) -> dict[str, ArchEvidence]:
    where = f"{path}: evidence"
    if not isinstance(raw, dict):
        raise ClaimsError(f"{where}: expected an object arch -> {{min_runs, min_margin, results}}")
    out = {}
    try:
        for arch, ev in raw.items():
            sources = []
            for r in ev["results"]:
                versions = r.get("versions", {})
                if not isinstance(versions, dict):
                    raise TypeError("versions")
                sources.append(RunSource(path=str(r["path"]), sha256=str(r["sha256"]), level=str(r.get("level", "")),
                                         complete=bool(r.get("complete", False)),
                                         selection=str(r.get("selection", "")),
                                         versions={k: str(versions.get(k) or UNKNOWN) for k in VERSION_KEYS}))
            out[arch] = ArchEvidence(min_runs=int(ev["min_runs"]), min_margin=float(ev["min_margin"]),
                                     min_orders=int(ev.get("min_orders", LEGACY_MIN_ORDERS)),
                                     results=tuple(sources))
            if out[arch].min_orders < 1:     # 0 would let any run back a claim
                raise ValueError(f"min_orders {out[arch].min_orders} is below 1")
    except (KeyError, TypeError, ValueError) as exc:
        raise ClaimsError(f"{where}: {arch}: malformed ({exc})") from exc
    return out


def write_claim_set(path: Path | str, claim_set: ClaimSet, inside: Path | str | None = None) -> bool:
    """Write canonically (bundlegen.safe_write, staying inside `inside`); returns whether
    the file changed. UnsafeWrite when the target may not be written."""
    path = Path(path)
    text = canonical_json(claim_set.to_json())
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    safe_write.write_text(path, text, inside=inside)
    return True


def load_claim_set(engine: str, root: Path | str | None = None) -> ClaimSet:
    return read_claim_set(claims_path(engine, root), engine)


def load_claims(engine: str, root: Path | str | None = None) -> dict[str, set[str]]:
    """arch -> claimed case ids, for claim enforcement in `bundlegen run`."""
    return {arch: set(ids) for arch, ids in load_claim_set(engine, root).claims.items()}


def is_claimed(engine: str, arch: str, case_id: str, root: Path | str | None = None) -> bool:
    return case_id in load_claim_set(engine, root).claimed(arch)
