"""What a kernel author reads about a numeric failure: the worst elements (port, index,
got, reference, bound) and the error's pattern (which batches, heads, rows, columns hold
the wrong elements). Uses the bound of checks.output_error (atol + rtol * mag) and judges
nothing: the verdict stays checks.judge_outputs'."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch


from bundlegen.harness.config import Tolerance

AXES = ("b", "h", "s", "d")
#: values of one axis listed by name before the rest are only counted
LIST_AT_MOST = 8


@dataclass(frozen=True)
class WorstElement:
    port: str
    index: tuple[int, int, int, int]   # b, h, s, d
    got: float
    reference: float
    bound: float                       # atol + rtol * mag at that element

    @property
    def excess(self) -> float:
        """|got - reference| / bound: above 1 is outside the tolerance (inf for NaN/Inf)."""
        err = abs(self.got - self.reference)
        if not math.isfinite(err):
            return math.inf
        return err / self.bound if self.bound > 0 else (math.inf if err > 0 else 0.0)

    def line(self) -> str:
        b, h, s, d = self.index
        return (f"{self.port}[b={b},h={h},s={s},d={d}]  got {self.got:.6g}  reference "
                f"{self.reference:.6g}  |err| {abs(self.got - self.reference):.3g}  "
                f"bound {self.bound:.3g}  ({self.excess:.3g}x)")


@dataclass(frozen=True)
class PortPattern:
    port: str
    wrong: int                         # elements outside their bound (NaN/Inf included)
    total: int
    axes: tuple[str, ...]              # one phrase per axis b, h, s, d

    def line(self) -> str:
        return f"{self.port}: {self.wrong} of {self.total} elements wrong; " + "; ".join(self.axes)


@dataclass(frozen=True, eq=False)
class _PortError:
    port: str
    got: torch.Tensor       # float64, on the reference's device
    ref: torch.Tensor
    bound: torch.Tensor
    wrong: torch.Tensor     # bool: outside the bound (a NaN error is outside)
    excess: torch.Tensor    # |got - ref| / bound, inf where the error is not finite


def _port_errors(outputs: Mapping[str, torch.Tensor], reference, tol: Tolerance) -> list[_PortError]:
    found = []
    for port in outputs:   # dq, dk, dv, and dbias, dsinks when the graph has them
        ref = getattr(reference, port).to(torch.float64)
        if ref.numel() == 0:
            continue
        got = outputs[port].detach().to(device=ref.device, dtype=torch.float64)
        bound = getattr(reference, f"mag_{port}").to(device=ref.device, dtype=torch.float64) * tol.rtol + tol.atol
        err = (got - ref).abs()
        excess = torch.where(torch.isfinite(err), err / bound, torch.full_like(err, math.inf))
        found.append(_PortError(port, got, ref, bound, ~(err <= bound), excess))
    return found


def worst_elements(outputs: Mapping[str, torch.Tensor], reference, tol: Tolerance,
                   count: int = 8) -> tuple[WorstElement, ...]:
    """The `count` elements furthest outside (or least inside) their bound, over dq, dk, dv."""
    found = []
    for e in _port_errors(outputs, reference, tol):
        values, flat = torch.topk(e.excess.reshape(-1).nan_to_num(nan=math.inf), min(count, e.excess.numel()))
        for value, i in zip(values.tolist(), flat.tolist()):
            index = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), e.excess.shape))
            found.append((value, WorstElement(e.port, index, float(e.got[index]), float(e.ref[index]),
                                              float(e.bound[index]))))
    found.sort(key=lambda pair: -pair[0])
    return tuple(w for _, w in found[:count])


def error_patterns(outputs: Mapping[str, torch.Tensor], reference, tol: Tolerance) -> tuple[PortPattern, ...]:
    """Per output port with wrong elements: how many, and along each axis which indices
    hold them ("all 4", "only 3", ">= 192 (64 of 256)", ...)."""
    patterns = []
    for e in _port_errors(outputs, reference, tol):
        wrong = e.wrong
        n = int(wrong.sum())
        if not n:
            continue
        phrases = []
        for axis, name in enumerate(AXES):
            others = tuple(a for a in range(4) if a != axis)
            hit = wrong.any(dim=others) if others else wrong
            phrases.append(f"{name} {index_phrase(hit.nonzero().flatten().tolist(), wrong.shape[axis])}")
        patterns.append(PortPattern(e.port, n, wrong.numel(), tuple(phrases)))
    return tuple(patterns)


def index_phrase(indices: list[int], length: int) -> str:
    """Which of range(length) the sorted `indices` are, in words."""
    k = len(indices)
    if k == length:
        return f"all {length}"
    if k == 1:
        return f"only {indices[0]} (of {length})"
    contiguous = indices[-1] - indices[0] + 1 == k
    if contiguous and indices[-1] == length - 1:
        return f">= {indices[0]} ({k} of {length})"
    if contiguous and indices[0] == 0:
        return f"< {indices[-1] + 1} ({k} of {length})"
    if contiguous:
        return f"in [{indices[0]}, {indices[-1]}] ({k} of {length})"
    shown = ", ".join(map(str, indices[:LIST_AT_MOST])) + (", ..." if k > LIST_AT_MOST else "")
    return f"{{{shown}}} ({k} of {length})"
