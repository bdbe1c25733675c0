"""Fitting the cost model (a plan's COST_MODEL, e.g. plans/sdpa_bwd.py) to measured case times.

Each executed case of a run (a results.jsonl record whose engine ran) is joined by case id
with its graph from the bundles; `bundlegen.cost.terms(graph)` gives its features. The fit
is a non-negative least squares of the measured `wall_s` in the model's own form, each
level weighted the same (a case counts sqrt(cases of its level) / its level's total):

    wall_s = engine_flops / engine_flops_per_s + oracle_flops / oracle_flops_per_s
             + io_bytes / bytes_per_s + overhead_s x runs

(runs: the engine runs of a case, CostTerms.runs) i.e. linear in (1/rate, 1/rate, 1/bandwidth, overhead). A rate the data cannot resolve
(its term explains under 0.1 % of the measured time, e.g. a fitted inverse of 0 or a
feature collinear with the others) keeps the plan's value and the other terms are refitted around it, so a written
plan never holds an infinite rate. `probe_s` is not fitted (probes are never executed);
probes count in the per-level sums at the model's `probe_s`.

`run_start_s`, the once-per-run time around the cases, is not part of that fit: it is the
median `outside_cases_s` of the given runs' run.json files (kept when none has one).

`write_coefficients` edits, in place, only the number literals of one COST_MODEL entry.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch

from bundlegen import safe_write
from bundlegen.cost import CostCoefficients, CostTerms, seconds, terms
from bundlegen.graph import BundleError, Case, load_bundle
from bundlegen.results_file import read_results, read_run_times, results_file

#: the coefficients the fit sets, in the order of the feature columns
FITTED = ("engine_flops_per_s", "oracle_flops_per_s", "bytes_per_s", "overhead_s")
RATES = FITTED[:3]
#: what --write puts into the plan: the fitted coefficients and the measured run start
WRITTEN = FITTED + ("run_start_s",)
#: which device class a record's arch measures
DEVICE_CLASS_OF_ARCH = {"sm90": "h200", "cpu": "cpu"}
SIGNIFICANT_DIGITS = 3
#: a rate whose term explains less than this share of the measured time is not resolved
NEGLIGIBLE_SHARE = 1e-3


class CalibrationError(ValueError):
    pass


# ----------------------------------------------------------------------------- samples
@dataclass(frozen=True)
class Sample:
    """One executed case: its cost-model features and its measured seconds."""
    case_id: str
    level: str
    terms: CostTerms
    wall_s: float


@dataclass(frozen=True)
class Timed:
    """A record the model does not fit but the level sums count (probes) or report."""
    case_id: str
    level: str
    wall_s: float


@dataclass(frozen=True)
class SampleSet:
    executed: tuple[Sample, ...]
    probes: tuple[Timed, ...]
    not_executed: tuple[Timed, ...]   # declined, skipped, crashed before the engine ran, ...
    unmatched: int                    # executed records whose case id no bundle holds
    other_device: int                 # records of another device class


def read_records(paths: Iterable[Path | str]) -> list[dict]:
    records: list[dict] = []
    for p in paths:
        file = results_file(p)
        if not file.is_file():
            raise CalibrationError(f"no results file at {p}")
        records.extend(read_results(file))
    return records


def run_starts(paths: Iterable[Path | str], device_class: str) -> list[float]:
    """Seconds outside the cases (run.json outside_cases_s) of each given run of this device
    class that has a run.json."""
    starts = []
    for p in paths:
        times = read_run_times(results_file(p).parent)
        if times is not None and DEVICE_CLASS_OF_ARCH.get(times.arch) == device_class:
            starts.append(times.outside_cases_s)
    return starts


def fitted_run_start(starts: Sequence[float], prior: CostCoefficients) -> float:
    if not starts:
        return prior.run_start_s
    ordered = sorted(starts)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return round_significant(median)


def case_index(bundle_root: Path | str, plan: str) -> dict[str, Case]:
    """Every case of every level of `plan` under `bundle_root`, by id (a malformed case is
    left out: it has no measured time to fit)."""
    out: dict[str, Case] = {}
    for path in sorted(Path(bundle_root).glob(f"*/{plan}/*.json")):
        try:
            bundle, _errors = load_bundle(path)
        except BundleError:
            continue
        out.update((c.id, c) for c in bundle.cases)
    return out


def device_class_of(record: Mapping) -> str | None:
    return DEVICE_CLASS_OF_ARCH.get(str(record.get("arch", "")))


def collect(records: Iterable[Mapping], cases: Mapping[str, Case], device_class: str) -> SampleSet:
    executed, probes, idle = [], [], []
    unmatched = other = 0
    for r in records:
        if device_class_of(r) != device_class:
            other += 1
            continue
        wall = float(r.get("wall_s") or 0.0)
        case_id, level = str(r.get("case_id", "")), str(r.get("level", ""))
        if r.get("purpose") == "probe":
            probes.append(Timed(case_id, level, wall))
        elif r.get("engine_s") is None:
            idle.append(Timed(case_id, level, wall))
        elif case_id not in cases:
            unmatched += 1
        else:
            executed.append(Sample(case_id, level, terms(cases[case_id].graph), wall))
    return SampleSet(tuple(executed), tuple(probes), tuple(idle), unmatched, other)


# ----------------------------------------------------------------------------- fit
def features(t: CostTerms) -> list[float]:
    return [float(t.engine_flops), float(t.oracle_flops), float(t.io_bytes), float(t.runs)]


def nnls(A: torch.Tensor, b: torch.Tensor, max_iter: int | None = None) -> torch.Tensor:
    """argmin ||A x - b|| subject to x >= 0 (Lawson-Hanson active set), float64.
    Columns are scaled to unit norm first, so features of very different size
    (FLOPs ~1e12, a constant 1) do not decide the tolerances."""
    A, b = A.to(torch.float64), b.to(torch.float64)
    norms = A.norm(dim=0)
    norms = torch.where(norms > 0, norms, torch.ones_like(norms))
    As = A / norms
    n = As.shape[1]
    x = torch.zeros(n, dtype=torch.float64)
    passive = torch.zeros(n, dtype=torch.bool)
    tol = 1e-12 * max(1.0, float(b.norm()))
    for _ in range(max_iter or 3 * n + 10):
        w = As.T @ (b - As @ x)
        w[passive] = -math.inf
        if passive.all() or float(w.max()) <= tol:
            break
        passive[int(w.argmax())] = True
        while True:
            s = torch.zeros(n, dtype=torch.float64)
            s[passive] = torch.linalg.lstsq(As[:, passive], b.unsqueeze(1)).solution.squeeze(1)
            if bool((s[passive] > 0).all()):
                x = s
                break
            blocking = passive & (s <= 0)
            gap = x[blocking] - s[blocking]
            alpha = float(torch.where(gap > 0, x[blocking] / gap, torch.zeros_like(gap)).min())
            x = x + alpha * (s - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x / norms


@dataclass(frozen=True)
class Fit:
    coefficients: CostCoefficients   # rounded to SIGNIFICANT_DIGITS, as written into the plan
    kept: tuple[str, ...]            # rates the data could not resolve: the prior's value
    samples: int


def inverse(coeffs: CostCoefficients) -> list[float]:
    """The model's linear form: (1/rate, 1/rate, 1/bandwidth, overhead)."""
    return [1.0 / getattr(coeffs, f) for f in RATES] + [coeffs.overhead_s]


def fit(samples: Sequence[Sample], prior: CostCoefficients) -> Fit:
    if len(samples) < len(FITTED):
        raise CalibrationError(f"{len(samples)} executed case(s); the fit needs at least {len(FITTED)}")
    X = torch.tensor([features(s.terms) for s in samples], dtype=torch.float64)
    y = torch.tensor([s.wall_s for s in samples], dtype=torch.float64)
    prior_theta = inverse(prior)
    total = float(y.sum())
    if total <= 0:
        raise CalibrationError("the measured cases took no time")
    # The target is a relative error per level, so each level weighs the same: a case of a
    # level with n cases and measured total T counts sqrt(n) / T (a misfit shared by the n
    # cases then costs the same squared relative error in every level). Unweighted, the few
    # long cases of the upper levels would decide the fit and quick's short ones be left off.
    level_total: dict[str, float] = {}
    level_count: dict[str, int] = {}
    for s in samples:
        level_total[s.level] = level_total.get(s.level, 0.0) + s.wall_s
        level_count[s.level] = level_count.get(s.level, 0) + 1
    w = torch.tensor([math.sqrt(level_count[s.level]) / level_total[s.level]
                      if level_total[s.level] > 0 else 0.0 for s in samples], dtype=torch.float64)
    fixed: set[int] = set()
    while True:
        free = [j for j in range(len(FITTED)) if j not in fixed]
        target = y - sum((X[:, j] * prior_theta[j] for j in fixed), torch.zeros_like(y))
        solution = nnls(X[:, free] * w[:, None], target * w)
        theta = list(prior_theta)
        for j, value in zip(free, solution.tolist()):
            theta[j] = value
        share = {j: float(X[:, j].sum()) * theta[j] / total for j in free}
        unresolved = {j for j in free if j < len(RATES) and share[j] < NEGLIGIBLE_SHARE}
        if not unresolved:
            break
        fixed |= unresolved
    values = {f: 1.0 / theta[j] for j, f in enumerate(RATES)}
    values["overhead_s"] = theta[3]
    rounded = {f: round_significant(v) for f, v in values.items()}
    return Fit(coefficients=replace(prior, **rounded),
               kept=tuple(FITTED[j] for j in sorted(fixed)), samples=len(samples))


def flop_correlation(samples: Sequence[Sample]) -> float:
    """Pearson correlation of engine and oracle FLOPs over the samples: near 1, the fit
    splits their time between the two rates only loosely (their sum is well fitted)."""
    if len(samples) < 2:
        return 1.0
    pair = torch.tensor([[s.terms.engine_flops, s.terms.oracle_flops] for s in samples],
                        dtype=torch.float64)
    return float(torch.corrcoef(pair.T)[0, 1])


# ----------------------------------------------------------------------------- per level
@dataclass(frozen=True)
class LevelError:
    level: str
    cases: int
    measured_s: float
    before_s: float     # predicted with the plan's coefficients
    after_s: float      # predicted with the fitted coefficients

    @staticmethod
    def relative(predicted: float, measured: float) -> float:
        return (predicted - measured) / measured if measured > 0 else math.inf

    @property
    def before_error(self) -> float:
        return self.relative(self.before_s, self.measured_s)

    @property
    def after_error(self) -> float:
        return self.relative(self.after_s, self.measured_s)


def level_errors(samples: SampleSet, before: CostCoefficients, after: CostCoefficients,
                 levels: Sequence[str]) -> list[LevelError]:
    """Per level (its own cases: executed ones and probes), then a 'total' row."""
    rows = []
    for level in [*levels, None]:
        ex = [s for s in samples.executed if level is None or s.level == level]
        pr = [p for p in samples.probes if level is None or p.level == level]
        if not ex and not pr:
            continue
        rows.append(LevelError(
            level=level or "total", cases=len(ex) + len(pr),
            measured_s=sum(s.wall_s for s in ex) + sum(p.wall_s for p in pr),
            before_s=sum(seconds(s.terms, before) for s in ex) + len(pr) * before.probe_s,
            after_s=sum(seconds(s.terms, after) for s in ex) + len(pr) * after.probe_s))
    return rows


# ----------------------------------------------------------------------------- plan text
def round_significant(x: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    return float(f"{x:.{digits - 1}e}")


def format_number(x: float) -> str:
    """A float literal with SIGNIFICANT_DIGITS digits, engineering exponent: 213e12, 2.05e9,
    0.0312."""
    x = round_significant(x)
    if x == 0.0:
        return "0.0"
    if 1e-3 <= abs(x) < 1e3:
        text = f"{x:.{SIGNIFICANT_DIGITS}g}"
    else:
        exp3 = 3 * math.floor(math.log10(abs(x)) / 3)
        text = f"{x / 10 ** exp3:.{SIGNIFICANT_DIGITS}g}e{exp3}"
    if not any(c in text for c in ".e"):
        text += ".0"
    return text


def coefficient_block(device_class: str, coeffs: CostCoefficients, indent: int = 4) -> str:
    """The COST_MODEL entry as it would be pasted into the plan."""
    head = " " * indent + f'"{device_class}": CostCoefficients('
    parts = [f"{f}={format_number(getattr(coeffs, f))}" for f in WRITTEN]
    pad = " " * len(head)
    return f"{head}{parts[0]}, {parts[1]},\n{pad}{parts[2]}, {parts[3]},\n{pad}{parts[4]}),"


@dataclass(frozen=True)
class Edit:
    field: str
    old: str
    new: str


def _entry_call(tree: ast.Module, device_class: str) -> ast.Call:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if not any(isinstance(t, ast.Name) and t.id == "COST_MODEL" for t in targets):
            continue
        if not isinstance(node.value, ast.Dict):
            raise CalibrationError("COST_MODEL is not a dict literal")
        for key, value in zip(node.value.keys, node.value.values):
            if isinstance(key, ast.Constant) and key.value == device_class:
                if not isinstance(value, ast.Call):
                    raise CalibrationError(f"COST_MODEL[{device_class!r}] is not a call")
                return value
        raise CalibrationError(f"COST_MODEL has no entry {device_class!r}")
    raise CalibrationError("no COST_MODEL assignment at the plan's top level")


def _literal_nodes(call: ast.Call) -> dict[str, ast.Constant]:
    """Field name -> the number literal that sets it (keyword or positional)."""
    names = [f.name for f in fields(CostCoefficients)]
    found = {names[i]: arg for i, arg in enumerate(call.args)}
    found.update({kw.arg: kw.value for kw in call.keywords if kw.arg})
    out = {}
    for name in WRITTEN:
        node = found.get(name)
        if node is None:
            raise CalibrationError(f"the entry does not set {name}")
        if not (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
                and not isinstance(node.value, bool)):
            raise CalibrationError(f"{name} is not a number literal; edit it by hand")
        out[name] = node
    return out


def write_coefficients(plan_path: Path | str, device_class: str, coeffs: CostCoefficients) -> list[Edit]:
    """Replace the number literals of COST_MODEL[device_class]'s fitted fields in the plan
    file, leaving every other byte as it was. Returns the edits made."""
    path = Path(plan_path)
    data = path.read_bytes()
    call = _entry_call(ast.parse(data), device_class)
    nodes = _literal_nodes(call)
    # ast offsets are UTF-8 byte columns, so the edit works on bytes
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = []
    for name, node in nodes.items():
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        spans.append((begin, end, name))
    edits, out = [], data
    for begin, end, name in sorted(spans, reverse=True):
        new = format_number(getattr(coeffs, name))
        edits.append(Edit(name, data[begin:end].decode(), new))
        out = out[:begin] + new.encode() + out[end:]
    written = _literal_nodes(_entry_call(ast.parse(out), device_class))
    for name in WRITTEN:
        if float(written[name].value) != float(format_number(getattr(coeffs, name))):
            raise CalibrationError(f"rewrite check failed for {name}")  # the file is not written
    if out != data:
        safe_write.write_bytes(path, out)   # the caller checked it lies in the workspace
    return sorted(edits, key=lambda e: WRITTEN.index(e.field))
