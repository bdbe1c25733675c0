"""The checks on one engine run, in the order DESIGN section 5 gives them: canaries intact,
inputs unmodified, no NaN/Inf where the oracle is finite, tolerance against the float64
oracle (CONTRACTS "Tolerance semantics"), and bitwise-equal repeated runs."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import torch

from bundlegen.graph import OUTPUT_PORTS
from bundlegen.harness import verdicts as V
from bundlegen.harness.config import Tolerance

#: the margin written when an output matches the oracle exactly (JSON has no infinity)
MARGIN_CAP = 1e9


@dataclass(frozen=True)
class OutputError:
    max_abs_err: float
    normalized_error: float   # 1 / margin
    margin: float             # min over elements of (atol + rtol * mag) / |out - ref|, capped
    within: bool              # every element inside its bound
    nonfinite: int            # NaN/Inf elements where the oracle is finite

    def to_json(self) -> dict:
        return {"max_abs_err": _json_number(self.max_abs_err),
                "normalized_error": _json_number(self.normalized_error),
                "margin": _json_number(self.margin)}


def _json_number(x: float) -> float | None:
    """Strict JSON has no NaN/Infinity: an unbounded error is written as null."""
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class Judgement:
    verdict: str
    detail: str
    outputs: Mapping[str, OutputError]
    #: port -> the statistical judge's statistical.SliceVerdict (empty when not judged so)
    statistical: Mapping = field(default_factory=dict)

    @property
    def margin(self) -> float | None:
        """The least margin against the worst-case bound."""
        margins = [e.margin for e in self.outputs.values()]
        return min(margins) if margins else None

    @property
    def statistical_margin(self) -> float | None:
        """The least margin against the statistical judge (None: not judged so)."""
        margins = [s.margin for s in self.statistical.values()]
        return min(margins) if margins else None

    def outputs_json(self) -> dict:
        """Per output, its worst-case error and margin, and its statistical judgement."""
        return {p: {**e.to_json(), **(self.statistical[p].to_json() if p in self.statistical else {})}
                for p, e in self.outputs.items()}


#: the scalars `_error_terms` reads back, in order
_TERMS = ("nonfinite", "max_err", "within", "min_ratio")


def _error_terms(out: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """float64 [len(_TERMS)] on the reference's device: every scalar output_error needs,
    computed where the reference lives (no full-size tensor leaves that device). max_err is
    NaN when any error is NaN (torch's max propagates NaN); the host reads that as the
    'NaN error' case."""
    got = out.detach().to(device=ref.device, dtype=torch.float64)
    ref = ref.to(torch.float64)
    nonfinite = torch.isfinite(got).logical_not_().logical_and_(torch.isfinite(ref)).sum(dtype=torch.float64)
    err = (got - ref).abs_()
    del got
    bound = mag.to(device=ref.device, dtype=torch.float64) * tol.rtol + tol.atol  # atol + rtol * mag, bitwise
    within = (err <= bound).all().to(torch.float64)
    # min over the elements with an error of bound / err (inf where there is none)
    ratio = torch.where(err > 0, bound / err, math.inf).min()
    return torch.stack([nonfinite, err.max(), within, ratio])


#: an output that matches the oracle exactly (or has no elements)
_EXACT = OutputError(max_abs_err=0.0, normalized_error=0.0, margin=MARGIN_CAP, within=True, nonfinite=0)


def _error_of(terms: list[float]) -> OutputError:
    t = dict(zip(_TERMS, terms))
    nonfinite = int(t["nonfinite"])
    if nonfinite or math.isnan(t["max_err"]):  # a NaN error counts as an infinite one
        return OutputError(max_abs_err=math.inf,
                           normalized_error=math.inf, margin=0.0, within=False, nonfinite=nonfinite)
    if not t["max_err"] > 0:  # no element has an error
        return _EXACT
    margin = min(t["min_ratio"], MARGIN_CAP)
    return OutputError(max_abs_err=t["max_err"],
                       normalized_error=1.0 / margin if margin > 0 else math.inf,
                       margin=margin, within=bool(t["within"]), nonfinite=0)


class PendingErrors:
    """output_error for several (out, ref, mag) at once, computed on the device and not
    yet read back: `tensors` go to `read_back` (with any other scalars of the case), and
    `resolve` turns what it read into OutputErrors."""

    def __init__(self, pairs: Mapping[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                 tol: Tolerance):
        self.names = list(pairs)
        self._terms = {name: _error_terms(out, ref, mag, tol)
                       for name, (out, ref, mag) in pairs.items() if out.numel()}

    @property
    def tensors(self) -> list[torch.Tensor]:
        return list(self._terms.values())

    def resolve(self, values: list[list[float]]) -> dict[str, OutputError]:
        """`values`: what read_back gave for `tensors`, in their order."""
        read = dict(zip(self._terms, values))
        # an output with no elements has nothing to compare: exact
        return {name: _error_of(read[name]) if name in read else _EXACT for name in self.names}


def read_back(groups: list[torch.Tensor]) -> list[list[float]]:
    """Tensors of scalars (bool, integer or float; any device), read back with one
    transfer per device: each one's values as floats, in order. Integers are exact up to
    2**53."""
    values: list[list[float] | None] = [None] * len(groups)
    by_device: dict[torch.device, list[int]] = {}
    for i, group in enumerate(groups):
        by_device.setdefault(group.device, []).append(i)
    for indices in by_device.values():
        flat = torch.cat([groups[i].reshape(-1).to(torch.float64) for i in indices]).tolist()
        for i in indices:
            n = groups[i].numel()
            values[i], flat = flat[:n], flat[n:]
    return values


def stacked(flags: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """A port -> device scalar map as one tensor, for read_back."""
    return _stack(list(flags.values()))


def _stack(scalars: list[torch.Tensor]) -> torch.Tensor:
    """Scalars computed on one device as one 1-D tensor (empty: a CPU one)."""
    return torch.stack([s.reshape(()) for s in scalars]) if scalars else torch.zeros(0)


def set_ports(flags: Mapping[str, torch.Tensor], values: list[float]) -> list[str]:
    """The ports of `flags` whose value read back (read_back of `stacked(flags)`) is set."""
    return [port for port, bad in zip(flags, values) if bad]


def output_errors(pairs: Mapping[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                  tol: Tolerance) -> dict[str, OutputError]:
    """output_error for several (out, ref, mag) at once, with one read-back per device."""
    pending = PendingErrors(pairs, tol)
    return pending.resolve(read_back(pending.tensors))


def output_error(out: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, tol: Tolerance) -> OutputError:
    """Compare one engine output (any device, io dtype) with the oracle (float64) on the
    oracle's device: for every element |out - ref| <= atol + rtol * mag; the margin is the
    least bound / |out - ref| over the elements with an error (capped at MARGIN_CAP); a
    NaN/Inf where the oracle is finite, or a NaN error, gives margin 0."""
    return output_errors({"out": (out, ref, mag)}, tol)["out"]


def output_pairs(outputs: Mapping[str, torch.Tensor], reference) -> dict[str, tuple]:
    """port -> (engine output, oracle gradient, oracle magnitude) for every output given."""
    return {port: (outputs[port], getattr(reference, port), getattr(reference, f"mag_{port}"))
            for port in outputs}


def judge_outputs(outputs: Mapping[str, torch.Tensor], reference, tol: Tolerance) -> Judgement:
    """judge_errors of the outputs (dq, dk, dv, and dbias, dsinks when the graph has them)
    against the oracle."""
    return judge_errors(output_errors(output_pairs(outputs, reference), tol), tol)


def judge_errors(errors: Mapping[str, OutputError], tol: Tolerance,
                 statistical: Mapping | None = None) -> Judgement:
    """NaN/Inf first (fail:nan), then the worst-case bound (fail:numeric), then the
    statistical judge (fail:statistical; `statistical`: port -> statistical.SliceVerdict)."""
    statistical = statistical or {}
    nan_ports = [p for p, e in errors.items() if e.nonfinite]
    if nan_ports:
        counts = ", ".join(f"{p}: {errors[p].nonfinite}" for p in nan_ports)
        return Judgement(V.FAIL_NAN, f"NaN/Inf where the oracle is finite ({counts})", errors)
    bad = [p for p, e in errors.items() if not e.within]
    if bad:
        worst = ", ".join(f"{p}: margin {errors[p].margin:.3g}, max |err| {errors[p].max_abs_err:.3g}"
                          for p in bad)
        return Judgement(V.FAIL_NUMERIC, f"outside rtol={tol.rtol:g} atol={tol.atol:g} ({worst})",
                         errors, statistical)
    unlike = [p for p, s in statistical.items() if not s.within]
    if unlike:
        return Judgement(V.FAIL_STATISTICAL, "; ".join(statistical[p].describe(p, tol) for p in unlike),
                         errors, statistical)
    return Judgement(V.PASS, "", errors, statistical)


def judge_memory(guard_ports: list[str], modified_ports: list[str]) -> tuple[str, str] | None:
    """Canaries first (fail:guard), then inputs (fail:input-modified); None when both hold."""
    if guard_ports:
        return V.FAIL_GUARD, f"canary overwritten outside the declared view: {', '.join(guard_ports)}"
    if modified_ports:
        return V.FAIL_INPUT_MODIFIED, f"input storage modified: {', '.join(modified_ports)}"
    return None


def read_flags(flags: list[torch.Tensor]) -> list[bool]:
    """Bool scalars computed on one device, read back with a single transfer."""
    return [bool(x) for x in read_back([_stack(flags)])[0]]


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same bits (so NaN == NaN and -0.0 != 0.0), over the whole storage incl. guards."""
    return not differing_ports({"t": a}, {"t": b}, ports=("t",))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def differing_ports(first: Mapping[str, torch.Tensor], again: Mapping[str, torch.Tensor],
                    ports=OUTPUT_PORTS) -> list[str]:
    """Ports whose tensors differ bitwise (shape, dtype or any bit), read back at once."""
    differ, flags = {}, []
    for p in ports:
        a, b = first[p], again[p]
        if a.shape != b.shape or a.dtype != b.dtype:
            differ[p] = True
            continue
        a_bytes = _bytes(a)
        flags.append((p, (a_bytes != _bytes(b).to(a_bytes.device)).any()))
    for (p, _), bad in zip(flags, read_flags([f for _, f in flags])):
        differ[p] = bad
    return [p for p in ports if differ[p]]


class DifferingElements:
    """Bitwise comparison of repeated runs with the first: per port, which elements of its
    storage ever differed, and in which runs (kept on the device, read back once)."""

    def __init__(self, first: Mapping[str, torch.Tensor]):
        self.first = {p: bit_pattern(t) for p, t in first.items()}
        self.mask = {p: torch.zeros_like(b, dtype=torch.bool) for p, b in self.first.items()}
        self.runs: list[int] = []
        self._flags: list[tuple[int, torch.Tensor]] = []
        self._any = False

    def add(self, run: int, again: Mapping[str, torch.Tensor]) -> None:
        differs = []
        for p, base in self.first.items():
            now = base != bit_pattern(again[p]).to(base.device)
            self.mask[p] |= now
            differs.append(now.any())
        self._flags.append((run, torch.stack(differs).any()))
        self._any = None   # read back lazily

    def any(self) -> bool:
        if self._any is None:
            flags = read_flags([f for _, f in self._flags])
            self.runs = [run for (run, _), bad in zip(self._flags, flags) if bad]
            self._any = bool(self.runs)
        return self._any

    def describe(self) -> str:
        """e.g. 'runs 3, 7 of 50 differ bitwise from run 1: dq in 12 of 4096 elements'."""
        self.any()
        counts = read_counts([self.mask[p].sum() for p in self.mask])
        parts = [f"{p} in {n} of {self.mask[p].numel()} elements"
                 for p, n in zip(self.mask, counts) if n]
        total = len(self._flags) + 1
        runs = ", ".join(str(r) for r in self.runs[:8]) + (", ..." if len(self.runs) > 8 else "")
        return (f"run{'s' if len(self.runs) > 1 else ''} {runs} of {total} differ bitwise from "
                f"run 1: {'; '.join(parts)}")


def bit_pattern(t: torch.Tensor) -> torch.Tensor:
    """A tensor's elements as integers of their width, same shape (NaN == NaN, -0.0 != 0.0)."""
    t = t.detach()
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def read_counts(counts: list[torch.Tensor]) -> list[int]:
    """Integer scalars computed on one device, read back with a single transfer."""
    return [int(x) for x in read_back([_stack(counts)])[0]]
