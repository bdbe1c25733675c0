"""Checks of plan input. Each failure is a PlanError naming the plan entry at fault."""
from __future__ import annotations

import dataclasses

import re

from bundlegen import reasons as R
from bundlegen.graph import ALIGNMENTS, DTYPES, PURPOSES, Attributes
from bundlegen.validate import frontend_reason, output_layout_reason
from bundlegen.generator import boundaries, focus, layouts, ragged, risks
from bundlegen.generator.errors import PlanError
from bundlegen.generator.expand import (KNOWN_AXES, MODIFIER_PORTS, OPTIONAL_AXES, PORTS, SPEC_AXES, axis_item,
                                        axis_table)
from bundlegen.generator.legality import Legality
from bundlegen.generator.records import Draft
from bundlegen.plans.records import LEVEL_NAMES, PADDED, RAGGED, Plan, Space, Spec

ITEM_ID = re.compile(r"^[A-Z][A-Z0-9]*(-[A-Z0-9]+)+$")
SPEC_FIELDS = {"dtype": "dtypes", "layout": "layouts", "stats_layout": "stats_layouts", "mask": "masks",
               "scale": "scales", "distribution": "distributions", "bias": "biases", "dbias": "switches",
               "sinks": "switches", "softcap": "softcaps", "dropout": "dropouts",
               "dropout_mask": "dropout_masks", "deterministic": "switches", "alibi_slopes": "alibi_slopes"}
MUTATION_KINDS = ("dims", "stride", "dtype", "attr", "reshape", "drop")
ATTRIBUTES = tuple(f.name for f in dataclasses.fields(Attributes))
ENGINE_LAYOUT_CODES = (R.ZERO_STRIDE_OUTPUT, R.OVERLAPPING_OUTPUT)


def declared_items(plan: Plan) -> dict[str, str]:
    """Every item id the plan declares -> title (gated included), raising on a duplicate."""
    items: dict[str, str] = {}

    def add(item: str, title: str, entry: str) -> None:
        if not ITEM_ID.match(item):
            raise PlanError(f"{entry}: item id {item!r} is not of the form ABC-DEF (capitals, digits, '-')")
        if item in items:
            raise PlanError(f"{entry}: duplicate item id {item!r}")
        items[item] = title

    padded = plan.padded
    for a in padded.axes:
        for v in a.values:
            add(axis_item(a.name, v), f"{a.title}: {v}", f"axis '{a.name}' value '{v}'")
    add(padded.value_suite_item, "each axis value once", "value suite")
    for s in padded.pair_suites:
        add(s.item, s.title, f"pair suite '{s.item}'")
    if plan.risks is not None:
        add(plan.risks.item, plan.risks.title, f"risks '{plan.risks.item}'")
    for f in plan.focus:
        add(f.item, f.title, f"focus '{f.item}'")
    r = plan.ragged
    if r is not None:
        for a in r.axes:
            for v in a.values:
                add(ragged.item(a.name, v), f"ragged {a.title}: {v}", f"ragged axis '{a.name}' value '{v}'")
        add(r.value_suite_item, "each ragged axis value once", "ragged value suite")
        for s in r.pair_suites:
            add(s.item, s.title, f"ragged pair suite '{s.item}'")
    entries = [("shape", padded.catalog), ("sweep", padded.sweeps), ("regression", padded.regressions),
               ("probe", padded.probes)]
    if plan.boundaries is not None:
        entries.append(("boundary class", plan.boundaries.classes))
    if r is not None:
        entries += [("ragged shape", r.catalog), ("ragged regression", r.regressions), ("ragged probe", r.probes)]
    for kind, group in entries + [("gated item", plan.gated)]:
        for e in group:
            title = getattr(e, "purpose", None) or getattr(e, "defect", None) or getattr(e, "title")
            add(e.item, title, f"{kind} '{e.item}'")
    return items


def check_plan(plan: Plan) -> None:
    level_names = tuple(lv.name for lv in plan.levels)
    if level_names != LEVEL_NAMES:
        raise PlanError(f"levels: expected {LEVEL_NAMES}, got {level_names}")
    for prev, lv in zip(plan.levels, plan.levels[1:]):
        if lv.per_case_seconds < prev.per_case_seconds or lv.per_case_bytes < prev.per_case_bytes:
            raise PlanError(f"level '{lv.name}': per-case ceilings must not shrink from '{prev.name}'")
    for dt in plan.dtypes:
        if dt not in DTYPES:
            raise PlanError(f"dtypes: unknown dtype {dt!r}")
    for name, mask in plan.masks.items():
        if mask.alignment not in ALIGNMENTS:
            raise PlanError(f"mask '{name}': unknown alignment {mask.alignment!r}")
    for name, layout in plan.layouts.items():
        missing = sorted(set(PORTS) - {"stats"} - set(layout.ports))
        if missing:
            raise PlanError(f"layout '{name}': no storage kind for {', '.join(missing)}")
        for port, kind in sorted(layout.ports.items()):
            if kind not in layouts.PORT_KINDS:
                raise PlanError(f"layout '{name}': unknown storage kind {kind!r} for port '{port}'")
    for name, kind in plan.stats_layouts.items():
        if kind not in layouts.STATS_KINDS:
            raise PlanError(f"stats layout '{name}': unknown storage kind {kind!r}")
    padded = plan.padded
    _check_storages(plan)
    _check_axes(plan)
    _check_rules(padded)
    for s in padded.pair_suites:
        _check_level(plan, s.level, f"pair suite '{s.item}'")
        if s.scope not in ("core", "all"):
            raise PlanError(f"pair suite '{s.item}': unknown scope {s.scope!r}")
    for c in padded.catalog:
        _check_level(plan, c.level, f"shape '{c.item}'")
        for k, spec in enumerate(c.specs):
            check_spec(plan, spec, f"shape '{c.item}'[{k}]")
    for sw in padded.sweeps:
        _check_level(plan, sw.level, f"sweep '{sw.item}'")
        for field, values in sw.vary:
            if field not in ("shape",) + SPEC_AXES:
                raise PlanError(f"sweep '{sw.item}': cannot vary {field!r}")
            for v in values:
                if field != "shape" and v not in getattr(plan, SPEC_FIELDS[field]):
                    raise PlanError(f"sweep '{sw.item}': unknown {field} {v!r}")
        check_spec(plan, sw.base, f"sweep '{sw.item}'")
    for r in padded.regressions:
        _check_level(plan, r.level, f"regression '{r.item}'")
        for k, spec in enumerate(r.specs):
            check_spec(plan, spec, f"regression '{r.item}'[{k}]")
    for p in padded.probes:
        entry = f"probe '{p.item}'"
        _check_level(plan, p.level, entry)
        known = R.FRONTEND if p.by == "frontend" else R.ENGINE if p.by == "engine" else None
        if known is None:
            raise PlanError(f"{entry}: unknown rejecting layer {p.by!r} (frontend | engine)")
        if p.reason not in known:
            raise PlanError(f"{entry}: {p.reason!r} is not a {p.by} reason code in bundlegen.reasons")
        check_spec(plan, p.spec, entry)
    for name, tc in plan.tolerance_classes.items():
        if name != tc.name or not (tc.rtol >= 0 and tc.atol >= 0):
            raise PlanError(f"tolerance class '{name}': needs its own name and rtol, atol >= 0")
    if not plan.min_claim_margin > 0 or not plan.cpu_case_limit_s > 0:
        raise PlanError("min_claim_margin and cpu_case_limit_s must be > 0")
    if plan.boundaries is not None:
        boundaries.check_plan(plan, level_names)
        for c in plan.boundaries.classes:
            for k, s in enumerate(c.sets):
                check_spec(plan, s.base, f"boundary class '{c.item}'[{k}]")
    if plan.ragged is not None:
        check_axis_list(plan.ragged.axes, ragged.KNOWN_AXES, lambda axis: ragged.axis_table(plan, axis),
                        "ragged ", optional=ragged.OPTIONAL_AXES)
        ragged.check_plan(plan)
        _check_rules(plan.ragged, "ragged rule")
        for e in (*plan.ragged.pair_suites, *plan.ragged.catalog, *plan.ragged.regressions, *plan.ragged.probes):
            _check_level(plan, e.level, f"ragged entry '{e.item}'")
    if plan.risks is not None:
        risks.check_plan(plan)
    focus.check_plan(plan)
    if plan.distinct_layouts_by is not None:
        _check_level(plan, plan.distinct_layouts_by, "distinct_layouts_by")
    declared_items(plan)


def _check_level(plan: Plan, level: str, entry: str) -> None:
    if level not in LEVEL_NAMES:
        raise PlanError(f"{entry}: unknown level {level!r} (known: {', '.join(LEVEL_NAMES)})")


def _check_storages(plan: Plan) -> None:
    """Each space holds the storage it is named for: Plan.padded padded, Plan.ragged ragged."""
    for name, space, want in (("padded", plan.padded, PADDED), ("ragged", plan.ragged, RAGGED)):
        if space is not None and space.storage != want:
            raise PlanError(f"Plan.{name}: a space of storage {space.storage!r}, expected {want!r}")
    if plan.ragged is not None and plan.ragged.sweeps:
        raise PlanError("Plan.ragged: sweeps are padded only (declare ragged graphs as catalog entries)")


def _check_axes(plan: Plan) -> None:
    check_axis_list(plan.padded.axes, KNOWN_AXES, lambda axis: axis_table(plan, axis), optional=OPTIONAL_AXES)


def check_axis_list(axes, known, table_of, prefix: str = "", optional=()) -> None:
    """One axis space's axes: every known axis once (an `optional` one at most once), its
    values distinct and named in its table (`table_of(axis)`), its default among them, and
    a value that joined the pair suites later after the earlier ones."""
    seen = set()
    for a in axes:
        entry = f"{prefix}axis '{a.name}'"
        if a.name not in known:
            raise PlanError(f"{entry}: unknown axis (known: {', '.join(known)})")
        if a.name in seen:
            raise PlanError(f"{entry}: declared twice")
        seen.add(a.name)
        if not a.values or len(set(a.values)) != len(a.values):
            raise PlanError(f"{entry}: values must be non-empty and distinct")
        if a.default not in a.values:
            raise PlanError(f"{entry}: default {a.default!r} is not one of its values")
        passes = [a.value_pass(v) for v in a.values]
        if passes != sorted(passes) or a.value_pass(a.default) != a.pass_joined:
            raise PlanError(f"{entry}: a value that joined a later pass must come after the earlier ones, "
                            "and the default must be there from the axis's own pass")
        unknown = sorted(set(a.values_joined) - set(a.values))
        if unknown:
            raise PlanError(f"{entry}: values_joined names unknown values {', '.join(unknown)}")
        table = table_of(a.name)
        for v in a.values:
            if v not in table:
                raise PlanError(f"{entry}: value {v!r} has no entry in the plan's {a.name} table")
    missing = sorted(set(known) - seen - set(optional))
    if missing:
        raise PlanError(f"{prefix}axes: missing {', '.join(missing)}")


def _check_rules(space: Space, kind: str = "rule") -> None:
    """The rules of one axis space (a plan's padded or ragged one) name its axes and values."""
    values = {a.name: a.values for a in space.axes}
    names = set()
    for rule in space.rules:
        entry = f"{kind} '{rule.name}'"
        if rule.name in names:
            raise PlanError(f"{entry}: declared twice")
        names.add(rule.name)
        if not rule.when or not rule.require:
            raise PlanError(f"{entry}: needs both 'when' and 'require'")
        for side in (rule.when, rule.require):
            for axis, vals in sorted(side.items()):
                if axis not in values:
                    raise PlanError(f"{entry}: unknown axis {axis!r}")
                for v in vals:
                    if v not in values[axis]:
                        raise PlanError(f"{entry}: unknown value {v!r} for axis {axis!r}")


def check_spec(plan: Plan, spec: Spec, entry: str) -> None:
    if spec.storage != PADDED:
        raise PlanError(f"{entry}: a {spec.storage} spec among the padded entries (its shape must be a Shape; "
                        "ragged entries go in Plan.ragged)")
    for field, table in SPEC_FIELDS.items():
        value = getattr(spec, field)
        if value not in getattr(plan, table):
            raise PlanError(f"{entry}: unknown {field} {value!r}")
    for port, kind in sorted(spec.port_kinds.items()):
        if port not in PORTS or port == "stats":
            raise PlanError(f"{entry}: port_kinds names unknown port {port!r}")
        if kind not in layouts.PORT_KINDS:
            raise PlanError(f"{entry}: unknown storage kind {kind!r} for port '{port}'")
    for m in spec.mutations:
        if m.kind not in MUTATION_KINDS:
            raise PlanError(f"{entry}: unknown mutation kind {m.kind!r}")
        if m.kind == "reshape" and (len(m.value) != 2 or len(m.value[0]) != len(m.value[1])):
            raise PlanError(f"{entry}: reshape needs as many strides as dims")
        if m.kind == "attr" and m.target not in ATTRIBUTES:
            raise PlanError(f"{entry}: unknown attribute {m.target!r}")
        if m.kind != "attr" and m.target not in PORTS + MODIFIER_PORTS:
            raise PlanError(f"{entry}: mutation names unknown port {m.target!r}")
        if m.kind == "drop" and m.target not in MODIFIER_PORTS:
            raise PlanError(f"{entry}: only a modifier port may be dropped, not {m.target!r}")
        if m.kind in ("dims", "stride") and m.axis not in (0, 1, 2, 3):
            raise PlanError(f"{entry}: mutation axis {m.axis!r} out of range")


def check_draft(plan: Plan, legality: Legality, draft: Draft) -> None:
    """A claim or regression must be a valid graph with addressable outputs; a probe must be
    rejected by exactly the layer and code it names."""
    entry, g = draft.entry, draft.graph
    if draft.purpose not in PURPOSES:
        raise PlanError(f"{entry}: unknown purpose {draft.purpose!r}")
    if draft.combo is not None and not legality.is_legal(draft.combo):
        raise PlanError(f"{entry}: breaks rule(s) {', '.join(legality.broken_rules(draft.combo))}")
    try:
        plan.tolerance_rule(g)   # every case names its class, a probe too (the bundle contract)
    except ValueError as exc:
        raise PlanError(f"{entry}: {exc}") from exc
    front = frontend_reason(g)
    if draft.purpose == "probe":
        r = draft.rejection
        if r.by == "frontend" and front != r.reason:
            raise PlanError(f"{entry}: the frontend gives {front!r}, the probe expects {r.reason!r}")
        if r.by == "device":
            ragged.check_draft(draft)
        if r.by == "engine":
            if front is not None:
                raise PlanError(f"{entry}: an engine probe must pass the frontend, which gives {front!r}")
            if r.reason in ENGINE_LAYOUT_CODES and output_layout_reason(g) != r.reason:
                raise PlanError(f"{entry}: output layout rule gives {output_layout_reason(g)!r}, "
                                f"the probe expects {r.reason!r}")
        return
    if front is not None:
        raise PlanError(f"{entry}: not a valid graph ({front})")
    if output_layout_reason(g) is not None:
        raise PlanError(f"{entry}: outputs not addressable ({output_layout_reason(g)}); make it an engine probe")
