"""Rendering a GeneratedPlan to files, writing them into a bundle root, and checking a
bundle root against the plan.

Bundles: <bundle root>/<level>/<plan>/<group>.json, canonical JSON, cases sorted by id.
Manifest: <bundle root>/<plan>.manifest.json (bundlegen.manifest), its digest over the
bundle texts. Tolerance TOML: <bundle root>/<plan>.tolerances.toml (bundlegen.tolerances),
the manifest records its digest.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from bundlegen import safe_read, safe_write
from bundlegen.graph import Bundle, canonical_json
from bundlegen.manifest import (AxisItems, Gate, Item, LevelLimits, Manifest, Section, manifest_name,
                                manifest_text)
from bundlegen.tolerances import text_digest, tolerances_name, tolerances_text
from bundlegen.generator import ragged
from bundlegen.generator.expand import axis_item
from bundlegen.generator.records import GeneratedPlan


def bundle_relpath(level: str, plan: str, group: str) -> str:
    """<level>/<plan>/<group>.json, relative to the bundle root."""
    return f"{level}/{plan}/{group}.json"


# ----------------------------------------------------------------------------- bundles
def bundle_texts(generated: GeneratedPlan) -> dict[str, str]:
    groups: dict[tuple[str, str], list] = {}
    for case in generated.cases:
        groups.setdefault((case.level, case.group), []).append(case)
    out = {}
    for (level, group), cases in sorted(groups.items()):
        bundle = Bundle(level=level, group=group, cases=tuple(sorted(cases, key=lambda c: c.id)),
                        plan=generated.plan.name)
        out[bundle_relpath(level, generated.plan.name, group)] = canonical_json(bundle.to_json())
    return out


# ----------------------------------------------------------------------------- manifest
def digest(texts: dict[str, str]) -> str:
    h = hashlib.sha256()
    for rel in sorted(texts):
        h.update(rel.encode("utf-8") + b"\0" + texts[rel].encode("utf-8") + b"\0")
    return f"sha256:{h.hexdigest()}"


def plan_tolerances_text(generated: GeneratedPlan) -> str:
    return tolerances_text(generated.plan.name, generated.plan.tolerance_classes)


def _plan_fields(generated: GeneratedPlan, texts: dict[str, str]) -> dict:
    """The manifest fields every plan has: its name, the bundles' digest, the levels'
    limits, the tolerance classes (and their TOML's digest), the cost model and margins."""
    plan = generated.plan
    return dict(
        plan=plan.name, digest=digest(texts),
        levels=tuple(LevelLimits(lv.name, lv.per_case_seconds, lv.per_case_bytes, lv.budget_seconds,
                                 lv.per_case_cpu_seconds) for lv in plan.levels),
        tolerance_classes=dict(plan.tolerance_classes),
        tolerances_digest=text_digest(plan_tolerances_text(generated)),
        cost_model=dict(plan.cost_model), min_claim_margin=float(plan.min_claim_margin),
        cpu_case_limit_s=float(plan.cpu_case_limit_s))


def build_manifest(generated: GeneratedPlan, texts: dict[str, str] | None = None) -> Manifest:
    """What the harness, claims and mutants need of the plan, for bundles `texts`."""
    plan = generated.plan
    texts = bundle_texts(generated) if texts is None else texts
    if generated.extends is not None:
        return _extension_manifest(generated, texts)
    return Manifest(
        **_plan_fields(generated, texts),
        axes=tuple(AxisItems(a.name, a.title, a.core, a.default, tuple(a.values),
                             tuple(axis_item(a.name, v) for v in a.values)) for a in plan.padded.axes)
        + _ragged_axes(plan),
        sections=(Section("shape catalog", tuple(Item(e.item, e.purpose) for e in plan.padded.catalog + _ragged(plan, "catalog"))),
                  Section("regressions", tuple(Item(r.item, r.defect)
                                               for r in plan.padded.regressions + _ragged(plan, "regressions"))))
        + _boundary_section(plan),
        gates=tuple(Gate(g.item, g.title, g.gate, g.planned_cases) for g in plan.gated))


def _extension_manifest(generated: GeneratedPlan, texts: dict[str, str]) -> Manifest:
    """An extension's manifest: the built-in manifest's axes, its sections with the added
    items appended, its gates and the new ones, the levels with the extension's budgets, and
    `extends` (the built-in bundles' digest); `digest` covers only the extension's bundles."""
    plan, base = generated.plan, generated.base_manifest
    added = {"shape catalog": plan.padded.catalog + _ragged(plan, "catalog"),
             "regressions": plan.padded.regressions + _ragged(plan, "regressions")}
    sections = tuple(Section(s.title, s.items + tuple(Item(e.item, getattr(e, "purpose", None) or e.defect)
                                                      for e in added.get(s.title, ())))
                     for s in base.sections)
    return Manifest(
        **_plan_fields(generated, texts), axes=base.axes, sections=sections,
        gates=base.gates + tuple(Gate(g.item, g.title, g.gate, g.planned_cases)
                                 for g in generated.base_gates + plan.gated),
        extends=generated.extends)


def _boundary_section(plan) -> tuple[Section, ...]:
    if plan.boundaries is None:
        return ()
    return (Section("boundary classes", tuple(Item(c.item, c.title) for c in plan.boundaries.classes)),)


def _ragged(plan, entries: str) -> tuple:
    return () if plan.ragged is None else tuple(getattr(plan.ragged, entries))


def _ragged_axes(plan) -> tuple[AxisItems, ...]:
    """The ragged space's axes as manifest axes `ragged-<axis>`. Not core in the manifest:
    its core axes are the padded space's, whose value pairs the report plots (a ragged and
    a padded value never meet in one case, so their pairs would all show as missing)."""
    return tuple(AxisItems(ragged.manifest_axis(a.name), f"ragged: {a.title}", False, a.default, tuple(a.values),
                           tuple(ragged.item(a.name, v) for v in a.values)) for a in _ragged(plan, "axes"))


def planned_texts(generated: GeneratedPlan) -> dict[str, str]:
    """Every file of the plan, relative to the bundle root: bundles, the manifest and the
    tolerance TOML."""
    texts = bundle_texts(generated)
    return {**texts, manifest_name(generated.plan.name): manifest_text(build_manifest(generated, texts)),
            tolerances_name(generated.plan.name): plan_tolerances_text(generated)}


# ----------------------------------------------------------------------------- write / check
@dataclass(frozen=True)
class WriteResult:
    written: tuple[str, ...]
    unchanged: int
    removed: tuple[str, ...]


def _stale_bundles(generated: GeneratedPlan, root: Path, planned: dict[str, str]) -> list[str]:
    found = sorted(p.relative_to(root).as_posix() for p in root.glob(f"*/{generated.plan.name}/*.json"))
    return [rel for rel in found if rel not in planned]


def _current_text(path: Path) -> str | None:
    """The text at `path` as a run reads it, None when there is none to read (the writer
    then refuses a FIFO or folder there itself)."""
    try:
        return safe_read.read_text(path)
    except (OSError, UnicodeDecodeError):
        return None


def write(generated: GeneratedPlan, root: Path) -> WriteResult:
    """Write the plan's bundles and manifest into bundle root `root`; remove its stale bundles."""
    root = Path(root)
    planned = planned_texts(generated)
    written, unchanged = [], 0
    for rel, text in planned.items():
        path = root / rel
        if _current_text(path) == text:
            unchanged += 1
            continue
        safe_write.write_text(path, text, inside=root)
        written.append(rel)
    removed = _stale_bundles(generated, root, planned)
    for rel in removed:
        safe_write.unlink(root / rel, inside=root)
    return WriteResult(tuple(written), unchanged, tuple(removed))


def check(generated: GeneratedPlan, root: Path) -> list[str]:
    """One line per drift between bundle root `root` and the plan; empty when in sync."""
    root = Path(root)
    drift = []
    for rel, text in planned_texts(generated).items():
        path = root / rel
        if not os.path.lexists(path):
            drift.append(f"{rel}: missing")
            continue
        try:
            current = safe_read.read_text(path)      # as a run reads it: line ends kept
        except (OSError, UnicodeDecodeError) as exc:
            drift.append(f"{rel}: cannot read: {exc}")
            continue
        if current == text:
            continue
        if rel == manifest_name(generated.plan.name):
            drift.append(f"{rel}: {_manifest_diff(current, text)}")
        elif rel == tolerances_name(generated.plan.name):
            drift.append(f"{rel}: differs from the plan's tolerance classes")
        else:
            drift.append(f"{rel}: {_bundle_diff(current, text)}")
    for rel in _stale_bundles(generated, root, bundle_texts(generated)):
        drift.append(f"{rel}: not produced by the plan")
    return drift


def _manifest_diff(current: str, expected: str) -> str:
    try:
        have = json.loads(current)
    except (json.JSONDecodeError, RecursionError):
        return "not valid JSON"
    want = json.loads(expected)
    if not isinstance(have, dict):
        return "not a manifest object"
    fields = sorted(str(k) for k in set(want) | set(have) if want.get(k) != have.get(k))
    return f"differs in {', '.join(fields)}" if fields else "formatting differs"


def _bundle_diff(current: str, expected: str) -> str:
    try:
        have = {c.get("id"): c for c in json.loads(current).get("cases", []) if isinstance(c, dict)}
    except (json.JSONDecodeError, AttributeError):
        return "not valid bundle JSON"
    except (TypeError, RecursionError):
        return "not a bundle (cases with unhashable or nested ids)"
    want = {c["id"]: c for c in json.loads(expected)["cases"]}
    added = sorted(set(want) - set(have))
    gone = sorted(set(have) - set(want))
    changed = sorted(i for i in set(want) & set(have) if want[i] != have[i])
    parts = [f"{len(added)} case(s) to add" if added else "",
             f"{len(gone)} case(s) to remove" if gone else "",
             f"{len(changed)} case(s) differ ({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''})"
             if changed else ""]
    return "; ".join(p for p in parts if p) or "formatting differs"
