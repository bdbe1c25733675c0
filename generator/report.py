"""The dry-run report: plain text, rendered from a GeneratedPlan."""
from __future__ import annotations

from collections import Counter

from bundlegen import cost as cost_model
from bundlegen.cost import size_text
from bundlegen.generator import focus, port_forms
from bundlegen.generator.pass_report import later_value_lines
from bundlegen.generator import peer_coverage
from bundlegen.generator import boundaries, layout_distinct
from bundlegen.generator.records import GeneratedPlan
from bundlegen.generator.report_layout import budget_rows, cpu_line, fold, headline, table as _table, whole_plan

SCOPE_LABEL = {"values": "axis values", "core": "all-pairs (core axes)", "all": "all-pairs"}


def _ragged_cell(cases, proof) -> str:
    """A level's own ragged cases and the ragged space's coverage proof at that level."""
    n = sum(1 for c in cases if c.graph.ragged is not None)
    return f"{n}, {SCOPE_LABEL[proof.scope]}: {proof.covered} of {proof.total}"


def cost_class_lines(g: GeneratedPlan) -> list[str]:
    """Per cost class and level: the level's own cases predicted with the class (as if its
    engine ran them all), and what the class's last calibration measured (plan.cost_measured):
    the cases its engine ran there, their measured seconds and their prediction."""
    plan = g.plan
    out = ["Cost classes (seconds of each level's own cases predicted with the class; the last "
           "calibration's cases, measured (each at its least over the runs) and predicted)"]
    rows = []
    terms = {c.id: cost_model.terms(c.graph) for c in g.cases}
    for name in sorted(plan.cost_model):
        measured = plan.cost_measured.get(name)
        seen = {row[0]: row[1:] for row in measured.levels} if measured else {}
        for level in plan.levels:
            predicted = sum(cost_model.predict_terms(terms[c.id], name, plan.cost_model,
                                                     probe=c.purpose == "probe").predicted_s
                            for c in g.only_level(level.name))
            cases, last, there = seen.get(level.name, ("-", None, None))
            error = f"{(there - last) / last:+.0%}" if last else ""
            rows.append([name, level.name, f"{predicted:.1f}", cases, "-" if last is None else f"{last:.1f}",
                         "-" if there is None else f"{there:.1f}", error])
        out.append(f"  {name}: " + (f"measured from {measured.source}" if measured else "not measured yet"))
    out += ["  " + line for line in _table(["class", "level", "predicted s", "measured cases", "measured s",
                                            "their predicted s", "error"], rows)]
    return out


def render(g: GeneratedPlan, written: bool = True) -> str:
    """The whole report, every line within report_layout.WIDTH columns; `written` False (a
    dry run): says what would be written. An extension's Levels table, groups and CPU run
    cover the whole plan (the built-in cases its runs keep and its own); its proofs are the
    built-in plan's, which that plan's report shows."""
    return fold(_render(g, written))


def _render(g: GeneratedPlan, written: bool) -> str:
    plan = g.plan
    out: list[str] = [headline(g, written), ""]
    whole = whole_plan(g)
    planned_gated = sum(x.planned_cases for x in plan.gated)

    # ---- levels
    start = plan.cost_model["h200"].run_start_s   # once per run, not per case
    out.append("Levels (seconds predicted on h200; budgets cover the level and every lower one, "
               "with the reserve kept free; run s: a `bundlegen run --level` process, "
               f"its {start:g} s start included)")
    proofs = {p.level: p for p in g.proofs}
    ragged_proofs = {p.level: p for p in g.ragged_proofs}
    rows = []
    for level, own, upto, purposes, seconds, cumulative, usable, ok in budget_rows(whole):
        proof = proofs.get(level.name)
        rows.append([level.name, len(own), len(upto), purposes["claim"], purposes["regression"], purposes["probe"],
                     f"{seconds:.1f}", f"{cumulative:.1f}", f"{cumulative + start:.1f}",
                     f"{usable:.1f} of {level.budget_seconds:g}", "ok" if ok else "OVER",
                     f"{level.per_case_seconds:g} s / {size_text(level.per_case_bytes)}",
                     "-" if proof is None else f"{SCOPE_LABEL[proof.scope]}: {proof.covered} of {proof.total}"]
                    + ([_ragged_cell(own, ragged_proofs[level.name])] if ragged_proofs else []))
    out += _table(["level", "cases", "total", "claim", "regr", "probe", "level s", "cumul s", "run s",
                   "budget s (usable)", "status", "ceiling/case", "coverage"]
                  + (["ragged: cases, coverage"] if ragged_proofs else []), rows)
    out.append(cpu_line(whole))
    out += cost_class_lines(g)
    out.append("")
    out.append("Groups per level")
    for level in plan.levels:
        groups = Counter(c.group for c in whole.only_level(level.name))
        out.append(f"  {level.name}: " + ", ".join(f"{k} {v}" for k, v in sorted(groups.items())))
    out.append("")

    # ---- coverage
    out.append("Coverage proof (the generator enumerates every legal unit itself; the ragged axes are "
               "a space of their own, proved over the ragged cases)")
    for proof in g.proofs + g.ragged_proofs:
        space = "ragged " if proof.space == "ragged" else ""
        line = f"  {proof.level}: {space}{SCOPE_LABEL[proof.scope]}: {proof.covered} of {proof.total}"
        if proof.missing:
            shown = ", ".join("+".join(f"{a}={v}" for a, v in unit) for unit in proof.missing[:5])
            line += f"  MISSING {len(proof.missing)}: {shown}{' ...' if len(proof.missing) > 5 else ''}"
        out.append(line)
    out.append(f"  pairs allpairspy missed, added as repair cases: {len(g.repaired_pairs)}")
    out += _later_pass_lines(g)
    out.append("")
    out += later_value_lines(g)

    out += _risk_lines(g)
    out += focus.report_lines(g.plan, g.focus_proofs)
    out += port_forms.report_lines(g.plan)
    out += _layout_lines(g)

    # ---- peers
    out += peer_lines(g)
    out += _boundary_lines(g)

    # ---- legality
    ragged_rules = () if plan.ragged is None else plan.ragged.rules
    out.append(f"Legality: {len(plan.padded.rules)} rules; {g.illegal_pairs} value pairs are in no legal combination"
               + (f"; ragged: {len(ragged_rules)} rules, {g.ragged_illegal_pairs} value pairs"
                  if plan.ragged is not None else ""))
    out += ["  " + ln for ln in _table(
        ["rule", "axes", "excludes", "illegal pairs", "reason"],
        [[e.rule, " x ".join(e.axes), f"{e.excluded} of {e.combinations}", e.illegal_pairs, e.reason]
         for e in g.exclusions + g.ragged_exclusions])]
    out.append(f"  legality violations in written cases: {len(g.legality_violations)}")
    for v in g.legality_violations[:10]:
        out.append(f"    {v}")
    out.append("")

    # ---- gated
    out.append(f"Gated items ({len(plan.gated)}, {planned_gated} planned cases)")
    for gi in plan.gated:
        out.append(f"  {gi.item} ({gi.planned_cases}): {gi.title} -- {gi.gate}")
    out.append("")

    # ---- traceability
    out.append(f"Traceability: {len(g.items)} items, {len(g.untraced_items)} without cases, "
               f"{len(g.cases_without_items)} cases without items, "
               f"{len(g.unknown_items)} cases' items undeclared")
    for name, ids in (("items without cases", g.untraced_items),
                      ("cases without items", g.cases_without_items),
                      ("undeclared items", g.unknown_items)):
        if ids:
            out.append(f"  {name}: {', '.join(ids)}")
    return "\n".join(out) + "\n"


def _later_pass_lines(g: GeneratedPlan) -> list[str]:
    """The axis values each later pair-suite pass added (their pairs are in the proofs above;
    the earlier passes' rows and case ids stay)."""
    passes: dict[tuple[str, int], list[str]] = {}
    for space in (g.plan.padded, g.plan.ragged):
        for axis in () if space is None else space.axes:
            later = [v for v in axis.values if axis.value_pass(v) > 0]
            for n in sorted({axis.value_pass(v) for v in later}):
                values = ", ".join(v for v in later if axis.value_pass(v) == n)
                passes.setdefault((space.storage, n), []).append(f"{axis.name}={values}")
    return [f"  {storage} pass {n} added: " + "; ".join(axes) for (storage, n), axes in sorted(passes.items())]


def peer_lines(g: GeneratedPlan, gaps: bool = False, shown: int = 3) -> list[str]:
    """Per peer and level: the share of the peer's value pairs our cases hold (with the
    plan's target), the first uncovered pairs (all of them with `gaps`)."""
    proofs = peer_coverage.of_generated(g)
    if not proofs:
        return []
    peers = g.plan.peers
    out = [f"Peer pair coverage (value pairs of each peer's backward grid over {', '.join(peers.axes)}, "
           "held by our claim and regression cases; plans/peers.py maps their values; "
           "`--peer-gaps` lists every uncovered pair)"]
    levels = [lv.name for lv in g.plan.levels]
    rows = []
    for grid in peers.grids:
        cells = []
        for level in levels:
            p = next(x for x in proofs if x.peer == grid.name and x.level == level)
            mark = "" if p.target is None else (f" (>= {p.target:.0%} ok)" if p.meets_target
                                                 else f" (>= {p.target:.0%} SHORT)")
            cells.append(f"{p.covered}/{p.total} {p.share:.1%}{mark}")
        rows.append([grid.name, "" if grid.cases is None else grid.cases] + cells)
    out += ["  " + ln for ln in _table(["peer", "their cases"] + levels, rows)]
    for grid in peers.grids:
        out.append(f"  {grid.name}: {grid.source}")
        for m in grid.missing:
            out.append(f"    not declared: {m}")
        for level in levels:
            p = next(x for x in proofs if x.peer == grid.name and x.level == level)
            if p.missing and (gaps or level == levels[-1] or not p.meets_target):
                listed = p.missing if gaps else p.missing[:shown]
                out.append(f"    {level}: {len(p.missing)} uncovered: "
                           + "; ".join(peer_coverage.pair_text(x) for x in listed)
                           + ("" if len(listed) == len(p.missing) else " ..."))
    out.append("")
    return out


def _risk_lines(g: GeneratedPlan) -> list[str]:
    """Per level: the risky triples held (the riskiest ones and all), against what the
    level must hold."""
    r = g.plan.risks
    if r is None or not g.risk_proofs:
        return []
    axes = "; ".join(f"{a} " + ", ".join(f"{v}:{rank}" for v, rank in vals.items()) for a, vals in r.values.items())
    out = [f"Risk triple proof ({r.item}: every legal triple of risky values of three axes by {r.every_by}; "
           f"the riskiest (rank <= {r.top_rank}) by {r.top_by}; a first sample, the {r.sample} cheapest rows on "
           f"the cpu class of their suite, at {r.sample_at}; allpairspy n=3 proposes, the generator proves and "
           "repairs; a triple naming a layout counts only where the case is no other layout's memory)",
           f"  ranks: {r.ranking}",
           f"  risky values (value:rank): {axes}"]
    rows = []
    for p in g.risk_proofs:
        rows.append([p.level, p.required, f"{p.top_covered} of {p.top_total}", f"{p.covered} of {p.total}",
                     "ok" if p.complete else f"MISSING {len(p.missing)}"])
    out += ["  " + ln for ln in _table(["level", "must hold", "riskiest triples", "all triples", "status"], rows)]
    for p in g.risk_proofs:
        if p.missing:
            shown = "; ".join(" + ".join(f"{a}={v}" for a, v in t) for t in p.missing[:3])
            out.append(f"  {p.level} missing: {shown}{' ...' if len(p.missing) > 3 else ''}")
    out.append("")
    return out


def _layout_lines(g: GeneratedPlan) -> list[str]:
    """Per layout value: its cases, those that are another layout's memory (not counted for
    it), and the first level with a distinct case of B, H, S >= 2 and with each head-dim
    tail at each gradient port."""
    proof = g.layout_proof
    if proof is None:
        return []
    names = [lv.name for lv in g.plan.levels]
    out = [f"Layout-distinct proof (a case counts for its layout only where no other layout places every data "
           f"port where it does, e.g. SBHD at B = 1 is BSHD's memory; every layout by "
           f"{proof.required_by}: a case of B, H, S >= 2, and at dq, dk, dv a head dim "
           f"{' and '.join(layout_distinct.TAILS)}; columns: the first level that holds it)"]
    rows = []
    for r in proof.rows:
        same = ", ".join(f"{n} as {o}" for o, n in r.same_memory.items()) or "-"
        tails = [r.tails_from[(p, t)] or "MISSING" for p in layout_distinct.GRADIENT_PORTS
                 for t in layout_distinct.TAILS]
        rows.append([r.layout, r.cases, same, r.multi_from or "MISSING"] + tails)
    out += ["  " + ln for ln in _table(["layout", "cases", "other's memory (not counted)", "B,H,S>=2"]
                                       + [f"{p} {t}" for p in layout_distinct.GRADIENT_PORTS
                                          for t in layout_distinct.TAILS], rows)]
    short = proof.short(names)
    out.append(f"  cases counted for a layout that is another's memory: 0; layouts short of the proof by "
               f"{proof.required_by}: {len(short)}")
    out += [f"    {line}" for line in short]
    out.append("")
    return out


def _boundary_lines(g: GeneratedPlan) -> list[str]:
    """Per class and level: units covered of those declared, against what the level must
    cover; then, per level that needs more than it has or holds only part, the sides per tile
    (tile then - below, = at, + above, . not covered) and extras."""
    bp = g.plan.boundaries
    if bp is None:
        return []
    names = [lv.name for lv in g.plan.levels]
    tiles = "; ".join(f"{name} {', '.join(map(str, t))}" for name, t in bp.tiles.items())
    out = [f"Boundary proof (values just below, at and just above each tile; tiles: {tiles}; every class by "
           f"{bp.each_class_by}, every value by {bp.every_value_by}; counted from the cases that trace to the "
           "class, by what their graphs hold)"]
    proofs = {(p.item, p.level): p for p in g.boundary_proofs}
    rows = []
    for c in bp.classes:
        cells = []
        for level in names:
            p = proofs[(c.item, level)]
            cells.append(f"{len(p.covered)} of {p.total}" + ("" if p.complete else " MISSING"))
        rows.append([c.item, c.quantity, " ".join(map(str, c.tiles)) + (f" (cap {c.cap})" if c.cap else "")
                     + (f" + {', '.join(map(str, c.extras))}" if c.extras else "")] + cells)
    out += ["  " + ln for ln in _table(["class", "quantity", "tiles + extras"] + names, rows)]
    shown = None
    for level in names:   # a level's sides, where they differ from the level below or fall short
        state = tuple((proofs[(c.item, level)].covered, proofs[(c.item, level)].complete) for c in bp.classes)
        if state == shown and all(ok for _cov, ok in state):
            continue
        shown = state
        out.append(f"  {level} (needs {boundaries.requirement(bp, names, level)} value per class; "
                   "tile then - below, = at, + above, . not covered; extras, (v) not covered):")
        for c in bp.classes:
            p = proofs[(c.item, level)]
            out.append(f"    {c.item}: {_sides(c, p)}" + ("" if p.complete else "  MISSING"))
    out.append("")
    return out


def _sides(c, proof) -> str:
    covered = set(proof.covered)
    parts = []
    for t in c.tiles:
        marks = "".join(boundaries.SIDE_MARK[side] if (t, side, v) in covered else "."
                        for t2, side, v in boundaries.units(c) if t2 == t)
        parts.append(f"{t}{marks}")
    parts += [f"{v}" if (boundaries.EXTRA, v, v) in covered else f"({v})" for v in c.extras]
    return " ".join(parts)
