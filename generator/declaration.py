"""A Spec, and a Regression around it, as source text in the plan module's own syntax
(plans/sdpa_bwd.py: `Spec(_shape(B=1, H=2, S=64, D=64), mask="causal-br")`). Only what
differs from a default is written. `evaluate` reads such text back in the plan module's
namespace, so tests can check that the text declares the same graph."""
from __future__ import annotations

import json
from types import ModuleType

from bundlegen.plans.records import Mutation, Regression, Shape, Spec

SPEC_DEFAULTS = {f: getattr(Spec(Shape(1, 1, 1, 1, 1, 1, 1, 1)), f)
                 for f in ("dtype", "layout", "stats_layout", "mask", "scale", "distribution",
                           "bias", "dbias", "sinks", "softcap", "dropout", "dropout_mask", "deterministic")}


def shape_text(shape: Shape, helper: bool = True) -> str:
    """`_shape(B=.., H=.., S=.., D=.., H_k=.., ...)` (the plan's helper; keyword-only
    sizes only where they differ), or a plain `Shape(...)` without it."""
    s = shape
    if not helper:
        return (f"Shape(B={s.B}, H_q={s.H_q}, H_k={s.H_k}, H_v={s.H_v}, S_q={s.S_q}, S_kv={s.S_kv}, "
                f"D_qk={s.D_qk}, D_v={s.D_v})")
    parts = [f"B={s.B}", f"H={s.H_q}", f"S={s.S_q}", f"D={s.D_qk}"]
    parts += [f"{name}={value}" for name, value, base in (
        ("H_k", s.H_k, s.H_q), ("H_v", s.H_v, s.H_k), ("S_kv", s.S_kv, s.S_q), ("D_v", s.D_v, s.D_qk))
        if value != base]
    return f"_shape({', '.join(parts)})"


def _q(value) -> str:
    """A value as the plan writes it: strings in double quotes."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def mutation_text(m: Mutation) -> str:
    if m.kind == "reshape":
        return f"reshape({_q(m.target)}, {tuple(m.value[0])!r}, {tuple(m.value[1])!r})"
    if m.kind == "drop":
        return f"drop({_q(m.target)})"
    if m.kind in ("dims", "stride"):
        return f"{m.kind}({_q(m.target)}, {m.axis}, {_q(m.value)})"
    return f"{m.kind}({_q(m.target)}, {_q(m.value)})"


def spec_text(spec: Spec, helper: bool = True) -> str:
    parts = [shape_text(spec.shape, helper)]
    parts += [f"{f}={_q(getattr(spec, f))}" for f, default in SPEC_DEFAULTS.items() if getattr(spec, f) != default]
    if spec.port_kinds:
        parts.append("port_kinds={" + ", ".join(f"{_q(p)}: {_q(k)}" for p, k in sorted(spec.port_kinds.items())) + "}")
    if spec.mutations:
        parts.append("mutations=(" + ", ".join(mutation_text(m) for m in spec.mutations)
                     + ("," if len(spec.mutations) == 1 else "") + ")")
    return f"Spec({', '.join(parts)})"


def regression_text(item: str, defect: str, source: str, spec: Spec, helper: bool = True) -> str:
    return (f"Regression({_q(item)}, {_q(defect)},\n"
            f"           {_q(source)},\n"
            f"           ({spec_text(spec, helper)},)),")


def evaluate(text: str, plan_module: ModuleType) -> Regression:
    """The Regression that `regression_text` output declares, in the plan module's namespace."""
    namespace = dict(vars(plan_module))
    return eval(text.rstrip().rstrip(","), namespace)  # noqa: S307 - our own output, in tests
