"""The float64 oracle of a ragged graph (DESIGN section 10): each sequence is the padded
oracle's problem of its own lengths, cut out of the token-major [T, H, D] tensors as a
[1, H, S_b, D] view (no copy), so every mask rule, GQA rule and magnitude bound is the
padded oracle's, applied per sequence.

A padded graph's sequences are their used rows (Ragged.seqused_*): the padding rows after
them are neither read nor given values. Score modifiers and the dropout mask act per
sequence (sequence_modifiers): the padded [B, H_q, max_seqlen_q, max_seqlen_kv] bias and
keep mask give sequence b their corner [b, :, :S_q_b, :S_kv_b] (sequence-local rows and
columns), as the padded oracle uses a whole one.

Rows outside the given sequences stay O = 0, LSE = -inf and zero gradients (they are not
judged). A sequence with no key gives its query rows O = 0, LSE = -inf and dQ = 0; one
with no query gives its key rows dK = dV = 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from bundlegen.graph import Attributes, Graph
from bundlegen.harness import oracle

F64 = torch.float64


@dataclass(frozen=True)
class Sequence:
    """Query rows [q0, q1) and key rows [k0, k1) of one sequence, sequence b of the batch."""
    q0: int
    q1: int
    k0: int
    k1: int
    b: int = 0   # its index in the batch: its bias block, its mask corner, its row of [B, H_q] slopes


def sequences(graph: Graph, which: tuple[int, ...]) -> tuple[Sequence, ...]:
    """The rows the oracle attends for each sequence in `which`: from its first row, its
    used length on each side (a padded graph's seqused; else its whole range)."""
    rag = graph.ragged
    cq, ck = rag.cu_seqlens_q, rag.cu_seqlens_kv
    uq, uk = rag.used_lengths("q"), rag.used_lengths("kv")
    return tuple(Sequence(cq[b], cq[b] + uq[b], ck[b], ck[b] + uk[b], b) for b in which)


def _cut(t: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """Rows [r0, r1) of a [T, H, D] tensor as the padded oracle's [1, H, S, D]."""
    return t[r0:r1].permute(1, 0, 2).unsqueeze(0)


def _paste(dst: torch.Tensor, r0: int, r1: int, src: torch.Tensor) -> None:
    """The padded oracle's [1, H, S, D] (or [1, H, S]) back into rows [r0, r1) of dst."""
    dst[r0:r1] = src[0].transpose(0, 1)


def sequence_modifiers(mods: oracle.Modifiers, s: Sequence) -> oracle.Modifiers:
    """The padded oracle's modifiers of one sequence: its block [b, :, :S_q_b, :S_kv_b] of
    the padded bias (docs/CONTRACTS.md, "Score modifiers") and of the padded keep mask
    ("Dropout"), its row of [B, H_q] slopes, the sinks as they are; a dBias of that block's size (1 on the batch axis)."""
    n_q, n_kv = s.q1 - s.q0, s.k1 - s.k0
    bias = None if mods.bias is None else mods.bias[s.b:s.b + 1, :, :n_q, :n_kv]
    slopes = mods.alibi_slopes
    if slopes is not None and slopes.dim() == 2:
        slopes = slopes[s.b:s.b + 1]
    keep = None if mods.dropout_keep is None else mods.dropout_keep[s.b:s.b + 1, :, :n_q, :n_kv]
    dbias_dims = None if mods.dbias_dims is None else (1, mods.dbias_dims[1], n_q, n_kv)
    return oracle.Modifiers(bias=bias, sinks=mods.sinks, dbias_dims=dbias_dims, dsinks=mods.dsinks,
                            alibi_slopes=slopes, dropout_keep=keep)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attrs: Attributes,
            seqs: tuple[Sequence, ...], *, modifiers: oracle.Modifiers = oracle.NO_MODIFIERS,
            max_block_elems: int | None = None) -> oracle.Forward:
    """O [T_q, H_q, D_v] and LSE [T_q, H_q], float64, sequence by sequence (a sequence with
    no key: LSE = sink_h with sinks, O = 0)."""
    T_q, H_q, D_v = q.shape[0], q.shape[1], v.shape[2]
    o = torch.zeros(T_q, H_q, D_v, dtype=F64, device=q.device)
    lse = torch.full((T_q, H_q), float("-inf"), dtype=F64, device=q.device)
    per_sequence = []
    for s in seqs:
        if s.k1 == s.k0 and modifiers.sinks is not None:   # every row's mass on the sink
            lse[s.q0:s.q1] = modifiers.sinks.to(device=q.device, dtype=F64).view(1, H_q)
        if s.q1 == s.q0 or s.k1 == s.k0:
            continue
        qs, ks, vs = _cut(q, s.q0, s.q1), _cut(k, s.k0, s.k1), _cut(v, s.k0, s.k1)
        fwd = oracle.forward(qs, ks, vs, attrs, modifiers=sequence_modifiers(modifiers, s),
                             max_block_elems=max_block_elems)
        _paste(o, s.q0, s.q1, fwd.o)
        _paste(lse, s.q0, s.q1, fwd.lse)
        per_sequence.append((s, qs, ks, vs, fwd))
    return oracle.Forward(o=o, lse=lse, operands=tuple(per_sequence))


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
             attrs: Attributes, fwd: oracle.Forward, seqs: tuple[Sequence, ...], *,
             modifiers: oracle.Modifiers = oracle.NO_MODIFIERS, max_block_elems: int | None = None,
             precision: oracle.Precision = oracle.ORACLE_PRECISION) -> oracle.Backward:
    """dQ, dK, dV and their magnitudes (none with the io-precision `precision`) in the token-major shapes of q, k, v; dBias in the
    padded [B|1, H_q|1, max_seqlen_q, max_seqlen_kv] (sequence b's block at [b, :, :S_q_b,
    :S_kv_b], summed into [0] when dBias sums over the batch; 0 outside every block) and
    dSinks summed over the sequences' query rows only. Reduced magnitudes add in
    quadrature, as the padded oracle's do."""
    shapes = {"dq": q.shape, "dk": k.shape, "dv": v.shape}
    cdt, fields = precision.compute, oracle.GRADIENT_FIELDS[:6 if precision.magnitudes else 3]
    out = {name: torch.zeros(shapes[name[-2:]], dtype=cdt, device=q.device) for name in fields}
    H_q = q.shape[1]
    if modifiers.dbias_dims is not None:
        out["dbias"] = torch.zeros(modifiers.dbias_dims, dtype=cdt, device=q.device)
        if precision.magnitudes:
            out["mag_dbias"] = torch.zeros_like(out["dbias"])
    if modifiers.dsinks:
        out["dsinks"] = torch.zeros(H_q, dtype=cdt, device=q.device)
        if precision.magnitudes:
            out["mag_dsinks"] = torch.zeros_like(out["dsinks"])
    done = {s: (qs, ks, vs, f) for s, qs, ks, vs, f in (fwd.operands or ())}
    for s in seqs:
        if s.q1 == s.q0 or s.k1 == s.k0:
            continue
        if s in done:
            qs, ks, vs, f = done[s]
        else:
            qs, ks, vs = _cut(q, s.q0, s.q1), _cut(k, s.k0, s.k1), _cut(v, s.k0, s.k1)
            f = oracle.Forward(o=_cut(fwd.o, s.q0, s.q1),
                               lse=fwd.lse[s.q0:s.q1].transpose(0, 1).unsqueeze(0))
        bwd = oracle.backward(qs, ks, vs, _cut(do, s.q0, s.q1), attrs, f,
                              modifiers=sequence_modifiers(modifiers, s),
                              max_block_elems=max_block_elems, precision=precision)
        for name in fields:
            r0, r1 = (s.q0, s.q1) if name.endswith("dq") else (s.k0, s.k1)
            _paste(out[name], r0, r1, getattr(bwd, name))
        if bwd.dbias is not None:
            b = 0 if out["dbias"].shape[0] == 1 else s.b
            block = (slice(b, b + 1), slice(None), slice(0, s.q1 - s.q0), slice(0, s.k1 - s.k0))
            out["dbias"][block] += bwd.dbias
            if precision.magnitudes:
                out["mag_dbias"][block] += bwd.mag_dbias.square()
        if bwd.dsinks is not None:
            out["dsinks"] += bwd.dsinks
            if precision.magnitudes:
                out["mag_dsinks"] += bwd.mag_dsinks.square()
    for name in ("mag_dbias", "mag_dsinks"):
        if name in out:
            out[name].sqrt_()
    return oracle.Backward(**out)
