"""Shrinking a failing case (issue 14), Hypothesis-style: from the case's Spec, try
simpler Specs in a fixed order of moves (smaller B, heads, sequences, head dims; packed
layouts; no mask; default scale; randn), keep a candidate only when it is a legal plan
graph and the engine still gives the same verdict class, and stop when a whole pass
keeps nothing. Deterministic: the same case, engine and plan give the same steps.

The loop runs nothing itself: it asks `judge(case) -> verdict`, so it is tested with
plain functions and the command wires in the harness's in-process runner. Each candidate
is judged as the case the generator would write for it (purpose regression, content id,
the id's seed), so the minimal case is exactly what the printed Regression generates."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Iterator

from bundlegen import ids
from bundlegen.graph import Case, DataSpec, Graph
from bundlegen.validate import frontend_reason, output_layout_reason
from bundlegen.generator.checks import check_spec
from bundlegen.generator.errors import PlanError
from bundlegen.generator.expand import axis_table, bias_values, graph_of
from bundlegen.plans.records import Plan, Shape, Spec

Judge = Callable[[Case], str]

#: sequence lengths tried before halving: short, and short with a tail past a block of 16, 32, 64
SEQ_TARGETS = (1, 16, 17, 32, 33, 64, 65)
HEAD_DIM_TARGETS = (8, 16, 32)
#: head dims below this are no kernel's concern: a shrunk D stops here
HEAD_DIM_FLOOR = 8


@dataclass(frozen=True)
class Step:
    move: str          # what changed, e.g. "S_q=S_kv 128 -> 16"
    spec: Spec
    graph: Graph
    verdict: str
    runs: int          # engine runs so far, this one included


@dataclass(frozen=True)
class ShrinkResult:
    start: Spec
    verdict: str
    minimal: Spec
    graph: Graph
    case: Case
    steps: tuple[Step, ...]
    runs: int          # engine runs, the first (of the start) included


class NotReproduced(ValueError):
    """The start Spec, judged as the case the plan would generate, does not give the verdict."""


# ----------------------------------------------------------------------------- legality
def legality_problem(plan: Plan, spec: Spec) -> str | None:
    """Why `spec` is not a graph the plan could declare as a regression, or None: the
    generator's checks on a declared spec (known names, a valid graph with addressable
    outputs and a tolerance class), and every legality rule whose axes all name a value of
    the plan's tables (a size outside the tables has no axis value to test)."""
    try:
        check_spec(plan, spec, "candidate")
        graph = graph_of(plan, spec)
    except (PlanError, KeyError, ValueError, IndexError) as exc:
        return str(exc)
    reason = frontend_reason(graph) or output_layout_reason(graph)
    if reason:
        return reason
    try:
        plan.tolerance_rule(graph)
    except ValueError as exc:
        return str(exc)
    values = axis_values(plan, spec)
    for rule in plan.padded.rules:
        read = set(rule.when) | set(rule.require)
        if not read <= set(values):
            continue
        if (all(values[a] in v for a, v in rule.when.items())
                and not all(values[a] in v for a, v in rule.require.items())):
            return f"breaks rule {rule.name}"
    return None


def axis_values(plan: Plan, spec: Spec) -> dict[str, str]:
    """axis -> the table name the spec's value has (axes whose value has none are left out)."""
    s = spec.shape
    named = {"batch": next((n for n, b in plan.batches.items() if b == s.B), None),
             "heads": next((n for n, h in plan.heads.items() if (h.H_q, h.H_k, h.H_v) == (s.H_q, s.H_k, s.H_v)), None),
             "seq": next((n for n, q in plan.seqs.items() if (q.S_q, q.S_kv) == (s.S_q, s.S_kv)), None),
             "head_dims": next((n for n, d in plan.head_dims.items() if (d.D_qk, d.D_v) == (s.D_qk, s.D_v)), None)}
    for field in ("dtype", "stats_layout", "mask", "scale", "distribution"):
        named[field] = getattr(spec, field)
    named["layout"] = None if spec.port_kinds else spec.layout
    return {a.name: named.get(a.name) for a in plan.padded.axes
            if named.get(a.name) is not None and named[a.name] in axis_table(plan, a.name)}


# ----------------------------------------------------------------------------- moves
def smaller_seqs(s: int) -> list[int]:
    return sorted({t for t in (*SEQ_TARGETS, s // 2, s // 2 + 1, s % 64, 64 + s % 64, s - 1) if 1 <= t < s})


def smaller_head_dims(d: int) -> list[int]:
    return sorted({t for t in (*HEAD_DIM_TARGETS, d // 2) if HEAD_DIM_FLOOR <= t < d})


def _pattern(h: tuple[int, int, int]) -> tuple[int, int, int]:
    """How H_q, H_k, H_v compare (the GQA class: MHA, GQA/MQA, H_k != H_v, ...)."""
    sign = lambda a, b: (a > b) - (a < b)  # noqa: E731
    return sign(h[0], h[1]), sign(h[0], h[2]), sign(h[1], h[2])


def smaller_heads(h: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """(1, 1, 1); the least heads of the same class; h over the gcd of its counts (the same
    ratios); H_q down to lcm(H_k, H_v); h halved. Smallest total first; H_k and H_v always
    divide H_q."""
    q, k, v = h
    legal = [(a, b, c) for a in range(1, q + 1) for b in range(1, k + 1) for c in range(1, v + 1)
             if a % b == 0 and a % c == 0]
    same_class = [t for t in legal if _pattern(t) == _pattern(h)]
    g = math.gcd(q, k, v)
    found = {(1, 1, 1), min(same_class, key=lambda t: (sum(t), t)), (q // g, k // g, v // g),
             (math.lcm(k, v), k, v)}
    if q % 2 == k % 2 == v % 2 == 0:
        found.add((q // 2, k // 2, v // 2))
    return sorted((t for t in found if t in legal and sum(t) < sum(h)), key=lambda t: (sum(t), t))


def _with_shape(spec: Spec, **sizes) -> Spec:
    return dataclasses.replace(spec, shape=dataclasses.replace(spec.shape, **sizes))


def _mask_weight(plan: Plan, name: str) -> tuple[int, int, int]:
    """How far a mask is from none: its bounds and alignment, then its window and band widths."""
    m = plan.masks[name]
    kinds = ((m.left_bound is not None) + (m.right_bound is not None) + (m.alignment == "BOTTOM_RIGHT")
             + (m.right_bound not in (None, 0)))
    return kinds, m.left_bound or 0, abs(m.right_bound or 0)


def _batch(plan: Plan, spec: Spec) -> Iterator[tuple[str, Spec]]:
    s = spec.shape
    for b in sorted({1, s.B // 2, s.B - 1} - {0}):
        if b < s.B:
            yield f"B {s.B} -> {b}", _with_shape(spec, B=b)


def _heads(plan: Plan, spec: Spec) -> Iterator[tuple[str, Spec]]:
    s = spec.shape
    for q, k, v in smaller_heads((s.H_q, s.H_k, s.H_v)):
        yield f"H_q/H_k/H_v {s.H_q}/{s.H_k}/{s.H_v} -> {q}/{k}/{v}", _with_shape(spec, H_q=q, H_k=k, H_v=v)


def _pair(spec: Spec, names: tuple[str, str], smaller: Callable[[int], list[int]]) -> Iterator[tuple[str, Spec]]:
    """Both sizes together while they are equal, then each alone (S_q/S_kv, D_qk/D_v)."""
    a, b = (getattr(spec.shape, n) for n in names)
    if a == b:
        for t in smaller(a):
            yield f"{'='.join(names)} {a} -> {t}", _with_shape(spec, **{n: t for n in names})
    for name, value in zip(names, (a, b)):
        for t in smaller(value):
            yield f"{name} {value} -> {t}", _with_shape(spec, **{name: t})


def _seqs(plan: Plan, spec: Spec) -> Iterator[tuple[str, Spec]]:
    return _pair(spec, ("S_q", "S_kv"), smaller_seqs)


def _head_dims(plan: Plan, spec: Spec) -> Iterator[tuple[str, Spec]]:
    return _pair(spec, ("D_qk", "D_v"), smaller_head_dims)


def _layouts(plan: Plan, spec: Spec) -> Iterator[tuple[str, Spec]]:
    packed = next(iter(plan.layouts))
    if spec.layout != packed or spec.port_kinds:
        yield f"layout {spec.layout} -> {packed}", dataclasses.replace(spec, layout=packed, port_kinds={})
    if len(spec.port_kinds) > 1:
        yield "port_kinds -> none", dataclasses.replace(spec, port_kinds={})
    for port in sorted(spec.port_kinds):
        rest = {p: k for p, k in spec.port_kinds.items() if p != port}
        yield f"{port} {spec.port_kinds[port]} -> the layout's", dataclasses.replace(spec, port_kinds=rest)
    plain_stats = next(iter(plan.stats_layouts))
    if spec.stats_layout != plain_stats:
        yield f"stats {spec.stats_layout} -> {plain_stats}", dataclasses.replace(spec, stats_layout=plain_stats)
    for i, m in enumerate(spec.mutations):
        if m.kind == "stride" or (m.kind == "attr" and m.target != "attn_scale"):
            where = m.target if m.axis is None else f"{m.target}[{m.axis}]"
            yield f"drop {m.kind} {where}={m.value}", dataclasses.replace(
                spec, mutations=spec.mutations[:i] + spec.mutations[i + 1:])


def _masks(plan: Plan, spec: Spec) -> Iterator[tuple[str, Spec]]:
    weight = _mask_weight(plan, spec.mask)
    for name in sorted(plan.masks, key=lambda n: _mask_weight(plan, n)):
        if _mask_weight(plan, name) < weight:
            yield f"mask {spec.mask} -> {name}", dataclasses.replace(spec, mask=name)


def _scale(plan: Plan, spec: Spec) -> Iterator[tuple[str, Spec]]:
    default = next((n for n, v in plan.scales.items() if v is None), None)
    fixed = [m for m in spec.mutations if m.kind == "attr" and m.target == "attn_scale"]
    if default is not None and (spec.scale != default or fixed):
        rest = tuple(m for m in spec.mutations if m not in fixed)
        was = f"{fixed[0].value:g}" if fixed else spec.scale
        yield f"scale {was} -> {default}", dataclasses.replace(spec, scale=default, mutations=rest)


def _distribution(plan: Plan, spec: Spec) -> Iterator[tuple[str, Spec]]:
    plain = plan.distributions[0]
    if spec.distribution != plain:
        yield f"distribution {spec.distribution} -> {plain}", dataclasses.replace(spec, distribution=plain)


#: the moves, in the order a pass tries them: each gives strictly simpler candidates
MOVES = (("batch", _batch), ("heads", _heads), ("seq", _seqs), ("head dims", _head_dims),
         ("layout", _layouts), ("mask", _masks), ("scale", _scale), ("distribution", _distribution))


# ----------------------------------------------------------------------------- the loop
def regression_case(plan: Plan, spec: Spec, item: str, level: str = "") -> Case:
    """The case the generator writes for `spec` declared as a regression."""
    graph = graph_of(plan, spec)
    values = bias_values(plan, spec)
    case_id = ids.case_id("regression", graph, spec.distribution, None, bias_values=values)
    return Case(id=case_id, purpose="regression", items=(item,), graph=graph,
                data=DataSpec(seed=ids.seed_of(case_id), distribution=spec.distribution,
                              bias_values=values),
                tolerance_class=plan.tolerance_rule(graph), level=level, group="regressions")


def shrink(plan: Plan, start: Spec, verdict: str, judge: Judge, *, item: str, level: str = "",
           on_step: Callable[[Step], None] | None = None, max_runs: int = 500) -> ShrinkResult:
    """The least Spec the moves reach from `start` whose case still gets `verdict`."""
    runs = 0

    def holds(spec: Spec) -> bool:
        nonlocal runs
        runs += 1
        return judge(regression_case(plan, spec, item, level)) == verdict

    problem = legality_problem(plan, start)
    if problem:
        raise NotReproduced(f"the start is not a legal regression of plan {plan.name}: {problem}")
    if not holds(start):
        raise NotReproduced(f"the case rebuilt as a regression (its own seed) does not give {verdict}")
    current, steps, changed = start, [], True
    while changed and runs < max_runs:      # a pass: every move in order; a fixpoint ends it
        changed = False
        for _name, move in MOVES:
            accepted = True
            while accepted and runs < max_runs:  # a move goes on from what it accepted
                accepted = False
                for what, candidate in move(plan, current):
                    if runs >= max_runs:
                        break
                    if legality_problem(plan, candidate) is not None or not holds(candidate):
                        continue
                    current, accepted, changed = candidate, True, True
                    steps.append(Step(what, candidate, graph_of(plan, candidate), verdict, runs))
                    if on_step:
                        on_step(steps[-1])
                    break
    case = regression_case(plan, current, item, level)
    return ShrinkResult(start=start, verdict=verdict, minimal=current, graph=case.graph, case=case,
                        steps=tuple(steps), runs=runs)
