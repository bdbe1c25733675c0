"""An HTML report of one or more runs (DESIGN section 7): one self-contained file (plots
embedded as PNG data), rendered with jinja2 (`templates/report.html.j2`), that leads with
what failed.

0. A table of contents: each engine's failing cases and their groups (with counts), the
   verdict table, the margins and every plot, each a link into the page.
1. Failing cases (`bundlegen.harness.verdicts.FAILING`), grouped by engine (and arch), then
   by the item with the highest failure rate among the engine's cases holding it
   (`failure_groups`: the feature the failures share, not the one every case holds): id,
   verdict, the graph in one line (sizes, dtype, scale, mask, modifiers, each port's
   strides; bundlegen.describe.graph_line, from the bundles), items, detail, the worst
   output (least margin, largest error; and an output's `worst` element when the record
   has one) and the command that reproduces the case (`repro_command`, with the engine
   spec the run was given, as its run.json records it: a `package.module:Class` engine's
   short name is not enough for `bundlegen repro`).
2. Verdict counts per engine and arch; margin quantiles per engine and output.
3. Plots: margin distribution per engine (one panel per output, log10, tolerance and claim
   margin marked); pair coverage per engine over the plan's core axes (from the manifest:
   for every two values of different core axes, how many passing cases hold both; a red
   mark is a pair nothing validated); predicted vs measured seconds of the cases the
   engine ran (declined, skipped and rejected cases are left out: they time no engine).
"""
from __future__ import annotations

import base64
import io
import math
import re
import shlex
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from bundlegen import safe_write
from bundlegen.harness import verdicts as V
from bundlegen.manifest import AxisItems, Manifest

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "report.html.j2"
OUTPUTS = ("dq", "dk", "dv")
PASS = V.PASS
REQUIRED = ("engine", "arch", "case_id", "verdict")
LABEL_PT = 9            # the smallest text in a plot


#: the failing cases of one group are folded away (a link target still) past this many in the report
OPEN_UP_TO = 20


@dataclass(frozen=True)
class FailingCase:
    case_id: str
    engine: str
    arch: str
    verdict: str
    items: tuple[str, ...]
    detail: str
    worst: str | None
    repro: str
    source: str
    graph: str = ""             # the graph in one line; "" when the bundles do not hold the case


@dataclass(frozen=True)
class FailureGroup:
    """The failing cases of one engine that share one item."""
    anchor: str
    item: str
    failing: int                # failing cases holding the item, over all results of the engine
    total: int                  # the engine's cases holding the item
    cases: tuple[FailingCase, ...]


@dataclass(frozen=True)
class EngineFailures:
    anchor: str
    engine: str
    arch: str
    groups: tuple[FailureGroup, ...]

    @property
    def count(self) -> int:
        return sum(len(g.cases) for g in self.groups)


@dataclass(frozen=True)
class Plot:
    title: str
    alt: str
    data_uri: str
    wide: bool = False          # keeps its width on a narrow screen (scrolls in its box)


def core_axes(manifest: Manifest) -> list[AxisItems]:
    """The manifest's core axes with their AX- items."""
    return [a for a in manifest.axes if a.core]


def repro_command(case_id: str, engine: str, device: str) -> str:
    """The command that reproduces one case (`bundlegen repro`)."""
    return " ".join(shlex.quote(w) for w in ("bundlegen", "repro", case_id, "--engine", engine, "--device", device))


def engine_ran(record: Mapping) -> bool:
    """Whether the engine ran the case, so its wall time is the engine's: not declined,
    skipped, rejected (probes) or a bad bundle."""
    verdict = record.get("verdict")
    if verdict == V.CLAIM_BROKEN:
        return not record.get("reason")          # a claimed case that was declined keeps the reason
    return verdict not in V.NOT_RUN and verdict not in (V.REJECTED, V.ERROR_BUNDLE)


def _pyplot():
    from bundlegen.extras import require

    matplotlib = require("matplotlib")   # imported here: only the plots need it, not the command's import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": LABEL_PT + 1, "axes.titlesize": LABEL_PT + 3,
                         "xtick.labelsize": LABEL_PT, "ytick.labelsize": LABEL_PT, "legend.fontsize": LABEL_PT})
    return plt


def _margin(record: Mapping, port: str, key: str = "margin") -> float | None:
    """An output's margin against the bound (`key` "margin") or the statistical judge
    ("statistical_margin"), None where the record has none."""
    out = (record.get("outputs") or {}).get(port) or {}
    m = out.get(key) if isinstance(out, Mapping) else None
    return float(m) if isinstance(m, (int, float)) and m > 0 else None


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


# ----------------------------------------------------------------------------- failing cases
def worst_output(record: Mapping) -> str | None:
    """The output with the least margin (and its largest error), plus its `worst` element when
    the record carries one; None when the record has no per-output numbers."""
    outputs = record.get("outputs") or {}
    rows = [(p, o) for p, o in outputs.items() if isinstance(o, Mapping) and isinstance(o.get("margin"), (int, float))]
    if not rows:
        return None
    port, out = min(rows, key=lambda po: po[1]["margin"])
    err = out.get("max_abs_err")
    text = f"{port}: margin {out['margin']:.3g}, max |err| " + (f"{err:.3g}" if isinstance(err, (int, float))
                                                                 else "not finite (NaN/Inf)")
    worst = out.get("worst")
    if isinstance(worst, Mapping) and worst:
        text += "; worst element " + ", ".join(f"{k} {v}" for k, v in worst.items())
    judged = [(p, o) for p, o in rows if isinstance(o.get("statistical_margin"), (int, float))]
    if judged:
        port, out = min(judged, key=lambda po: po[1]["statistical_margin"])
        ratio = out.get("error_ratio")
        text += (f"; statistical margin {out['statistical_margin']:.3g} in {port} at {out.get('slice')} "
                 f"({out.get('measure')} " + (f"{ratio:.3g}x" if isinstance(ratio, (int, float)) else "n/a")
                 + " the io-precision reference's)")
    return text


def failing_cases(runs: Sequence[Sequence[Mapping]], sources: Sequence[str],
                  specs: Sequence[Mapping[str, str]] = (), graphs: Mapping[str, str] | None = None) -> list[FailingCase]:
    """`specs`: per run, engine name -> the --engine the run was given (run.json's
    `engine_spec`); an engine not in it is reproduced by its name. `graphs`: case id -> its
    graph in one line."""
    found = []
    for index, (records, source) in enumerate(zip(runs, sources)):
        spec_of = specs[index] if index < len(specs) else {}
        for r in records:
            if r.get("verdict") not in V.FAILING:
                continue
            engine = spec_of.get(r["engine"]) or r["engine"]
            found.append(FailingCase(
                case_id=r["case_id"], engine=r["engine"], arch=r["arch"], verdict=r["verdict"],
                items=tuple(str(i) for i in r.get("items") or ()),
                detail=" ".join(str(r.get("detail") or r.get("reason") or "").split()),
                worst=worst_output(r), repro=repro_command(r["case_id"], engine, str(r.get("device") or "cpu")),
                source=source, graph=(graphs or {}).get(r["case_id"], "")))
    return sorted(found, key=lambda f: (f.engine, f.arch, f.verdict, f.case_id))


def anchor_of(*parts: str) -> str:
    """An HTML id from names (letters, digits, '-', '_', '.')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(parts)).strip("-") or "x"


def failure_groups(failing: Sequence[FailingCase], records: Sequence[Mapping]) -> list[EngineFailures]:
    """The failing cases by engine and arch, then each under the item of it with the highest
    failure rate among the engine's cases (in `records`; a case failing in any run counts as
    failed) holding the item; ties: more failures, then the item's name. An item every case of the engine holds explains
    nothing, so it groups a case only when the case holds no other."""
    held: dict[tuple[str, str], dict[str, tuple[str, ...]]] = defaultdict(dict)   # case -> its items
    failed_any: dict[tuple[str, str], set[str]] = defaultdict(set)                  # failed in some run
    for r in records:
        key = (r["engine"], r["arch"])
        held[key].setdefault(r["case_id"], tuple(r.get("items") or ()))
        if r.get("verdict") in V.FAILING:
            failed_any[key].add(r["case_id"])
    totals: dict[tuple[str, str], Counter] = defaultdict(Counter)
    fails: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for key, cases in held.items():
        for case_id, items in cases.items():
            for item in items:
                totals[key][item] += 1
                fails[key][item] += case_id in failed_any[key]
    out, used = [], set()
    by_engine: dict[tuple[str, str], list[FailingCase]] = defaultdict(list)
    for f in failing:
        by_engine[(f.engine, f.arch)].append(f)
    for (engine, arch), cases in sorted(by_engine.items()):
        total, failed, everyone = totals[(engine, arch)], fails[(engine, arch)], len(held[(engine, arch)])

        def rank(item: str) -> tuple:
            held = max(total[item], 1)
            return (total[item] >= everyone, -failed[item] / held, -failed[item], item)

        grouped: dict[str, list[FailingCase]] = defaultdict(list)
        for f in cases:
            grouped[min(f.items, key=rank) if f.items else "(no item)"].append(f)
        engine_anchor = _unique(anchor_of("failing", engine, arch), used)
        groups = tuple(FailureGroup(_unique(anchor_of(engine_anchor, item), used), item, failed[item] or len(fs),
                                    total[item] or len(fs), tuple(fs))
                       for item, fs in sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[0])))
        out.append(EngineFailures(engine_anchor, engine, arch, groups))
    return out


def _unique(anchor: str, used: set[str]) -> str:
    candidate, n = anchor, 1
    while candidate in used:
        n += 1
        candidate = f"{anchor}-{n}"
    used.add(candidate)
    return candidate


# ----------------------------------------------------------------------------- plots
def plot_margins(records: Sequence[Mapping], min_margin: float) -> Plot | None:
    engines = sorted({r["engine"] for r in records if any(_margin(r, p) for p in OUTPUTS)})
    if not engines:
        return None
    plt = _pyplot()
    # one panel per output, stacked: the figure stays narrow enough for a phone
    fig, axes = plt.subplots(len(OUTPUTS), 1, figsize=(6.5, 2.9 * len(OUTPUTS)), sharex=True)
    for ax, port in zip(axes, OUTPUTS):
        data = [[math.log10(m) for r in records if r["engine"] == e and (m := _margin(r, port))]
                for e in engines]
        ax.boxplot([d or [float("nan")] for d in data], showfliers=True)
        ax.set_xticks(range(1, len(engines) + 1), engines, rotation=20, ha="right")
        ax.axhline(0.0, color="red", lw=1, label="tolerance (margin 1)")
        ax.axhline(math.log10(min_margin), color="orange", lw=1, ls="--", label=f"claim margin {min_margin:g}")
        ax.set_ylabel(f"{port}: log10 margin")
    axes[0].set_title("margin = tolerance / error, per output")
    axes[0].legend()
    fig.tight_layout()
    return Plot("Margin distribution per engine", "margin distribution per engine and output", _png(fig))


def pair_counts(records: Iterable[Mapping], axes: Sequence[AxisItems]) -> tuple[list[str], list[list[int]]]:
    """Item labels (core-axis values, axis by axis) and counts[i][j] of distinct passing
    cases holding both items; -1 where i and j belong to the same axis."""
    items = [i for a in axes for i in a.items]
    axis_of = {i: a.name for a in axes for i in a.items}
    index = {item: n for n, item in enumerate(items)}
    cases: dict[str, set[int]] = {}
    for r in records:
        if r.get("verdict") == PASS:
            cases[r["case_id"]] = {index[i] for i in r.get("items", ()) if i in index}
    counts = [[-1 if axis_of[a] == axis_of[b] else 0 for b in items] for a in items]
    for held in cases.values():
        for i in held:
            for j in held:
                if counts[i][j] >= 0:
                    counts[i][j] += 1
    labels = [f"{axis_of[i]}={v}" for a in axes for i, v in zip(a.items, a.values)]
    return labels, counts


def plot_pairs(records: Sequence[Mapping], axes: Sequence[AxisItems], engine: str) -> Plot | None:
    if not axes:
        return None
    labels, counts = pair_counts(records, axes)
    plt = _pyplot()
    import numpy as np

    grid = np.array(counts, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        shown = np.where(grid > 0, np.log10(np.where(grid > 0, grid, 1.0)), np.nan)
    size = max(7.0, 0.18 * len(labels))        # 0.18 inch a label keeps LABEL_PT text apart
    fig, ax = plt.subplots(figsize=(size + 2.0, size + 1.0))
    # white: same axis (no pair) or never validated; the latter also gets a red mark
    image = ax.imshow(shown, cmap=plt.get_cmap("viridis").with_extremes(bad="white"), interpolation="nearest")
    zero = np.argwhere(grid == 0)
    if len(zero):
        ax.scatter(zero[:, 1], zero[:, 0], marker="s", s=14, color="red", label="pair never validated")
        ax.legend(loc="upper right")
    ax.set_xticks(range(len(labels)), labels, rotation=90)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_title(f"{engine}: passing cases per core-axis value pair")
    fig.colorbar(image, ax=ax, label="log10 passing cases holding the pair", shrink=0.6)
    fig.tight_layout()
    return Plot(f"Pair coverage: {engine}", f"pair coverage of {engine}", _png(fig), wide=True)


def cost_points(records: Iterable[Mapping]) -> dict[str, list[tuple[float, float]]]:
    """engine -> (predicted, measured wall seconds) of the cases the engine ran."""
    points = defaultdict(list)
    for r in records:
        p, w = r.get("predicted_s"), r.get("wall_s")
        if engine_ran(r) and isinstance(p, (int, float)) and isinstance(w, (int, float)) and p > 0 and w > 0:
            points[r["engine"]].append((p, w))
    return dict(points)


def plot_cost(records: Sequence[Mapping]) -> Plot | None:
    points = cost_points(records)
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 5.5))
    lo = min(min(p, w) for pts in points.values() for p, w in pts)
    hi = max(max(p, w) for pts in points.values() for p, w in pts)
    for engine, pts in sorted(points.items()):
        ax.scatter([p for p, _ in pts], [w for _, w in pts], s=10, alpha=0.6, label=engine)
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted seconds")
    ax.set_ylabel("measured wall seconds")
    ax.set_title("Cost model: cases the engine ran")
    ax.legend()
    fig.tight_layout()
    return Plot("Cost model: predicted vs measured", "predicted vs measured seconds of the cases the engines ran",
                _png(fig))


# ----------------------------------------------------------------------------- tables
def verdict_table(records: Sequence[Mapping]) -> tuple[list[str], list[tuple[str, str, Counter]]]:
    seen = {r["verdict"] for r in records}
    verdicts = [v for v in V.ALL if v in seen] + sorted(seen - set(V.ALL))
    groups: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in records:
        groups[(r["engine"], r["arch"])][r["verdict"]] += 1
    return verdicts, [(e, a, c) for (e, a), c in sorted(groups.items())]


def margin_quantiles(records: Sequence[Mapping]) -> list[tuple]:
    """(engine, output, cases, then min, p5 and median of the bound's margin and of the
    statistical judge's: None where no record has one)."""
    rows = []
    for engine in sorted({r["engine"] for r in records}):
        for port in OUTPUTS:
            ms = sorted(m for r in records if r["engine"] == engine and (m := _margin(r, port)))
            if ms:
                stat = sorted(m for r in records if r["engine"] == engine
                              and (m := _margin(r, port, "statistical_margin")))
                rows.append((engine, port, len(ms), *_quantiles(ms), *_quantiles(stat)))
    return rows


def _quantiles(sorted_values: Sequence[float]) -> tuple:
    """min, p5 and median of sorted values (Nones when there are none)."""
    if not sorted_values:
        return None, None, None
    q = lambda f: sorted_values[min(len(sorted_values) - 1, int(f * len(sorted_values)))]  # noqa: E731
    return sorted_values[0], q(0.05), q(0.5)


# ----------------------------------------------------------------------------- report
def report_html(runs: Sequence[Sequence[Mapping]], sources: Sequence[str], min_margin: float,
                axes: Sequence[AxisItems], template_dir: Path = TEMPLATE_DIR,
                specs: Sequence[Mapping[str, str]] = (), graphs: Mapping[str, str] | None = None) -> str:
    """`specs` and `graphs`: see failing_cases."""
    import jinja2

    records = [r for run in runs for r in run if all(isinstance(r.get(k), str) for k in REQUIRED)]
    runs = [[r for r in run if all(isinstance(r.get(k), str) for k in REQUIRED)] for run in runs]
    verdicts, groups = verdict_table(records)
    engines = sorted({r["engine"] for r in records})
    pairs = [plot_pairs([r for r in records if r["engine"] == e], axes, e) for e in engines]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    failing = failing_cases(runs, sources, specs, graphs)
    return env.get_template(TEMPLATE_NAME).render(
        sources=sources, count=len(records), failing=failing, by_engine=failure_groups(failing, records),
        open_groups=len(failing) <= OPEN_UP_TO, verdicts=verdicts, groups=groups, failing_verdicts=V.FAILING,
        quantiles=margin_quantiles(records), margins=plot_margins(records, min_margin),
        pairs=[p for p in pairs if p is not None], cost=plot_cost(records), has_axes=bool(axes))


def write_report(runs: Sequence[Sequence[Mapping]], sources: Sequence[str], out: Path | str,
                 min_margin: float, axes: Sequence[AxisItems], specs: Sequence[Mapping[str, str]] = (),
                 graphs: Mapping[str, str] | None = None) -> Path:
    """Write the report: `out` itself when it ends in .html, else out/index.html."""
    out = Path(out)
    path = out if out.suffix == ".html" else out / "index.html"
    html = report_html(runs, sources, min_margin, axes, specs=specs, graphs=graphs)
    # the folder the user named, wherever it is; a report file that is a link out of it is refused
    safe_write.write_text(path, html, inside=path.absolute().parent)
    return path
