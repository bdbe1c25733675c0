"""Mutants as plain wrappers: `Wrapper(engine, ...)` is the correct `engine` with one defect
put back, by handing it altered views or graphs, post-processing its outputs or removing
one of its decline arms. The data-path ones work for any engine that reads the port they
alter (an engine that recomputes O and LSE never reads stats or O).

Every altered view is made with `as_strided` over the port's own storage, so it addresses
exactly what a kernel told those strides would address; a view that would reach past the
storage raises, where a kernel would read or write memory it does not own.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import torch

from bundlegen.graph import Graph, TensorSpec, packed_strides
from bundlegen.reasons import code_of
from bundlegen.engines.base import Engine


# ----------------------------------------------------------------------------- views
class OutOfStorage(RuntimeError):
    """A misaddressed view reaches past its port's storage: a kernel would read or write
    memory it does not own."""


def restrided(t: torch.Tensor, dims, strides, port: str = "?") -> torch.Tensor:
    """A view of t's storage at t's offset with other dims and strides."""
    dims, strides = tuple(dims), tuple(strides)
    size = t.untyped_storage().nbytes() // t.element_size()
    end = t.storage_offset() + 1 + sum((d - 1) * s for d, s in zip(dims, strides))
    if end > size:
        raise OutOfStorage(f"{port} addressed with dims {list(dims)} and strides {list(strides)} "
                           f"reaches {end - size} element(s) past its storage")
    return t.as_strided(dims, strides, t.storage_offset())


def with_spec(graph: Graph, port: str, spec: TensorSpec) -> Graph:
    return dataclasses.replace(graph, tensors={**graph.tensors, port: spec})


# ----------------------------------------------------------------------------- base
class EngineWrapper(Engine):
    """Presents `inner` as itself (name, device, arch, determinism, decline rules), so the
    harness reads the same engine.toml, claims and tolerances as for the real engine. It
    declares neither ragged graphs nor score modifiers: the data-path defects alter padded
    views of the plain ports, so the harness declines those graphs for it."""

    def __init__(self, inner: Engine):
        self.inner = inner
        self.device, self.arch = inner.device, inner.arch
        self.name, self.deterministic = inner.name, inner.deterministic

    def archs(self) -> tuple[str, ...]:
        return self.inner.archs()

    @property
    def draws_dropout_mask(self) -> bool:   # the mask the engine draws is the wrapper's too
        return self.inner.draws_dropout_mask

    def drawn_dropout_mask(self, graph: Graph) -> torch.Tensor | None:
        return self.inner.drawn_dropout_mask(graph)

    def is_applicable(self, graph: Graph) -> str | None:
        return self.inner.is_applicable(graph)

    def run(self, graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
        self.inner.run(graph, tensors)


class WholeEngineWrapper(EngineWrapper):
    """`inner` with all it declares (ragged graphs, score modifiers, deterministic mode) and
    its own warm-up and prepare: for a defect inside the engine's own code or rules (a
    removed decline arm, a patched source), which every graph it serves can meet, or one
    that shows only under its own condition (mutants/conditional.py)."""

    @property
    def ragged(self) -> bool:
        return self.inner.ragged

    @property
    def seqused(self) -> bool:
        return self.inner.seqused

    @property
    def score_modifiers(self) -> frozenset[str]:
        return self.inner.score_modifiers

    @property
    def deterministic_mode(self) -> bool:
        return self.inner.deterministic_mode

    @property
    def prepare_shared(self) -> bool:
        return self.inner.prepare_shared

    def warm_up(self) -> None:
        self.inner.warm_up()

    def prepare(self, graphs) -> None:
        self.inner.prepare(graphs)


# ----------------------------------------------------------------------------- stats
class StatsRestrided(EngineWrapper):
    """The engine reads stats through the wrong strides: `packed` (derived from Q's dims,
    whatever stats' own strides) or `swap-batch-head` (batch and head strides exchanged)."""

    HOW = ("packed", "swap-batch-head")

    def __init__(self, inner: Engine, how: str):
        if how not in self.HOW:
            raise ValueError(f"unknown stats misreading {how!r} (known: {', '.join(self.HOW)})")
        super().__init__(inner)
        self.how = how

    def run(self, graph, tensors):
        stats = tensors["stats"]
        if self.how == "packed":
            strides = packed_strides(stats.shape)
        else:
            s = stats.stride()
            strides = (s[1], s[0], s[2], s[3])
        self.inner.run(graph, {**tensors, "stats": restrided(stats, stats.shape, strides, "stats")})


# ----------------------------------------------------------------------------- heads
class VHeadsAsKHeads(EngineWrapper):
    """H_v ignored: V and dV indexed as if they had H_k heads (their own strides), so the
    dV of H_k heads is written (past dV's end when H_k > H_v, short of it when H_k < H_v)."""

    def run(self, graph, tensors):
        if graph.H_v == graph.H_k:
            return self.inner.run(graph, tensors)
        views, g = dict(tensors), graph
        for port in ("v", "dv"):
            spec = graph.tensors[port]
            dims = (spec.dims[0], graph.H_k, *spec.dims[2:])
            g = with_spec(g, port, dataclasses.replace(spec, dims=dims))
            views[port] = restrided(tensors[port], dims, tensors[port].stride(), port)
        self.inner.run(g, views)


# ----------------------------------------------------------------------------- dO
class DoStridesAsO(EngineWrapper):
    """dO assumed to share O's strides: dO's storage read through O's strides."""

    def run(self, graph, tensors):
        do = tensors["do"]
        self.inner.run(graph, {**tensors, "do": restrided(do, do.shape, tensors["o"].stride(), "do")})


# ----------------------------------------------------------------------------- dV
def row_past_end(view: torch.Tensor) -> torch.Tensor:
    """Storage indices of row S (one past the last row) of every (batch, head) slice."""
    B, H, S, D = view.shape
    sb, sh, ss, sd = view.stride()
    dev = view.device
    b = torch.arange(B, device=dev).view(B, 1, 1)
    h = torch.arange(H, device=dev).view(1, H, 1)
    d = torch.arange(D, device=dev).view(1, 1, D)
    return (view.storage_offset() + b * sb + h * sh + S * ss + d * sd).reshape(-1)


class DvExtraRow(EngineWrapper):
    """dV written with one extra row past its end: after the engine's run, row S_kv of every
    (batch, head) slice gets what a store mask of `n <= S_kv` writes there (zeros: masked
    loads give no key, so P = 0). In BHSD that row is the next head's row 0; past the last
    slice it is the guard band. Indices beyond the storage are not written: that memory is
    not the harness's to watch."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        dv = tensors["dv"]
        size = dv.untyped_storage().nbytes() // dv.element_size()
        index = row_past_end(dv)
        index = index[index < size]
        dv.as_strided((size,), (1,), 0)[index] = 0


# ----------------------------------------------------------------------------- decline arms
class WithoutDeclineArm(WholeEngineWrapper):
    """The engine with one decline arm removed: a graph whose first decline reason has
    `code` is accepted and run anyway. The engine's own run may ask is_applicable again
    (Triton's does), so the wrapped engine answers with this wrapper's rules too: the arm
    is gone wherever the engine asks."""

    def __init__(self, inner: Engine, code: str):
        super().__init__(inner)
        self.code = code
        self.declines = inner.is_applicable      # the engine's own rules, every arm in place
        inner.is_applicable = self.is_applicable

    def is_applicable(self, graph: Graph) -> str | None:
        reason = self.declines(graph)
        return None if reason is not None and code_of(reason) == self.code else reason


# ----------------------------------------------------------------------------- precision
def tf32_rounded(t: torch.Tensor) -> torch.Tensor:
    """t's values rounded to TF32 (fp32 with a 10-bit mantissa, to nearest), in a storage
    of its own addressed with t's dims, strides and offset."""
    whole = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    bits = whole.detach().clone().view(torch.int32)
    bits.add_(1 << 12).bitwise_and_(~((1 << 13) - 1))    # drop 13 of fp32's 23 mantissa bits
    return bits.view(torch.float32).as_strided(t.shape, t.stride(), t.storage_offset())


class Tf32Products(EngineWrapper):
    """An fp32 graph computed with TF32 products, as a GPU's tensor cores do when TF32 is
    allowed: modelled on any device by rounding the products' inputs (Q, K, V, dO) to TF32
    before the engine reads them. Graphs of other dtypes run as they are."""

    PORTS = ("q", "k", "v", "do")

    def run(self, graph, tensors):
        if graph.dtype != "fp32":
            self.inner.run(graph, tensors)
            return
        self.inner.run(graph, {**tensors, **{p: tf32_rounded(tensors[p]) for p in self.PORTS}})


# ----------------------------------------------------------------------------- dropout
def ones_like_view(t: torch.Tensor) -> torch.Tensor:
    """A keep-everything mask addressed like t (t's dims, strides and offset), in a storage
    of its own."""
    whole = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    return torch.ones_like(whole).as_strided(t.shape, t.stride(), t.storage_offset())


def has_dropout_mask(graph: Graph) -> bool:
    """A graph whose dropout mask port the kernels read, with p > 0."""
    return "dropout_mask" in graph.tensors and bool(graph.attributes.dropout_probability)


class DropoutDvUnscaled(EngineWrapper):
    """dV = (P * keep)^T dO: the 1 / (1 - p) scale left out of the dV product only (dP, so
    dQ and dK, keep it). dV is linear in that scale, so the engine's dV times (1 - p) is
    exactly what such a kernel writes."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        if has_dropout_mask(graph):
            tensors["dv"].mul_(1.0 - graph.attributes.dropout_probability)


class DropoutDvMaskMissing(EngineWrapper):
    """dV = (P / (1 - p))^T dO: the mask applied to dP (dQ, dK right) but not to P in the dV
    product. dV comes from a second run with a keep-everything mask; the other outputs from
    the first."""

    def run(self, graph, tensors):
        self.inner.run(graph, tensors)
        if not graph.attributes.dropout_probability or "dropout_mask" not in tensors:
            return
        kept = {p: tensors[p].clone() for p in graph.output_ports if p != "dv"}
        self.inner.run(graph, {**tensors, "dropout_mask": ones_like_view(tensors["dropout_mask"])})
        for port, values in kept.items():
            tensors[port].copy_(values)
