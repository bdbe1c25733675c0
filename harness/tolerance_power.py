"""Tolerance power: can a case's verdict see a lost contribution or a wrong gradient?

Generic defect models are applied to the float64 oracle's own outputs of a case, and each
perturbed output is judged by the case's bound (docs/CONTRACTS.md, "Tolerance semantics":
|out - ref| <= atol + rtol * mag, the numbers of the case's tolerance class). A model is
*seen* by a case when every way of applying it (every batch, head or key tile it could
drop) puts some element outside the bound; the report gives, per output and level, the
share of the sampled cases that see each model. An output with a model that applies to
some case but that no case sees is a tolerance that cannot see that defect.

The models (each applies only where it changes something):
- `batch-dropped`: one batch's contribution removed (B >= 2). For dQ, dK, dV and a dBias
  kept per batch, that batch's slice is zero; for dSinks and a dBias summed over the
  batch, the batch's terms are missing from the sum.
- `head-dropped`: one query head's contribution removed (H_q >= 2): its dQ slice and its
  dSinks element are zero; dK and dV lose its terms of their group's sum (a group of one:
  the kv head's slice is zero); a dBias summed over heads loses its terms.
- `key-tile-dropped`: one tile of KEY_TILES keys (the largest that leaves at least two
  tiles) missing: dQ loses the tile's terms, dK, dV and dBias its rows or columns.
- `row-shifted`: the last sequence row of an output holds the row before it (an
  off-by-one row index at a tail).
- `bf16-sum`: the output's longest sum accumulated in bf16, term by term (keys for dQ,
  query rows and group heads for dK and dV, the summed batches and heads for dBias, the
  batches' query rows for dSinks).

The models of a few per cent (POWERED_MODELS), each judged by the whole verdict (the bound,
then the statistical judge of harness/statistical.py against the case's io-precision
reference), the perturbed output rounded to its port's dtype as an engine writes it; each
must fail at least MIN_SHARE of the sampled cases it applies to, per output:
- `scaled`: the whole output x (1 + e), e = SCALE_E of the io dtype (bf16 2 %, fp16 0.5 %,
  fp32 0.05 %);
- `slice-scaled`: one slice (the middle head of the head axis) x (1 + e), for an output the
  statistical judge cuts into more than one slice;
- `io-sum`: the longest sum accumulated in the io dtype (bf16 or fp16) instead of fp32, where
  it has at least IO_SUM_MIN_TERMS terms (a shorter one errs within k of an honest kernel's
  roundings: its error grows as the root of the terms);
- `tf32-products`: an fp32 graph's products taken in TF32 (Q, K, V and dO rounded to 10
  mantissa bits).
Each applies where its relative error on what it perturbs is at least k x the io-precision
reference's there plus the floor (k, floor: the case's class's; what the statistical judge
grants): a defect inside that band (an output of cancelling
terms, one that underflows the io dtype) is one the verdict grants any honest engine, so no
verdict without false failures can see it; the report counts such cases per model ("in the
honest band") beside the share of the others that fail.

The terms are recomputed here in float64 from the case's materialized inputs (the
oracle's forward gives O and LSE); their sums must equal the oracle's gradients
(`TERM_RTOL`), so a model is applied to what the oracle computes, not to a copy of it.
Dense graphs only (a ragged or dropout case is skipped), sampled and size-capped so the check stays
small on the CPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping

import torch

from bundlegen.graph import Case
from bundlegen.tolerance import Tolerance
from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.harness import oracle, statistical
from bundlegen.harness.materialize import logical_inputs, materialize
from bundlegen.mask import keep_mask

F64 = torch.float64
OUTPUTS = ("dq", "dk", "dv", "dbias", "dsinks")
#: models that must fail at least MIN_SHARE of the cases they apply to (the module's doc)
POWERED_MODELS = ("scaled", "slice-scaled", "io-sum", "tf32-products")
MODELS = ("batch-dropped", "head-dropped", "key-tile-dropped", "row-shifted", "bf16-sum") + POWERED_MODELS
MIN_SHARE = 0.95
#: the scale error per io dtype of `scaled` and `slice-scaled`
SCALE_E = {"bf16": 0.02, "fp16": 0.005, "fp32": 0.0005}
#: the fewest terms in a sum whose accumulation in the io dtype `io-sum` models
IO_SUM_MIN_TERMS = 256
#: fp32 cases a sample takes early (tf32-products applies to them alone)
FP32_SAMPLED = 4
#: key tile sizes a kernel loops by; the model drops one of the largest that leaves two
KEY_TILES = (64, 32, 16)
#: the recomputed terms' sums agree with the oracle's gradients to this (relative to mag)
TERM_RTOL = 1e-9
#: data distributions whose dO is correlated with O (an L2 loss): the terms of a sum share a
#: sign, so a sum kept in bf16 errs with its running total, where independent terms cancel
CORRELATED_DISTRIBUTIONS = ("l2-grad",)
#: cases whose term tensors (B x H_q x S_q x S_kv x D float64 elements) exceed this are
#: not sampled
MAX_TERM_ELEMS = 1 << 22


@dataclass(frozen=True)
class ModelSeen:
    """One (output, model) of one case: applicable, and seen (outside the bound for every
    way of applying it)."""
    output: str
    model: str
    seen: bool


@dataclass(frozen=True)
class CasePower:
    case_id: str
    tolerance_class: str
    results: tuple[ModelSeen, ...]
    #: (output, model) of the powered models whose defect is in the honest band here
    banded: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Share:
    applicable: int
    seen: int
    banded: int = 0      # cases whose defect lies in the honest band (not applicable)

    @property
    def share(self) -> float:
        return self.seen / self.applicable if self.applicable else float("nan")


@dataclass(frozen=True)
class LevelPower:
    level: str
    cases: int                      # cases judged
    shares: Mapping[tuple[str, str], Share] = field(default_factory=dict)   # (output, model) ->

    def invisible(self) -> list[tuple[str, str]]:
        """(output, model) pairs some case applies and no case sees, or, for a powered
        model, fewer than MIN_SHARE of the cases it applies to."""
        return [key for key, s in self.shares.items()
                if s.applicable and (not s.seen or (key[1] in POWERED_MODELS and s.share < MIN_SHARE))]


# ----------------------------------------------------------------------------- terms
@dataclass(frozen=True, eq=False)
class Terms:
    """The float64 pieces every gradient sums (per q head; k, v expanded to q heads)."""
    q: torch.Tensor       # [B, H_q, S_q, D_qk]
    k: torch.Tensor       # [B, H_q, S_kv, D_qk]
    do: torch.Tensor      # [B, H_q, S_q, D_v]
    p: torch.Tensor       # [B, H_q, S_q, S_kv]
    ds_pre: torch.Tensor  # dS before the softcap's slope (dBias)
    ds: torch.Tensor      # dS (dQ, dK)
    sink_terms: torch.Tensor | None   # [B, H_q, S_q]: -P_sink * Delta (dSinks sums them)
    scale: float
    group_k: int
    group_v: int


def terms_of(case: Case) -> tuple[Terms, object]:
    """(terms, materialized): the case materialized on the CPU, its terms recomputed."""
    m = materialize(case, "cpu")
    return terms_from(case, m, logical_inputs(m)), m


def terms_from(case: Case, m, x: Mapping[str, torch.Tensor]) -> Terms:
    """The terms of the case's inputs `x` (port -> logical tensor) with the oracle's O and
    LSE of `m`."""
    g, attrs = case.graph, case.graph.attributes
    H_q = g.H_q
    group_k, group_v = H_q // g.H_k, H_q // g.H_v
    q = x["q"].to(F64)
    k = x["k"].to(F64).repeat_interleave(group_k, dim=1)
    v = x["v"].to(F64).repeat_interleave(group_v, dim=1)
    do = x["do"].to(F64)
    o, lse = m.forward.o.to(F64), m.forward.lse.to(F64)
    s = torch.matmul(q, k.transpose(-1, -2)) * attrs.attn_scale
    slope = None
    if attrs.softcap is not None:
        t = torch.tanh(s / attrs.softcap)
        s, slope = t * attrs.softcap, 1.0 - t * t
    added = oracle.additive_scores(oracle.Modifiers(bias=x.get("bias"), alibi_slopes=x.get("alibi_slopes")),
                                   g.B, H_q, g.S_q, g.S_kv, attrs)
    if added is not None:
        s = s + added
    keep = keep_mask(g.S_q, g.S_kv, attrs)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    finite_lse = lse.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).unsqueeze(-1)
    p = torch.exp(s - finite_lse)
    delta = (do * o).sum(-1, keepdim=True)
    ds_pre = p * (torch.matmul(do, v.transpose(-1, -2)) - delta)
    ds = ds_pre if slope is None else ds_pre * slope
    sink_terms = None
    if "sinks" in x:
        p_sink = torch.exp(x["sinks"].to(F64).view(1, H_q, 1, 1) - finite_lse)
        sink_terms = -(p_sink * delta).squeeze(-1)
    return Terms(q, k, do, p, ds_pre, ds, sink_terms, attrs.attn_scale, group_k, group_v)


def _group_sum(t: torch.Tensor, group: int) -> torch.Tensor:
    """[B, H_q, ...] summed over each kv group of q heads -> [B, H_q // group, ...]."""
    return t.unflatten(1, (-1, group)).sum(2)


def _reduce_like(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """[B, H_q, S_q, S_kv] summed over the axes where `dims` (dbias's) is 1."""
    for axis in (0, 1):
        if dims[axis] == 1 and t.shape[axis] > 1:
            t = t.sum(axis, keepdim=True)
    return t


def full_outputs(t: Terms, dbias_dims: tuple[int, ...] | None) -> dict[str, torch.Tensor]:
    """Every output as the plain sums of the terms (checked against the oracle)."""
    out = {"dq": torch.matmul(t.ds, t.k) * t.scale,
           "dk": _group_sum(torch.matmul(t.ds.transpose(-1, -2), t.q), t.group_k) * t.scale,
           "dv": _group_sum(torch.matmul(t.p.transpose(-1, -2), t.do), t.group_v)}
    if dbias_dims is not None:
        out["dbias"] = _reduce_like(t.ds_pre, dbias_dims)
    if t.sink_terms is not None:
        out["dsinks"] = t.sink_terms.sum(dim=(0, 2))
    return out


# ----------------------------------------------------------------------------- models
def key_tile(S_kv: int) -> int | None:
    """The largest KEY_TILES size that leaves at least two tiles, or None."""
    return next((n for n in KEY_TILES if S_kv > n), None)


def _outputs_without(t: Terms, dbias_dims, *, batch=None, head=None, keys=None) -> dict[str, torch.Tensor]:
    """The outputs with one batch's, q head's or key range's terms zeroed."""
    keep = torch.ones(t.p.shape, dtype=F64)
    if batch is not None:
        keep[batch] = 0
    if head is not None:
        keep[:, head] = 0
    if keys is not None:
        keep[..., keys[0]:keys[1]] = 0
    cut = Terms(q=t.q, k=t.k, do=t.do, p=t.p * keep, ds_pre=t.ds_pre * keep, ds=t.ds * keep,
                sink_terms=None, scale=t.scale, group_k=t.group_k, group_v=t.group_v)
    out = full_outputs(cut, dbias_dims)
    if t.sink_terms is not None:
        sink = t.sink_terms.clone()
        if batch is not None:
            sink[batch] = 0
        if head is not None:
            sink[:, head] = 0
        out["dsinks"] = sink.sum(dim=(0, 2))
    if keys is not None:   # a key tile's dK, dV rows hold nothing of the kept keys either
        for name in ("dk", "dv"):
            out[name][:, :, keys[0]:keys[1]] = 0
    if batch is not None:  # a batch's own slices hold nothing (its O, Delta are gone too)
        for name in ("dq", "dk", "dv"):
            out[name][batch] = 0
    return out


def running_sum(terms: torch.Tensor, axis: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The sum over `axis`, accumulated in `dtype` one term at a time (the terms in fp32)."""
    terms = terms.movedim(axis, 0).to(torch.float32)
    acc = torch.zeros(terms.shape[1:], dtype=dtype)
    for term in terms:
        acc = (acc.to(torch.float32) + term).to(dtype)
    return acc.to(F64)


def low_precision_sums(t: Terms, dbias_dims, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Each output's longest sum kept in `dtype` (an output with no sum is left out)."""
    out = {"dq": running_sum(t.ds.unsqueeze(-1) * t.k.unsqueeze(2) * t.scale, 3, dtype)}
    for name, weights, rows, group in (("dk", t.ds, t.q, t.group_k), ("dv", t.p, t.do, t.group_v)):
        terms = weights.unsqueeze(-1) * rows.unsqueeze(3)            # [B, H_q, S_q, S_kv, D]
        terms = terms.unflatten(1, (-1, group)).movedim(2, 3)          # [B, H_kv, S_q, g, S_kv, D]
        terms = terms.flatten(2, 3)                                     # rows, then the group's heads
        out[name] = running_sum(terms, 2, dtype) * (t.scale if name == "dk" else 1.0)
    if dbias_dims is not None:
        summed = [axis for axis in (0, 1) if dbias_dims[axis] == 1 and t.p.shape[axis] > 1]
        if summed:
            terms = t.ds_pre.movedim(summed, list(range(len(summed))))
            terms = terms.flatten(0, len(summed) - 1)
            acc = running_sum(terms, 0, dtype)
            for axis in summed:
                acc = acc.unsqueeze(axis)
            out["dbias"] = acc
    if t.sink_terms is not None:
        out["dsinks"] = running_sum(t.sink_terms.transpose(0, 1).flatten(1).transpose(0, 1), 0, dtype)
    return out


def _row_shifted(ref: torch.Tensor) -> torch.Tensor | None:
    """The last sequence row (axis 2) holds the row before it; None with one row."""
    if ref.dim() != 4 or ref.shape[2] < 2:
        return None
    out = ref.clone()
    out[:, :, -1] = ref[:, :, -2]
    return out


def _outside(got: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, tol: Tolerance) -> bool:
    return bool(((got - ref).abs() > mag * tol.rtol + tol.atol).any())


def case_power(case: Case, tol: Tolerance) -> CasePower:
    """Every applicable (output, model) of one dense case, seen or not."""
    terms, m = terms_of(case)
    ref = m.reference
    g = case.graph
    dbias_dims = g.tensors["dbias"].dims if "dbias" in g.tensors else None
    refs = {name: ref.gradient(name) for name in OUTPUTS if getattr(ref, name) is not None}
    mags = {name: ref.magnitude(name) for name in refs}
    mine = full_outputs(terms, dbias_dims)
    for name, value in refs.items():   # the models act on what the oracle computes
        err = float(((mine[name] - value).abs() - TERM_RTOL * (mags[name] + value.abs())).max())
        if err > 1e-300:
            raise AssertionError(f"case {case.id}: the recomputed terms of {name} do not sum to "
                                 f"the oracle's gradient (excess {err:.3g})")
    B, H_q, _, S_kv = terms.p.shape
    variants: dict[str, list[Callable[[], dict[str, torch.Tensor]]]] = {}
    if B >= 2:
        variants["batch-dropped"] = [lambda b=b: _outputs_without(terms, dbias_dims, batch=b) for b in range(B)]
    if H_q >= 2:
        variants["head-dropped"] = [lambda h=h: _outputs_without(terms, dbias_dims, head=h) for h in range(H_q)]
    tile = key_tile(S_kv)
    if tile is not None:
        variants["key-tile-dropped"] = [
            lambda a=a: _outputs_without(terms, dbias_dims, keys=(a, min(S_kv, a + tile)))
            for a in range(0, S_kv, tile)]
    results = []
    for model, ways in variants.items():
        outcomes = [w() for w in ways]
        for name in refs:
            changed = [o[name] for o in outcomes if name in o and not torch.equal(o[name], refs[name])]
            if len(changed) == len(outcomes):
                results.append(ModelSeen(name, model, all(_outside(c, refs[name], mags[name], tol)
                                                          for c in changed)))
    for name in refs:
        shifted = _row_shifted(refs[name])
        if shifted is not None and not torch.equal(shifted, refs[name]):
            results.append(ModelSeen(name, "row-shifted", _outside(shifted, refs[name], mags[name], tol)))
    for name, value in low_precision_sums(terms, dbias_dims).items():
        results.append(ModelSeen(name, "bf16-sum", _outside(value, refs[name], mags[name], tol)))
    banded: list[tuple[str, str]] = []
    verdict = _Verdict(refs, mags, m.io_reference, tol, {p: TORCH_DTYPES[g.tensors[p].dtype] for p in refs})
    for name, model, value in powered_variants(case, m, terms, dbias_dims, refs, tol):
        if value is None:
            banded.append((name, model))
        else:
            results.append(ModelSeen(name, model, verdict.fails(name, value)))
    return CasePower(case.id, case.tolerance_class or "", tuple(results), tuple(banded))


@dataclass(frozen=True)
class _Verdict:
    """The whole verdict on one perturbed output: outside the bound, or failing the
    statistical judge against the io-precision reference (when the numbers have k)."""
    refs: Mapping[str, torch.Tensor]
    mags: Mapping[str, torch.Tensor]
    honest: object
    tol: Tolerance
    dtypes: Mapping[str, torch.dtype]

    def fails(self, name: str, value: torch.Tensor) -> bool:
        written = value.to(self.dtypes[name])      # as an engine writes it
        ref = self.refs[name]
        if _outside(written.to(F64), ref, self.mags[name], self.tol):
            return True
        if self.tol.k is None or self.honest is None:
            return False
        how = statistical.slicing_of(name, tuple(ref.shape), None)
        values = statistical.slice_terms(written, ref, self.honest.gradient(name), how).reshape(-1).tolist()
        return not statistical.resolve(values, how, tuple(ref.shape), self.tol).within


def powered_variants(case: Case, m, terms: Terms, dbias_dims, refs: Mapping[str, torch.Tensor],
                     tol: Tolerance) -> Iterator[tuple[str, str, torch.Tensor | None]]:
    """(output, model, perturbed output) of every POWERED_MODELS model that changes the
    output; the perturbed output is None where its error on the part it perturbs is within k
    x the io-precision reference's there (the honest band: the module's doc)."""
    multiple = tol.k if tol.k is not None else 1.0
    floor = tol.floor if tol.floor is not None else 0.0
    for name, model, value, part in _powered_candidates(case, m, terms, dbias_dims, refs):
        ref, honest = part(refs[name]), part(m.io_reference.gradient(name).to(F64))
        error = (part(value) - ref).norm()
        if ref.norm() > 0 and error > 0:
            granted = multiple * (honest - ref).norm() + floor * ref.norm()
            yield name, model, value if error >= granted else None


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t


def _powered_candidates(case: Case, m, terms: Terms, dbias_dims, refs: Mapping[str, torch.Tensor]):
    """(output, model, perturbed output, the part it perturbs) of every POWERED_MODELS model."""
    dtype, e = case.graph.dtype, SCALE_E[case.graph.dtype]
    for name, ref in refs.items():
        yield name, "scaled", ref * (1 + e), _whole
        if statistical.slicing_of(name, tuple(ref.shape), None).lead == 2 and ref.shape[1] > 1:
            middle = ref.shape[1] // 2
            scaled = ref.clone()
            scaled[:, middle] *= 1 + e
            yield name, "slice-scaled", scaled, lambda t, middle=middle: t[:, middle]
    if dtype != "fp32":
        for name, value in low_precision_sums(terms, dbias_dims, TORCH_DTYPES[dtype]).items():
            if longest_sum(case, name) >= IO_SUM_MIN_TERMS:
                yield name, "io-sum", value, _whole
    else:
        x = {port: tf32_values(t) if port in ("q", "k", "v", "do") else t
             for port, t in logical_inputs(m).items()}
        for name, value in full_outputs(terms_from(case, m, x), dbias_dims).items():
            yield name, "tf32-products", value, _whole


def tf32_values(t: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to TF32 (10 mantissa bits, to nearest): a new contiguous tensor."""
    bits = t.to(torch.float32).contiguous().view(torch.int32).clone()
    bits.add_(1 << 12).bitwise_and_(~((1 << 13) - 1))
    return bits.view(torch.float32)


# ----------------------------------------------------------------------------- sampling
def term_elems(case: Case) -> int:
    g = case.graph
    return g.B * g.H_q * g.S_q * g.S_kv * max(g.D_qk, g.D_v)


def eligible(case: Case) -> bool:
    """A dense claim or regression case (no probe, no ragged graph, no dropout: the terms
    here have no dropout mask) small enough here."""
    return (case.expected_rejection is None and case.graph.ragged is None
            and not case.graph.attributes.dropout_probability
            and term_elems(case) <= MAX_TERM_ELEMS)


def longest_sum(case: Case, output: str) -> int:
    """The number of terms in `output`'s longest sum (what the bf16-sum model accumulates),
    0 where the case has no such sum."""
    g = case.graph
    if output == "dq":
        return g.S_kv
    if output in ("dk", "dv"):
        return g.S_q * g.H_q // (g.H_k if output == "dk" else g.H_v)
    if output == "dbias" and "dbias" in g.tensors:
        dims = g.tensors["dbias"].dims
        return math.prod(n for axis, n in enumerate((g.B, g.H_q)) if dims[axis] == 1 and n > 1) \
            if 1 in dims[:2] else 0
    if output == "dsinks" and "dsinks" in g.tensors:
        return g.B * g.S_q
    return 0


def sample(cases: Iterable[Case], count: int) -> list[Case]:
    """Up to `count` eligible cases: first, per output, the case with its longest sum, and
    every case with correlated gradients (CORRELATED_DISTRIBUTIONS): a sum kept in bf16
    shows there first, and a level's reduced outputs are more than a sample holds at pr;
    then up to FP32_SAMPLED fp32 cases (tf32-products applies to them alone), then every one
    with a reduced output (dSinks, or a dBias summed over batches or heads;
    the reason for this check), then an even spread of the others, each in id order."""
    pool = sorted((c for c in cases if eligible(c)), key=lambda c: c.id)
    first: list[Case] = []
    for output in OUTPUTS:
        best = max(pool, key=lambda c: longest_sum(c, output), default=None)
        if best is not None and longest_sum(best, output) and best not in first:
            first.append(best)
    first += [c for c in pool if c.data.distribution in CORRELATED_DISTRIBUTIONS and c not in first]
    first += [c for c in pool if c not in first and c.graph.dtype == "fp32"][:FP32_SAMPLED]
    first += [c for c in pool if c not in first and ("dsinks" in c.graph.tensors
              or ("dbias" in c.graph.tensors and 1 in c.graph.tensors["dbias"].dims[:2]))]

    rest = [c for c in pool if c not in first]
    first = first[:count]
    room = min(len(rest), max(0, count - len(first)))
    return first + [rest[i * len(rest) // room] for i in range(room)]


def level_power(level: str, cases: Iterable[Case], tolerance_for: Callable[[Case], Tolerance],
                progress: Callable[[CasePower], None] | None = None) -> LevelPower:
    counts: dict[tuple[str, str], list[int]] = {}
    judged = 0
    for case in cases:
        power = case_power(case, tolerance_for(case))
        judged += 1
        for r in power.results:
            c = counts.setdefault((r.output, r.model), [0, 0, 0])
            c[0] += 1
            c[1] += int(r.seen)
        for key in power.banded:
            counts.setdefault(key, [0, 0, 0])[2] += 1
        if progress is not None:
            progress(power)
    order = {(o, m): (OUTPUTS.index(o), MODELS.index(m)) for o, m in counts}
    shares = {key: Share(*counts[key]) for key in sorted(counts, key=order.get)}
    return LevelPower(level, judged, shares)


def report_lines(powers: Iterable[LevelPower]) -> Iterator[str]:
    """A table per level: output, model, seen / applicable cases and the share."""
    for lp in powers:
        yield f"level {lp.level}: {lp.cases} cases sampled"
        for (output, model), s in lp.shares.items():
            flag = "" if s.seen else "   <- no case sees it"
            band = f"   ({s.banded} in the honest band)" if s.banded else ""
            yield f"  {output:6s} {model:17s} {s.seen:4d} / {s.applicable:<4d} {100 * s.share:5.1f} %{flag}{band}"
        missing = [f"{o}/{m}" for o in OUTPUTS for m in MODELS if (o, m) not in lp.shares]
        if missing:
            yield f"  not applicable in the sample: {', '.join(missing)}"
