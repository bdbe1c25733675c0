"""The interpreter's language patching runs once per launch (engines/triton/interpreter_patch.py):
a kernel whose nested @triton.jit helper is called many times walks triton.language as often
as one that calls it once, and computes the same values."""
import dataclasses

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


@triton.jit
def _offsets_kernel(out_ptr, stride, n):
    offs = tl.arange(0, 16)
    tl.store(out_ptr + offs, offs * stride + n - 1, mask=offs < n)


class _Builder:
    def __init__(self, options):
        self.options = options


def test_overflow_checks_whose_finding_is_dropped_are_skipped(monkeypatch):
    """With debug off the sanitizer's int64 recomputation feeds a device_assert that does
    nothing: install() turns it off, and an int add, sub or mul then runs no int64 cast."""
    assert interpreter_patch.install()
    assert not I.interpreter_builder.options.debug
    assert not I.interpreter_builder.options.sanitize_overflow
    casts = []
    real = I.interpreter_builder.create_int_cast
    monkeypatch.setattr(I.interpreter_builder, "create_int_cast",
                        lambda *a, **k: casts.append(1) or real(*a, **k))
    out = torch.zeros(16, dtype=torch.int32)
    _offsets_kernel[(1,)](out, 3, 10)
    assert not casts
    assert torch.equal(out[:10], torch.arange(10, dtype=torch.int32) * 3 + 9)


def test_overflow_checks_kept_where_they_would_assert():
    """A builder with debug on keeps its sanitizer; options of another shape are left alone."""
    checked = _Builder(I.InterpreterOptions(debug=True, sanitize_overflow=True))
    assert not interpreter_patch.skip_dead_overflow_checks(checked)
    assert checked.options.sanitize_overflow
    unchecked = _Builder(I.InterpreterOptions(debug=False, sanitize_overflow=True))
    assert interpreter_patch.skip_dead_overflow_checks(unchecked)
    assert not unchecked.options.sanitize_overflow
    odd = _Builder({"debug": False, "sanitize_overflow": True})
    assert not interpreter_patch.skip_dead_overflow_checks(odd)
    assert odd.options["sanitize_overflow"]


def test_kernels_compute_the_same_bits_without_the_dead_checks(monkeypatch):
    """The Triton engine's gradients (bias and dBias, GQA, a band, bf16) are bitwise equal
    with the sanitizer on and off."""
    from bundlegen.graph import dense_graph, with_modifiers
    from tests.triton_reference import prepare
    from tests.triton_tiles import SmallTileEngine

    graph = with_modifiers(dense_graph(B=2, H_q=4, H_k=2, S_q=33, S_kv=47, D_qk=16, right=0, dtype="bf16"),
                           bias="batch", dbias=True)
    engine = SmallTileEngine("cpu")
    outputs = []
    builder = I.interpreter_builder
    off = builder.options
    try:
        for sanitize in (True, False):
            builder.options = dataclasses.replace(off, sanitize_overflow=sanitize)
            # the launch's install() would turn the sanitizer off again
            monkeypatch.setattr(interpreter_patch, "skip_dead_overflow_checks", lambda b: not sanitize)
            prep = prepare(graph, seed=3)
            engine.run(prep.graph, prep.views)
            assert builder.options.sanitize_overflow == sanitize
            outputs.append({p: prep.views[p].clone() for p in ("dq", "dk", "dv", "dbias")})
    finally:
        builder.options = off
    for port, bits in outputs[0].items():
        assert torch.equal(bits, outputs[1][port]), port


class _Handle:
    def __init__(self, data):
        self.data = data


def test_a_scalar_held_as_a_one_element_array_is_an_index():
    """A Triton whose interpreter holds scalars as one-element 1-D arrays (3.6) failed every
    `range()` over a computed bound under numpy 2.4; the patch scope's `__index__` reads the
    element, and the scope's restore puts Triton's own back."""
    import numpy as np

    scope = I._LangPatchScope()
    before = tl.core.tensor.__dict__.get("__index__")
    assert interpreter_patch.index_from_one_element(scope)
    scalar = tl.core.tensor.__new__(tl.core.tensor)
    scalar.handle = _Handle(np.array([7], dtype=np.int32))
    assert range(scalar) == range(7)
    scalar.handle = _Handle(np.array(5, dtype=np.int64))
    assert list(range(1, scalar)) == [1, 2, 3, 4]
    scope.restore()
    assert tl.core.tensor.__dict__.get("__index__") is before
    assert not interpreter_patch.index_from_one_element(object())
