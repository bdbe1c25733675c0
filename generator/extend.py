"""Workspace plans that extend the built-in plan (bundlegen.plans.extension.Extension):
the plan they mean, and the cases they add, with no I/O but reading the built-in bundles.

`merged_plan` is the built-in plan with the extension's tables and entries, under the
extension's name: what `shrink` recovers specs and checks legality against. `build_extension`
generates only the added cases: each is checked as the built-in plan's are, gets its id,
seed, tolerance class and cost the same way, and goes to the lowest level it fits whose
budget (the built-in level's, or the extension's Budget) the built-in cases left room for.
The manifest it leads to records the built-in bundles' digest (bundlegen.manifest.Extends).
"""
from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

from bundlegen import cost as cost_model
from bundlegen import ids
from bundlegen.graph import BundleError, Case, DataSpec, load_bundle
from bundlegen.manifest import Extends, Manifest, load_manifest
from bundlegen.workspace import builtin_bundle_root
from bundlegen.generator import levels as L
from bundlegen.generator import ragged
from bundlegen.generator.checks import check_draft, check_plan, declared_items
from bundlegen.generator.errors import PlanError
from bundlegen.generator.expand import declared_drafts
from bundlegen.generator.legality import Legality
from bundlegen.generator.records import Draft, GeneratedPlan
from bundlegen.plans.extension import Extension
from bundlegen.plans.records import PADDED, RAGGED, Plan, Space

PLAN_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
PURPOSE_PRECEDENCE = ("claim", "regression", "probe")   # as generator/generate.py merges drafts
TABLES = ("masks", "scales", "layouts")


def is_extension(plan: object) -> bool:
    return isinstance(plan, Extension)


def base_plan(ext: Extension) -> Plan:
    """The Plan of the module `ext` extends."""
    try:
        module = importlib.import_module(ext.extends)
    except ImportError as exc:
        raise PlanError(f"plan {ext.name!r}: extends {ext.extends!r}, which cannot be imported: {exc}") from None
    plan = getattr(module, "PLAN", None)
    if not isinstance(plan, Plan):
        raise PlanError(f"plan {ext.name!r}: extends {ext.extends!r}, whose PLAN is not a Plan")
    return plan


def _split(entries: tuple, storage: str) -> tuple:
    return tuple(e for e in entries if e.storage == storage)


def _tables(ext: Extension, base: Plan) -> dict:
    out = {}
    for table in TABLES:
        added = getattr(ext, table)
        clash = sorted(set(added) & set(getattr(base, table)))
        if clash:
            raise PlanError(f"plan {ext.name!r}: {table}: {clash[0]!r} is already a built-in name (add new names only)")
        out[table] = {**getattr(base, table), **added}
    return out


def _with_entries(base: Plan, ext: Extension, keep_base: bool) -> dict:
    """The two spaces of a plan holding the extension's entries, after the base's or alone."""
    def space(owner, storage):
        if owner is None:
            if any(e.storage == storage for e in ext.regressions + ext.catalog + ext.probes):
                raise PlanError(f"plan {ext.name!r}: {storage} entries, but {ext.extends} has no {storage} space")
            return None
        kept = (lambda name: getattr(owner, name)) if keep_base else (lambda name: ())
        return dataclasses.replace(
            owner, catalog=kept("catalog") + _split(ext.catalog, storage),
            regressions=kept("regressions") + _split(ext.regressions, storage),
            probes=kept("probes") + _split(ext.probes, storage),
            **({"sweeps": kept("sweeps")} if storage == PADDED else {}))
    return {"padded": space(base.padded, PADDED), "ragged": space(base.ragged, RAGGED)}


def merged_plan(ext: Extension, base: Plan | None = None) -> Plan:
    """The built-in plan with the extension's tables and entries, named as the extension."""
    base = base_plan(ext) if base is None else base
    new_gates = tuple(g for g in ext.gated if g.item not in declared_items(base))
    return dataclasses.replace(base, name=ext.name, **_tables(ext, base), **_with_entries(base, ext, True),
                               gated=base.gated + new_gates, levels=_levels(ext, base))


def _levels(ext: Extension, base: Plan):
    names = [lv.name for lv in base.levels]
    seen = set()
    for b in ext.budgets:
        if b.level not in names or b.level in seen:
            raise PlanError(f"plan {ext.name!r}: budgets: {b.level!r} is not a level, or named twice "
                            f"(levels: {', '.join(names)})")
        seen.add(b.level)
    out = []
    for lv in base.levels:
        b = next((b for b in ext.budgets if b.level == lv.name), None)
        if b is not None:
            lv = dataclasses.replace(lv, budget_seconds=lv.budget_seconds if b.seconds is None else b.seconds,
                                     cpu_budget_seconds=(lv.cpu_budget_seconds if b.cpu_seconds is None
                                                         else b.cpu_seconds))
        out.append(lv)
    return tuple(out)


def additions_plan(ext: Extension, base: Plan) -> Plan:
    """A plan whose entries are only the extension's: what its bundles are generated from.
    The built-in suites (pairs, boundaries, risks, peers) stay with the built-in bundles."""
    new_gates = tuple(g for g in ext.gated if g.item not in declared_items(base))
    return dataclasses.replace(base, name=ext.name, **_tables(ext, base), **_with_entries(base, ext, False),
                               gated=new_gates, levels=_levels(ext, base), peers=None, boundaries=None,
                               risks=None, distinct_layouts_by=None)


def removed_items(ext: Extension, base: Plan) -> tuple[str, ...]:
    """The built-in items whose cases the extension leaves out: removed, or gated by it."""
    known = declared_items(base)
    for item in ext.removed:
        if item not in known:
            raise PlanError(f"plan {ext.name!r}: removed: {item!r} is not an item of {ext.extends}")
    return tuple(sorted(set(ext.removed) | {g.item for g in ext.gated if g.item in known}))


# ----------------------------------------------------------------------------- the built-in bundles
@dataclass(frozen=True)
class BaseBundles:
    """The built-in plan's generated bundles, as installed: its manifest and cases."""
    manifest: Manifest
    cases: tuple[Case, ...]


def base_bundles(base: Plan) -> BaseBundles:
    root = builtin_bundle_root()
    try:
        manifest = load_manifest(root, base.name)
    except BundleError as exc:
        raise PlanError(f"plan {base.name!r} has no generated bundles in the package ({exc}); only a plan "
                        "whose bundles the package ships can be extended") from None
    cases = []
    for level in manifest.level_names:
        for path in sorted((Path(root) / level / base.name).glob("*.json")):
            bundle, errors = load_bundle(path)
            if errors:    # levelling against part of the built-in cases would misplace the added ones
                raise PlanError(f"the built-in bundles are damaged: {errors[0]}")
            cases += [dataclasses.replace(c, level=level) for c in bundle.cases]
    return BaseBundles(manifest, tuple(cases))


# ----------------------------------------------------------------------------- build
def build_extension(ext: Extension) -> GeneratedPlan:
    """The extension's own cases (never a built-in one), levelled against what the built-in
    cases left of each level's budgets."""
    if not isinstance(ext.name, str) or not PLAN_NAME_RE.match(ext.name):
        raise PlanError(f"plan name {ext.name!r}: expected lower-case letters, digits and '_'")
    base = base_plan(ext)
    if ext.name == base.name:
        raise PlanError(f"plan {ext.name!r}: an extension needs a name of its own, not the built-in plan's")
    plan = additions_plan(ext, base)
    check_plan(plan)
    base_items = declared_items(base)
    own = declared_items(plan)
    for entry in ext.regressions + ext.catalog + ext.probes + tuple(g for g in ext.gated if g.item not in base_items):
        if entry.item in base_items:
            raise PlanError(f"plan {ext.name!r}: item {entry.item!r} is already a built-in item")
    removed = removed_items(ext, base)
    installed = base_bundles(base)
    spaces = {PADDED: Legality(plan.padded)}
    drafts = declared_drafts(plan)
    if plan.ragged is not None:
        spaces[RAGGED] = Legality(plan.ragged)
        drafts += ragged.declared_drafts(plan)
    for d in drafts:
        check_draft(plan, spaces[d.space], d)
    kept_base = [c for c in installed.cases if not set(c.items) & set(removed)]
    cases, cpu = _cases(plan, drafts, kept_base, {c.id for c in installed.cases})
    traced = {i for c in cases for i in c.items}     # the built-in items (axis values) the added cases give
    items = {k: v for k, v in own.items()
             if (k not in base_items or k in traced) and k not in {g.item for g in plan.gated}}
    return GeneratedPlan(plan=plan, cases=cases, combos={}, entries={c.id: () for c in cases}, cpu_seconds=cpu,
                         proofs=(), exclusions=(), illegal_pairs=0, repaired_pairs=(), legality_violations=(),
                         items=items, extends=Extends(base.name, installed.manifest.digest, removed),
                         base_manifest=installed.manifest,
                         base_gates=tuple(g for g in ext.gated if g.item in base_items),
                         base_cases=tuple(kept_base))


def _merged(drafts: list[Draft]) -> list[tuple[Draft, list[Draft]]]:
    groups: dict[str, list[Draft]] = {}
    for d in drafts:
        groups.setdefault(ids.content_key(d.graph, d.distribution, d.rejection, d.bias_values), []).append(d)
    out = []
    for group in groups.values():
        purpose = max((d.purpose for d in group), key=PURPOSE_PRECEDENCE.index)
        out.append((next(d for d in group if d.purpose == purpose), group))
    return out


def _cases(plan: Plan, drafts: list[Draft], kept_base: list[Case], base_ids: set[str]):
    names = [lv.name for lv in plan.levels]
    costed, built, cpu = [], {}, {}
    for lead, group in _merged(drafts):
        case_id = ids.case_id(lead.purpose, lead.graph, lead.distribution, lead.rejection,
                              bias_values=lead.bias_values)
        if case_id in base_ids:
            raise PlanError(f"{lead.entry}: the same case as built-in case {case_id}: already tested")
        probe = lead.purpose == "probe" and lead.rejection.by != "device"
        cost, h200 = L.costed(case_id, lead.entry, min((d.min_level for d in group), key=names.index),
                              lead.graph, probe, plan.cost_model)
        costed.append(cost)
        built[case_id] = (lead, group, h200)
        cpu[case_id] = cost.cpu_seconds
    assigned = L.assign(costed, _headroom(plan, kept_base))
    _check_cpu_budget(plan, kept_base, [c for c in costed if assigned[c.key] == names[0]])
    cases = [Case(id=case_id, purpose=lead.purpose, items=tuple(sorted({i for d in group for i in d.items})),
                  graph=lead.graph, data=DataSpec(seed=ids.seed_of(case_id), distribution=lead.distribution,
                                                  bias_values=lead.bias_values),
                  tolerance_class=plan.tolerance_rule(lead.graph), expected_rejection=lead.rejection,
                  cost=h200, level=assigned[case_id], group=lead.group)
             for case_id, (lead, group, h200) in built.items()]
    cases.sort(key=lambda c: (names.index(c.level), c.group, c.id))
    return tuple(cases), cpu


def _headroom(plan: Plan, kept_base: list[Case]):
    """Each level as the added cases see it: its per-case ceilings, and as budget what the
    built-in cases it keeps (that level and every lower one) leave of budget x (1 - reserve)."""
    names = [lv.name for lv in plan.levels]
    out = []
    for i, lv in enumerate(plan.levels):
        used = sum(c.cost.predicted_s for c in kept_base if names.index(c.level) <= i)
        room = max(0.0, lv.budget_seconds * (1.0 - lv.reserve) - used)    # a Budget may cut below the built-in use
        out.append(dataclasses.replace(lv, budget_seconds=room, reserve=0.0))
    return tuple(out)


def _check_cpu_budget(plan: Plan, kept_base: list[Case], added_quick: list[L.Costed]) -> None:
    """The lowest level's cpu budget holds the built-in cases and the added ones together."""
    lowest = plan.levels[0]
    if lowest.cpu_budget_seconds is None:
        return
    base = [cost_model.predict_terms(cost_model.terms(c.graph), "cpu", plan.cost_model,
                                     probe=c.expected_rejection is not None
                                     and c.expected_rejection.by != "device").predicted_s
            for c in kept_base if c.level == lowest.name]
    total = L.cpu_run_wall(base + [c.cpu_seconds for c in added_quick], lowest, plan.cost_model["cpu"].run_start_s)
    if total > lowest.cpu_budget_seconds:
        raise PlanError(f"plan {plan.name!r}: level '{lowest.name}' with the added cases is predicted at "
                        f"{total:.1f} s on the cpu class, over its cpu budget of {lowest.cpu_budget_seconds:g} s: "
                        f"make the added cases smaller or raise it with Budget({lowest.name!r}, cpu_seconds=...)")


# ----------------------------------------------------------------------------- defined but not taken
def field_hint(exc: Exception) -> str:
    """' (did you mean 'regressions'?)' for a TypeError naming an unexpected keyword close to
    a field of a plan record; empty otherwise."""
    import difflib
    from bundlegen.plans import records

    found = re.search(r"unexpected keyword argument '(\w+)'", str(exc)) if isinstance(exc, TypeError) else None
    if found is None:
        return ""
    fields = {f.name for record in [*vars(records).values(), Extension]
              if dataclasses.is_dataclass(record) and isinstance(record, type) for f in dataclasses.fields(record)}
    close = difflib.get_close_matches(found.group(1), sorted(fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


DECLARATION_NAMES = frozenset(f.name.upper() for record in (Plan, Space, Extension) for f in dataclasses.fields(record))


def untaken(module, plan: object) -> list[str]:
    """Module-level names that look like plan declarations (a field of Plan, Space or
    Extension in capitals: REGRESSIONS, CATALOG, LEVELS, ...) whose value `plan` does not
    hold: each would be silently ignored. A tuple is taken when each of its elements is in
    the field, a mapping when each of its keys is (with its value). A name an extension's
    module merely imported from the plan it extends is not its declaration."""
    records = [plan]
    if isinstance(plan, Plan):
        records += [s for s in (plan.padded, plan.ragged) if s is not None]
    fields: dict[str, list] = {}
    for record in records:
        for f in dataclasses.fields(record):
            fields.setdefault(f.name.upper(), []).append(getattr(record, f.name))
    extended = importlib.import_module(plan.extends) if is_extension(plan) else None
    out = []
    for name, value in sorted(vars(module).items()):
        if name not in DECLARATION_NAMES or name == "PLAN":
            continue
        if extended is not None and getattr(extended, name, None) is value:
            continue
        if not any(_holds(held, value) for held in fields.get(name, ())):
            out.append(name)
    return out


def _holds(held, value) -> bool:
    if held is value or held == value:
        return True
    if isinstance(value, tuple) and isinstance(held, tuple):
        return all(any(v is h or v == h for h in held) for v in value)
    if isinstance(value, dict) and hasattr(held, "keys"):
        return set(value) <= set(held.keys()) and all(held[k] == v for k, v in value.items())
    return False


#: how close an extension's capitalised name must be to a declaration's to be its misspelling
MISSPELT_CUTOFF = 0.8


def misspelt(module, plan: object) -> list[tuple[str, str]]:
    """(name, the declaration it is close to) for each module-level name of an extension's
    module that is in capitals, is no declaration, was not imported from the plan it
    extends, and spells one nearly (REGRESIONS for REGRESSIONS): it would be dropped
    silently. The built-in plan's own constants (PROBE_ARMS, ...) are not an extension's."""
    import difflib

    if not is_extension(plan):
        return []
    extended = importlib.import_module(plan.extends)
    out = []
    for name, value in sorted(vars(module).items()):
        if not name.isupper() or name in DECLARATION_NAMES or getattr(extended, name, None) is value:
            continue
        close = difflib.get_close_matches(name, sorted(DECLARATION_NAMES), n=1, cutoff=MISSPELT_CUTOFF)
        if close:
            out.append((name, close[0]))
    return out


def untaken_error(module, plan: object) -> str | None:
    """One line naming the first declaration `plan` does not take (or the first name that
    misspells one), or None."""
    wrong = misspelt(module, plan)
    if wrong:
        where = getattr(module, "__file__", None) or module.__name__
        name, close = wrong[0]
        return f"{where}: {name} is not a plan declaration (did you mean {close!r}?)"
    names = untaken(module, plan)
    if not names:
        return None
    name, field = names[0], names[0].lower()
    where = getattr(module, "__file__", None) or module.__name__
    if is_extension(plan):
        taken = [f.name for f in dataclasses.fields(Extension)]
        hint = (f"pass it as Extension({field}={name})" if field in taken
                else f"an Extension takes only {', '.join(taken)}")
    else:
        hint = ("a plan module that re-exports or copies the built-in PLAN does not read it; declare "
                "PLAN = Extension(...) (bundlegen.plans.extension) with it")
    return f"{where}: {name} is defined but PLAN does not take it ({hint})"
