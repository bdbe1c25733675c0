"""The checks on one engine run, in the order DESIGN section 5 gives them: canaries intact,
inputs unmodified, no NaN/Inf where the oracle is finite, tolerance against the float64
oracle (CONTRACTS "Tolerance semantics"), and bitwise-equal repeated runs."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch

from bundlegen.graph import OUTPUT_PORTS
from harness import verdicts as V
from harness.config import Tolerance

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

    @property
    def margin(self) -> float | None:
        margins = [e.margin for e in self.outputs.values()]
        return min(margins) if margins else None


def output_error(out: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, tol: Tolerance) -> OutputError:
    """Compare one engine output (any device, io dtype) with the oracle (float64, CPU)."""
    got = out.detach().to(device="cpu", dtype=torch.float64)
    ref = ref.to(torch.float64)
    nonfinite = int((~torch.isfinite(got) & torch.isfinite(ref)).sum())
    err = (got - ref).abs()
    bound = tol.atol + tol.rtol * mag.to(torch.float64)
    if nonfinite or torch.isnan(err).any():
        return OutputError(max_abs_err=math.inf if nonfinite else float(err.nan_to_num(math.inf).max()),
                           normalized_error=math.inf, margin=0.0, within=False, nonfinite=nonfinite)
    within = bool((err <= bound).all())
    wrong = err > 0
    if not bool(wrong.any()):
        return OutputError(max_abs_err=0.0, normalized_error=0.0, margin=MARGIN_CAP,
                           within=True, nonfinite=0)
    margin = min(float((bound[wrong] / err[wrong]).min()), MARGIN_CAP)
    return OutputError(max_abs_err=float(err.max()),
                       normalized_error=1.0 / margin if margin > 0 else math.inf,
                       margin=margin, within=within, nonfinite=0)


def judge_outputs(outputs: Mapping[str, torch.Tensor], reference, tol: Tolerance) -> Judgement:
    """NaN/Inf first (fail:nan), then the tolerance (fail:numeric), over dq, dk, dv."""
    errors = {port: output_error(outputs[port], getattr(reference, port),
                                 getattr(reference, f"mag_{port}"), tol)
              for port in OUTPUT_PORTS}
    nan_ports = [p for p, e in errors.items() if e.nonfinite]
    if nan_ports:
        counts = ", ".join(f"{p}: {errors[p].nonfinite}" for p in nan_ports)
        return Judgement(V.FAIL_NAN, f"NaN/Inf where the oracle is finite ({counts})", errors)
    bad = [p for p, e in errors.items() if not e.within]
    if bad:
        worst = ", ".join(f"{p}: margin {errors[p].margin:.3g}, max |err| {errors[p].max_abs_err:.3g}"
                          for p in bad)
        return Judgement(V.FAIL_NUMERIC, f"outside rtol={tol.rtol:g} atol={tol.atol:g} ({worst})",
                         errors)
    return Judgement(V.PASS, "", errors)


def judge_memory(guard_ports: list[str], modified_ports: list[str]) -> tuple[str, str] | None:
    """Canaries first (fail:guard), then inputs (fail:input-modified); None when both hold."""
    if guard_ports:
        return V.FAIL_GUARD, f"canary overwritten outside the declared view: {', '.join(guard_ports)}"
    if modified_ports:
        return V.FAIL_INPUT_MODIFIED, f"input storage modified: {', '.join(modified_ports)}"
    return None


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same bits (so NaN == NaN and -0.0 != 0.0), over the whole storage incl. guards."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a_bytes = a.detach().contiguous().reshape(-1).view(torch.uint8)
    b_bytes = b.detach().contiguous().reshape(-1).view(torch.uint8)
    return bool(torch.equal(a_bytes, b_bytes.to(a_bytes.device)))


def differing_ports(first: Mapping[str, torch.Tensor], again: Mapping[str, torch.Tensor]) -> list[str]:
    return [p for p in OUTPUT_PORTS if not bitwise_equal(first[p], again[p])]
