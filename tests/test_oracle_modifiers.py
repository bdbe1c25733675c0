"""The float64 oracle's score modifiers (bias + dBias with broadcasts, sinks + dSinks,
softcap) against autograd through a direct float64 formulation, blocked and whole, with
rows that keep no key; and the magnitudes bound each gradient."""
from __future__ import annotations

import pytest
import torch

from bundlegen.graph import Attributes
from bundlegen.mask import keep_mask
from bundlegen.harness import oracle
from bundlegen.harness.distributions import alibi_bias

F64 = torch.float64


def _autograd(q, k, v, do, attrs, bias, sinks):
    """dQ, dK, dV, dBias (bias's own shape), dSinks by autograd, float64, no blocking."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    bias = bias.detach().clone().requires_grad_()
    sinks = sinks.detach().clone().requires_grad_()
    B, H, S_q, _ = q.shape
    S_kv = k.shape[2]
    kk = k.repeat_interleave(H // k.shape[1], 1)
    vv = v.repeat_interleave(H // v.shape[1], 1)
    s = q @ kk.transpose(-1, -2) * attrs.attn_scale
    if attrs.softcap is not None:
        s = attrs.softcap * torch.tanh(s / attrs.softcap)
    s = s + bias
    keep = keep_mask(S_q, S_kv, attrs)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    logits = torch.cat([s, sinks.view(1, H, 1, 1).expand(B, H, S_q, 1)], -1)
    o = torch.softmax(logits, -1)[..., :S_kv] @ vv
    return torch.autograd.grad(o, (q, k, v, bias, sinks), do)


CASES = [  # (bias broadcast shape prefix, softcap, mask bounds, alignment, S_q, S_kv)
    ((2, 4), None, (None, None), "TOP_LEFT", 7, 11),
    ((1, 4), 5.0, (None, 0), "BOTTOM_RIGHT", 12, 5),     # rows with no kept key
    ((2, 1), 30.0, (3, 0), "TOP_LEFT", 9, 9),
    ((1, 1), 2.0, (None, 0), "TOP_LEFT", 6, 10),
]


@pytest.mark.parametrize("budget", [None, 40])
@pytest.mark.parametrize("prefix, cap, bounds, alignment, S_q, S_kv", CASES)
def test_modifiers_match_autograd(prefix, cap, bounds, alignment, S_q, S_kv, budget):
    g = torch.Generator().manual_seed(S_q * 31 + S_kv)
    B, H_q, H_k, D = 2, 4, 2, 8
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=F64)
    q, k, v, do = rnd(B, H_q, S_q, D), rnd(B, H_k, S_kv, D), rnd(B, H_k, S_kv, D), rnd(B, H_q, S_q, D)
    bias_small, sinks = rnd(*prefix, S_q, S_kv), rnd(H_q) * 2
    attrs = Attributes(attn_scale=0.4, diagonal_alignment=alignment, left_bound=bounds[0],
                       right_bound=bounds[1], softcap=cap)
    mods = oracle.Modifiers(bias=bias_small.expand(B, H_q, S_q, S_kv), sinks=sinks,
                            dbias_dims=tuple(bias_small.shape), dsinks=True)
    fwd = oracle.forward(q, k, v, attrs, modifiers=mods, max_block_elems=budget)
    bwd = oracle.backward(q, k, v, do, attrs, fwd, modifiers=mods, max_block_elems=budget)
    want = _autograd(q, k, v, do, attrs, bias_small, sinks)
    for name, w in zip(("dq", "dk", "dv", "dbias", "dsinks"), want):
        got = bwd.gradient(name)
        assert got.shape == w.shape, name
        torch.testing.assert_close(got, w, rtol=1e-10, atol=1e-12, msg=name)
        assert bool((bwd.magnitude(name) >= got.abs() * (1 - 1e-12)).all()), name
    assert torch.isfinite(fwd.lse).all()   # with sinks every row has a finite LSE


def test_without_sinks_a_row_with_no_key_has_lse_minus_inf_and_zero_gradients():
    B, H, S_q, S_kv, D = 1, 2, 8, 3, 4
    q, k, v, do = (torch.randn(*s, dtype=F64) for s in
                   ((B, H, S_q, D), (B, H, S_kv, D), (B, H, S_kv, D), (B, H, S_q, D)))
    attrs = Attributes(attn_scale=0.5, diagonal_alignment="BOTTOM_RIGHT", right_bound=0, softcap=4.0)
    mods = oracle.Modifiers(bias=torch.randn(1, 1, S_q, S_kv, dtype=F64).expand(B, H, S_q, S_kv),
                            dbias_dims=(1, 1, S_q, S_kv))
    fwd = oracle.forward(q, k, v, attrs, modifiers=mods)
    bwd = oracle.backward(q, k, v, do, attrs, fwd, modifiers=mods)
    assert torch.isneginf(fwd.lse[:, :, :S_q - S_kv]).all()
    assert (bwd.dq[:, :, :S_q - S_kv] == 0).all() and (bwd.dbias[..., :S_q - S_kv, :] == 0).all()
    assert torch.isfinite(bwd.dbias).all() and bwd.dsinks is None


@pytest.mark.parametrize("alignment, shift", [("TOP_LEFT", 0), ("BOTTOM_RIGHT", 3)])
def test_alibi_follows_the_contract(alignment, shift):
    H, S_q, S_kv = 4, 5, 8
    bias = alibi_bias(H, S_q, S_kv, alignment)
    assert bias.shape == (1, H, S_q, S_kv)
    for h, i, j in [(0, 0, 0), (1, 2, 7), (3, 4, 0), (2, 1, 5)]:
        slope = 2.0 ** (-8 * (h + 1) / H)
        assert bias[0, h, i, j].item() == pytest.approx(-slope * abs(i + shift - j), rel=1e-6)
