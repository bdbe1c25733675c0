"""The Triton engine tests' own float64 autograd reference (an oracle independent of the
harness's blocked one, so the two cannot share a mistake) and their small harness over
graphs of any layout from bundlegen.graph.dense_graph: strided views over NaN-guarded
storage, the reference, and `check` (canaries, untouched inputs, no NaN, error). The
engine's GPU smoke run is bench/triton_selfcheck.py, on the harness's own pieces."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.graph import Attributes, Graph, TensorSpec
from bundlegen.mask import keep_mask

GUARD = 16  # canary elements before and after every storage (whole 16-byte groups)
OUTPUTS = ("dq", "dk", "dv")
MODIFIER_OUTPUTS = ("dbias", "dsinks")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def permuted(dims, order, pad=0) -> tuple[int, ...]:
    """Strides of `dims` stored with axes in `order` (outermost first), the innermost axis
    of the order padded by `pad` elements per row of the next one."""
    strides = [0] * 4
    acc = 1
    for n, axis in enumerate(reversed(order)):
        strides[axis] = acc
        acc *= dims[axis] + (pad if n == 0 else 0)
    return tuple(strides)


def reference(q, k, v, do, attrs: Attributes, bias=None, sinks=None):
    """float64 forward (O, LSE) and autograd backward (dQ, dK, dV) of masked GQA attention,
    with the score modifiers of docs/CONTRACTS.md: softcap (attrs.softcap), an additive
    `bias` [B|1, H_q|1, S_q, S_kv] (broadcast by its size-1 axes) and per-head `sinks` [H_q]
    in the denominator. Returns (O, LSE, grads) with grads dq, dk, dv, and dbias (bias's
    dims: summed over its broadcast axes) and dsinks when given."""
    q, k, v, do = (t.detach().double() for t in (q, k, v, do))
    leaves = {"q": q, "k": k, "v": v}
    if bias is not None:
        leaves["bias"] = bias = bias.detach().double()
    if sinks is not None:
        leaves["sinks"] = sinks = sinks.detach().double()
    for t in leaves.values():
        t.requires_grad_()
    H_q, S_q, S_kv = q.shape[1], q.shape[2], k.shape[2]
    kk = k.repeat_interleave(H_q // k.shape[1], 1)
    vv = v.repeat_interleave(H_q // v.shape[1], 1)
    s = attrs.attn_scale * q @ kk.transpose(-1, -2)
    if attrs.softcap is not None:
        s = attrs.softcap * torch.tanh(s / attrs.softcap)
    if bias is not None:
        s = s + bias
    keep = keep_mask(S_q, S_kv, attrs, device=q.device)
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    if sinks is not None:   # one more logit per row; it adds no value row
        sink_col = sinks.view(1, H_q, 1, 1).expand(*s.shape[:3], 1)
        s = torch.cat([s, sink_col], dim=-1)
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    p = e / torch.where(den == 0, torch.ones_like(den), den)
    if sinks is not None:
        p = p[..., :S_kv]
    o = p @ vv
    (o * do).sum().backward()
    lse = (torch.log(den) + m).squeeze(-1).detach()
    grads = {name: t.grad for name, t in leaves.items()}
    out = {"dq": grads["q"], "dk": grads["k"], "dv": grads["v"]}
    if bias is not None:
        out["dbias"] = grads["bias"]
    if sinks is not None:
        out["dsinks"] = grads["sinks"]
    return o.detach(), lse, out


def alibi(H_q: int, S_q: int, S_kv: int, shift: int = 0) -> torch.Tensor:
    """An ALiBi bias [1, H_q, S_q, S_kv]: -slope_h |i + shift - j|, slope_h = 2^(-8(h+1)/H_q)."""
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H_q) for h in range(H_q)], dtype=torch.float64)
    i = torch.arange(S_q, dtype=torch.float64).view(-1, 1)
    j = torch.arange(S_kv, dtype=torch.float64).view(1, -1)
    return (-slopes.view(-1, 1, 1) * (i + shift - j).abs()).unsqueeze(0)


@dataclass
class Prepared:
    graph: Graph
    views: dict
    storages: dict
    addressed: dict
    ref: dict


def _storage_for(spec: TensorSpec, fill: float, dtype: torch.dtype, device):
    size = GUARD + spec.storage_elements + GUARD
    storage = torch.full((size,), fill, dtype=dtype, device=device)
    view = storage.as_strided(spec.dims, spec.strides, GUARD + spec.offset)
    marks = torch.zeros(size, dtype=torch.bool, device=device)
    marks.as_strided(spec.dims, spec.strides, GUARD + spec.offset).fill_(True)
    return storage, view, marks


def _write(view: torch.Tensor, value: torch.Tensor) -> None:
    """Write `value` into `view`, reading one slice along each zero-stride (broadcast) axis."""
    for axis, st in enumerate(view.stride()):
        if st == 0 and view.shape[axis] > 1:
            view, value = view.narrow(axis, 0, 1), value.narrow(axis, 0, 1)
    view.copy_(value)


def _reduced(spec: TensorSpec) -> tuple[int, ...]:
    """dims with 1 on every broadcast (zero-stride) axis."""
    return tuple(1 if st == 0 else d for d, st in zip(spec.dims, spec.strides))


def prepare(graph: Graph, seed: int = 0, inputs=None, device="cpu") -> Prepared:
    """Inputs from `seed` (constant along zero-stride axes; a bias drawn N(0, 1), sinks
    N(0, 1) * 2, unless `inputs` has them), O and Stats from the float64 forward, outputs
    filled with NaN canaries."""
    gen = torch.Generator().manual_seed(seed)
    io = TORCH_DTYPES[graph.dtype]
    t = graph.tensors
    if inputs is None:
        inputs = {}
        for p in ("q", "k", "v", "do"):
            x = torch.randn(t[p].dims, generator=gen, dtype=torch.float64)
            for axis, (d, st) in enumerate(zip(t[p].dims, t[p].strides)):
                if st == 0 and d > 1:   # a broadcast input holds one value along that axis
                    x = x.narrow(axis, 0, 1).expand_as(x).contiguous()
            inputs[p] = x
    inputs = dict(inputs)
    if "bias" in t and "bias" not in inputs:
        inputs["bias"] = torch.randn(_reduced(t["bias"]), generator=gen, dtype=torch.float64)
    if "sinks" in t and "sinks" not in inputs:
        inputs["sinks"] = torch.randn(t["sinks"].dims, generator=gen, dtype=torch.float64) * 2
    inputs = {p: x.to(device=device, dtype=torch.float32 if p == "sinks" else io)
              for p, x in inputs.items()}
    o, lse, ref = reference(inputs["q"], inputs["k"], inputs["v"], inputs["do"],
                            graph.attributes, inputs.get("bias"), inputs.get("sinks"))
    if "bias" in inputs:   # the logical [B, H_q, S_q, S_kv] bias the ports address
        inputs["bias"] = inputs["bias"].expand(t["bias"].dims)
    logical = dict(inputs, o=o.to(io), stats=lse.float().unsqueeze(-1))
    views, storages, addressed = {}, {}, {}
    for port, spec in t.items():
        dtype = torch.float32 if spec.dtype == "fp32" else io
        storage, view, marks = _storage_for(spec, math.nan, dtype, device)
        if port in logical:
            _write(view, logical[port])
        views[port], storages[port], addressed[port] = view, storage, marks
    ref = {p: g for p, g in ref.items() if p in t}   # dbias / dsinks only where asked
    if "dbias" in ref:   # a given bias longer than dbias on an axis: summed there
        axes = [a for a, d in enumerate(t["dbias"].dims) if d == 1 and ref["dbias"].shape[a] > 1]
        if axes:         # (sum over an empty list would sum everything)
            ref["dbias"] = ref["dbias"].sum(dim=axes, keepdim=True)
    return Prepared(graph, views, storages, addressed, ref)


def check(prep: Prepared, engine, rel: float = 0.02) -> dict:
    """Run the engine; assert canaries, untouched inputs, no NaN and |err| <= rel * max|ref|.
    Returns the relative max errors."""
    outputs = tuple(prep.ref)
    before = {p: _bits(s).clone() for p, s in prep.storages.items() if p not in outputs}
    engine.run(prep.graph, prep.views)
    for p, bits in before.items():
        assert torch.equal(bits, _bits(prep.storages[p])), f"input {p} modified"
    errors = {}
    for p in outputs:
        storage, marks = prep.storages[p], prep.addressed[p]
        assert torch.isnan(storage[~marks]).all(), f"{p}: guard or gap written"
        out = prep.views[p].double()
        assert not torch.isnan(out).any(), f"{p}: NaN in output"
        ref = prep.ref[p]
        bound = rel * max(ref.abs().max().item(), 1e-4)
        err = (out - ref).abs().max().item()
        errors[p] = err / bound * rel
        assert err <= bound, (f"{p}: max err {err:.3g} > {bound:.3g} "
                              f"(max |ref| {ref.abs().max():.3g})")
    return errors
