"""The float64 oracle of a ragged graph (DESIGN section 10): each sequence is the padded
oracle's problem of its own lengths, cut out of the token-major [T, H, D] tensors as a
[1, H, S_b, D] view (no copy), so every mask rule, GQA rule and magnitude bound is the
padded oracle's, applied per sequence.

Dropout (docs/CONTRACTS.md, "Dropout"): the keep mask is padded [B, H_q, max_seqlen_q,
max_seqlen_kv]; sequence b uses its corner [b, :, :S_q_b, :S_kv_b] (sequence-local rows and
columns), as the padded oracle uses a whole mask.

Rows outside the given sequences stay O = 0, LSE = -inf and zero gradients (they are not
judged). A sequence with no key gives its query rows O = 0, LSE = -inf and dQ = 0; one
with no query gives its key rows dK = dV = 0.
"""
from __future__ import annotations

import dataclasses
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
    b: int = 0


def sequences(graph: Graph, which: tuple[int, ...]) -> tuple[Sequence, ...]:
    rag = graph.ragged
    cq, ck = rag.cu_seqlens_q, rag.cu_seqlens_kv
    return tuple(Sequence(cq[b], cq[b + 1], ck[b], ck[b + 1], b) for b in which)


def _cut(t: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """Rows [r0, r1) of a [T, H, D] tensor as the padded oracle's [1, H, S, D]."""
    return t[r0:r1].permute(1, 0, 2).unsqueeze(0)


def _paste(dst: torch.Tensor, r0: int, r1: int, src: torch.Tensor) -> None:
    """The padded oracle's [1, H, S, D] (or [1, H, S]) back into rows [r0, r1) of dst."""
    dst[r0:r1] = src[0].transpose(0, 1)


def _own(modifiers: oracle.Modifiers, s: Sequence) -> oracle.Modifiers:
    """The padded oracle's modifiers of sequence s: the keep mask's corner of its lengths."""
    keep = modifiers.dropout_keep
    if keep is None:
        return modifiers
    keep = keep[s.b:s.b + 1, :, :s.q1 - s.q0, :s.k1 - s.k0]
    return dataclasses.replace(modifiers, dropout_keep=keep)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attrs: Attributes,
            seqs: tuple[Sequence, ...], *, max_block_elems: int | None = None,
            modifiers: oracle.Modifiers = oracle.NO_MODIFIERS) -> oracle.Forward:
    """O [T_q, H_q, D_v] and LSE [T_q, H_q], float64, sequence by sequence."""
    T_q, H_q, D_v = q.shape[0], q.shape[1], v.shape[2]
    o = torch.zeros(T_q, H_q, D_v, dtype=F64, device=q.device)
    lse = torch.full((T_q, H_q), float("-inf"), dtype=F64, device=q.device)
    per_sequence = []
    for s in seqs:
        if s.q1 == s.q0 or s.k1 == s.k0:
            continue
        qs, ks, vs = _cut(q, s.q0, s.q1), _cut(k, s.k0, s.k1), _cut(v, s.k0, s.k1)
        fwd = oracle.forward(qs, ks, vs, attrs, modifiers=_own(modifiers, s),
                             max_block_elems=max_block_elems)
        _paste(o, s.q0, s.q1, fwd.o)
        _paste(lse, s.q0, s.q1, fwd.lse)
        per_sequence.append((s, qs, ks, vs, fwd))
    return oracle.Forward(o=o, lse=lse, operands=tuple(per_sequence))


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
             attrs: Attributes, fwd: oracle.Forward, seqs: tuple[Sequence, ...], *,
             max_block_elems: int | None = None,
             modifiers: oracle.Modifiers = oracle.NO_MODIFIERS) -> oracle.Backward:
    """dQ, dK, dV and their magnitudes in the token-major shapes of q, k, v."""
    shapes = {"dq": q.shape, "dk": k.shape, "dv": v.shape}
    out = {name: torch.zeros(shapes[name[-2:]], dtype=F64, device=q.device)
           for name in oracle.GRADIENT_FIELDS}
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
                              modifiers=_own(modifiers, s), max_block_elems=max_block_elems)
        for name in oracle.GRADIENT_FIELDS:
            r0, r1 = (s.q0, s.q1) if name.endswith("dq") else (s.k0, s.k1)
            _paste(out[name], r0, r1, getattr(bwd, name))
    return oracle.Backward(**out)
