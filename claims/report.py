"""An HTML report of one or more runs (DESIGN section 7): `out/index.html` with PNG plots.

- margins.png: the margin distribution per engine, one panel per output (dQ, dK, dV);
  log10 scale, with the tolerance (margin 1) and the plan's claim margin marked.
- pairs_<engine>.png: pair coverage of what was validated (verdict pass, so neither
  declined nor failed) over the plan's core axes (from the bundle manifest): for every two values of different core
  axes, how many passing cases hold both. An empty cell is a pair nothing validated.
- cost.png: predicted vs measured seconds per case (the cost model's check).
"""
from __future__ import annotations

import html
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import matplotlib

from bundlegen.manifest import Manifest

OUTPUTS = ("dq", "dk", "dv")
PASS = "pass"


@dataclass(frozen=True)
class AxisValues:
    name: str
    items: tuple[str, ...]      # AX- item per value, in the plan's order
    values: tuple[str, ...]


def core_axes(manifest: Manifest) -> list[AxisValues]:
    """The manifest's core axes with their AX- items."""
    return [AxisValues(a.name, a.items, a.values) for a in manifest.axes if a.core]


def _pyplot():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _margin(record: Mapping, port: str) -> float | None:
    out = (record.get("outputs") or {}).get(port) or {}
    m = out.get("margin") if isinstance(out, Mapping) else None
    return float(m) if isinstance(m, (int, float)) and m > 0 else None


# ----------------------------------------------------------------------------- plots
def plot_margins(records: Sequence[Mapping], path: Path, min_margin: float) -> bool:
    engines = sorted({r["engine"] for r in records if any(_margin(r, p) for p in OUTPUTS)})
    if not engines:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(OUTPUTS), figsize=(4 * len(OUTPUTS), 3.5), sharey=True)
    for ax, port in zip(axes, OUTPUTS):
        data = [[math.log10(m) for r in records if r["engine"] == e and (m := _margin(r, port))]
                for e in engines]
        ax.boxplot([d or [float("nan")] for d in data], showfliers=True)
        ax.set_xticks(range(1, len(engines) + 1), engines, rotation=30, ha="right", fontsize=8)
        ax.axhline(0.0, color="red", lw=1, label="tolerance (margin 1)")
        ax.axhline(math.log10(min_margin), color="orange", lw=1, ls="--",
                   label=f"claim margin {min_margin:g}")
        ax.set_title(port)
    axes[0].set_ylabel("log10 margin (tolerance / error)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def pair_counts(records: Iterable[Mapping], axes: Sequence[AxisValues]) -> tuple[list[str], list[list[int]]]:
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


def plot_pairs(records: Sequence[Mapping], axes: Sequence[AxisValues], path: Path, title: str) -> bool:
    if not axes:
        return False
    labels, counts = pair_counts(records, axes)
    plt = _pyplot()
    import numpy as np

    grid = np.array(counts, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        shown = np.where(grid > 0, np.log10(np.where(grid > 0, grid, 1.0)), np.nan)
    size = max(6.0, 0.22 * len(labels))
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    # white: same axis (no pair) or never validated; the latter also gets a red mark
    image = ax.imshow(shown, cmap=plt.get_cmap("viridis").with_extremes(bad="white"),
                      interpolation="nearest")
    zero = np.argwhere(grid == 0)
    if len(zero):
        ax.scatter(zero[:, 1], zero[:, 0], marker="s", s=12, color="red", label="pair never validated")
        ax.legend(loc="upper right", fontsize=7)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="log10 passing cases holding the pair")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_cost(records: Sequence[Mapping], path: Path) -> bool:
    points = defaultdict(list)
    for r in records:
        p, w = r.get("predicted_s"), r.get("wall_s")
        if isinstance(p, (int, float)) and isinstance(w, (int, float)) and p > 0 and w > 0:
            points[r["engine"]].append((p, w))
    if not points:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    lo = min(min(p, w) for pts in points.values() for p, w in pts)
    hi = max(max(p, w) for pts in points.values() for p, w in pts)
    for engine, pts in sorted(points.items()):
        ax.scatter([p for p, _ in pts], [w for _, w in pts], s=8, alpha=0.6, label=engine)
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted seconds")
    ax.set_ylabel("measured wall seconds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------- tables
def verdict_table(records: Sequence[Mapping]) -> tuple[list[str], list[tuple[str, str, Counter]]]:
    verdicts = sorted({r["verdict"] for r in records})
    groups: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in records:
        groups[(r["engine"], r["arch"])][r["verdict"]] += 1
    return verdicts, [(e, a, c) for (e, a), c in sorted(groups.items())]


def margin_quantiles(records: Sequence[Mapping]) -> list[tuple[str, str, int, float, float, float]]:
    rows = []
    for engine in sorted({r["engine"] for r in records}):
        for port in OUTPUTS:
            ms = sorted(m for r in records if r["engine"] == engine and (m := _margin(r, port)))
            if ms:
                q = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))]  # noqa: E731
                rows.append((engine, port, len(ms), ms[0], q(0.05), q(0.5)))
    return rows


def _html_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ----------------------------------------------------------------------------- report
def write_report(runs: Sequence[Sequence[Mapping]], sources: Sequence[str], out_dir: Path | str,
                 min_margin: float, axes: Sequence[AxisValues]) -> Path:
    """Write out_dir/index.html and its plots; `axes`: the pair-coverage axes (core_axes of
    the manifest)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = [r for run in runs for r in run
               if all(isinstance(r.get(k), str) for k in ("engine", "arch", "case_id", "verdict"))]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>bundlegen report</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:right}"
             "th{background:#eee}img{max-width:100%}</style></head><body>",
             "<h1>bundlegen report</h1>",
             f"<p>{len(records)} results from {len(sources)} file(s): "
             + ", ".join(html.escape(s) for s in sources) + "</p>"]
    verdicts, groups = verdict_table(records)
    parts.append("<h2>Verdicts</h2>" + _html_table(
        ["engine", "arch", *verdicts], [(e, a, *(c.get(v, 0) for v in verdicts)) for e, a, c in groups]))
    parts.append("<h2>Margins</h2>" + _html_table(
        ["engine", "output", "cases", "min", "p5", "median"],
        [(e, p, n, f"{lo:.3g}", f"{p5:.3g}", f"{med:.3g}") for e, p, n, lo, p5, med in margin_quantiles(records)]))
    if plot_margins(records, out / "margins.png", min_margin):
        parts.append("<img src='margins.png' alt='margin distribution per engine and output'>")
    else:
        parts.append("<p>No margins recorded.</p>")
    parts.append("<h2>Pair coverage of validated cases</h2>")
    drawn = False
    for engine in sorted({r["engine"] for r in records}):
        name = "pairs_" + "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in engine) + ".png"
        mine = [r for r in records if r["engine"] == engine]
        if plot_pairs(mine, axes, out / name, f"{engine}: passing cases per core-axis value pair"):
            parts.append(f"<h3>{html.escape(engine)}</h3><img src='{name}' alt='pair coverage {html.escape(engine)}'>")
            drawn = True
    if not drawn:
        parts.append("<p>No core axes in the plan, or no results.</p>")
    parts.append("<h2>Cost model: predicted vs measured</h2>")
    parts.append("<img src='cost.png' alt='predicted vs measured seconds'>" if plot_cost(records, out / "cost.png")
                 else "<p>No predicted and measured times recorded.</p>")
    parts.append("</body></html>\n")
    index = out / "index.html"
    index.write_text("\n".join(parts), encoding="utf-8")
    return index
