"""True fp32 products for an fp32 graph: PyTorch may run an fp32 matmul or convolution on
a GPU's TF32 tensor cores (10-bit mantissa inputs), whose error (2^-11 relative) is far
past the fp32 tolerance classes. An engine serving fp32 io runs its work inside
`ieee_fp32()`, which turns both switches off for the block and puts them back after, so
the choice never leaks into another case or engine."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def ieee_fp32(on: bool = True):
    """torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 off for
    the block when `on` (an fp32 graph), as they were after it."""
    if not on:
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn
