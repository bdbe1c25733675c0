"""Defects the mutation gate puts back into the Triton engine (mutants/catalog.py).

`TritonEngine(device, defects=KernelDefects(flag=True))` is the engine with one real defect
class switched on. Each flag is either applied by the launcher (what it tells the kernels)
or reaches the kernels as a `tl.constexpr` (`MUT_*`). The production engine has no defects:
every MUT_* is a constexpr False, so those branches are not compiled into its kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class KernelDefects:
    # launcher
    stats_packed: bool = False        # stats strides derived from Q's dims, not stats' own
    top_left: bool = False            # diagonal shift 0 whatever the alignment asked
    left_off_by_one: bool = False     # keep i - j' <= left_bound (left_bound + 1 passed)
    # kernels (tl.constexpr MUT_<NAME>)
    drop_tail: bool = False           # the loops skip the last partial Q block / KV block
    no_scale_dk: bool = False         # dK not multiplied by the scale
    row_pitch_early: bool = False     # odd rows of an odd row pitch read one element early
    delta_wrong_dtype: bool = False   # Delta from O read as fp16 (bf16 bits taken for fp16)
    masked_rows_nan: bool = False     # P = exp(S_masked - LSE): -inf - (-inf) on empty rows
    dq_fp16: bool = False             # the dQ accumulator rounded to fp16 after each KV block
    no_group_reduce: bool = False     # dK/dV from the group's first query head only

    def constexprs(self, kernel: str) -> dict[str, bool]:
        """The MUT_* constexprs `kernel` (preprocess, dkdv or dq) declares, set from these flags."""
        return {f"MUT_{name.upper()}": getattr(self, name) for name in KERNEL_FLAGS[kernel]}

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self) if getattr(self, f.name))


#: which kernel reads which flag
KERNEL_FLAGS = {
    "preprocess": ("row_pitch_early", "delta_wrong_dtype"),
    "dkdv": ("drop_tail", "no_scale_dk", "row_pitch_early", "masked_rows_nan", "no_group_reduce"),
    "dq": ("drop_tail", "row_pitch_early", "masked_rows_nan", "dq_fp16"),
}

NO_DEFECTS = KernelDefects()
