"""Plan entries -> drafts: axis combinations and declared specs become graphs.

Axis names the generator understands: the four that build the shape (batch, heads, seq,
head_dims) and the eleven that name a Spec field (dtype, layout, stats_layout, mask, scale,
distribution, the score modifiers bias, dbias, sinks, softcap, and deterministic). A plan
may leave out an optional axis (its Spec field keeps its default)."""
from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Collection, Mapping

from bundlegen.graph import (INPUT_PORTS, MODIFIER_INPUT_PORTS, MODIFIER_OUTPUT_PORTS, OUTPUT_PORTS,
                             Attributes, Graph, Rejection, TensorSpec, default_scale, packed_strides,
                             with_modifiers)
from bundlegen.generator import layouts
from bundlegen.generator.errors import PlanError
from bundlegen.generator.legality import Legality
from bundlegen.generator.pairs import suite_rows
from bundlegen.generator.records import Combo, Draft
from bundlegen.plans.records import PADDED, Plan, Shape, Space, Spec

SHAPE_AXES = ("batch", "heads", "seq", "head_dims")
MODIFIER_AXES = ("bias", "dbias", "sinks", "softcap")
SPEC_AXES = ("dtype", "layout", "stats_layout", "mask", "scale", "distribution") + MODIFIER_AXES + (
    "deterministic", "alibi_slopes")
#: an axis naming two Spec fields at once (Plan.dropout_forms: dropout and dropout_mask)
FORM_AXES = ("dropout_form",)
KNOWN_AXES = SHAPE_AXES + SPEC_AXES + FORM_AXES
OPTIONAL_AXES = ("deterministic", "alibi_slopes", "dropout_form")
PORTS = INPUT_PORTS + OUTPUT_PORTS
MODIFIER_PORTS = MODIFIER_INPUT_PORTS + MODIFIER_OUTPUT_PORTS


def axis_table(plan: Plan, axis: str) -> Collection[str]:
    """The names an axis may take: the keys of its value table."""
    return {"batch": plan.batches, "heads": plan.heads, "seq": plan.seqs, "head_dims": plan.head_dims,
            "dtype": plan.dtypes, "layout": plan.layouts, "stats_layout": plan.stats_layouts,
            "mask": plan.masks, "scale": plan.scales, "distribution": plan.distributions,
            "bias": plan.biases, "dbias": plan.switches, "sinks": plan.switches,
            "softcap": plan.softcaps, "deterministic": plan.switches, "alibi_slopes": plan.alibi_slopes,
            "dropout_form": plan.dropout_forms}[axis]


def axis_item(axis: str, value: str) -> str:
    """AX-<AXIS>-<VALUE>, e.g. AX-HEAD-DIMS-D192-128."""
    return "AX-" + re.sub(r"[^A-Z0-9]+", "-", f"{axis}-{value}".upper()).strip("-")


def space_axis(storage: str, axis: str) -> str:
    """The manifest's name of an axis of the padded or the ragged space: a padded axis by its
    own name, a ragged one as ragged-<axis> (its items AX-RAGGED-<AXIS>-<VALUE>)."""
    return axis if storage == PADDED else f"{storage}-{axis}"


def found_items(space: Space, found: Mapping[str, str | None]) -> tuple[str, ...]:
    """The items of the axes of `space` whose value `found` names (None or absent: none)."""
    return tuple(axis_item(space_axis(space.storage, a.name), found[a.name])
                 for a in space.axes if found.get(a.name) in a.values)


def combo_items(space: Space, combo: Combo) -> tuple[str, ...]:
    return tuple(axis_item(space_axis(space.storage, a.name), v) for a, v in zip(space.axes, combo))


# ----------------------------------------------------------------------------- spec <-> graph
def spec_of(plan: Plan, combo: Combo) -> Spec:
    v = dict(zip((a.name for a in plan.padded.axes), combo))
    h, s, d = plan.heads[v["heads"]], plan.seqs[v["seq"]], plan.head_dims[v["head_dims"]]
    shape = Shape(plan.batches[v["batch"]], h.H_q, h.H_k, h.H_v, s.S_q, s.S_kv, d.D_qk, d.D_v)
    return Spec(shape, **{field: v[field] for field in SPEC_AXES if field in v}, **form_fields(plan, v))


def form_fields(plan: Plan, values) -> dict[str, str]:
    """The Spec fields a combination's dropout_form names (none when the space has no such axis)."""
    if "dropout_form" not in values:
        return {}
    form = plan.dropout_forms[values["dropout_form"]]
    return {"dropout": form.dropout, "dropout_mask": form.dropout_mask}


def form_of(plan: Plan, spec: Spec) -> str | None:
    """The dropout_form value a spec's dropout and mask form are (any mask form when off)."""
    return next((n for n, f in plan.dropout_forms.items() if f.dropout == spec.dropout
                 and (spec.dropout == "off" or f.dropout_mask == spec.dropout_mask)), None)


def graph_of(plan: Plan, spec: Spec) -> Graph:
    s = spec.shape
    q, kv_k, kv_v = (s.B, s.H_q, s.S_q), (s.B, s.H_k, s.S_kv), (s.B, s.H_v, s.S_kv)
    dims = {"q": (*q, s.D_qk), "k": (*kv_k, s.D_qk), "v": (*kv_v, s.D_v), "o": (*q, s.D_v),
            "do": (*q, s.D_v), "dq": (*q, s.D_qk), "dk": (*kv_k, s.D_qk), "dv": (*kv_v, s.D_v),
            "stats": (*q, 1)}
    dtypes = {p: ("fp32" if p == "stats" else spec.dtype) for p in PORTS}
    core = [m for m in spec.mutations if m.target not in MODIFIER_PORTS]
    for m in core:
        if m.kind == "dims":
            dims[m.target] = tuple(m.value if i == m.axis else d for i, d in enumerate(dims[m.target]))
        elif m.kind == "dtype":
            dtypes[m.target] = m.value
    layout = plan.layouts[spec.layout]
    kinds = {**layout.ports, **spec.port_kinds, "stats": plan.stats_layouts[spec.stats_layout]}
    placed = {p: layouts.place(kinds[p], dims[p]) for p in PORTS}
    strides = {p: list(placed[p][0]) for p in PORTS}
    if layout.stats_batch_broadcast:
        strides["stats"][0] = 0
    for m in core:
        if m.kind == "stride":
            strides[m.target][m.axis] = m.value
        elif m.kind == "reshape":
            dims[m.target], strides[m.target] = tuple(m.value[0]), list(m.value[1])
    tensors = {p: TensorSpec(dims=tuple(dims[p]), strides=tuple(strides[p]), dtype=dtypes[p],
                             offset=placed[p][1]) for p in PORTS}
    mask, scale = plan.masks[spec.mask], plan.scales[spec.scale]
    attrs = Attributes(attn_scale=default_scale(s.D_qk) if scale is None else float(scale),
                       diagonal_alignment=mask.alignment, left_bound=mask.left_bound,
                       right_bound=mask.right_bound,
                       deterministic_algorithm=plan.switches[spec.deterministic])
    graph = spec_modifiers(plan, spec, Graph(tensors=tensors, attributes=attrs))
    for m in spec.mutations:
        if m.kind == "attr":
            graph = dataclasses.replace(graph, attributes=dataclasses.replace(graph.attributes,
                                                                              **{m.target: m.value}))
    return graph


def bias_values(plan: Plan, spec: Spec) -> str:
    """What the spec's bias holds (randn when it has none)."""
    kind = plan.biases[spec.bias]
    return "randn" if kind is None else kind.values


def spec_modifiers(plan: Plan, spec: Spec, graph: Graph) -> Graph:
    """The spec's score-modifier ports (packed; bundlegen.graph.with_modifiers), then the
    mutations that target them: dims (strides repacked, zero strides kept), stride, dtype,
    reshape, drop. A ragged graph's too (its bias in the padded max_seqlen layout)."""
    kind = plan.biases[spec.bias]
    graph = with_modifiers(graph, bias=None if kind is None else kind.broadcast,
                           dbias=plan.switches[spec.dbias] and kind is not None,
                           sinks=plan.switches[spec.sinks], dsinks=plan.switches[spec.sinks],
                           softcap=plan.softcaps[spec.softcap], dropout=plan.dropouts[spec.dropout],
                           dropout_mask=plan.dropout_masks[spec.dropout_mask],
                           alibi_slopes=plan.alibi_slopes[spec.alibi_slopes])
    if plan.switches[spec.dbias] and kind is None:   # a probe's dbias without a bias
        full = (graph.B, graph.H_q, graph.S_q, graph.S_kv)
        graph = dataclasses.replace(graph, tensors={**graph.tensors, "dbias": TensorSpec(
            dims=full, strides=packed_strides(full), dtype=graph.dtype)})
    tensors = dict(graph.tensors)
    for m in spec.mutations:
        if m.target not in MODIFIER_PORTS:
            continue
        if m.kind == "drop":
            tensors.pop(m.target)
            continue
        t = tensors[m.target]
        if m.kind == "dims":
            d = tuple(m.value if i == m.axis else x for i, x in enumerate(t.dims))
            packed = packed_strides(d)
            t = dataclasses.replace(t, dims=d, strides=tuple(0 if s == 0 else p for s, p in zip(t.strides, packed)))
        elif m.kind == "stride":
            t = dataclasses.replace(t, strides=tuple(m.value if i == m.axis else x for i, x in enumerate(t.strides)))
        elif m.kind == "dtype":
            t = dataclasses.replace(t, dtype=m.value)
        elif m.kind == "reshape":
            t = dataclasses.replace(t, dims=tuple(m.value[0]), strides=tuple(m.value[1]))
        tensors[m.target] = t
    return dataclasses.replace(graph, tensors=tensors)


def spec_items(plan: Plan, spec: Spec) -> tuple[str, ...]:
    """The axis items a declared spec realises: each axis whose value it matches exactly."""
    s = spec.shape
    found = {"dtype": spec.dtype, "layout": spec.layout, "stats_layout": spec.stats_layout,
             "mask": spec.mask, "scale": spec.scale, "distribution": spec.distribution,
             "bias": spec.bias, "dbias": spec.dbias, "sinks": spec.sinks, "softcap": spec.softcap,
             "deterministic": spec.deterministic, "alibi_slopes": spec.alibi_slopes,
             "dropout_form": form_of(plan, spec)}
    found["heads"] = next((n for n, h in plan.heads.items() if (h.H_q, h.H_k, h.H_v) == (s.H_q, s.H_k, s.H_v)), None)
    found["seq"] = next((n for n, q in plan.seqs.items() if (q.S_q, q.S_kv) == (s.S_q, s.S_kv)), None)
    found["head_dims"] = next((n for n, d in plan.head_dims.items() if (d.D_qk, d.D_v) == (s.D_qk, s.D_v)), None)
    found["batch"] = next((n for n, b in plan.batches.items() if b == s.B), None)
    if spec.port_kinds or any(m.kind in ("stride", "reshape") for m in spec.mutations):
        found["layout"] = None      # a layout with overrides is not the named layout
    changed = {m.target for m in spec.mutations if m.kind == "attr"}
    if changed & {"left_bound", "right_bound", "diagonal_alignment"}:
        found["mask"] = None        # a mask with a bound set by hand is not the named mask
    if "attn_scale" in changed:
        found["scale"] = None
    if "softcap" in changed:
        found["softcap"] = None
    if "deterministic_algorithm" in changed:   # the flag set by hand: what the graph asks for
        found["deterministic"] = "on" if graph_of(plan, spec).attributes.deterministic_algorithm else "off"
    if any(m.target in MODIFIER_PORTS for m in spec.mutations):
        for axis in ("bias", "dbias", "sinks"):
            found[axis] = None      # modifier ports changed by hand are not the named ones
    return found_items(plan.padded, found)


# ----------------------------------------------------------------------------- drafts
def _combo_draft(plan: Plan, combo: Combo, entry: str, group: str, item: str, level: str) -> Draft:
    spec = spec_of(plan, combo)
    return Draft(entry=entry, group=group, purpose="claim", items=(item,) + combo_items(plan.padded, combo),
                 graph=graph_of(plan, spec), distribution=spec.distribution, rejection=None,
                 min_level=level, combo=combo, bias_values=bias_values(plan, spec))


def value_drafts(plan: Plan, legality: Legality, *, combo_draft=None, label: str = "",
                 group: str = "axes") -> list[Draft]:
    """Each value of each axis of the legality's space once, the other axes at their defaults
    where legal (quick). A ragged space passes its draft builder, label and group."""
    draft, space, out = combo_draft or _combo_draft, legality.space, []
    for axis in space.axes:
        for value in axis.values:
            entry = f"{label}axis value {axis.name}={value}"
            combo = legality.complete({axis.name: value})
            if combo is None:
                raise PlanError(f"{entry}: no legal combination holds it")
            out.append(draft(plan, combo, entry, group, space.value_suite_item, plan.levels[0].name))
    return out


def pair_drafts(plan: Plan, legality: Legality, suites=None, *, combo_draft=None,
                label: str = "") -> list[Draft]:
    """One draft per row of each pair suite (default: the plan's; a ragged space passes its
    own suites, its draft builder and the label its entries start with)."""
    draft = combo_draft or _combo_draft
    return [draft(plan, combo, f"{label}pair suite {suite.item} row {n}", suite.group, suite.item,
                  suite.level)
            for suite in (plan.padded.pair_suites if suites is None else suites)
            for n, combo in enumerate(suite_rows(legality, suite))]


def repair_drafts(plan: Plan, suite_item: str, level: str, combos: list[Combo], *,
                  combo_draft=None, label: str = "", group: str = "pairs-repair") -> list[Draft]:
    draft = combo_draft or _combo_draft
    return [draft(plan, c, f"{label}pair repair {suite_item} #{n}", group, suite_item, level)
            for n, c in enumerate(combos)]


def _spec_draft(plan: Plan, spec: Spec, entry: str, group: str, purpose: str, item: str, level: str) -> Draft:
    return Draft(entry=entry, group=group, purpose=purpose, items=(item,) + spec_items(plan, spec),
                 graph=graph_of(plan, spec), distribution=spec.distribution, rejection=None, min_level=level,
                 bias_values=bias_values(plan, spec))


def declared_drafts(plan: Plan) -> list[Draft]:
    """Shape catalog, sweeps, regressions and probes."""
    out = []
    for c in plan.padded.catalog:
        out += [_spec_draft(plan, s, f"shape {c.item}[{k}]", c.group, "claim", c.item, c.level)
                for k, s in enumerate(c.specs)]
    for sw in plan.padded.sweeps:
        fields = [f for f, _ in sw.vary]
        for k, values in enumerate(itertools.product(*(vals for _, vals in sw.vary))):
            spec = dataclasses.replace(sw.base, **dict(zip(fields, values)))
            out.append(_spec_draft(plan, spec, f"sweep {sw.item}[{k}]", sw.group, "claim", sw.item, sw.level))
    for r in plan.padded.regressions:
        out += [_spec_draft(plan, s, f"regression {r.item}[{k}]", r.group, "regression", r.item, r.level)
                for k, s in enumerate(r.specs)]
    for p in plan.padded.probes:
        out.append(Draft(entry=f"probe {p.item}", group=p.group, purpose="probe", items=(p.item,),
                         graph=graph_of(plan, p.spec), distribution=p.spec.distribution,
                         rejection=Rejection(by=p.by, reason=p.reason), min_level=p.level,
                         bias_values=bias_values(plan, p.spec)))
    return out
