"""The support matrix (DESIGN section 7): plan features x (engine, arch) cells.

Rows are the plan's feature items as the bundle manifest lists them (one per axis value,
AX-<AXIS>-<VALUE>, grouped by axis; then its sections: the shape catalog, the
regressions). A feature's cases are the claim and regression cases of the bundles (every
level) that trace to it; probes are excluded. Columns are the engines with a config
folder in the workspace x every arch the engine's archs() names (or its claims hold). A cell:
  ✅ n/n     every case of the feature is claimed
  🟡 k/n     k of them are claimed
  ❌ reason  none is claimed and the engine declined some (the most common reason code)
  —          the engine has not been harvested on that arch
Everything here takes explicit inputs (build_matrix, render); `feature_groups`,
`feature_cases`, `workspace_engines` and `default_columns` read the manifest, the bundles,
the workspace and the registry.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from bundlegen.manifest import Manifest
from bundlegen.reasons import code_of
from bundlegen.workspace import Workspace, builtin_engine_dir, check_engine_name, package_root
from bundlegen.claims.store import CLAIMS_NAME, ClaimSet, ClaimsError, load_claim_set, read_claim_set

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "support_matrix.md.j2"

CLAIMED, PARTIAL, DECLINED, NOT_RUN, NO_CASES = "claimed", "partial", "declined", "not-run", "no-cases"


@dataclass(frozen=True)
class Feature:
    id: str
    title: str


@dataclass(frozen=True)
class FeatureGroup:
    title: str
    features: tuple[Feature, ...]


@dataclass(frozen=True)
class GatedFeature:
    id: str
    title: str
    gate: str


@dataclass(frozen=True)
class Column:
    engine: str
    arch: str

    @property
    def label(self) -> str:
        return f"{self.engine} {self.arch}"


@dataclass(frozen=True)
class Cell:
    status: str
    claimed: int = 0
    total: int = 0
    reason: str | None = None

    @property
    def text(self) -> str:
        if self.status == CLAIMED:
            return f"✅ {self.claimed}/{self.total}"
        if self.status == PARTIAL:
            return f"🟡 {self.claimed}/{self.total}"
        if self.status == DECLINED:
            return f"❌ {self.reason}"
        if self.status == NO_CASES:
            return "n/a"
        return "—"


@dataclass(frozen=True)
class Row:
    feature: Feature
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Section:
    title: str
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class ColumnSummary:
    column: Column
    run: bool
    claims: int
    declines: int


@dataclass(frozen=True)
class Matrix:
    columns: tuple[Column, ...]
    sections: tuple[Section, ...]
    summaries: tuple[ColumnSummary, ...]
    gated: tuple[GatedFeature, ...] = ()
    plan: str = ""


# ----------------------------------------------------------------------------- cells
def cell_for(case_ids: frozenset[str], column: Column, claim_set: ClaimSet) -> Cell:
    if not case_ids:
        return Cell(NO_CASES)
    if column.arch not in claim_set.archs_run:
        return Cell(NOT_RUN, total=len(case_ids))
    claimed = len(case_ids & claim_set.claimed(column.arch))
    if claimed == len(case_ids):
        return Cell(CLAIMED, claimed, len(case_ids))
    declined = claim_set.declined(column.arch)
    codes = Counter(code_of(declined[c]) for c in case_ids if c in declined)
    if claimed == 0 and codes:
        # most common code; ties go to the alphabetically first, so the text is stable
        reason = min(codes.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        return Cell(DECLINED, 0, len(case_ids), reason)
    return Cell(PARTIAL, claimed, len(case_ids))


def build_matrix(groups: Iterable[FeatureGroup], cases: Mapping[str, frozenset[str]],
                 columns: Iterable[Column], claim_sets: Mapping[str, ClaimSet],
                 gated: Iterable[GatedFeature] = (), plan: str = "") -> Matrix:
    columns = tuple(columns)
    sets = {c.engine: claim_sets.get(c.engine) or ClaimSet(engine=c.engine) for c in columns}
    sections = []
    for group in groups:
        rows = tuple(Row(f, tuple(cell_for(frozenset(cases.get(f.id, ())), c, sets[c.engine])
                                  for c in columns))
                     for f in group.features)
        sections.append(Section(group.title, rows))
    summaries = tuple(ColumnSummary(c, run=c.arch in sets[c.engine].archs_run,
                                    claims=len(sets[c.engine].claimed(c.arch)),
                                    declines=len(sets[c.engine].declined(c.arch)))
                      for c in columns)
    return Matrix(columns=columns, sections=tuple(sections), summaries=summaries,
                  gated=tuple(gated), plan=plan)


# ----------------------------------------------------------------------------- rendering
def _md(text: str) -> str:
    """Safe inside a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(matrix: Matrix, template_dir: Path = TEMPLATE_DIR) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)),
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["md"] = _md
    return env.get_template(TEMPLATE_NAME).render(matrix=matrix)


# ----------------------------------------------------------------------------- inputs
def feature_groups(manifest: Manifest) -> tuple[list[FeatureGroup], list[GatedFeature]]:
    """The manifest's feature rows: one group per axis (an AX- item per value), then its
    sections (shape catalog, regressions); and the gated items (declared, not written)."""
    groups = [FeatureGroup(axis.title, tuple(Feature(item, v) for item, v in zip(axis.items, axis.values)))
              for axis in manifest.axes]
    groups += [FeatureGroup(s.title, tuple(Feature(i.id, i.title) for i in s.items)) for s in manifest.sections]
    gated = [GatedFeature(g.item, g.title, g.gate) for g in manifest.gates]
    return groups, gated


def feature_cases(bundle_root: Path | str, plan: str) -> tuple[dict[str, frozenset[str]], list[str]]:
    """item -> ids of the claim/regression cases tracing to it, over every level's bundles;
    and the bundle errors met on the way (a bad case is left out, not fatal)."""
    from bundlegen.graph import BundleError, load_bundle

    found: dict[str, set[str]] = defaultdict(set)
    errors: list[str] = []
    for path in sorted(Path(bundle_root).glob(f"*/{plan}/*.json")):
        try:
            bundle, bad = load_bundle(path)
        except BundleError as exc:
            errors.append(str(exc))
            continue
        errors.extend(str(e) for e in bad)
        for case in bundle.cases:
            if case.purpose == "probe":
                continue
            for item in case.items:
                found[item].add(case.id)
    return {item: frozenset(ids) for item, ids in found.items()}, errors


def _engine_name(folder: Path) -> str:
    """The engine a config folder belongs to: its claims.json's `engine`, else the folder
    name with '_' as '-'."""
    claims = folder / CLAIMS_NAME
    name = read_claim_set(claims, "").engine if claims.is_file() else ""
    return check_engine_name(name or folder.name.replace("_", "-"))


def workspace_engines(workspace: Workspace) -> dict[str, Path]:
    """Engine name -> config folder, for every folder in the workspace's engine folders that
    holds an engine.toml or claims.json (the first folder naming an engine wins), plus the
    built-in engines when those folders are the package's own."""
    found: dict[str, Path] = {}
    for folder in workspace.engine_dirs:
        if not folder.is_dir():
            continue
        for sub in sorted(folder.iterdir()):
            if (sub / "engine.toml").is_file() or (sub / CLAIMS_NAME).is_file():
                found.setdefault(_engine_name(sub), sub)
    own = (package_root() / "engines").resolve()
    if any(folder.resolve() == own for folder in workspace.engine_dirs):
        from bundlegen.engines.registry import BUILTIN

        for name in BUILTIN:
            found.setdefault(name, builtin_engine_dir(name))
    return dict(sorted(found.items()))


def default_columns(engine_names: Iterable[str] | None = None,
                    claim_sets: Mapping[str, ClaimSet] | None = None) -> list[Column]:
    """Each engine x every arch its archs() names (an engine that cannot load: the archs
    its claims hold), in the order given (default: every registered engine)."""
    from bundlegen.engines.registry import engine_class, known_names

    columns = []
    for name in engine_names if engine_names is not None else known_names():
        try:
            archs = engine_class(name)("cpu").archs()
        except Exception:  # noqa: BLE001 - an engine that cannot load shows what it claimed
            held = (claim_sets or {}).get(name)
            archs = sorted(held.archs_run) if held is not None else []
        columns.extend(Column(name, arch) for arch in archs)
    return columns


def load_claim_sets(engines: Iterable[str], claims_root: Path | str | None = None) -> dict[str, ClaimSet]:
    return {e: load_claim_set(e, claims_root) for e in sorted(set(engines))}


def support_matrix_text(manifest: Manifest, bundle_root: Path | str, claim_sets: Mapping[str, ClaimSet],
                        columns: Iterable[Column] | None = None) -> tuple[str, list[str]]:
    """SUPPORT_MATRIX.md's text from a manifest, its bundles and the engines' claims (columns
    default: each claim set's engine, by default_columns), and the bundle errors met."""
    groups, gated = feature_groups(manifest)
    cases, errors = feature_cases(bundle_root, manifest.plan)
    columns = list(columns) if columns is not None else default_columns(list(claim_sets), claim_sets)
    matrix = build_matrix(groups, cases, columns, claim_sets, gated, manifest.plan)
    return render(matrix), errors


__all__ = ["Cell", "Column", "Feature", "FeatureGroup", "GatedFeature", "Matrix", "ClaimsError",
           "build_matrix", "cell_for", "default_columns", "feature_cases", "feature_groups",
           "render", "support_matrix_text", "workspace_engines"]
