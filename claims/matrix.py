"""The support matrix (DESIGN section 7): plan features x (engine, arch) cells that decide.

Rows are the plan's feature items as the bundle manifest lists them (one per axis value,
AX-<AXIS>-<VALUE>, grouped by axis; then its sections: the shape catalog, the
regressions). A feature's cases are the claim and regression cases of the bundles (every
level) that trace to it; probes are excluded. Columns are the (engine, arch) pairs the
claims say were run; archs an engine is configured for but never ran are listed apart.

A cell is one of four states (`cell_for`, the one rule):
  ✅ n        supported: every case of the feature the engine accepted (did not decline) is
              claimed; n claimed. Cases declined for another feature's sake do not count.
  🟡 k/n [^] partial: k of the n accepted cases are claimed; its one footnote lists why the
              others are not (skipped, and by what: bundlegen.claims.skips; failed, too few
              runs, too little margin, in no run).
  ❌ code     declined: the engine declined every case of the feature it was seen to accept or
              decline (cases in no harvested run do not count); the code is this feature's
              reason (`feature_reason`), not the most common one overall.
  —          not run: the engine was never harvested on that arch.
  n/a        no case of the feature in the levels the column's runs covered.
A column counts only the cases of the levels its runs covered (`covered_levels`: up to the
highest level its cited results ran), so a matrix harvested from quick and pr says so and
does not count nightly's cases as unclaimed.
Below the grid: per engine and arch the ranges it serves, axis by axis, the versions the
claims came from and the results files they cite.
"""
from __future__ import annotations

import json

import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from bundlegen.manifest import Gate, Item, Manifest
from bundlegen.reasons import code_of
from bundlegen.workspace import Workspace, builtin_engine_dir, check_engine_name, package_root
from bundlegen.claims.cases import BundleCases, bundle_cases
from bundlegen.claims.harvest import WHY_FAILED, WHY_FEW_RUNS, WHY_MARGIN, WHY_SKIPPED, why_kind
from bundlegen.claims.skips import is_size_limit, skip_note
from bundlegen.claims.store import (CLAIMS_NAME, UNKNOWN, VERSION_KEYS, ClaimSet, ClaimsError, RunSource,
                                    load_claim_set, read_claim_set)
from bundlegen.harness.config import SkipRow
from bundlegen.harness.verdicts import TOO_LARGE

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "support_matrix.md.j2"
WIDTH = 120            # display columns of every line of the matrix
WIDE_CHARS = frozenset("✅🟡❌")   # two columns wide on a terminal

SUPPORTED, PARTIAL, DECLINED, NOT_RUN, NO_CASES = "supported", "partial", "declined", "not-run", "no-cases"
IN_NO_RUN = "in no run"
CAUSE_TEXT = {
    WHY_FAILED: "failed in a harvested run (the engine's claims.json `unclaimed` names each verdict)",
    WHY_FEW_RUNS: "passed, but in fewer runs than the harvest's --min-runs",
    WHY_MARGIN: "passed with less than the plan's claim margin",
    IN_NO_RUN: "in no harvested run (a case added since, or a level the runs did not cover)",
}


#: a row of the matrix: a plan item (its id and title, as the manifest gives them)
Feature = Item


@dataclass(frozen=True)
class FeatureGroup:
    title: str
    features: tuple[Feature, ...]
    axis: bool = False              # an axis: rows show the value, the items are AX-<AXIS>-<VALUE>


@dataclass(frozen=True)
class Column:
    engine: str
    arch: str

    @property
    def label(self) -> str:
        return f"{self.engine} {self.arch}"


@dataclass(frozen=True)
class Cause:
    """Why some accepted cases of a partial cell are not claimed."""
    kind: str          # WHY_* of bundlegen.claims.harvest, or IN_NO_RUN
    detail: str        # a skip's detail (a byte-ceiling skip's as TOO_LARGE alone); "" otherwise
    count: int


@dataclass(frozen=True)
class Note:
    """A cell's one footnote: every cause of its unclaimed cases, each named with its source
    (one note per distinct set of causes, so a cell carries one marker however many it has)."""
    label: str
    causes: tuple[str, ...]

    @property
    def text(self) -> str:
        return "; ".join(self.causes)


@dataclass(frozen=True)
class Cell:
    status: str
    claimed: int = 0
    accepted: int = 0
    reason: str | None = None
    causes: tuple[Cause, ...] = ()
    note: str = ""                     # the footnote label of its causes

    @property
    def text(self) -> str:
        if self.status == SUPPORTED:
            return f"✅ {self.claimed}"
        if self.status == PARTIAL:
            return f"🟡 {self.claimed}/{self.accepted}" + (f" [^{self.note}]" if self.note else "")
        if self.status == DECLINED:   # in a row too wide for its codes, a footnote names it
            return f"❌ [^{self.note}]" if self.note else f"❌ {self.reason}"
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
    axis: bool = False


@dataclass(frozen=True)
class ColumnSummary:
    column: Column
    claims: int
    declines: int
    unclaimed: int
    runs: int
    min_runs: int | None
    versions: tuple[str, ...]          # per VERSION_KEYS; several differing values joined by " / "
    sources: tuple[RunSource, ...]
    levels: tuple[str, ...] = ()       # the levels its counts cover (covered_levels)


@dataclass(frozen=True)
class Range:
    axis: str
    supported: tuple[str, ...]
    partial: tuple[str, ...]
    declined: tuple[tuple[str, tuple[str, ...]], ...]     # (code, values), codes in order of first value


@dataclass(frozen=True)
class EngineRanges:
    column: Column
    ranges: tuple[Range, ...]


@dataclass(frozen=True)
class Matrix:
    columns: tuple[Column, ...]
    sections: tuple[Section, ...]
    summaries: tuple[ColumnSummary, ...]
    gated: tuple[Gate, ...] = ()
    plan: str = ""
    not_run: tuple[Column, ...] = ()
    #: configured archs never run but compiled and resource-checked: column -> variants
    compiled: Mapping[Column, int] = field(default_factory=dict)
    notes: tuple[Note, ...] = ()
    ranges: tuple[EngineRanges, ...] = ()
    catalog: tuple[Feature, ...] = ()          # section items with their titles
    levels: tuple[str, ...] = ()               # every level of the bundles, lowest first

    @property
    def covered(self) -> tuple[str, ...] | None:
        """The levels every column covers, when all columns cover the same ones."""
        found = {s.levels for s in self.summaries}
        return found.pop() if len(found) == 1 else None

    def levels_text(self, levels: Sequence[str]) -> str:
        return "all" if tuple(levels) == self.levels else ", ".join(levels)

    @property
    def levels_sentence(self) -> str:
        covered = self.covered
        if covered is None:
            return ("Levels covered: each column's own (the levels column below); a column does not count "
                    "the cases of the levels its runs did not cover.")
        if covered == self.levels:
            return f"Levels covered: every level ({', '.join(covered)})."
        return (f"Levels covered: {', '.join(covered)} of {', '.join(self.levels)}; the cases of the other "
                "levels are not counted.")

    @property
    def never_run(self) -> tuple[Column, ...]:
        """Configured archs with neither runs nor a clean compile report."""
        return tuple(c for c in self.not_run if c not in self.compiled)

    @property
    def compiled_only(self) -> tuple[Column, ...]:
        return tuple(c for c in self.not_run if c in self.compiled)

    @property
    def single_arch(self) -> str | None:
        archs = {c.arch for c in self.columns}
        return archs.pop() if len(archs) == 1 else None

    def header(self, column: Column) -> str:
        return column.engine if self.single_arch else column.label


# ----------------------------------------------------------------------------- cells
def served_items(claimed: frozenset[str], case_items: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """The items at least one claimed case holds."""
    return frozenset(i for c in claimed for i in case_items.get(c, ()))


def feature_reason(feature: str | frozenset[str], declined: Mapping[str, str],
                   case_items: Mapping[str, frozenset[str]], served: frozenset[str]) -> str:
    """This feature's decline code: the most common code among its declined cases whose other
    items the engine serves (so the decline is the feature's own); when there is no such
    case, the most common code among all of them. Ties go to the alphabetically first.
    `feature`: one item, or the items of a combination (bundlegen.claims.combinations)."""
    mine = frozenset({feature}) if isinstance(feature, str) else frozenset(feature)
    own = Counter(code_of(why) for cid, why in declined.items()
                  if case_items.get(cid, frozenset()) - mine <= served)
    codes = own or Counter(code_of(why) for why in declined.values())
    return min(codes.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def covered_levels(claim_set: ClaimSet, arch: str, cases: BundleCases) -> tuple[str, ...]:
    """The levels one column's counts cover: every level up to the highest its cited results
    ran (their run.json's level); without one, up to the highest level of a case the claims
    mention; with neither, every level."""
    names = [name for name, _ in cases.levels]
    evidence = claim_set.evidence.get(arch)
    ran = [s.level for s in (evidence.results if evidence else ()) if s.level in names]
    if not ran:
        seen = set(claim_set.claimed(arch)) | set(claim_set.declined(arch)) | set(claim_set.not_claimed(arch))
        ran = [level for c in seen if (level := cases.level_of(c)) is not None]
    if not ran:
        return tuple(names)
    top = max(ran, key=names.index)
    return tuple(names[:names.index(top) + 1])


def skip_detail(why: str) -> str:
    """The detail of a skip's why, a byte-ceiling skip's as TOO_LARGE alone (its text names
    each case's own bytes)."""
    detail = why.split(":", 1)[1].strip() if ":" in why else ""
    return TOO_LARGE if is_size_limit(detail) and detail.startswith(TOO_LARGE + ":") else detail


def causes_of(unclaimed_ids: Iterable[str], claim_set: ClaimSet, arch: str) -> tuple[Cause, ...]:
    counts: Counter = Counter()
    whys = claim_set.not_claimed(arch)
    for cid in unclaimed_ids:
        why = whys.get(cid)
        if why is None:
            counts[(IN_NO_RUN, "")] += 1
        elif why_kind(why) == WHY_SKIPPED:
            counts[(WHY_SKIPPED, skip_detail(why))] += 1
        else:
            counts[(why_kind(why) if why_kind(why) in CAUSE_TEXT else WHY_FAILED, "")] += 1
    return tuple(Cause(kind, detail, n) for (kind, detail), n in sorted(counts.items()))


def cell_for(case_ids: frozenset[str], column: Column, claim_set: ClaimSet,
             case_items: Mapping[str, frozenset[str]] | None = None, feature: str | frozenset[str] = "",
             served: frozenset[str] | None = None) -> Cell:
    if not case_ids:
        return Cell(NO_CASES)
    if column.arch not in claim_set.archs_run:
        return Cell(NOT_RUN)
    declined_all = claim_set.declined(column.arch)
    declined = {c: declined_all[c] for c in case_ids if c in declined_all}
    accepted = case_ids - set(declined)
    claimed = accepted & claim_set.claimed(column.arch)
    seen_accepted = claimed | (accepted & set(claim_set.not_claimed(column.arch)))
    # a feature declined wherever it was seen is declined: cases in no run say nothing
    if declined and not seen_accepted:
        case_items = case_items or {}
        if served is None:
            served = served_items(claim_set.claimed(column.arch), case_items)
        return Cell(DECLINED, reason=feature_reason(feature, declined, case_items, served))
    if claimed == accepted:
        return Cell(SUPPORTED, len(claimed), len(accepted))
    return Cell(PARTIAL, len(claimed), len(accepted), causes=causes_of(accepted - claimed, claim_set, column.arch))


def note_text(cause: Cause, engine_toml: str | None = None, skip_rows: Sequence[SkipRow] = ()) -> str:
    if cause.kind != WHY_SKIPPED:
        return CAUSE_TEXT[cause.kind]
    return skip_note(cause.detail, skip_rows, engine_toml)


def build_matrix(groups: Iterable[FeatureGroup], cases: BundleCases, columns: Iterable[Column],
                 claim_sets: Mapping[str, ClaimSet], gated: Iterable[Gate] = (), plan: str = "",
                 engine_tomls: Mapping[str, str] | None = None,
                 compiled: Mapping[str, Mapping[str, int]] | None = None,
                 skip_rows: Mapping[str, Sequence[SkipRow]] | None = None) -> Matrix:
    """`columns`: every configured (engine, arch); those never run are listed apart, the ones
    whose kernels compiled and passed their resource check (`compiled`: engine -> arch ->
    variants, from compile_reports) apart again.
    `engine_tomls`: engine -> link to its engine.toml from the matrix (skip notes link it);
    `skip_rows`: engine -> its engine.toml's [[test_skips]] rows (skip notes name the row)."""
    groups = tuple(groups)
    sets = {c.engine: claim_sets.get(c.engine) or ClaimSet(engine=c.engine) for c in columns}
    columns = tuple(columns)
    run = tuple(c for c in columns if c.arch in sets[c.engine].archs_run)
    not_run = tuple(c for c in columns if c not in run)
    served = {c: served_items(sets[c.engine].claimed(c.arch), cases.case_items) for c in run}
    levels = {c: covered_levels(sets[c.engine], c.arch, cases) for c in run}
    scope = {c: cases.upto(levels[c][-1]) if levels[c] else frozenset() for c in run}
    notes: dict[tuple, Note] = {}

    def labelled(cell: Cell, column: Column) -> Cell:
        if not cell.causes:
            return cell
        # a skip's note names the engine's own engine.toml row, so skips key on the engine
        key = tuple((cause.kind, cause.detail, column.engine if cause.kind == WHY_SKIPPED else "")
                    for cause in cell.causes)
        if key not in notes:
            notes[key] = Note(str(len(notes) + 1),
                              tuple(note_text(cause, (engine_tomls or {}).get(column.engine),
                                              (skip_rows or {}).get(column.engine, ())) for cause in cell.causes))
        return Cell(cell.status, cell.claimed, cell.accepted, cell.reason, cell.causes, notes[key].label)

    def fitted(row: Row, axis: bool) -> Row:
        """The row, its declined cells' reason codes moved to footnotes when it is wider than
        WIDTH with them inline."""
        title = row.feature.title if axis else f"`{row.feature.id}`"
        if _row_width(title, row.cells) <= WIDTH:
            return row
        cells = []
        for cell in row.cells:
            if cell.status == DECLINED:
                key = (DECLINED, cell.reason)
                if key not in notes:
                    notes[key] = Note(str(len(notes) + 1), (f"declined: `{cell.reason}`",))
                cell = Cell(DECLINED, reason=cell.reason, note=notes[key].label)
            cells.append(cell)
        return Row(row.feature, tuple(cells))

    sections = []
    for group in groups:
        rows = tuple(fitted(Row(f, tuple(labelled(cell_for(cases.items.get(f.id, frozenset()) & scope[c], c,
                                                           sets[c.engine], cases.case_items, f.id, served[c]), c)
                                         for c in run)), group.axis)
                     for f in group.features)
        sections.append(Section(group.title, rows, group.axis))
    summaries = tuple(_summary(c, sets[c.engine], levels[c]) for c in run)
    ranges = tuple(_ranges(c, sections, run) for c in run)
    catalog = tuple(f for g in groups if not g.axis for f in g.features)
    checked = {c: (compiled or {}).get(c.engine, {})[c.arch] for c in not_run
               if c.arch in (compiled or {}).get(c.engine, {})}
    return Matrix(columns=run, sections=tuple(sections), summaries=summaries, gated=tuple(gated), plan=plan,
                  not_run=not_run, compiled=checked, notes=tuple(notes.values()), ranges=ranges,
                  catalog=catalog, levels=tuple(name for name, _ in cases.levels))


def _summary(column: Column, claim_set: ClaimSet, levels: tuple[str, ...] = ()) -> ColumnSummary:
    evidence = claim_set.evidence.get(column.arch)
    sources = evidence.results if evidence else ()
    versions = tuple(" / ".join(sorted({s.versions.get(k, UNKNOWN) for s in sources})) or UNKNOWN
                     for k in VERSION_KEYS)
    return ColumnSummary(column, claims=len(claim_set.claimed(column.arch)),
                         declines=len(claim_set.declined(column.arch)),
                         unclaimed=len(claim_set.not_claimed(column.arch)), runs=len(sources),
                         min_runs=evidence.min_runs if evidence else None, versions=versions,
                         sources=tuple(sources), levels=levels)


def _ranges(column: Column, sections: Sequence[Section], run: Sequence[Column]) -> EngineRanges:
    index = run.index(column)
    out = []
    for section in sections:
        if not section.axis:
            continue
        by_status: dict[str, list[str]] = {SUPPORTED: [], PARTIAL: []}
        declined: dict[str, list[str]] = {}
        for row in section.rows:
            cell = row.cells[index]
            if cell.status == DECLINED:
                declined.setdefault(str(cell.reason), []).append(row.feature.title)
            elif cell.status in by_status:
                by_status[cell.status].append(row.feature.title)
        out.append(Range(section.title, tuple(by_status[SUPPORTED]), tuple(by_status[PARTIAL]),
                         tuple((code, tuple(values)) for code, values in declined.items())))
    return EngineRanges(column, tuple(out))


# ----------------------------------------------------------------------------- rendering
def _md(text: str) -> str:
    """Safe inside a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def display_width(line: str) -> int:
    return len(line) + sum(ch in WIDE_CHARS for ch in line)


def _row_width(title: str, cells: Sequence[Cell]) -> int:
    """Display width of a table row as the template writes it."""
    return display_width(f"| {_md(title)} |" + "".join(f" {_md(c.text)} |" for c in cells))


def _wrap(text: str, indent: str = "  ") -> str:
    """A markdown list item or footnote folded to WIDTH display columns (continuation lines
    indented)."""
    width = WIDTH - sum(ch in WIDE_CHARS for ch in text)
    return "\n".join(textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=False,
                                   break_on_hyphens=False))


def range_text(r: Range) -> str:
    parts = []
    if r.supported:
        parts.append("✅ " + ", ".join(r.supported))
    if r.partial:
        parts.append("🟡 " + ", ".join(r.partial))
    parts += [f"❌ {code}: " + ", ".join(values) for code, values in r.declined]
    return f"- {r.axis}: " + ("; ".join(parts) or "no cases")


def render(matrix: Matrix, template_dir: Path = TEMPLATE_DIR) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)),
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["md"] = _md
    env.filters["wrap"] = _wrap
    env.filters["range_text"] = range_text
    env.filters["compiled_label"] = lambda column, m: f"{column.label} ({m.compiled[column]} variants)"
    return env.get_template(TEMPLATE_NAME).render(matrix=matrix, version_keys=VERSION_KEYS)


# ----------------------------------------------------------------------------- inputs
def feature_groups(manifest: Manifest) -> tuple[list[FeatureGroup], list[Gate]]:
    """The manifest's feature rows: one group per axis (an AX- item per value), then its
    sections (shape catalog, regressions); and the gated items (declared, not written)."""
    groups = [FeatureGroup(axis.title, tuple(Feature(item, v) for item, v in zip(axis.items, axis.values)), True)
              for axis in manifest.axes]
    groups += [FeatureGroup(s.title, s.items) for s in manifest.sections]
    gated = list(manifest.gates)
    return groups, gated


def feature_cases(bundle_root: Path | str, plan: str) -> tuple[dict[str, frozenset[str]], list[str]]:
    """item -> ids of the claim/regression cases tracing to it, over every level's bundles;
    and the bundle errors met on the way (a bad case is left out, not fatal)."""
    cases = bundle_cases(bundle_root, plan, ())
    return dict(cases.items), list(cases.errors)


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


#: an engine's compile report beside its claims.json: {"archs": {arch: {"variants": {name:
#: {"problems": [...]}}}}} (the Triton engine's is written by bench/triton_resources.py)
COMPILE_REPORT_NAME = "resources.json"


def compile_reports(folders: Mapping[str, Path]) -> dict[str, dict[str, int]]:
    """engine -> arch -> variants, for each arch whose compile report lists variants and
    none with a problem (a spill, memory past its budget, occupancy under its floor)."""
    out: dict[str, dict[str, int]] = {}
    for engine, folder in folders.items():
        path = Path(folder) / COMPILE_REPORT_NAME
        if not path.is_file():
            continue
        try:
            archs = json.loads(path.read_text(encoding="utf-8")).get("archs") or {}
        except (OSError, ValueError) as exc:
            raise ClaimsError(f"{path}: cannot read the compile report: {exc}") from exc
        clean = {arch: len(entry.get("variants") or {}) for arch, entry in archs.items()
                 if entry.get("variants") and not any(v.get("problems") for v in entry["variants"].values())}
        if clean:
            out[engine] = clean
    return out


def default_columns(engine_names: Iterable[str] | None = None,
                    claim_sets: Mapping[str, ClaimSet] | None = None) -> list[Column]:
    """Each engine x every arch its archs() names or its claims hold, in the order given
    (default: every registered engine)."""
    from bundlegen.engines.registry import engine_class, known_names

    columns = []
    for name in engine_names if engine_names is not None else known_names():
        held = (claim_sets or {}).get(name)
        try:
            archs = list(engine_class(name)("cpu").archs())
        except Exception:  # noqa: BLE001 - an engine that cannot load shows what it claimed
            archs = []
        archs += sorted(set(held.archs_run) - set(archs)) if held is not None else []
        columns.extend(Column(name, arch) for arch in archs)
    return columns


def load_claim_sets(engines: Iterable[str], claims_root: Path | str | None = None) -> dict[str, ClaimSet]:
    return {e: load_claim_set(e, claims_root) for e in sorted(set(engines))}


def support_matrix_text(manifest: Manifest, bundle_root: Path | str, claim_sets: Mapping[str, ClaimSet],
                        columns: Iterable[Column] | None = None, cases: BundleCases | None = None,
                        engine_tomls: Mapping[str, str] | None = None,
                        compiled: Mapping[str, Mapping[str, int]] | None = None,
                        skip_rows: Mapping[str, Sequence[SkipRow]] | None = None) -> tuple[str, list[str]]:
    """SUPPORT_MATRIX.md's text from a manifest, its bundles and the engines' claims (columns
    default: each claim set's engine, by default_columns), and the bundle errors met."""
    groups, gated = feature_groups(manifest)
    if cases is None:
        cases = bundle_cases(bundle_root, manifest.plan, manifest.level_names)
    columns = list(columns) if columns is not None else default_columns(list(claim_sets), claim_sets)
    matrix = build_matrix(groups, cases, columns, claim_sets, gated, manifest.plan, engine_tomls, compiled,
                          skip_rows)
    return render(matrix), list(cases.errors)


__all__ = ["Cell", "Column", "Feature", "FeatureGroup", "Gate", "Matrix", "ClaimsError",
           "build_matrix", "cell_for", "default_columns", "feature_cases", "feature_groups",
           "feature_reason", "render", "support_matrix_text", "workspace_engines"]
