"""A bundle graph back to a plan Spec (the inverse of expand.graph_of), so a case can be
shrunk with the plan's own moves and printed in the plan's own syntax. Storage kinds,
stats layout, mask and scale are matched by name in the plan's tables; what no name
covers becomes a mutation (a stride, an attribute). The Spec is checked to build the
same graph again, else SpecNotFound names the case and what differs."""
from __future__ import annotations

import dataclasses

from bundlegen.graph import BIAS_BROADCASTS, Graph, default_scale
from bundlegen.generator import layouts
from bundlegen.generator.expand import MODIFIER_PORTS, PORTS, graph_of
from bundlegen.plans.records import Mutation, Plan, Shape, Spec, attr, drop, reshape, stride

DATA_PORTS = tuple(p for p in PORTS if p != "stats")


class SpecNotFound(ValueError):
    """The graph has no Spec in the plan's terms (one line, naming the case)."""


def shape_of(graph: Graph) -> Shape:
    g = graph
    return Shape(g.B, g.H_q, g.H_k, g.H_v, g.S_q, g.S_kv, g.D_qk, g.D_v)


def _placement(graph: Graph, port: str) -> tuple[tuple[int, ...], int]:
    t = graph.tensors[port]
    return tuple(t.strides), t.offset


def _kinds_matching(graph: Graph, port: str) -> list[str]:
    dims, want = graph.tensors[port].dims, _placement(graph, port)
    return [k for k in layouts.PORT_KINDS if layouts.place(k, dims) == want]


def _stride_fixes(graph: Graph, port: str, kind: str, case_id: str) -> list[Mutation]:
    """Stride mutations that turn `kind`'s placement into the port's; the offsets must agree."""
    strides, offset = layouts.place(kind, graph.tensors[port].dims)
    have, have_offset = _placement(graph, port)
    if offset != have_offset:
        raise SpecNotFound(f"case {case_id}: port {port}: offset {have_offset} is no storage kind's "
                           f"(the plan's kinds give {offset} for {kind!r})")
    return [stride(port, axis, v) for axis, (v, w) in enumerate(zip(have, strides)) if v != w]


def spec_of_graph(plan: Plan, graph: Graph, distribution: str, case_id: str = "?", *,
                  bias_values: str = "randn") -> Spec:
    if graph.ragged is not None:
        raise SpecNotFound(f"case {case_id}: a ragged graph; shrink moves only padded graphs so far")
    if graph.dtype not in plan.dtypes:
        raise SpecNotFound(f"case {case_id}: dtype {graph.dtype!r} is not one of the plan's")
    matching = {p: _kinds_matching(graph, p) for p in DATA_PORTS}
    stats_strides = _placement(graph, "stats")

    def stats_of(layout) -> str | None:
        for name, kind in plan.stats_layouts.items():
            strides, offset = layouts.place(kind, graph.tensors["stats"].dims)
            if layout.stats_batch_broadcast:
                strides = (0, *strides[1:])
            if (tuple(strides), offset) == stats_strides:
                return name
        return None

    def score(item):
        _name, layout = item
        return (sum(layout.ports[p] in matching[p] for p in DATA_PORTS) + (stats_of(layout) is not None))

    best = max(plan.layouts.items(), key=score)      # max keeps the first of equals (declared order)
    layout_name, layout = best
    port_kinds, mutations = {}, []
    for p in DATA_PORTS:
        if layout.ports[p] in matching[p]:
            continue
        if matching[p]:
            port_kinds[p] = matching[p][0]
        else:
            mutations += _stride_fixes(graph, p, layout.ports[p], case_id)
    stats_name = stats_of(layout)
    if stats_name is None:
        stats_name = next(iter(plan.stats_layouts))
        base = dataclasses.replace(Spec(shape_of(graph)), stats_layout=stats_name)
        placed = graph_of(plan, dataclasses.replace(base, layout=layout_name)).tensors["stats"]
        if placed.offset != graph.tensors["stats"].offset:
            raise SpecNotFound(f"case {case_id}: port stats: offset {graph.tensors['stats'].offset} "
                               "is no stats layout's")
        mutations += [stride("stats", axis, v) for axis, (v, w)
                      in enumerate(zip(graph.tensors["stats"].strides, placed.strides)) if v != w]
    mask_name, attr_fixes = _mask(plan, graph)
    scale_name, scale_fixes = _scale(plan, graph)
    modifiers, cap_fixes = _modifiers(plan, graph, bias_values, case_id)
    dropout, dropout_fixes = _dropout(plan, graph, case_id)
    switch = {v: k for k, v in plan.switches.items()}
    spec = Spec(shape_of(graph), dtype=graph.dtype, layout=layout_name, stats_layout=stats_name,
                mask=mask_name, scale=scale_name, distribution=distribution, port_kinds=port_kinds,
                deterministic=switch[graph.attributes.deterministic_algorithm],
                mutations=tuple(mutations + attr_fixes + scale_fixes + cap_fixes + dropout_fixes),
                **modifiers, **dropout)
    rebuilt = graph_of(plan, spec)
    relaid = [reshape(p, graph.tensors[p].dims, graph.tensors[p].strides) for p in MODIFIER_PORTS
              if p in graph.tensors and p in rebuilt.tensors and rebuilt.tensors[p] != graph.tensors[p]]
    if relaid:   # a modifier port laid out by hand
        spec = dataclasses.replace(spec, mutations=spec.mutations + tuple(relaid))
        rebuilt = graph_of(plan, spec)
    if rebuilt != graph:
        differ = sorted(p for p in set(graph.tensors) | set(rebuilt.tensors)
                        if rebuilt.tensors.get(p) != graph.tensors.get(p))
        what = f"ports {', '.join(differ)}" if differ else "attributes"
        raise SpecNotFound(f"case {case_id}: no Spec of plan {plan.name} builds this graph ({what} differ)")
    return spec


def _modifiers(plan: Plan, graph: Graph, bias_values: str, case_id: str) -> tuple[dict, list[Mutation]]:
    """The Spec's bias, dbias, sinks, alibi_slopes and softcap names for the graph's modifiers (a softcap
    no table value has: the "off" name and an attr mutation)."""
    t = graph.tensors
    switch = {v: k for k, v in plan.switches.items()}
    out = {"dbias": switch["dbias" in t], "sinks": switch["sinks" in t]}
    frozen = [drop("dsinks")] if "sinks" in t and "dsinks" not in t else []   # sinks without dSinks
    out["bias"] = next(n for n, b in plan.biases.items() if b is None)
    if "bias" in t:
        zero = tuple(a for a in (0, 1) if t["bias"].strides[a] == 0 and t["bias"].dims[a] > 1)
        broadcast = next(k for k, axes in BIAS_BROADCASTS.items() if axes == zero)
        found = [n for n, b in plan.biases.items()
                 if b is not None and (b.broadcast, b.values) == (broadcast, bias_values)]
        if not found:
            raise SpecNotFound(f"case {case_id}: no bias kind of the plan is a {broadcast} {bias_values} bias")
        out["bias"] = found[0]
    form = None if "alibi_slopes" not in t else "head" if len(t["alibi_slopes"].dims) == 1 else "batch"
    forms = [n for n, f in plan.alibi_slopes.items() if f == form]
    if not forms:
        raise SpecNotFound(f"case {case_id}: no alibi_slopes form of the plan is {form!r}")
    out["alibi_slopes"] = forms[0]
    cap = graph.attributes.softcap
    names = [n for n, v in plan.softcaps.items() if v == cap]
    if names:
        return {**out, "softcap": names[0]}, frozen
    off = next(n for n, v in plan.softcaps.items() if v is None)
    return {**out, "softcap": off}, frozen + [attr("softcap", cap)]


def _mask(plan: Plan, graph: Graph) -> tuple[str, list[Mutation]]:
    a = graph.attributes
    for name, m in plan.masks.items():
        if (m.left_bound, m.right_bound, m.alignment) == (a.left_bound, a.right_bound, a.diagonal_alignment):
            return name, []
    name, m = next(iter(plan.masks.items()))
    fixes = [attr(field, value) for field, value, base in (
        ("diagonal_alignment", a.diagonal_alignment, m.alignment), ("left_bound", a.left_bound, m.left_bound),
        ("right_bound", a.right_bound, m.right_bound)) if value != base]
    return name, fixes


def _scale(plan: Plan, graph: Graph) -> tuple[str, list[Mutation]]:
    a = graph.attributes
    for name, value in plan.scales.items():
        if (default_scale(graph.D_qk) if value is None else float(value)) == a.attn_scale:
            return name, []
    default = next((n for n, v in plan.scales.items() if v is None), next(iter(plan.scales)))
    return default, [attr("attn_scale", a.attn_scale)]


def _dropout(plan: Plan, graph: Graph, case_id: str) -> tuple[dict, list[Mutation]]:
    """The Spec's dropout and dropout_mask names: the probability by value in
    Plan.dropouts, the mask port's broadcast kind (its zero strides on batch / heads) in
    Plan.dropout_masks, no mask port with a probability set the "drawn" kind. A probability
    no table value has: an attr mutation on a declared probability when a mask port must be
    built, else on the "off" name (no port built, the attribute set by hand)."""
    p, mask = graph.attributes.dropout_probability, graph.tensors.get("dropout_mask")
    out = {"dropout_mask": next(iter(plan.dropout_masks))}
    if mask is not None:
        zero = tuple(a for a in (0, 1) if mask.strides[a] == 0)
        kinds = [n for n, k in plan.dropout_masks.items() if k is not None and BIAS_BROADCASTS[k] == zero]
        if not kinds:
            raise SpecNotFound(f"case {case_id}: no dropout-mask kind of the plan broadcasts axes {zero}")
        out["dropout_mask"] = kinds[0]
    named = [n for n, v in plan.dropouts.items() if v == p and (v is not None or mask is None)]
    if named:
        out["dropout"], fixes = named[0], []
    else:
        out["dropout"] = next((n for n, v in plan.dropouts.items() if (v is not None) == (mask is not None)), None)
        fixes = [attr("dropout_probability", p)]
        if out["dropout"] is None:
            raise SpecNotFound(f"case {case_id}: dropout probability {p} has no declaration of the plan to start from")
    if mask is None and plan.dropouts[out["dropout"]] is not None:   # dropout on, the engine draws its mask
        drawn = [n for n, k in plan.dropout_masks.items() if k is None]
        if not drawn:
            raise SpecNotFound(f"case {case_id}: dropout without a mask port, and the plan has no drawn-mask kind")
        out["dropout_mask"] = drawn[0]
    return out, fixes
