"""The interpreter's language patching runs once per launch (engines/triton/interpreter_patch.py):
a kernel whose nested @triton.jit helper is called many times walks triton.language as often
as one that calls it once, and computes the same values."""
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter as I

from bundlegen.engines.triton import interpreter_patch


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _nested_kernel(out_ptr, TRIPS: tl.constexpr):
    offs = tl.arange(0, 16)
    acc = tl.zeros([16], dtype=tl.float32) + offs
    for _ in tl.static_range(TRIPS):
        acc = _twice(acc)
    tl.store(out_ptr + offs, acc)


def _walks(trips: int, monkeypatch) -> tuple[int, torch.Tensor]:
    calls = []
    real = I.inspect.getmembers
    monkeypatch.setattr(I.inspect, "getmembers", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = torch.zeros(16)
    _nested_kernel[(1,)](out, TRIPS=trips)
    monkeypatch.setattr(I.inspect, "getmembers", real)
    return len(calls), out


def test_nested_calls_do_not_patch_again(monkeypatch):
    assert interpreter_patch.install()
    _walks(8, monkeypatch)   # the first launch rewrites the functions' source (its own walks)
    once, out1 = _walks(1, monkeypatch)
    many, out8 = _walks(8, monkeypatch)
    assert once == many > 0
    assert torch.equal(out1, torch.arange(16.0) * 2)
    assert torch.equal(out8, torch.arange(16.0) * 256)


def test_patches_are_restored_after_a_launch():
    assert interpreter_patch.install()
    before = tl.arange
    _nested_kernel[(1,)](torch.zeros(16), TRIPS=2)
    assert tl.arange is before and not interpreter_patch._launches
