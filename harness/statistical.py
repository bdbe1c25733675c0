"""The statistical judge (docs/CONTRACTS.md, "Statistical judge"), beside the worst-case
bound of harness/checks.py. The bound never fails a correct kernel, but where a gradient's
terms cancel (dQ, dK, dBias, dSinks) it is many times the gradient and cannot see an error
of a few per cent. This judge compares the engine's error with the error an honest
computation in the graph's io dtype makes on the same inputs: the io-precision reference
(harness/oracle.py, `io_precision`), both measured against the float64 oracle.

An output is cut into slices: (batch, head) of a padded dQ, dK, dV; (sequence, head) of a
ragged one; (batch, head) of a rank-4 dBias over its own axes (one slice when it sums over
both); dSinks whole. In every slice whose reference is not all zero, the engine's relative
RMS error must stay within k x the reference's plus `floor`, and its max |error| within k x
the reference's plus `floor` x the slice's max |ref| (k and floor: the tolerance class's).
A slice's margin is the least allowed / error of the two; an output's the least over its
slices.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch

from bundlegen.harness.checks import MARGIN_CAP
from bundlegen.tolerance import Tolerance

F64 = torch.float64
#: per slice, in this order: sum err^2, sum honest err^2, sum ref^2, max |err|, max |honest err|, max |ref|
_TERMS = 6


@dataclass(frozen=True)
class Slicing:
    """How one output splits: its `lead` leading axes index the slices; or, for a ragged
    output's judged rows [R, H, D], `rows` gives each sequence's rows (slices: sequence x
    head), in order and back to back."""
    lead: int = 0
    rows: tuple[int, ...] | None = None

    def label(self, index: int, shape: tuple[int, ...]) -> str:
        if self.rows is not None:
            return f"sequence {index // shape[1]}, head {index % shape[1]}"
        if self.lead == 2:
            return f"batch {index // shape[1]}, head {index % shape[1]}"
        return "whole output"


def slicing_of(port: str, shape: tuple[int, ...],
               sequence_rows: Mapping[str, tuple[int, ...]] | None) -> Slicing:
    """The slices of output `port` (judged rows' shape `shape`)."""
    if port in ("dq", "dk", "dv"):
        if sequence_rows is not None:
            return Slicing(rows=sequence_rows[port])
        return Slicing(lead=2)
    if port == "dbias" and len(shape) == 4:
        return Slicing(lead=2)
    return Slicing()


@dataclass(frozen=True)
class SliceVerdict:
    """An output's statistical judgement: its least margin and where it was."""
    margin: float
    slice: str = ""
    measure: str = ""        # "relative RMS error" or "max |error|"
    error: float = 0.0       # the engine's, in that measure
    honest: float = 0.0      # the io-precision reference's, in that measure
    slices: int = 0          # the slices judged (reference not all zero)

    @property
    def within(self) -> bool:
        return self.margin >= 1.0

    @property
    def ratio(self) -> float:
        """The engine's error over the honest one (inf when that is 0)."""
        return self.error / self.honest if self.honest > 0 else (math.inf if self.error > 0 else 0.0)

    def to_json(self) -> dict:
        ratio = self.ratio
        return {"statistical_margin": self.margin, "slice": self.slice, "measure": self.measure,
                "error_ratio": ratio if math.isfinite(ratio) else None}

    def describe(self, port: str, tol: Tolerance) -> str:
        return (f"{port} {self.slice}: {self.measure} {self.error:.3g} = {self.ratio:.3g}x the io-precision "
                f"reference's {self.honest:.3g} (k {tol.k:g}, floor {tol.floor:g})")


#: an output with no slice to judge (empty, or its reference all zero)
NOTHING_JUDGED = SliceVerdict(margin=MARGIN_CAP)


def slice_terms(out: torch.Tensor, ref: torch.Tensor, honest: torch.Tensor, how: Slicing) -> torch.Tensor:
    """float64 [_TERMS, slices] on the reference's device (see _TERMS)."""
    ref = ref.to(F64)
    err = out.detach().to(device=ref.device, dtype=F64) - ref
    honest_err = honest.to(device=ref.device, dtype=F64) - ref
    return torch.stack([_per_slice(t, how, square) for square in (True, False)
                        for t in (err, honest_err, ref)])


def _per_slice(t: torch.Tensor, how: Slicing, square: bool) -> torch.Tensor:
    """Per slice, the sum of squares (`square`) or the max of |t|: a 1-D float64 tensor."""
    if how.rows is not None:            # [R, H, D]: each sequence's rows, back to back
        per_row = t.square().sum(-1) if square else t.abs().amax(-1)
        parts = [part.sum(0) if square else part.amax(0) if part.shape[0] else part.new_zeros(part.shape[1])
                 for part in per_row.split(list(how.rows))]
        return torch.stack(parts).reshape(-1) if parts else per_row.new_zeros(0)
    flat = t.reshape(math.prod(t.shape[:how.lead]), -1)
    return flat.square().sum(1) if square else flat.abs().amax(1)


def resolve(values: list[float], how: Slicing, shape: tuple[int, ...], tol: Tolerance,
            tiny: float = 0.0) -> SliceVerdict:
    """The output's SliceVerdict from slice_terms' values read back (flattened). A slice whose
    reference is all below `tiny` (the output dtype's smallest normal number) is not judged:
    the io dtype holds it only as subnormals, so no relative error means anything there (the
    bound's atol judges it)."""
    n = len(values) // _TERMS
    rows = [values[i * n:(i + 1) * n] for i in range(_TERMS)]
    worst = NOTHING_JUDGED
    judged = 0
    for index, (err_sq, honest_sq, ref_sq, err_max, honest_max, ref_max) in enumerate(zip(*rows)):
        if not ref_sq > 0 or ref_max < tiny:
            continue
        judged += 1
        measures = (("relative RMS error", math.sqrt(err_sq / ref_sq), math.sqrt(honest_sq / ref_sq), tol.floor),
                    ("max |error|", err_max, honest_max, tol.floor * ref_max))
        for measure, error, honest, floor in measures:
            allowed = tol.k * honest + floor
            margin = min(allowed / error, MARGIN_CAP) if error > 0 else MARGIN_CAP
            if margin < worst.margin:
                worst = SliceVerdict(margin, how.label(index, shape), measure, error, honest)
    return SliceVerdict(worst.margin, worst.slice, worst.measure, worst.error, worst.honest, judged)


class PendingSlices:
    """The statistical judge of several outputs, computed on the device and not yet read
    back: `tensors` go to checks.read_back, `resolve` gives port -> SliceVerdict."""

    def __init__(self, outputs: Mapping[str, torch.Tensor], reference, honest,
                 sequence_rows: Mapping[str, tuple[int, ...]] | None, tol: Tolerance):
        self.tol = tol
        self._how, self._terms, self._shapes, self._tiny = {}, {}, {}, {}
        for port, out in outputs.items():
            if not out.numel():
                continue
            shape = tuple(out.shape)
            how = slicing_of(port, shape, sequence_rows)
            self._how[port], self._shapes[port] = how, shape
            self._tiny[port] = torch.finfo(out.dtype).tiny
            self._terms[port] = slice_terms(out, reference.gradient(port), honest.gradient(port), how)
        self.names = list(outputs)

    @property
    def tensors(self) -> list[torch.Tensor]:
        return list(self._terms.values())

    def resolve(self, values: list[list[float]]) -> dict[str, SliceVerdict]:
        read = dict(zip(self._terms, values))
        return {port: resolve(read[port], self._how[port], self._shapes[port], self.tol, self._tiny[port])
                if port in read else NOTHING_JUDGED for port in self.names}
