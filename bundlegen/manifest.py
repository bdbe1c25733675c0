"""The bundle manifest (DESIGN section 9, "the bundle is the contract"): what the harness,
claims and mutants need to know about the plan that generated a bundle root, so that they
never import the plan or the generator.

`bundlegen generate` writes one per plan, canonical JSON, at
`<bundle root>/<plan>.manifest.json`, beside `<bundle root>/<level>/<plan>/*.json`:

    {"version": 2, "plan": "sdpa_bwd", "digest": "sha256:<hex>",
     "levels": [{"name": "quick", "per_case_seconds": 0.25, ...}, ...],   # lowest first
     "tolerances": {"file": "sdpa_bwd.tolerances.toml", "digest": "sha256:<hex>",
                    "classes": ["bf16-r16k", "bf16-r1k", ...]},
     "cost_model": {"h200": {<CostCoefficients fields>}, "cpu": {...}},
     "min_claim_margin": 1.5, "cpu_case_limit_s": 30.0,
     "axes": [{"name": "dtype", "title": "...", "core": true, "default": "bf16",
               "values": ["bf16", ...], "items": ["AX-DTYPE-BF16", ...]}, ...],
     "sections": [{"title": "shape catalog", "items": [{"id": "SHP-...", "title": "..."}]}, ...],
     "gates": [{"item": "GATE-FP32", "title": "...", "gate": "waiting on ...", "planned_cases": 20}],
     "extends": {"plan": "sdpa_bwd", "digest": "sha256:<hex>", "removed": ["SHP-..."]}}   # optional

`digest` is the sha256 of the plan's generated bundle files (their paths relative to the
bundle root and their texts, in path order): it changes exactly when a bundle does.
`tolerances` names the plan's tolerance TOML beside it (bundlegen.tolerances), the only
place the classes' numbers live, with the sha256 of its text and the class names; loading
the manifest reads the numbers from it and refuses a TOML whose digest differs.

`extends` is present only in the manifest of a workspace plan that extends the built-in
one (bundlegen.plans.extension): its bundles hold only the cases it adds, the built-in
plan's bundles are read where the package installed them, and `extends` records their
digest when the workspace generated, and the items whose built-in cases it leaves out.
Loading such a manifest refuses built-in bundles whose digest has changed since.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from bundlegen import safe_read, strict_json
from bundlegen.cost import COEFFICIENT_FIELDS, DEVICE_CLASSES, REQUIRED_FIELDS, CostCoefficients
from bundlegen.graph import BundleError, canonical_json
from bundlegen.tolerance import Tolerance
from bundlegen.tolerances import read_tolerances, text_digest, tolerances_name

MANIFEST_VERSION = 2
MANIFEST_SUFFIX = ".manifest.json"
#: the keys each object of a manifest may have, and nothing else
TOP_KEYS = ("version", "plan", "digest", "levels", "tolerances", "cost_model", "min_claim_margin",
            "cpu_case_limit_s", "axes", "sections", "gates", "extends")
LEVEL_KEYS = ("name", "per_case_seconds", "per_case_bytes", "budget_seconds", "per_case_cpu_seconds")
TOLERANCES_KEYS = ("file", "digest", "classes")
AXIS_KEYS = ("name", "title", "core", "default", "values", "items")
SECTION_KEYS = ("title", "items")
ITEM_KEYS = ("id", "title")
GATE_KEYS = ("item", "title", "gate", "planned_cases")
EXTENDS_KEYS = ("plan", "digest", "removed")
#: the cost model's rates (per second) that divide a case's work: below this floor every
#: case is predicted past every limit and skipped, so a run would go green having run none
RATE_FIELDS = ("engine_flops_per_s", "oracle_flops_per_s", "bytes_per_s", "check_bytes_per_s")
MIN_RATE_PER_S = 1e3
LEVEL_NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
RUN_FIELDS = ("ordinary_runs", "requested_runs")   # DeterminismRuns: whole numbers


@dataclass(frozen=True)
class LevelLimits:
    """A level's per-case ceilings (h200 prediction; cpu seconds at quick) and the
    cumulative budget of it and every lower level."""
    name: str
    per_case_seconds: float
    per_case_bytes: int
    budget_seconds: float
    per_case_cpu_seconds: float | None = None


@dataclass(frozen=True)
class AxisItems:
    """One plan axis: its values in plan order and the AX- item of each."""
    name: str
    title: str
    core: bool
    default: str
    values: tuple[str, ...]
    items: tuple[str, ...]


@dataclass(frozen=True)
class Item:
    id: str
    title: str


@dataclass(frozen=True)
class Section:
    """Plan items outside the axes, grouped as the support matrix shows them."""
    title: str
    items: tuple[Item, ...]


@dataclass(frozen=True)
class Gate:
    item: str
    title: str
    gate: str
    planned_cases: int


@dataclass(frozen=True)
class Extends:
    """The built-in plan an extension's bundles add to: its name, the digest of its bundles
    when the extension was generated (reused by reference, never copied) and the items
    whose built-in cases the extension leaves out (removed or gated)."""
    plan: str
    digest: str
    removed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Manifest:
    plan: str
    digest: str
    levels: tuple[LevelLimits, ...]
    tolerance_classes: Mapping[str, Tolerance]    # read from the tolerance TOML
    tolerances_digest: str                        # the sha256 of that TOML's text
    cost_model: Mapping[str, CostCoefficients]
    min_claim_margin: float
    cpu_case_limit_s: float
    axes: tuple[AxisItems, ...]
    sections: tuple[Section, ...]
    gates: tuple[Gate, ...]
    extends: Extends | None = None

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(lv.name for lv in self.levels)

    def levels_upto(self, level: str) -> tuple[str, ...]:
        """The level and every lower one, lowest first; ValueError for an unknown level."""
        names = self.level_names
        if level not in names:
            raise ValueError(f"unknown level {level!r} (known: {', '.join(names)})")
        return names[: names.index(level) + 1]

    def default_items(self) -> frozenset[str]:
        """The AX- items of every axis's default value."""
        return frozenset(a.items[a.values.index(a.default)] for a in self.axes)

    def to_json(self) -> dict:
        out = {
            "version": MANIFEST_VERSION, "plan": self.plan, "digest": self.digest,
            "levels": [{"name": lv.name, "per_case_seconds": lv.per_case_seconds,
                        "per_case_bytes": lv.per_case_bytes, "budget_seconds": lv.budget_seconds,
                        "per_case_cpu_seconds": lv.per_case_cpu_seconds} for lv in self.levels],
            "tolerances": {"file": tolerances_name(self.plan), "digest": self.tolerances_digest,
                           "classes": sorted(self.tolerance_classes)},
            "cost_model": {name: {f: getattr(k, f) for f in COEFFICIENT_FIELDS}
                           for name, k in sorted(self.cost_model.items())},
            "min_claim_margin": self.min_claim_margin, "cpu_case_limit_s": self.cpu_case_limit_s,
            "axes": [{"name": a.name, "title": a.title, "core": a.core, "default": a.default,
                      "values": list(a.values), "items": list(a.items)} for a in self.axes],
            "sections": [{"title": s.title, "items": [{"id": i.id, "title": i.title} for i in s.items]}
                         for s in self.sections],
            "gates": [{"item": g.item, "title": g.title, "gate": g.gate, "planned_cases": g.planned_cases}
                      for g in self.gates],
        }
        if self.extends is not None:     # absent from a plan that extends none
            out["extends"] = {"plan": self.extends.plan, "digest": self.extends.digest,
                              "removed": list(self.extends.removed)}
        return out


def manifest_name(plan: str) -> str:
    return f"{plan}{MANIFEST_SUFFIX}"


def manifest_text(manifest: Manifest) -> str:
    return canonical_json(manifest.to_json())


def plans_in(root: Path | str) -> tuple[str, ...]:
    """The plans that have a manifest in `root`, sorted."""
    return tuple(sorted(p.name[: -len(MANIFEST_SUFFIX)] for p in Path(root).glob(f"*{MANIFEST_SUFFIX}")))


def manifest_path(root: Path | str, plan: str | None = None) -> Path:
    """`root`'s manifest of `plan`, or of its only plan; BundleError (one line) when `plan`
    has none there, or when `plan` is None and the root holds no plan or several."""
    root = Path(root)
    plans = plans_in(root)
    if plan is not None:
        path = root / manifest_name(plan)
        if not path.is_file():
            known = f"plans there: {', '.join(plans)}" if plans else "it holds no manifest"
            raise BundleError(f"no manifest for plan {plan!r} ({known})", file=str(path), case_id="-",
                              field="plan")
        return path
    if len(plans) == 1:
        return root / manifest_name(plans[0])
    if not plans:
        raise BundleError(f"no *{MANIFEST_SUFFIX} here: not a generated bundle root (run `bundlegen "
                          "generate`)", file=str(root), case_id="-", field="manifest")
    raise BundleError(f"holds several plans ({', '.join(plans)}): choose one with --plan",
                      file=str(root), case_id="-", field="plan")


def load_manifest(root: Path | str, plan: str | None = None) -> Manifest:
    """Read the manifest of `plan` (default: the only plan) in bundle root `root`, with the
    numbers of its tolerance classes from the tolerance TOML beside it; for an extension,
    check that the built-in bundles it extends are the ones it was generated against.
    Raises BundleError naming the file and the field at fault."""
    path = manifest_path(root, plan)
    manifest = read_manifest(path)
    if manifest.extends is not None:
        base_manifest(manifest, path)
    return manifest


def base_manifest(manifest: Manifest, path: Path | str = "-") -> Manifest:
    """The built-in manifest an extension's `manifest` extends; BundleError (one line) when
    it is missing or its bundles' digest is no longer the one the extension recorded."""
    from bundlegen.workspace import builtin_bundle_root

    ext = manifest.extends
    base = read_manifest(manifest_path(builtin_bundle_root(), ext.plan))
    if base.digest != ext.digest:
        raise _fail(str(path), "extends.digest",
                    f"the built-in bundles of plan {ext.plan!r} changed since this workspace generated its "
                    f"own (recorded {ext.digest}, installed {base.digest}): run `bundlegen generate`")
    return base


def read_manifest(path: Path | str, text: str | None = None, tolerances_text: str | None = None) -> Manifest:
    """The manifest at `path` (or of `text`) with its tolerance classes from the TOML it names,
    read beside `path` (or from `tolerances_text`)."""
    file = str(path)
    try:
        raw = strict_json.loads(safe_read.read_text(path) if text is None else text)
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(file, "-", f"cannot read: {exc}") from None
    except strict_json.JSONError as exc:
        raise _fail(file, "-", str(exc)) from None
    r = _Fields(file)
    top = r.obj(raw, "")
    r.only(top, TOP_KEYS, "")
    if r.get(top, "version", int, "") != MANIFEST_VERSION:
        raise _fail(file, "version", f"unsupported version {top['version']!r}")
    plan = r.get(top, "plan", str, "")
    if file.endswith(MANIFEST_SUFFIX) and Path(file).name != manifest_name(plan):
        raise _fail(file, "plan", f"is {plan!r} but the file is named {Path(file).name!r}")
    levels = tuple(
        LevelLimits(name=r.get(lv, "name", str, w), per_case_seconds=r.num(lv, "per_case_seconds", w, positive=True),
                    per_case_bytes=r.count(lv, "per_case_bytes", w, positive=True),
                    budget_seconds=r.num(lv, "budget_seconds", w, positive=True),
                    per_case_cpu_seconds=r.num(lv, "per_case_cpu_seconds", w, optional=True, positive=True))
        for w, lv in r.items(top, "levels", keys=LEVEL_KEYS))
    if not levels or len({lv.name for lv in levels}) != len(levels):
        raise _fail(file, "levels", "expected distinct level names, lowest first")
    for i, lv in enumerate(levels):
        if not LEVEL_NAME_RE.fullmatch(lv.name):     # it names a folder under the bundle root
            raise _fail(file, f"levels[{i}].name", f"{lv.name!r} is not a level name (lower-case letters, "
                        "digits, '-' and '_'; it names a folder inside the bundle root)")
    for i, (low, high) in enumerate(zip(levels, levels[1:]), 1):
        if high.budget_seconds < low.budget_seconds:     # each budget covers every lower level
            raise _fail(file, f"levels[{i}]", f"{high.name!r} (budget {high.budget_seconds:g} s) is listed "
                        f"above {low.name!r} (budget {low.budget_seconds:g} s): levels go lowest first, "
                        "as the plan orders them (a budget covers its level and every lower one)")
    tolerances, tolerances_digest = _tolerances(r, top, plan, Path(path), tolerances_text)
    cost_model = _cost_model(r, top)
    axes = tuple(
        AxisItems(name=r.get(a, "name", str, w), title=r.get(a, "title", str, w),
                  core=r.get(a, "core", bool, w), default=r.get(a, "default", str, w),
                  values=r.strings(a, "values", w), items=r.strings(a, "items", w))
        for w, a in r.items(top, "axes", keys=AXIS_KEYS))
    for i, a in enumerate(axes):
        if len(a.values) != len(a.items) or a.default not in a.values:
            raise _fail(file, f"axes[{i}]", "values and items must pair up and hold the default")
    sections = tuple(
        Section(title=r.get(s, "title", str, w),
                items=tuple(Item(r.get(i, "id", str, iw), r.get(i, "title", str, iw))
                            for iw, i in r.items(s, "items", w, keys=ITEM_KEYS)))
        for w, s in r.items(top, "sections", keys=SECTION_KEYS))
    gates = tuple(Gate(item=r.get(g, "item", str, w), title=r.get(g, "title", str, w),
                       gate=r.get(g, "gate", str, w), planned_cases=r.count(g, "planned_cases", w))
                  for w, g in r.items(top, "gates", keys=GATE_KEYS))
    extends = None
    if "extends" in top:
        e = r.obj(top["extends"], "extends")
        r.only(e, EXTENDS_KEYS, "extends")
        extends = Extends(plan=r.get(e, "plan", str, "extends"), digest=r.get(e, "digest", str, "extends"),
                          removed=r.strings(e, "removed", "extends"))
        if extends.plan == plan:
            raise _fail(file, "extends.plan", f"a plan cannot extend itself ({plan!r})")
    return Manifest(plan=plan, digest=r.get(top, "digest", str, ""), levels=levels,
                    tolerance_classes=tolerances, tolerances_digest=tolerances_digest, cost_model=cost_model,
                    min_claim_margin=r.num(top, "min_claim_margin", "", positive=True),
                    cpu_case_limit_s=r.num(top, "cpu_case_limit_s", "", positive=True),
                    axes=axes, sections=sections, gates=gates, extends=extends)


def _tolerances(r: "_Fields", top: dict, plan: str, path: Path,
                text: str | None) -> tuple[dict[str, Tolerance], str]:
    """The classes of the tolerance TOML the manifest names, checked against its digest and
    class names, and that digest."""
    entry = r.obj(r.get(top, "tolerances", dict, ""), "tolerances")
    r.only(entry, TOLERANCES_KEYS, "tolerances")
    name = r.get(entry, "file", str, "tolerances")
    if name != tolerances_name(plan):
        raise _fail(r.file, "tolerances.file", f"is {name!r}, expected {tolerances_name(plan)!r}")
    digest = r.get(entry, "digest", str, "tolerances")
    names = r.strings(entry, "classes", "tolerances")
    toml_path = path.parent / name
    if text is None:
        root = os.path.realpath(path.parent)
        if not Path(os.path.realpath(toml_path)).is_relative_to(root):
            raise _fail(r.file, "tolerances.file", f"{toml_path} leads outside the bundle root {root} (a "
                        f"symlink to {os.path.realpath(toml_path)}): the tolerance TOML must lie in it")
        try:
            text = safe_read.read_text(toml_path)
        except (OSError, UnicodeDecodeError) as exc:
            raise _fail(r.file, "tolerances.file", f"cannot read {toml_path}: {exc}") from None
    if text_digest(text) != digest:
        raise _fail(r.file, "tolerances.digest", f"{toml_path} is not the tolerance TOML the manifest "
                    "records (its sha256 differs): regenerate both with `bundlegen generate`")
    classes = read_tolerances(toml_path, text, plan)
    if sorted(classes) != sorted(names):
        raise _fail(r.file, "tolerances.classes", f"names {sorted(names)}, {toml_path} holds {sorted(classes)}")
    return classes, digest


def _cost_model(r: "_Fields", top: dict) -> dict[str, CostCoefficients]:
    """One set of coefficients per device class, every one present (the harness predicts
    CPU times with `cpu`, the generator levels with `h200`), and any engine's own class on
    one of them ("cpu/torch-math"); fields added after the first manifests may be absent."""
    model = r.get(top, "cost_model", dict, "")
    extra = [name for name in model if "/" in str(name) and str(name).split("/", 1)[0] in DEVICE_CLASSES
             and str(name).split("/", 1)[1]]
    r.only(model, (*DEVICE_CLASSES, *extra), "cost_model")
    out = {}
    for name in (*DEVICE_CLASSES, *sorted(extra)):
        where = f"cost_model.{name}"
        k = r.obj(r.get(model, name, dict, "cost_model"), where)
        r.only(k, COEFFICIENT_FIELDS, where)
        numbers = {f: r.num(k, f, where) for f in COEFFICIENT_FIELDS if f in REQUIRED_FIELDS or f in k}
        for f in RATE_FIELDS:
            if f in numbers and numbers[f] < MIN_RATE_PER_S:
                raise _fail(r.file, f"{where}.{f}", f"{numbers[f]!r} per second is below the floor of "
                            f"{MIN_RATE_PER_S:g}: every case would be predicted past its limits and skipped")
        for f in RUN_FIELDS:
            if f in numbers:
                if numbers[f] != int(numbers[f]) or numbers[f] < 1:
                    raise _fail(r.file, f"{where}.{f}", f"{numbers[f]!r}: expected a whole number of runs, 1 or more")
                numbers[f] = int(numbers[f])
        out[name] = CostCoefficients(**numbers)
    return out


def _fail(file: str, fieldname: str, message: str) -> BundleError:
    return BundleError(message, file=file, case_id="-", field=fieldname)


class _Fields:
    """Typed field access raising BundleError with the field's dotted path."""

    def __init__(self, file: str):
        self.file = file

    def obj(self, value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise _fail(self.file, where or "-", f"expected an object, got {type(value).__name__}")
        return value

    def get(self, obj: Any, key: str, types: type, where: str) -> Any:
        name = f"{where}.{key}" if where else key
        obj = self.obj(obj, where)
        if key not in obj:
            raise _fail(self.file, name, "missing")
        value = obj[key]
        if (isinstance(value, bool) and types is not bool) or not isinstance(value, types):
            raise _fail(self.file, name, f"expected {types.__name__}, got {type(value).__name__}")
        return value

    def only(self, obj: dict, keys: tuple[str, ...], where: str) -> None:
        """Refuse a key the object does not have: a misspelt one would be ignored."""
        for key in obj:
            if key not in keys:
                name = f"{where}.{key}" if where else key
                raise _fail(self.file, name, f"unknown key (known: {', '.join(keys)})")

    def num(self, obj: Any, key: str, where: str, *, optional: bool = False,
            positive: bool = False) -> float | None:
        """A finite number >= 0 (> 0 when `positive`); None for an `optional` null."""
        name = f"{where}.{key}" if where else key
        value = self.obj(obj, where).get(key)
        if value is None and optional and key in obj:
            return None
        bound = "> 0" if positive else ">= 0"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(self.file, name, f"expected a number {bound}, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number) or number < 0 or (positive and number == 0):
            raise _fail(self.file, name, f"expected a number {bound} (finite), got {value!r}")
        return number

    def count(self, obj: Any, key: str, where: str, *, positive: bool = False) -> int:
        """A whole number >= 0 (> 0 when `positive`)."""
        value = self.get(obj, key, int, where)
        if value < 0 or (positive and value == 0):
            raise _fail(self.file, f"{where}.{key}" if where else key,
                        f"expected a whole number {'> 0' if positive else '>= 0'}, got {value!r}")
        return value

    def strings(self, obj: Any, key: str, where: str) -> tuple[str, ...]:
        values = self.get(obj, key, list, where)
        if not all(isinstance(v, str) for v in values):
            raise _fail(self.file, f"{where}.{key}", "expected a list of strings")
        return tuple(values)

    def items(self, obj: Any, key: str, where: str = "", *, keys: tuple[str, ...]):
        """(dotted path, element) of a list field whose elements are objects with `keys`."""
        name = f"{where}.{key}" if where else key
        for i, value in enumerate(self.get(obj, key, list, where)):
            element = self.obj(value, f"{name}[{i}]")
            self.only(element, keys, f"{name}[{i}]")
            yield f"{name}[{i}]", element
