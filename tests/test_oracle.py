"""The float64 oracle against torch autograd in float64 (a plain, unchunked masked softmax
attention written here from DESIGN section 2), for every mask kind, both alignments,
S_q <, =, > S_kv, GQA with H_k != H_v, D_qk != D_v, custom scale, fully masked rows,
and chunked against unchunked."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from bundlegen.graph import Attributes
from bundlegen.mask import keep_mask
from bundlegen.harness import oracle

MASKS = {  # name -> (left_bound, right_bound)
    "none": (None, None),
    "causal": (None, 0),
    "window": (3, 0),
    "band": (2, 1),
    "left-only": (4, None),
    "strict-causal": (None, -1),
}
ALIGNMENTS = ("TOP_LEFT", "BOTTOM_RIGHT")
SEQS = ((5, 9), (8, 8), (11, 6))  # S_q <, =, > S_kv


def spec_keep(S_q: int, S_kv: int, attrs: Attributes) -> torch.Tensor:
    """DESIGN section 2, element by element."""
    keep = torch.ones(S_q, S_kv, dtype=torch.bool)
    for i, j in itertools.product(range(S_q), range(S_kv)):
        jp = j - (S_kv - S_q) if attrs.diagonal_alignment == "BOTTOM_RIGHT" else j
        ok = attrs.right_bound is None or jp - i <= attrs.right_bound
        ok = ok and (attrs.left_bound is None or i - jp < attrs.left_bound)
        keep[i, j] = ok
    return keep


def autograd_reference(q, k, v, do, attrs):
    """(o, lse, dq, dk, dv) by float64 autograd over full S_q x S_kv matrices."""
    q, k, v = (t.detach().to(torch.float64).requires_grad_() for t in (q, k, v))
    H_q = q.shape[1]
    k_rep = k.repeat_interleave(H_q // k.shape[1], dim=1)
    v_rep = v.repeat_interleave(H_q // v.shape[1], dim=1)
    s = torch.matmul(q, k_rep.transpose(-1, -2)) * attrs.attn_scale
    keep = spec_keep(q.shape[2], k.shape[2], attrs)
    s = s.masked_fill(~keep, float("-inf"))
    has_key = keep.any(-1, keepdim=True)
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(torch.where(has_key, s, torch.zeros_like(s)), -1) * has_key
    o = torch.matmul(p, v_rep)
    o.backward(do.to(torch.float64))
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def make_inputs(B=2, H_q=4, H_k=2, H_v=1, S_q=8, S_kv=8, D_qk=8, D_v=12, seed=0,
                dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H_q, S_q, D_qk), (B, H_k, S_kv, D_qk), (B, H_v, S_kv, D_v), (B, H_q, S_q, D_v))
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def attributes(D_qk=8, scale=None, alignment="TOP_LEFT", left=None, right=None):
    return Attributes(attn_scale=1 / math.sqrt(D_qk) if scale is None else scale,
                      diagonal_alignment=alignment, left_bound=left, right_bound=right)


def assert_gradient(got, want, mag):
    """The oracle's own error is ~1e-12 relative to the magnitude bound (or below 1e-14)."""
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert torch.isfinite(got).all() and torch.isfinite(mag).all()
    err = (got - want).abs()
    assert (err <= 1e-12 * mag + 1e-14).all(), f"max err {err.max().item():.3e}"
    # the magnitude bounds the gradient itself: |sum| <= sum of |terms|
    assert (mag >= got.abs() * (1 - 1e-12)).all()


def check_against_autograd(q, k, v, do, attrs, **kw):
    fwd = oracle.forward(q, k, v, attrs, **kw)
    bwd = oracle.backward(q, k, v, do, attrs, fwd, **kw)
    o, lse, dq, dk, dv = autograd_reference(q, k, v, do, attrs)
    torch.testing.assert_close(fwd.o, o, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(fwd.lse, lse, rtol=1e-12, atol=1e-14)  # -inf matches -inf
    assert_gradient(bwd.dq, dq, bwd.mag_dq)
    assert_gradient(bwd.dk, dk, bwd.mag_dk)
    assert_gradient(bwd.dv, dv, bwd.mag_dv)
    return fwd, bwd


@pytest.mark.parametrize("S_q,S_kv", SEQS)
@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_every_mask_and_alignment_matches_autograd(mask, alignment, S_q, S_kv):
    left, right = MASKS[mask]
    attrs = attributes(alignment=alignment, left=left, right=right)
    q, k, v, do = make_inputs(S_q=S_q, S_kv=S_kv, seed=S_q * 100 + S_kv)
    check_against_autograd(q, k, v, do, attrs)


@pytest.mark.parametrize("H_q,H_k,H_v", [(4, 4, 4), (4, 2, 1), (4, 1, 2), (6, 6, 3), (6, 3, 2)])
def test_gqa_head_maps_and_group_sums(H_q, H_k, H_v):
    q, k, v, do = make_inputs(H_q=H_q, H_k=H_k, H_v=H_v, S_q=7, S_kv=10, D_qk=8, D_v=5)
    check_against_autograd(q, k, v, do, attributes(alignment="BOTTOM_RIGHT", right=0))


@pytest.mark.parametrize("scale", [0.37, 2.0])
def test_custom_scale(scale):
    q, k, v, do = make_inputs(S_q=6, S_kv=9)
    check_against_autograd(q, k, v, do, attributes(scale=scale, left=5))


def test_low_precision_inputs_are_upcast():
    q, k, v, do = make_inputs(dtype=torch.bfloat16)
    fwd, _ = check_against_autograd(q, k, v, do, attributes(right=0))
    assert fwd.o.dtype == torch.float64


def test_fully_masked_rows_are_zero_and_never_nan():
    # bottom-right causal with S_q > S_kv: rows i < S_q - S_kv keep no key
    S_q, S_kv = 11, 6
    q, k, v, do = make_inputs(S_q=S_q, S_kv=S_kv)
    attrs = attributes(alignment="BOTTOM_RIGHT", right=0)
    fwd, bwd = check_against_autograd(q, k, v, do, attrs)
    empty = S_q - S_kv
    assert torch.isneginf(fwd.lse[:, :, :empty]).all()
    assert torch.isfinite(fwd.lse[:, :, empty:]).all()
    assert (fwd.o[:, :, :empty] == 0).all()
    assert (bwd.dq[:, :, :empty] == 0).all() and (bwd.mag_dq[:, :, :empty] == 0).all()
    assert (bwd.dq[:, :, empty:] != 0).any()
    for t in (fwd.o, bwd.dq, bwd.dk, bwd.dv, bwd.mag_dq, bwd.mag_dk, bwd.mag_dv):
        assert not torch.isnan(t).any()


def test_no_row_keeps_a_key():
    # a window that ends before it starts for every row: everything masked
    q, k, v, do = make_inputs(S_q=4, S_kv=8)
    attrs = attributes(alignment="BOTTOM_RIGHT", left=1, right=-1)
    fwd, bwd = check_against_autograd(q, k, v, do, attrs)
    assert torch.isneginf(fwd.lse).all() and (fwd.o == 0).all()
    assert all((t == 0).all() for t in (bwd.dq, bwd.dk, bwd.dv))


@pytest.mark.parametrize("budget", [1, 7, 40, 300])
@pytest.mark.parametrize("mask", ["none", "window", "strict-causal"])
def test_chunked_equals_unchunked(budget, mask):
    left, right = MASKS[mask]
    attrs = attributes(alignment="BOTTOM_RIGHT", left=left, right=right)
    q, k, v, do = make_inputs(H_q=6, H_k=3, H_v=2, S_q=13, S_kv=10, seed=3)
    whole_f = oracle.forward(q, k, v, attrs, max_block_elems=1 << 30)
    whole_b = oracle.backward(q, k, v, do, attrs, whole_f, max_block_elems=1 << 30)
    f = oracle.forward(q, k, v, attrs, max_block_elems=budget)
    b = oracle.backward(q, k, v, do, attrs, f, max_block_elems=budget)
    torch.testing.assert_close(f.o, whole_f.o, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(f.lse, whole_f.lse, rtol=1e-13, atol=1e-15)
    for port in ("dq", "dk", "dv"):
        assert_gradient(b.gradient(port), whole_b.gradient(port), whole_b.magnitude(port))
        torch.testing.assert_close(b.magnitude(port), whole_b.magnitude(port), rtol=1e-13, atol=0)


def test_strided_inputs_read_logically():
    q, k, v, do = make_inputs(S_q=9, S_kv=7)
    attrs = attributes(right=1)
    want_f = oracle.forward(q, k, v, attrs)
    want_b = oracle.backward(q, k, v, do, attrs, want_f)
    # the same logical values through BSHD storage and a broadcast-free transposed copy
    qs, ks, vs, dos = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, do))
    f = oracle.forward(qs, ks, vs, attrs)
    b = oracle.backward(qs, ks, vs, dos, attrs, f)
    torch.testing.assert_close(f.o, want_f.o, rtol=0, atol=0)
    torch.testing.assert_close(b.dk, want_b.dk, rtol=1e-14, atol=0)


# ----------------------------------------------------------------------------- blocking
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("S_q,S_kv", SEQS + ((1, 37), (40, 3)))
def test_kept_columns_cover_every_kept_key(mask, alignment, S_q, S_kv):
    left, right = MASKS[mask]
    attrs = attributes(alignment=alignment, left=left, right=right)
    keep = spec_keep(S_q, S_kv, attrs)
    mask_fn = keep_mask(S_q, S_kv, attrs)
    if mask_fn is not None:
        assert torch.equal(mask_fn, keep)
    for r0, r1 in itertools.combinations(range(S_q + 1), 2):
        c0, c1 = oracle.kept_columns(S_q, S_kv, attrs, r0, r1)
        outside = keep[r0:r1].clone()
        outside[:, max(c0, 0):max(c1, c0)] = False
        assert not outside.any(), (r0, r1, c0, c1)
        if mask_fn is not None and c1 > c0:  # the column window of keep_mask
            part = keep_mask(S_q, S_kv, attrs, rows=range(r0, r1), cols=range(c0, c1))
            assert torch.equal(part, keep[r0:r1, c0:c1])


@pytest.mark.parametrize("budget", [1, 100, 100_000, 1 << 22])
@pytest.mark.parametrize("mask", ["none", "window", "causal"])
def test_blocks_cover_each_row_once_within_budget(budget, mask):
    left, right = MASKS[mask]
    attrs = attributes(alignment="BOTTOM_RIGHT", left=left, right=right)
    B, H, S_q, S_kv = 2, 3, 300, 257
    seen = torch.zeros(B, H, S_q, dtype=torch.int64)
    for blk in oracle.blocks(B, H, S_q, S_kv, attrs, budget):
        width = max(0, blk.c1 - blk.c0)
        assert blk.elements <= max(budget, width)
        seen[blk.b0:blk.b1, blk.h0:blk.h1, blk.r0:blk.r1] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize("budget", [1, 20, 100, 1000, 10_000, 1 << 22])
@pytest.mark.parametrize("B,H,align", [(3, 12, 1), (3, 12, 2), (3, 12, 6), (2, 6, 6), (4, 8, 4)])
def test_blocks_span_batches_and_aligned_heads(budget, B, H, align):
    attrs = attributes(alignment="BOTTOM_RIGHT", right=0)
    S_q, S_kv = 9, 10
    seen = torch.zeros(B, H, S_q, dtype=torch.int64)
    blks = list(oracle.blocks(B, H, S_q, S_kv, attrs, budget, align))
    widest = max(b.elements // ((b.b1 - b.b0) * (b.h1 - b.h0)) for b in blks)
    for blk in blks:
        assert blk.elements <= max(budget, blk.c1 - blk.c0)
        assert blk.b1 - blk.b0 == 1 or (blk.h0, blk.h1) == (0, H)  # batches only with all heads
        if budget // widest >= align:  # at least one group fits: blocks hold whole groups
            assert blk.h0 % align == 0 and blk.h1 % align == 0
        seen[blk.b0:blk.b1, blk.h0:blk.h1, blk.r0:blk.r1] += 1
    assert (seen == 1).all()
    if budget >= B * H * S_q * S_kv:
        assert len({(b.b0, b.b1, b.h0, b.h1) for b in blks}) == 1  # one block per row block


@pytest.mark.parametrize("H_q,H_k,H_v", [(12, 4, 3), (8, 1, 2), (6, 6, 3), (4, 4, 4), (8, 2, 8)])
@pytest.mark.parametrize("budget", [1, 9, 30, 61, 300, 1 << 30])
def test_multi_batch_and_gqa_blocks_match_autograd(H_q, H_k, H_v, budget):
    """Blocks spanning batches and heads, whole and cut kv groups, against autograd; the
    result does not depend on the run (bitwise) and barely on the blocking."""
    attrs = attributes(alignment="BOTTOM_RIGHT", left=5, right=1)
    q, k, v, do = make_inputs(B=3, H_q=H_q, H_k=H_k, H_v=H_v, S_q=7, S_kv=6, D_qk=4, D_v=3,
                              seed=H_q + 10 * H_k + 100 * H_v)
    fwd, bwd = check_against_autograd(q, k, v, do, attrs, max_block_elems=budget)
    again = oracle.backward(q, k, v, do, attrs, oracle.forward(q, k, v, attrs, max_block_elems=budget),
                            max_block_elems=budget)
    for name in oracle.GRADIENT_FIELDS:
        assert torch.equal(getattr(again, name), getattr(bwd, name)), name
    whole = oracle.backward(q, k, v, do, attrs, fwd, max_block_elems=1 << 30)
    for port in ("dq", "dk", "dv"):
        assert_gradient(bwd.gradient(port), whole.gradient(port), whole.magnitude(port))
        torch.testing.assert_close(bwd.magnitude(port), whole.magnitude(port), rtol=1e-13, atol=0)


@pytest.mark.parametrize("h0,h1,group", [(1, 6, 2), (2, 4, 3), (0, 6, 3), (1, 2, 3), (3, 9, 3),
                                          (4, 11, 4), (0, 12, 1), (5, 7, 2)])
def test_group_sums_add_whole_and_cut_groups(h0, h1, group):
    H_q = 12
    part = torch.randn(2, h1 - h0, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(h0))
    dst = torch.zeros(2, H_q // group, 6, 2, dtype=torch.float64)
    blk = oracle.Block(b0=0, b1=2, h0=h0, h1=h1, r0=0, r1=1, c0=2, c1=5)
    oracle._add_group_sums(dst, part, blk, group=group, scale=0.5)
    want = torch.zeros_like(dst)
    for h in range(h0, h1):
        want[:, h // group, 2:5] += 0.5 * part[:, h - h0]
    torch.testing.assert_close(dst, want, rtol=1e-14, atol=1e-15)
    untouched = [kv for kv in range(H_q // group) if not any(h // group == kv for h in range(h0, h1))]
    assert all((dst[:, kv] == 0).all() for kv in untouched)
    assert (dst[..., :2, :] == 0).all() and (dst[..., 5:, :] == 0).all()
