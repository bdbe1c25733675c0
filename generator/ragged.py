"""The ragged (THD / varlen) space of a plan: ragged Specs become graphs, axis combinations
and declared entries become drafts, and the checks only ragged graphs need (the plan's
ragged tables, device probes and how far their stray rows reach).

Axis names of the ragged space: the eight shared axes below that name a table of the plan (shared with
the padded space) and the two of its own (lengths, storage). Its items are
AX-RAGGED-<AXIS>-<VALUE>; its drafts carry space "ragged", so their combinations are
proved against the ragged axes only."""
from __future__ import annotations

import dataclasses
from typing import Collection

from bundlegen import reasons as R
from bundlegen.graph import Graph, Rejection, ragged_graph, with_modifiers
from bundlegen.validate import (GUARD_ELEMS, frontend_finding, good_sequences, ragged_offsets_finding,  # noqa: F401
                                stray_reach, stray_reach_problem)
from bundlegen.generator import expand, layouts
from bundlegen.generator.errors import PlanError
from bundlegen.generator.expand import PORTS, axis_item
from bundlegen.generator.legality import Legality
from bundlegen.generator.records import Combo, Draft
from bundlegen.plans.records import RAGGED, Offsets, Plan, RaggedShape, Spec

SPACE = RAGGED
SHARED_AXES = ("dtype", "heads", "head_dims", "mask", "scale", "distribution", "deterministic", "dropout_form")
OWN_AXES = ("lengths", "storage", "modifiers", "seqused")
KNOWN_AXES = SHARED_AXES + OWN_AXES
OPTIONAL_AXES = ("deterministic", "modifiers", "seqused", "dropout_form")
PROBE_LAYERS = {"frontend": R.FRONTEND, "device": R.DEVICE}


def axis_table(plan: Plan, axis: str) -> Collection[str]:
    r = plan.ragged
    return {"dtype": plan.dtypes, "heads": plan.heads, "head_dims": plan.head_dims, "mask": plan.masks,
            "scale": plan.scales, "distribution": plan.distributions, "deterministic": plan.switches,
            "dropout_form": plan.dropout_forms, "lengths": r.lengths,
            "storage": r.storages, "modifiers": r.modifiers, "seqused": r.seqused}[axis]


def item(axis: str, value: str) -> str:
    """AX-RAGGED-<AXIS>-<VALUE>: the manifest names the axis ragged-<axis>."""
    return axis_item(manifest_axis(axis), value)


def manifest_axis(axis: str) -> str:
    return expand.space_axis(SPACE, axis)


# ----------------------------------------------------------------------------- spec <-> graph
def spec_of(plan: Plan, combo: Combo) -> Spec:
    v = dict(zip((a.name for a in plan.ragged.axes), combo))
    shape = RaggedShape(plan.heads[v["heads"]], plan.head_dims[v["head_dims"]], plan.ragged.lengths[v["lengths"]])
    mods = plan.ragged.modifiers[v["modifiers"]].fields() if "modifiers" in v else {}
    return Spec(shape, dtype=v["dtype"], layout=v["storage"], mask=v["mask"], scale=v["scale"],
                distribution=v["distribution"], deterministic=v.get("deterministic", "off"),
                seqused=v.get("seqused", "off"), **mods, **expand.form_fields(plan, v))


def offsets_of(plan: Plan, spec: Spec) -> Offsets:
    """The spec's sequences as offsets: lengths are packed from the storage's lead rows on,
    with its tail rows after them; explicit offsets as declared."""
    lengths = spec.shape.lengths
    if isinstance(lengths, Offsets):
        return lengths
    st = plan.ragged.storages[spec.layout]

    def cu(lengths: tuple[int, ...]) -> tuple[int, ...]:
        out = [st.lead]
        for n in lengths:
            out.append(out[-1] + n)
        return tuple(out)
    cq, ck = cu(lengths.q), cu(lengths.kv_lengths)
    pads = plan.ragged.seqused.get(spec.seqused)
    used = lambda lengths, pad: None if pad is None else tuple(max(0, n - pad) for n in lengths)
    return Offsets(cq, ck, T_q=cq[-1] + st.tail, T_kv=ck[-1] + st.tail,
                   used_q=used(lengths.q, pads and pads.q_pad), used_kv=used(lengths.kv_lengths, pads and pads.kv_pad))


def graph_of(plan: Plan, spec: Spec) -> Graph:
    st = plan.ragged.storages[spec.layout]
    off = offsets_of(plan, spec)
    cu_kv = off.cu_q if off.cu_kv is None else off.cu_kv
    h, d = spec.shape.heads, spec.shape.head_dims
    T_q = off.cu_q[-1] if off.T_q is None else off.T_q
    T_kv = cu_kv[-1] if off.T_kv is None else off.T_kv
    dims = {"q": (T_q, h.H_q, d.D_qk), "k": (T_kv, h.H_k, d.D_qk), "v": (T_kv, h.H_v, d.D_v),
            "o": (T_q, h.H_q, d.D_v), "do": (T_q, h.H_q, d.D_v), "dq": (T_q, h.H_q, d.D_qk),
            "dk": (T_kv, h.H_k, d.D_qk), "dv": (T_kv, h.H_v, d.D_v), "stats": (T_q, h.H_q, 1)}
    strides = {p: layouts.ragged_strides(st.stats if p == "stats" else st.kind, dims[p]) for p in PORTS}
    offsets = dict.fromkeys(PORTS, st.offset)
    slots = layouts.PACKED_SLOTS.get(st.packed, {})
    if len({dims[p] for p in slots}) > 1:
        raise PlanError(f"ragged storage '{spec.layout}' packs {', '.join(sorted(slots))} into one buffer: "
                        f"they need one shape [T, H, D], not {sorted({dims[p] for p in slots})}")
    for p in slots:
        placed = layouts.packed_placement(st.packed, p, dims[p])
        if placed is not None:
            strides[p], offsets[p] = placed[0], st.offset + placed[1]
    mask, scale = plan.masks[spec.mask], plan.scales[spec.scale]
    graph = ragged_graph(off.cu_q, cu_kv, H_q=h.H_q, H_k=h.H_k, H_v=h.H_v, D_qk=d.D_qk, D_v=d.D_v,
                        dtype=spec.dtype, scale=None if scale is None else float(scale),
                        alignment=mask.alignment, left=mask.left_bound, right=mask.right_bound,
                        max_seqlen_q=off.max_q, max_seqlen_kv=off.max_kv, T_q=T_q, T_kv=T_kv,
                        strides=strides, offsets=offsets, seqused_q=off.used_q, seqused_kv=off.used_kv)
    graph = expand.spec_modifiers(plan, spec, graph)   # the score modifiers (and their mutations)
    p = plan.dropouts[spec.dropout]
    if p is not None:   # the mask port padded to the max lengths (docs/CONTRACTS.md, "Dropout")
        graph = with_modifiers(graph, dropout=p, dropout_mask=plan.dropout_masks[spec.dropout_mask])
    if not plan.switches[spec.deterministic]:
        return graph
    return dataclasses.replace(graph, attributes=dataclasses.replace(graph.attributes, deterministic_algorithm=True))


def spec_items(plan: Plan, spec: Spec) -> tuple[str, ...]:
    """The ragged axis items a declared spec realises: each axis whose value it matches."""
    shape = spec.shape
    found = {"dtype": spec.dtype, "storage": spec.layout, "mask": spec.mask, "scale": spec.scale,
             "distribution": spec.distribution, "deterministic": spec.deterministic, "seqused": spec.seqused,
             "dropout_form": expand.form_of(plan, spec),
             "heads": next((n for n, h in plan.heads.items() if h == shape.heads), None),
             "head_dims": next((n for n, d in plan.head_dims.items() if d == shape.head_dims), None),
             "lengths": next((n for n, ln in plan.ragged.lengths.items() if ln == shape.lengths), None),
             "modifiers": next((n for n, m in plan.ragged.modifiers.items()
                                if m.fields() == {f: getattr(spec, f) for f in m.fields()}), None)}
    if any(m.target in expand.MODIFIER_PORTS for m in spec.mutations):
        found["modifiers"] = None   # modifier ports changed by hand are not the named ones
    return expand.found_items(plan.ragged, found)


# ----------------------------------------------------------------------------- drafts
def _combo_draft(plan: Plan, combo: Combo, entry: str, group: str, suite_item: str, level: str) -> Draft:
    spec = spec_of(plan, combo)
    return Draft(entry=entry, group=group, purpose="claim",
                 items=(suite_item,) + expand.combo_items(plan.ragged, combo), graph=graph_of(plan, spec),
                 distribution=spec.distribution, rejection=None, min_level=level, combo=combo, space=SPACE)


def value_drafts(plan: Plan, legality: Legality) -> list[Draft]:
    return expand.value_drafts(plan, legality, combo_draft=_combo_draft, label="ragged ", group="ragged-axes")


def pair_drafts(plan: Plan, legality: Legality) -> list[Draft]:
    return expand.pair_drafts(plan, legality, plan.ragged.pair_suites, combo_draft=_combo_draft,
                              label="ragged ")


def repair_drafts(plan: Plan, suite_item: str, level: str, combos: list[Combo], *, label: str = "ragged ",
                  group: str = "ragged-pairs-repair") -> list[Draft]:
    return expand.repair_drafts(plan, suite_item, level, combos, combo_draft=_combo_draft,
                                label=label, group=group)


def declared_drafts(plan: Plan) -> list[Draft]:
    """The ragged catalog, regressions and probes."""
    r, out = plan.ragged, []

    def draft(spec, entry, group, purpose, item_id, level, rejection=None) -> Draft:
        items = (item_id,) if rejection is not None else (item_id,) + spec_items(plan, spec)
        return Draft(entry=entry, group=group, purpose=purpose, items=items, graph=graph_of(plan, spec),
                     distribution=spec.distribution, rejection=rejection, min_level=level, space=SPACE)
    for c in r.catalog:
        out += [draft(s, f"ragged shape {c.item}[{k}]", c.group, "claim", c.item, c.level)
                for k, s in enumerate(c.specs)]
    for g in r.regressions:
        out += [draft(s, f"ragged regression {g.item}[{k}]", g.group, "regression", g.item, g.level)
                for k, s in enumerate(g.specs)]
    for p in r.probes:
        out.append(draft(p.spec, f"ragged probe {p.item}", p.group, "probe", p.item, p.level,
                         Rejection(by=p.by, reason=p.reason)))
    return out


# ----------------------------------------------------------------------------- checks
def check_plan(plan: Plan) -> None:
    """The ragged part's tables, axes and entries name things that exist."""
    r = plan.ragged
    for name, st in r.storages.items():
        if st.kind not in layouts.RAGGED_KINDS or st.stats not in layouts.RAGGED_STATS_KINDS:
            raise PlanError(f"ragged storage '{name}': unknown storage kind {st.kind!r} or {st.stats!r}")
        if st.packed and st.packed not in layouts.PACKED_SLOTS:
            raise PlanError(f"ragged storage '{name}': unknown packing {st.packed!r} "
                            f"(known: {', '.join(layouts.PACKED_SLOTS)})")
        if min(st.offset, st.lead, st.tail) < 0:
            raise PlanError(f"ragged storage '{name}': offset, lead and tail must be >= 0")
    for name, ln in r.lengths.items():
        if not ln.q or len(ln.kv_lengths) != len(ln.q) or min(ln.q + ln.kv_lengths) < 0:
            raise PlanError(f"ragged lengths '{name}': needs B >= 1 lengths >= 0, as many on each side")
    for s in r.pair_suites:
        if s.scope not in ("core", "all"):
            raise PlanError(f"ragged pair suite '{s.item}': unknown scope {s.scope!r}")
    specs = [(f"ragged shape '{c.item}'[{k}]", s) for c in r.catalog for k, s in enumerate(c.specs)]
    specs += [(f"ragged regression '{g.item}'[{k}]", s) for g in r.regressions for k, s in enumerate(g.specs)]
    specs += [(f"ragged probe '{p.item}'", p.spec) for p in r.probes]
    for entry, spec in specs:
        check_spec(plan, spec, entry)
    for p in r.probes:
        known = PROBE_LAYERS.get(p.by)
        if known is None:
            raise PlanError(f"ragged probe '{p.item}': unknown rejecting layer {p.by!r} "
                            f"(frontend | device)")
        if p.reason not in known:
            raise PlanError(f"ragged probe '{p.item}': {p.reason!r} is not a {p.by} reason code in bundlegen.reasons")


def check_spec(plan: Plan, spec: Spec, entry: str) -> None:
    if spec.storage != RAGGED:
        raise PlanError(f"{entry}: a {spec.storage} spec in the ragged space (its shape must be a RaggedShape)")
    for field, table in (("dtype", plan.dtypes), ("mask", plan.masks), ("scale", plan.scales),
                         ("distribution", plan.distributions), ("layout", plan.ragged.storages)):
        if getattr(spec, field) not in table:
            raise PlanError(f"{entry}: unknown {field} {getattr(spec, field)!r}")
    for field, table in (("bias", plan.biases), ("dbias", plan.switches), ("sinks", plan.switches),
                         ("softcap", plan.softcaps), ("alibi_slopes", plan.alibi_slopes)):
        if getattr(spec, field) not in table:
            raise PlanError(f"{entry}: unknown {field} {getattr(spec, field)!r}")
    # graph_of reads none of the padded-only fields; score modifiers (and mutations of their
    # ports, for probes) it applies as a padded graph's
    plain = Spec(spec.shape, dtype=spec.dtype, layout=spec.layout, mask=spec.mask, scale=spec.scale,
                 distribution=spec.distribution, bias=spec.bias, dbias=spec.dbias, sinks=spec.sinks,
                 softcap=spec.softcap, alibi_slopes=spec.alibi_slopes, seqused=spec.seqused,
                 dropout=spec.dropout, dropout_mask=spec.dropout_mask,
                 mutations=tuple(m for m in spec.mutations if m.target in expand.MODIFIER_PORTS))
    if spec.seqused not in plan.ragged.seqused and spec.seqused != "off":
        raise PlanError(f"{entry}: unknown seqused {spec.seqused!r}")
    if spec != plain:     # graph_of reads none of the padded-only fields
        raise PlanError(f"{entry}: a ragged spec has no stats layout or port kinds, and mutations only "
                        "of score-modifier ports (leave them at their defaults)")
    st = plan.ragged.storages[spec.layout]
    if isinstance(spec.shape.lengths, Offsets) and (st.lead or st.tail):
        raise PlanError(f"{entry}: explicit offsets place their own rows; storage "
                        f"'{spec.layout}' adds lead/tail rows")


def check_draft(draft: Draft) -> None:
    """A device probe: valid in every rule but its offset values, which break the named
    rule; at least one good sequence; stray rows within the guard band."""
    r, g = draft.rejection, draft.graph
    if r is None or r.by != "device":
        return
    entry = draft.entry
    other = frontend_finding(g, offsets_on_device=True)
    if other is not None:
        raise PlanError(f"{entry}: a device probe must be valid but for its offsets; the frontend "
                        f"gives {other.reason!r} at {other.field}")
    broken = ragged_offsets_finding(g)
    if broken is None or broken.reason != r.reason:
        raise PlanError(f"{entry}: the offsets break {None if broken is None else broken.reason!r}, "
                        f"the probe names {r.reason!r}")
    if not good_sequences(g):
        raise PlanError(f"{entry}: a device probe needs a good sequence (validate.good_sequences) "
                        "whose gradients the engine must still get right")
    problem = stray_reach_problem(g)
    if problem is not None:
        raise PlanError(f"{entry}: {problem}; make it smaller")
