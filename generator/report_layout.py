"""What the plan reports share: lines kept within WIDTH columns (tables split into column
groups, long lines folded at spaces), the whole plan of an extension (the built-in cases its
runs keep and its own), and the short summary `generate --dry-run` prints."""
from __future__ import annotations

import dataclasses
import textwrap
from collections import Counter

from bundlegen.generator import levels as L
from bundlegen.generator.generate import cpu_run_seconds
from bundlegen.generator.records import GeneratedPlan

#: the widest line a report prints
WIDTH = 120


def numeric(cell) -> bool:
    return isinstance(cell, (int, float)) or str(cell).replace(".", "", 1).isdigit()


def table(header: list[str], rows: list[list], width: int = WIDTH) -> list[str]:
    """Columns padded to width: numbers right-aligned, text left-aligned. A table wider than
    `width` is split into several, each repeating the first column."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    groups, current = [], [0]
    for i in range(1, len(header)):
        if current[1:] and sum(widths[j] + 2 for j in current) + widths[i] > width:
            groups.append(current)
            current = [0]
        current.append(i)
    groups.append(current)

    def fmt(row: list, cols: list[int]) -> str:
        return "  ".join(str(row[i]).rjust(widths[i]) if numeric(row[i]) else str(row[i]).ljust(widths[i])
                         for i in cols).rstrip()
    out: list[str] = []
    for n, cols in enumerate(groups):
        out += ([""] if n else []) + [fmt(header, cols), fmt(["-" * w for w in widths], cols)]
        out += [fmt(r, cols) for r in rows]
    return out


def fold(text: str, width: int = WIDTH) -> str:
    """Every line of `text` within `width` columns: a longer one is broken at spaces, its
    continuation indented four columns past the line's own indent."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()))
        out += textwrap.wrap(line, width=width, initial_indent="", subsequent_indent=indent + "    ",
                             break_long_words=True, break_on_hyphens=False, drop_whitespace=True) or [line]
    return "\n".join(out)


def whole_plan(g: GeneratedPlan) -> GeneratedPlan:
    """The plan a run executes: for an extension, the built-in cases it keeps and its own
    (with their CPU predictions), ordered by level; a plan of its own as it is."""
    if g.extends is None:
        return g
    names = [lv.name for lv in g.plan.levels]
    cases = sorted((*g.base_cases, *g.cases), key=lambda c: (names.index(c.level), c.group, c.id))
    cpu = dict(g.cpu_seconds)
    for c in g.base_cases:
        probe = c.purpose == "probe" and c.expected_rejection is not None and c.expected_rejection.by != "device"
        cpu[c.id] = L.costed(c.id, "", c.level, c.graph, probe, g.plan.cost_model)[0].cpu_seconds
    return dataclasses.replace(g, cases=tuple(cases), cpu_seconds=cpu)


def headline(g: GeneratedPlan, written: bool) -> str:
    """What generate writes (or would write) of the plan, and its gates."""
    plan = g.plan
    verb = "written" if written else "would be written"
    gated = sum(x.planned_cases for x in plan.gated)
    if g.extends is None:
        what = f"{len(g.cases)} cases {verb} over {len(plan.levels)} levels"
    else:
        what = (f"{len(g.base_cases) + len(g.cases)} cases over {len(plan.levels)} levels: "
                f"{len(g.base_cases)} built-in (plan {g.extends.plan}, not copied), {len(g.cases)} of its own {verb}")
    return f"plan {plan.name}: {what}; {len(plan.gated)} gated items ({gated} planned cases) not written"


def budget_rows(g: GeneratedPlan) -> list[tuple]:
    """Per level of the whole plan: (level, its own cases, cases a run of it executes,
    purposes, its h200 seconds, cumulative seconds, usable budget, ok)."""
    rows, cumulative = [], 0.0
    for level in g.plan.levels:
        own = g.only_level(level.name)
        seconds = sum(c.cost.predicted_s for c in own)
        cumulative += seconds
        usable = level.budget_seconds * (1 - level.reserve)
        rows.append((level, own, g.at_level(level.name), Counter(c.purpose for c in own), seconds, cumulative,
                     usable, cumulative <= usable))
    return rows


def cpu_line(g: GeneratedPlan) -> str:
    """The first level's predicted run on the cpu class, against its budget."""
    plan, first = g.plan, g.plan.levels[0]
    quick = g.at_level(first.name)
    repeated = [c for c in quick if c.graph.attributes.deterministic_algorithm]
    worst = max((g.cpu_seconds[c.id] for c in quick if c not in repeated), default=0.0)
    run = cpu_run_seconds(plan, first.name, g.cases, g.cpu_seconds)
    budget = "" if first.cpu_budget_seconds is None else f" of its {first.cpu_budget_seconds:g} s budget"
    return (f"{first.name} on the cpu class: a run predicted at {run:.1f} s{budget} (cases "
            f"{sum(g.cpu_seconds[c.id] for c in quick):.1f} s over {first.cpu_workers} worker(s), "
            f"start {plan.cost_model['cpu'].run_start_s:.1f} s); "
            f"largest case {worst:.2f} s (ceiling {first.per_case_cpu_seconds:g} s, one run); {len(repeated)} "
            f"deterministic-mode cases {sum(g.cpu_seconds[c.id] for c in repeated):.1f} s with their re-runs")


def proof_gaps(g: GeneratedPlan) -> list[str]:
    """One short line per proof the generator could not complete (coverage, risk triples,
    boundaries, layouts); none when every proof holds."""
    gaps = [f"coverage at {p.level}: {p.covered} of {p.total} {p.space} {p.scope} units"
            for p in g.proofs + g.ragged_proofs if not p.complete]
    gaps += [f"risk triples at {p.level}: {len(p.missing)} missing" for p in g.risk_proofs if not p.complete]
    gaps += [f"boundary {p.item} at {p.level}" for p in g.boundary_proofs if not p.complete]
    if g.layout_proof is not None:
        gaps += [f"layout {line}" for line in g.layout_proof.short([lv.name for lv in g.plan.levels])]
    return gaps


def summary(g: GeneratedPlan, written: bool) -> str:
    """The short report: counts per level, budgets, the CPU run, whether every proof holds."""
    whole = whole_plan(g)
    rows = [[level.name, len(own), len(upto), purposes["claim"], purposes["regression"], purposes["probe"],
             f"{cumulative:.1f}", f"{usable:.1f}", "ok" if ok else "OVER"]
            for level, own, upto, purposes, _s, cumulative, usable, ok in budget_rows(whole)]
    proofs = len(g.proofs + g.ragged_proofs) + len(g.risk_proofs) + len(g.boundary_proofs)
    gaps = proof_gaps(g)
    lines = [headline(g, written),
             *("  " + ln for ln in table(["level", "cases", "total", "claim", "regr", "probe", "cumul s (h200)",
                                          "usable budget s", "status"], rows)),
             "  " + cpu_line(whole),
             ("  proofs: " + (f"all {proofs} hold" if proofs else "none of its own (the built-in plan's hold)")
              if not gaps else f"  proofs: {len(gaps)} gap(s): " + "; ".join(gaps)),
             "  (`bundlegen generate --dry-run --report` prints the whole report)"]
    return fold("\n".join(lines)) + "\n"
