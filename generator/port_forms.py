"""Port forms: the vocabulary the contract accepts for each optional input and storage
(bundlegen.graph's tables: bias broadcasts and values, the dropout mask's broadcasts or a
drawn mask, the ALiBi slopes' two forms, sinks, dBias, used lengths, the io dtypes; the
packed and broadcast storages of generator/layouts.py; a ragged batch's token orders and
packed buffers) against the forms a plan draws where they meet the other axes by pr: the
values of core axes (PAIR-CORE pairs each with every other core value) and the subjects of
the plan's focused pairs due by pr. A form the contract accepts that the plan neither draws
there nor declares left out (Plan.port_forms_left_out, with why) is a gap."""
from __future__ import annotations

from bundlegen.graph import ALIBI_SLOPES_DIMS, BIAS_BROADCASTS, BIAS_VALUES, DTYPES, RAGGED_LAYOUT_ORDERS
from bundlegen.generator import layouts
from bundlegen.plans.records import LEVEL_NAMES, PADDED, RAGGED, Plan

#: storage kinds of a padded layout's ports -> the form they are
_PADDED_KIND_FORMS = {"qkv-0": "qkv-packed", "kv-0": "kv-packed", "bcast-batch": "bcast-batch",
                      "bcast-head": "bcast-head"}
SEQUSED_FORMS = {(True, False): "q", (False, True): "kv", (True, True): "both"}


def contract_forms() -> frozenset[str]:
    """Every form the contract accepts, as "<space> <port>: <form>"."""
    out = set()
    for space in (PADDED, RAGGED):
        out |= {f"{space} bias: {b}" for b in BIAS_BROADCASTS} | {f"{space} bias values: {v}" for v in BIAS_VALUES}
        out |= {f"{space} dropout_mask: {m}" for m in (*BIAS_BROADCASTS, "drawn")}
        out |= {f"{space} alibi_slopes: {f}" for f in ALIBI_SLOPES_DIMS}
        out |= {f"{space} sinks: with dsinks", f"{space} sinks: without dsinks", f"{space} dbias: on"}
        out |= {f"{space} dtype: {d}" for d in DTYPES}
    out |= {f"{PADDED} storage: {f}" for f in _PADDED_KIND_FORMS.values()}
    out |= {f"{RAGGED} storage: {o}" for o in RAGGED_LAYOUT_ORDERS}
    out |= {f"{RAGGED} storage: {p}-packed" for p in layouts.PACKED_SLOTS}
    out |= {f"{RAGGED} seqused: {f}" for f in SEQUSED_FORMS.values()}
    return frozenset(out)


def _value_forms(plan: Plan, space: str, axis: str, value: str) -> set[str]:
    """The forms one axis value draws."""
    p = f"{space} "
    if axis == "dtype":
        return {p + f"dtype: {value}"}
    if axis == "dropout_form":
        form = plan.dropout_forms.get(value)     # None: a value the table no longer has
        if form is None or plan.dropouts[form.dropout] is None:
            return set()
        return {p + f"dropout_mask: {plan.dropout_masks[form.dropout_mask] or 'drawn'}"}
    if space == RAGGED and axis == "modifiers":
        m = plan.ragged.modifiers[value]
        return set().union(*(_value_forms(plan, space, a, v) for a, v in m.fields().items()))
    if axis == "bias" and plan.biases[value] is not None:
        kind = plan.biases[value]
        return {p + f"bias: {kind.broadcast}", p + f"bias values: {kind.values}"}
    if axis in ("dbias", "sinks") and plan.switches[value]:
        return {p + ("dbias: on" if axis == "dbias" else "sinks: with dsinks")}
    if axis == "alibi_slopes" and plan.alibi_slopes[value] is not None:
        return {p + f"alibi_slopes: {plan.alibi_slopes[value]}"}
    if space == PADDED and axis == "layout":
        return {p + f"storage: {_PADDED_KIND_FORMS[k]}" for k in plan.layouts[value].ports.values()
                if k in _PADDED_KIND_FORMS}
    if space == RAGGED and axis == "storage":
        st = plan.ragged.storages[value]
        return {p + f"storage: {st.packed}-packed" if st.packed else p + f"storage: {st.kind}"} & contract_forms()
    if space == RAGGED and axis == "seqused" and plan.ragged.seqused[value] is not None:
        used = plan.ragged.seqused[value]
        return {p + f"seqused: {SEQUSED_FORMS[(used.q_pad is not None, used.kv_pad is not None)]}"}
    return set()


def planned_forms(plan: Plan, by: str = "pr") -> dict[str, str]:
    """Form -> the axis value that draws it where it meets the other axes by `by`: a core
    axis's value, or a subject of a focused-pair entry due by then."""
    out: dict[str, str] = {}
    due = LEVEL_NAMES.index(by)
    for space_name in (PADDED, RAGGED):
        space = plan.space(space_name) if getattr(plan, space_name) is not None else None
        if space is None:
            continue
        chosen = [(a.name, v) for a in space.axes if a.core for v in a.values]
        chosen += [(axis, v) for f in plan.focus if f.storage == space_name and LEVEL_NAMES.index(f.level) <= due
                   for axis, values in f.subjects.items() for v in values]
        for axis, value in chosen:
            for form in sorted(_value_forms(plan, space_name, axis, value)):
                out.setdefault(form, f"{space_name} {axis}={value}")
    return out


def gaps(plan: Plan) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(forms the contract accepts that the plan neither draws by pr nor leaves out with why,
    forms it declares left out although it draws them or the contract has no such form)."""
    planned, left = planned_forms(plan), plan.port_forms_left_out
    contract = contract_forms()
    missing = tuple(sorted(f for f in contract if f not in planned and f not in left))
    stale = tuple(sorted(f for f in left if f in planned or f not in contract))
    return missing, stale


def report_lines(plan: Plan) -> list[str]:
    planned = planned_forms(plan)
    contract = contract_forms()
    missing, stale = gaps(plan)
    out = [f"Port forms (the contract's vocabulary against the axis values that draw it by pr: a core axis's "
           f"value or a focused-pair subject): {sum(f in planned for f in contract)} of {len(contract)} drawn, "
           f"{len(plan.port_forms_left_out)} left out with why, {len(missing)} missing"]
    for form in sorted(contract):
        out.append(f"  {form}: " + (planned.get(form) or f"left out: {plan.port_forms_left_out.get(form, 'MISSING')}"))
    out += [f"  stale left-out entry: {f}" for f in stale]
    out.append("")
    return out
