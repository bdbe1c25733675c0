"""The one tolerance record: a bound `|out - ref| <= atol + rtol * mag` (docs/CONTRACTS.md,
"Tolerance semantics") and the statistical judge's numbers beside it: per slice of an
output, the engine's relative RMS error and max |error| against the float64 oracle within
`k` x the io-precision reference's, plus `floor` (relative to the slice's scale). A plan
declares its tolerance classes with it (name, dtype, the
longest reduction the class covers), the manifest carries them to the harness, and the
harness resolves one per case (`source`: the class, or the engine's override row)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    source: str = ""          # where the numbers came from, as a result records it
    #: the statistical judge: k x the io-precision reference's error, plus floor (a fraction
    #: of the slice's RMS, or of its max |ref| for the max error); None: not judged that way
    k: float | None = None
    floor: float | None = None
    name: str = ""            # the tolerance class ("bf16-r256"); "" for an override row
    dtype: str = ""           # the io dtype the class is for
    max_reduction: int = 0    # the longest reduction (summed terms) the class covers
    covers: str = ""          # what graphs the class is for, for a reviewer
    derivation: str = ""      # how the bound was derived, for a reviewer

    def to_json(self) -> dict:
        """The numbers a result records, with their source."""
        numbers = {"rtol": self.rtol, "atol": self.atol}
        if self.k is not None:
            numbers.update(k=self.k, floor=self.floor)
        return {**numbers, "source": self.source}
