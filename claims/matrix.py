"""The support matrix (DESIGN section 7): plan features x (engine, arch) cells.

Rows are the plan's feature items (one per axis value, AX-<AXIS>-<VALUE>, grouped by axis;
then the shape catalog and the regressions). A feature's cases are the claim and
regression cases of the checked-in bundles (every level) that trace to it; probes are
excluded. Columns are every registered engine x every arch its archs() names. A cell:
  ✅ n/n     every case of the feature is claimed
  🟡 k/n     k of them are claimed
  ❌ reason  none is claimed and the engine declined some (the most common reason code)
  —          the engine has not been harvested on that arch
Everything here takes explicit inputs (build_matrix, render); `feature_groups`,
`feature_cases` and `default_columns` read the plan, the bundles and the registry.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from bundlegen.reasons import code_of
from bundlegen.claims.store import ClaimSet, ClaimsError, load_claim_set

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLE_ROOT = REPO_ROOT / "bundles"
MATRIX_PATH = REPO_ROOT / "SUPPORT_MATRIX.md"
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "support_matrix.md.j2"
PLAN_NAME = "sdpa_bwd"

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
                 gated: Iterable[GatedFeature] = ()) -> Matrix:
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
                  gated=tuple(gated))


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
def feature_groups(plan=None) -> tuple[list[FeatureGroup], list[GatedFeature]]:
    """The plan's feature rows: one group per axis (an AX- item per value), then the shape
    catalog and the regressions; and the gated items (declared, not written)."""
    if plan is None:
        from bundlegen.plans.sdpa_bwd import PLAN as plan
    from bundlegen.generator.expand import axis_item

    groups = [FeatureGroup(axis.title, tuple(Feature(axis_item(axis.name, v), v) for v in axis.values))
              for axis in plan.axes]
    groups.append(FeatureGroup("shape catalog", tuple(Feature(e.item, e.purpose) for e in plan.catalog)))
    groups.append(FeatureGroup("regressions", tuple(Feature(r.item, r.defect) for r in plan.regressions)))
    gated = [GatedFeature(g.item, g.title, g.gate) for g in plan.gated]
    return groups, gated


def feature_cases(bundle_root: Path | str = BUNDLE_ROOT, plan: str = PLAN_NAME
                  ) -> tuple[dict[str, frozenset[str]], list[str]]:
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


def default_columns(engine_names: Iterable[str] | None = None) -> list[Column]:
    """Every registered engine x every arch its archs() names, in registry order."""
    from bundlegen.engines.registry import engine_class, known_names

    columns = []
    for name in engine_names or known_names():
        try:
            archs = engine_class(name)("cpu").archs()
        except Exception:  # noqa: BLE001 - an engine that cannot load has no column
            continue
        columns.extend(Column(name, arch) for arch in archs)
    return columns


def load_claim_sets(engines: Iterable[str], claims_root: Path | str | None = None) -> dict[str, ClaimSet]:
    return {e: load_claim_set(e, claims_root) for e in sorted(set(engines))}


def support_matrix_text(bundle_root: Path | str = BUNDLE_ROOT, claims_root: Path | str | None = None,
                        plan=None, columns: Iterable[Column] | None = None) -> tuple[str, list[str]]:
    """SUPPORT_MATRIX.md's text from the checked-in plan, bundles and claims, and the
    bundle errors met. Raises ClaimsError for a malformed claims.json."""
    groups, gated = feature_groups(plan)
    cases, errors = feature_cases(bundle_root)
    columns = list(columns) if columns is not None else default_columns()
    matrix = build_matrix(groups, cases, columns,
                          load_claim_sets((c.engine for c in columns), claims_root), gated)
    return render(matrix), errors


__all__ = ["Cell", "Column", "Feature", "FeatureGroup", "GatedFeature", "Matrix", "ClaimsError",
           "build_matrix", "cell_for", "default_columns", "feature_cases", "feature_groups",
           "render", "support_matrix_text"]
