"""The kernels' launches: their arguments, flags and grids (how each tensor is addressed:
addressing.py).

The user's tensors are addressed where they are, through their storage offsets and
strides: nothing is made contiguous or copied. The only allocations are the fp32 Delta
scratch, packed [B, H_q, S_q], and with atomic dQ (DqScratch) a packed fp32 dQ scratch.

A ragged graph's [T, H, D] ports are handed as [1, H, T, D] views whose batch stride is the
token stride (kernels: a program indexes the batch axis by its sequence's first token), and
its offsets as the int32 device tensors `cu_seqlens_q` / `cu_seqlens_kv`, never read here:
the kernels read and bound them. S_q / S_kv are then the max_seqlen bounds (grids, Delta).

Score modifiers: the bias, dbias, sinks, dsinks and alibi_slopes ports are addressed
the same way (base, offset, strides; bias strides 0 where it broadcasts; the dK/dV and dQ
kernels get the bias's and the dropout mask's divided by SCORE_VEC, score_vec); a launch
without one passes None for its arguments (Triton makes them
constexprs, so the kernels compile as they did without modifiers). dBias and dSinks have
kernels of their own, run after dQ (kernels.bwd_dbias, bwd_dsinks).
"""
from __future__ import annotations

import importlib
import math
import sys
import dataclasses
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from bundlegen.graph import OFFSET_PORTS, SEQUSED_PORTS, Graph
from bundlegen.mask import diagonal_shift
from bundlegen.engines.triton.configs import BlockConfig, block_d
from bundlegen.engines.triton.aot import FUSED_DBIAS_ARGS   # the dK/dV kernel's dBias arguments
from bundlegen.engines.triton.dropout_seed import DEFAULT_OFFSET, DEFAULT_SEED
from bundlegen.engines.triton.engine import interpret_enabled, triton_mode_error
from bundlegen.engines.triton.side_stream import beside, side_stream
from bundlegen.engines.triton.addressing import (IO_PORTS, addr, kernel_views, offsets, plain_addr,
                                                 stats_addr, vec_for)
from bundlegen.engines.triton.tile_plan import score_vec
from bundlegen.engines.triton.tile_plan import (STREAMED_PORTS, TILE_OFFSET_LIMIT, VEC,  # noqa: F401
                                                descriptor_loads, head_tiles, needs_wide,
                                                streams_take_descriptors, tile_span, whole_tiles)

SCORE_PORTS = ("bias", "dbias")     # [B|1, H_q|1, S_q, S_kv], io dtype
DROPOUT_PORTS = ("dropout_mask",)   # [B|1, H_q|1, S_q, S_kv], io dtype, keep 1 / drop 0
SCORE_TILE_PORTS = ("bias", "dropout_mask")   # the kernels read tiles of these (score_vec)
SINK_PORTS = ("sinks", "dsinks")    # [H_q] fp32
ALIBI_PORTS = ("alibi_slopes",)     # [H_q] or [B, H_q] fp32
DSINKS_BLOCK = 256                  # rows per step of the dSinks kernel
DBIAS_CHUNK = 32                    # head-dim columns per step of the dBias kernel
DBIAS_TILE = 32                     # its Q and KV blocks: the dQ kernel's, at most this
#: the dQ kernel's stages with score modifiers, at most: its pipelined bias tiles took sm90's
#: D 256 tier (3 stages) past the shared memory an H200 block may have (237568 > 232448
#: bytes), and sm120's D 64 tier spilled 16 bytes at 2 stages (none at 1). Any modifier, not
#: the bias alone: a softcap-only launch compiles as the same variant as one with a bias
#: (resources.REPRESENTED), so it must have the same options.
DQ_MODIFIER_STAGES = 1
#: stages of a split dK or dV pass (BlockConfig.split_dkdv) with score modifiers: the bias
#: tile on top of three stages of the wide tiles is past sm90's shared memory at D 256
SPLIT_MODIFIER_STAGES = 2
KERNELS = "bundlegen.engines.triton.kernels"


def kernels_module(name: str = KERNELS):
    """The kernels module `name`, decorated for the mode TRITON_INTERPRET asks for now. Triton
    reads it when a function is decorated: a kernels module imported under the other mode
    is reloaded, but Triton's own library (tl.sum, tl.cdiv, ...) cannot be, so a process
    that imported Triton under the other mode gets a clear error instead of a crash inside."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    kernels = importlib.import_module(name)
    error = triton_mode_error()
    if error is not None:
        raise RuntimeError(error)
    if isinstance(kernels.bwd_dq, InterpretedFunction) != isinstance(tl.cdiv, InterpretedFunction):
        for part in tile_modules(kernels):   # first: the reloaded kernels import their functions
            importlib.reload(part)
        kernels = importlib.reload(kernels)
    assert isinstance(kernels.bwd_dq, InterpretedFunction) == interpret_enabled()
    if interpret_enabled():
        from bundlegen.engines.triton import interpreter_patch
        interpreter_patch.install()
    return kernels


def tile_modules(kernels) -> list:
    """The modules of the @triton.jit functions the kernels import (tile_ops.py): reloaded too."""
    names = {getattr(getattr(v, "fn", None), "__module__", None) for v in vars(kernels).values()}
    return [sys.modules[n] for n in sorted(names - {None, kernels.__name__})
            if n in sys.modules and not n.startswith("triton")]


def out_of_resources(exc: BaseException) -> bool:
    """A launch failed for shared memory or registers: a smaller config may fit."""
    from triton.runtime.errors import OutOfResources
    return isinstance(exc, OutOfResources) or "out of resource" in str(exc).lower()


def _bounds(graph: Graph) -> tuple[int, int, int]:
    """(shift, left, right) for the kernels. A bound at `far` or beyond keeps every (i, j),
    so bounds are clipped to it (keeping them 32-bit), and an absent bound is passed as
    `far`: the kernel of both bounds then serves every band kind (band_flags).
    `far` is past every |j - i - shift| by more than a tile's rows, so that no bound formula
    of the kernels finds a partial block at it. A ragged graph's shift is per sequence, from
    its own lengths (the kernels form it; 0 here)."""
    a = graph.attributes
    shift = diagonal_shift(graph.S_q, graph.S_kv, a.diagonal_alignment)
    if graph.ragged is not None:   # per sequence (ragged_flags' bottom_right)
        shift = 0
    far = 2 * (graph.S_q + graph.S_kv + 1)
    left = min(a.left_bound, far) if a.left_bound is not None else far
    right = min(a.right_bound, far) if a.right_bound is not None else far
    return shift, left, right


def modifier_flags(graph: Graph) -> dict:
    """HAS_BIAS and SOFTCAP, the score-modifier constexprs of the dK/dV and dQ kernels, with
    HAS_ALIBI (the alibi_slopes port), and HAS_DROPOUT (p > 0) with DRAWN_DROPOUT (no
    dropout_mask port: the kernels draw the mask)."""
    dropout = bool(graph.attributes.dropout_probability)
    return dict(HAS_BIAS="bias" in graph.tensors, SOFTCAP=graph.attributes.softcap is not None,
                HAS_DROPOUT=dropout, DRAWN_DROPOUT=graph.asks_drawn_dropout,
                HAS_ALIBI="alibi_slopes" in graph.tensors)


def dropout_form(graph: Graph) -> str | None:
    """The graph's dropout: "port" (the dropout_mask port), "drawn" (the kernels draw the
    mask), or None (no dropout)."""
    if not graph.attributes.dropout_probability:
        return None
    return "drawn" if graph.asks_drawn_dropout else "port"


@dataclass(frozen=True)
class Launch:
    """Everything the three kernels of one backward are launched with; the stages below
    (preprocess, dK/dV, dQ) run in that order and can be timed one by one (bench/tune_triton.py)."""
    kernels: Any
    graph: Graph
    cfg: BlockConfig
    vec: int
    flags: Mapping[str, Any]
    tiles: Mapping[str, int]     # head-dim tiles: BLOCK_DQK, BLOCK_DV, BLOCK_DQK2, BLOCK_DV2
    ports: Mapping[str, tuple]   # port -> (base, offset, strides...) from addressing.addr / stats_addr
    delta: torch.Tensor          # fp32 [B, H_q, S_q] scratch
    ragged: tuple = (None, None, None, None)   # offsets(): (cu_q, cu_kv, T_q, T_kv)
    #: modifier port -> addressing.plain_addr (None where the graph has no such port)
    mods: Mapping[str, tuple | None] = dataclasses.field(default_factory=dict)
    #: atomic dQ (prepare's atomic_dq): the dK pass adds dS K into this scratch, no dQ kernel
    dq_scratch: "DqScratch | None" = None
    #: TMA launches (descriptor_loads): the [B, H, S, D] ports their descriptors are made of
    streamed: Mapping[str, torch.Tensor] | None = None
    used: tuple = (None, None)   # used_lengths(): (seqused_q, seqused_kv) device tensors or None
    #: (seed, Philox offset) a DRAWN_DROPOUT launch draws its mask from (dropout_draw.py)
    draw: tuple[int, int] = (DEFAULT_SEED, DEFAULT_OFFSET)
    #: the config the preprocess kernel runs with: the one prepare was given, before its
    #: switches (BlockConfig.switches), so that a tier compiles one preprocess variant
    #: whatever dQ tiles its modifier and dropout configs have; None: cfg's
    preprocess_cfg: BlockConfig | None = None

    @property
    def variant(self) -> tuple:
        """What Triton compiles this launch's kernels from besides the config: the io dtype,
        the head-dim tiles, the constexpr flags, the dK/dV passes' head sharing and which
        modifier kernels run. The engine keys the config that fits a variant by it, so a
        launch's config never depends on which launches came before it."""
        g = self.graph
        return (g.dtype, tuple(sorted(self.tiles.items())), tuple(sorted(self.flags.items())),
                g.H_k == g.H_v, tuple(sorted(p for p, a in self.mods.items() if a is not None)),
                self.dq_scratch is not None)

    @property
    def pointers(self) -> tuple:
        p = self.ports
        return (p["q"][0], p["k"][0], p["v"][0], p["do"][0], p["stats"][0], self.delta)

    @property
    def addressing(self) -> tuple:
        p = self.ports
        return (*p["q"][1:], *p["k"][1:], *p["v"][1:], *p["do"][1:], *p["stats"][1:])

    def descriptors(self, ports: tuple[str, str], rows: int) -> tuple:
        """The TMA descriptors of two streamed ports (q and do, or k and v), [1, 1, rows,
        head-dim tile] blocks; (None, None) in a launch without TMA."""
        if self.streamed is None:
            return None, None
        from triton.tools.tensor_descriptor import TensorDescriptor

        out = []
        for port in ports:
            t = self.streamed[port]
            cols = self.tiles["BLOCK_DQK" if port in ("q", "k") else "BLOCK_DV"]
            out.append(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, cols]))
        return tuple(out)

    @property
    def score_args(self) -> tuple:
        """(BIAS, bias_off, 4 bias strides, softcap, DROP, drop_off, 4 mask strides,
        drop_scale, drop_seed, drop_offset, drop_p, ALIBI, alibi_off, 2 slope strides) of the
        dK/dV and dQ kernels; None for a modifier the graph does not have (the mask port's or
        the draw's, without dropout)."""
        bias = self._score_addr("bias") or (None,) * 6
        cap = self.graph.attributes.softcap
        port = self._score_addr("dropout_mask")
        p = self.graph.attributes.dropout_probability
        scale = (1.0 / (1.0 - p),) if p else (None,)
        drawn = (*self.draw, float(p)) if self.flags["DRAWN_DROPOUT"] else (None,) * 3
        return (*bias, None if cap is None else float(cap), *(port or (None,) * 6), *scale, *drawn,
                *self.alibi_args)

    def _score_addr(self, port: str) -> tuple | None:
        """A bias or dropout mask port's address for the dK/dV and dQ kernels: offset and
        strides divided by SCORE_VEC (tile_ops.score_tile multiplies them back)."""
        at, vec = self.mods.get(port), self.flags.get("SCORE_VEC", 1)
        return at if at is None or vec == 1 else (at[0], *(x // vec for x in at[1:]))

    @property
    def alibi_args(self) -> tuple:
        """(ALIBI, alibi_off, salibi_b, salibi_h): the slopes, their batch stride 0 when they
        are [H_q]; None each without them."""
        slopes = self.mods.get("alibi_slopes") or (None,) * 4
        return (*slopes[:2], 0, slopes[2]) if len(slopes) == 3 else slopes

    @property
    def sizes(self) -> tuple:
        g = self.graph
        shift, left, right = _bounds(g)
        return (g.S_q, g.S_kv, g.D_qk // self.vec, g.D_v // self.vec,
                float(g.attributes.attn_scale), shift, left, right, *self.ragged[2:])


@dataclass(frozen=True)
class DqScratch:
    """An atomic-dQ launch's fp32 scratch (the only allocation besides Delta): zeros in dQ's
    logical dims with each row padded to the head-dim tile, so the kernel's atomic adds are
    aligned vector reductions with no head-dim mask; and the dq port it is copied into."""
    acc: torch.Tensor
    out: torch.Tensor

    @property
    def kernel_args(self) -> tuple:
        """(DQA, sqa_b, sqa_h, sqa_s): the scratch, strides in padded rows."""
        row = self.acc.shape[-1]
        return (self.acc, *(s // row for s in self.acc.stride()[:3]))

    def copy_out(self) -> None:
        self.out.copy_(self.acc[..., :self.out.shape[-1]])


def dq_scratch(graph: Graph, dq: torch.Tensor) -> DqScratch:
    """The zeroed scratch of a padded graph (engine.atomic_dq_serves: never a ragged one)."""
    if graph.ragged is not None:
        raise ValueError("atomic dQ serves padded graphs only (engine.atomic_dq_serves)")
    padded = (*dq.shape[:-1], block_d(graph.D_qk))
    return DqScratch(torch.zeros(padded, dtype=torch.float32, device=dq.device), dq)


def block_major(graph: Graph) -> bool:
    """Programs ordered block by block across heads (the heavy blocks of every head first)
    under a one-sided band (causal, or a left bound alone) with K/V heads shared by a group
    of Q heads: a dK/dV program then does a group's work, and head-major order leaves the
    heaviest programs of the last heads for the end. MHA stays head-major: there the order
    gained nothing at D <= 128 and lost at D >= 192 (`python bench/tune_triton.py --orders`)."""
    a = graph.attributes
    one_sided = (a.left_bound is None) != (a.right_bound is None)
    return one_sided and graph.H_q > min(graph.H_k, graph.H_v)


def prepare(graph: Graph, tensors: Mapping[str, torch.Tensor], cfg: BlockConfig,
            order: bool | None = None, kernels: str = KERNELS, atomic_dq: bool = False,
            tma: bool | None = None, draw: tuple[int, int] = (DEFAULT_SEED, DEFAULT_OFFSET)) -> Launch:
    """`order` overrides block_major(graph) (bench/tune_triton.py compares the two);
    `kernels` names the kernels module (the engine's); `atomic_dq`: dQ from the dK pass with
    atomics (kernels.bwd_dkdv ATOMIC_DQ) instead of the dQ kernel; `tma` False keeps the
    pointer loads where descriptor_loads would allow descriptors (bench/compare_kernels.py).
    A launch with score modifiers or dropout runs the config's own for them
    (BlockConfig.for_scores), and one without descriptors then its pointer_loads where it
    has one. `draw`:
    the (seed, offset) a graph with dropout and no mask port draws its mask from."""
    a = graph.attributes
    scratch = dq_scratch(graph, tensors["dq"]) if atomic_dq else None
    ragged, used = offsets(graph, tensors), used_lengths(graph, tensors)
    mods = {p: plain_addr(tensors.get(p)) for p in SCORE_PORTS + SINK_PORTS + DROPOUT_PORTS + ALIBI_PORTS}
    scores = {p: tensors[p] for p in SCORE_PORTS if p in tensors}
    read = [tensors[p] for p in SCORE_TILE_PORTS if p in tensors]
    tensors = kernel_views(graph, tensors)
    vec = vec_for(tensors)
    given = cfg
    cfg = cfg.for_scores(modified(modifier_flags(graph)), dropout_form(graph))
    tiles = head_tiles(graph, cfg)
    # (the atomic-dQ launches keep the pointer loads they were measured with)
    descriptors = (descriptor_loads(graph, cfg, tiles, vec, tensors) and tma is not False
                   and not atomic_dq)
    if not descriptors and cfg.pointer_loads is not None:
        cfg = cfg.pointer_loads
    flags = dict(**band_flags(graph, tiles),
                 block_major=int(block_major(graph) if order is None else order),
                 # the interpreter's tl.dot cannot multiply bf16 (see tile_ops.dot_acc)
                 UPCAST=interpret_enabled() and graph.dtype == "bf16",
                 WIDE=needs_wide(tensors, cfg, scores), VEC=vec, **ragged_flags(graph),
                 **modifier_flags(graph), EVEN=whole_tiles(graph, cfg, tiles))
    flags["TMA"] = descriptors
    flags["SCORE_VEC"] = score_vec(cfg, flags, read)
    ports = {p: addr(tensors[p], vec) for p in IO_PORTS}
    ports["stats"] = stats_addr(tensors["stats"])
    delta = torch.empty((graph.B, graph.H_q, graph.S_q), dtype=torch.float32,
                        device=tensors["q"].device)
    streamed = {p: tensors[p] for p in STREAMED_PORTS} if flags["TMA"] else None
    return Launch(kernels_module(kernels), graph, cfg, vec, flags, tiles, ports, delta, ragged,
                  mods, scratch, streamed, used, draw, preprocess_cfg=given)


def band_flags(graph: Graph, tiles: Mapping[str, int]) -> dict:
    """HAS_LEFT and HAS_RIGHT: a band of any kind (causal, a window, a left bound alone)
    launches the kernels of both bounds (_bounds passes an absent one as `far`), so the
    three kinds compile as one kernel, not three; except the two-chunk kernels (BLOCK_DQK2),
    where each kind keeps its own: the code of both bounds made them 3 % slower causal on the
    H200 at every S, for 46 kernels of the four levels' 902. D 64 causal lost 1-3 % at S 4096
    and under; keeping its kinds apart too would compile 152 more kernels. lone_bound, a
    run-time 1 (a left bound alone) or 2 (a right bound alone: causal), else 0, puts the
    programs with the most work first: the dK/dV kernel's last KV blocks under a left bound
    alone, the dQ kernel's last Q blocks under a right bound alone."""
    a = graph.attributes
    left, right = a.left_bound is not None, a.right_bound is not None
    lone = 1 if left and not right else 2 if right and not left else 0
    if (left or right) and not tiles["BLOCK_DQK2"]:
        left = right = True
    return dict(HAS_LEFT=left, HAS_RIGHT=right, lone_bound=lone)


def ragged_flags(graph: Graph) -> dict:
    """RAGGED, and bottom_right (a run-time 1: the kernels shift each sequence's diagonal by
    its own S_kv_b - S_q_b); both off for a padded graph, whose shift comes from _bounds.
    HAS_USED_Q / HAS_USED_KV: the side has used lengths (Ragged.seqused_*), read on the device."""
    ragged = graph.ragged is not None
    used = graph.ragged.seqused_ports if ragged else ()
    flags = dict(RAGGED=ragged,
                 bottom_right=int(ragged and graph.attributes.diagonal_alignment == "BOTTOM_RIGHT"))
    return dict(flags, HAS_USED_Q="seqused_q" in used, HAS_USED_KV="seqused_kv" in used)


def meta_tensors(graph: Graph) -> dict[str, torch.Tensor]:
    """The tensors `prepare` takes for `graph` on the meta device (nothing allocated, nothing
    runs): each port at its declared dims, strides and offset, and a ragged graph's offsets
    and used lengths."""
    from bundlegen.dtypes import TORCH_DTYPES
    tensors = {port: torch.empty(1, dtype=TORCH_DTYPES[spec.dtype], device="meta").as_strided(
                   spec.dims, spec.strides, spec.offset) for port, spec in graph.tensors.items()}
    if graph.ragged is not None:
        for name in OFFSET_PORTS:
            tensors[name] = torch.empty(graph.B + 1, dtype=torch.int32, device="meta")
        for name in graph.ragged.seqused_ports:
            tensors[name] = torch.empty(graph.B, dtype=torch.int32, device="meta")
    return tensors


def used_lengths(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> tuple:
    """(seqused_q, seqused_kv) for the kernels: the int32 [B] device tensors of the sides that
    have used lengths, None for the others (and for a padded graph)."""
    if graph.ragged is None:
        return None, None
    for name in graph.ragged.seqused_ports:
        t = tensors.get(name)
        if t is None or t.dtype != torch.int32 or t.shape != (graph.B,) or t.device != tensors["q"].device:
            raise ValueError(f"a graph with {name} needs it as int32 [B] = [{graph.B}] on the ports' device; "
                             f"got {None if t is None else (t.dtype, tuple(t.shape), str(t.device))}")
    return tuple(tensors[n] if n in graph.ragged.seqused_ports else None for n in SEQUSED_PORTS)


def run_preprocess(L: Launch) -> None:
    """Delta, over the dQ kernel's Q tiles with its options, those of the config prepare was
    given (Launch.preprocess_cfg: the same with and without descriptors, the pointer_loads
    configs differ in the dK/dV kernel only; and before the modifiers' or dropout's)."""
    g, cfg, o, do = L.graph, L.preprocess_cfg or L.cfg, L.ports["o"], L.ports["do"]
    grid = math.ceil(g.S_q / cfg.block_m2) * g.B * g.H_q
    if grid == 0:   # a ragged batch whose q sequences are all empty
        return
    L.kernels.bwd_preprocess[(grid,)](
        o[0], do[0], L.delta, L.ragged[0], *o[1:], *do[1:], g.H_q, g.S_q, g.D_v // L.vec,
        L.ragged[2], BLOCK_M=cfg.block_m2, BLOCK_DV=block_d(g.D_v), VEC=L.vec,
        WIDE=L.flags["WIDE"], RAGGED=L.flags["RAGGED"], HAS_USED_Q=L.flags["HAS_USED_Q"],
        USED_Q=L.used[0], **cfg.launch_kwargs(dq=True))


def dkdv_passes(graph: Graph, cfg: BlockConfig) -> list[tuple[int, bool, bool]]:
    """(H_grp, COMPUTE_DK, COMPUTE_DV) of each dK/dV pass: one pass grouped by K heads when
    H_k == H_v (unless the config splits it), else a dK pass and a dV pass."""
    if graph.H_k == graph.H_v and not cfg.split_dkdv:
        return [(graph.H_k, True, True)]
    return [(graph.H_k, True, False), (graph.H_v, False, True)]


def run_dkdv(L: Launch, only: str | None = None) -> None:
    """The dK/dV passes (dkdv_passes); `only` "dk" or "dv" runs that pass alone (timing)."""
    g, dk, dv = L.graph, L.ports["dk"], L.ports["dv"]
    for H_grp, do_dk, do_dv in dkdv_passes(g, L.cfg):
        if only is not None and only != ("dk" if do_dk else "dv"):
            continue
        cfg = L.cfg
        if not do_dk and cfg.dv_pass is not None:
            m, n, warps, stages = cfg.dv_pass
            cfg = replace(cfg, block_m1=m, block_n1=n, num_warps=warps, num_stages=stages)
        if g.H_k != g.H_v and cfg.unshared_stages is not None:
            cfg = replace(cfg, num_stages=cfg.unshared_stages)
        if cfg.split_dkdv and modified(L.flags):
            cfg = replace(cfg, num_stages=min(cfg.num_stages, SPLIT_MODIFIER_STAGES))
        grid = math.ceil(g.S_kv / cfg.block_n1) * g.B * H_grp
        if grid == 0:   # a ragged batch whose kv sequences are all empty
            return
        atomic = L.dq_scratch is not None and do_dk   # dS exists in the dK pass only
        fused = fused_dbias_args(L, do_dk and fuses_dbias(L))
        L.kernels.bwd_dkdv[(grid,)](
            *L.pointers, dk[0], dv[0], *L.ragged[:2], *L.addressing, *dk[1:], *dv[1:],
            g.H_q, H_grp, g.H_q // g.H_k, g.H_q // g.H_v, *L.sizes, *L.score_args,
            *(L.dq_scratch.kernel_args if atomic else (None,) * 4),
            *L.descriptors(("q", "do"), cfg.block_m1), ATOMIC_DQ=atomic,
            COMPUTE_DK=do_dk, COMPUTE_DV=do_dv, BLOCK_M=cfg.block_m1, BLOCK_N=cfg.block_n1,
            KV_SHARED=g.H_k == g.H_v, DP_FIRST=dp_first(cfg, L.flags), **L.flags, **L.tiles,
            USED_Q=L.used[0], USED_KV=L.used[1], **fused, **cfg.launch_kwargs())


def fuses_dbias(L: Launch) -> bool:
    """Whether the dK pass stores dBias (BlockConfig.fused_dbias): where every dBias entry is
    one (query head, Q block, KV block) tile of that pass, visited once: dBias not broadcast
    over batch or heads (a sum), a padded batch without used lengths, no band (the blocks it
    skips would be left unwritten) and no dropout (bwd_dbias's dS has no dropout factor)."""
    g, f = L.graph, L.flags
    return (L.cfg.fused_dbias and L.mods.get("dbias") is not None
            and tuple(g.tensors["dbias"].dims[:2]) == (g.B, g.H_q) and g.ragged is None
            and not (f["HAS_LEFT"] or f["HAS_RIGHT"] or f["HAS_DROPOUT"] or f.get("HAS_USED_Q")
                     or f.get("HAS_USED_KV")))


def fused_dbias_args(L: Launch, on: bool) -> dict:
    """The dK/dV kernel's FUSED_DBIAS and its arguments: dBias's address, or all None (every
    constexpr is passed: resources.py records them)."""
    values = L.mods["dbias"] if on else (None,) * len(FUSED_DBIAS_ARGS)
    return dict(zip(FUSED_DBIAS_ARGS, values), FUSED_DBIAS=on)


def modified(flags: Mapping[str, Any]) -> bool:
    """A launch with score modifiers (a bias, a softcap, ALiBi slopes) or dropout: the stage
    and dp_first limits below hold for each, since all compile as one variant
    (resources.REPRESENTED)."""
    return bool(flags["HAS_BIAS"] or flags["SOFTCAP"] or flags.get("HAS_ALIBI") or flags["HAS_DROPOUT"])


def dp_first(cfg: BlockConfig, flags: Mapping[str, Any]) -> bool:
    """The dK pass's DP_FIRST: the config's, never with score modifiers (with their tiles
    dP^T first spilled 568-928 bytes in sm90's aligned D 128 and D 192 variants,
    engines/triton/resources.json)."""
    return cfg.dp_first and not modified(flags)


def run_dq(L: Launch) -> None:
    """The dQ kernel; with atomic dQ, the copy of the scratch the dK pass added into."""
    if L.dq_scratch is not None:
        L.dq_scratch.copy_out()
        return
    g, cfg, dq = L.graph, L.cfg, L.ports["dq"]
    grid = math.ceil(g.S_q / cfg.block_m2) * g.B * g.H_q
    if grid == 0:
        return
    L.kernels.bwd_dq[(grid,)](
        *L.pointers, dq[0], *L.ragged[:2], *L.addressing, *dq[1:], g.H_q, g.H_q // g.H_k,
        g.H_q // g.H_v,
        *L.sizes, *L.score_args, *L.descriptors(("k", "v"), cfg.block_n2),
        BLOCK_M=cfg.block_m2, BLOCK_N=cfg.block_n2, **L.flags, **L.tiles, USED_Q=L.used[0],
        USED_KV=L.used[1], **dq_options(L))


def dq_options(L: Launch) -> dict:
    """The dQ kernel's compile options: the config's, at most DQ_MODIFIER_STAGES with score
    modifiers."""
    kw = L.cfg.launch_kwargs(dq=True)
    if modified(L.flags):
        kw["num_stages"] = min(kw["num_stages"], DQ_MODIFIER_STAGES)
    return kw


def run_dbias(L: Launch) -> None:
    """dBias, summed over the batch and / or head axes it has length 1 on (where the bias
    broadcasts): one program per dBias tile. Tiles: the dQ kernel's, at most DBIAS_TILE;
    options: the dQ kernel's with one stage (the loop reloads Q, K, dO and V for every
    summed head; pipelining them took more shared memory than sm90 has at D 128)."""
    dbias = L.mods.get("dbias")
    if dbias is None or fuses_dbias(L):
        return
    g, cfg, f = L.graph, L.cfg, L.flags
    B_db, H_db = g.tensors["dbias"].dims[:2]
    block_m, block_n, warps = dbias_tiles(cfg)
    grid = B_db * H_db * math.ceil(g.S_q / block_m) * math.ceil(g.S_kv / block_n)
    shift, left, right = _bounds(g)
    L.kernels.bwd_dbias[(grid,)](
        *L.pointers, L.mods["bias"][0], dbias[0], *L.addressing, *L.mods["bias"][1:],
        *dbias[1:], g.H_q, g.H_q // g.H_k, g.H_q // g.H_v, g.S_q, g.S_kv, g.D_qk // L.vec,
        g.D_v // L.vec, float(g.attributes.attn_scale), shift, left, right, L.score_args[6],
        g.B if B_db == 1 else 1, g.H_q if H_db == 1 else 1, H_db,
        HAS_LEFT=f["HAS_LEFT"], HAS_RIGHT=f["HAS_RIGHT"], SOFTCAP=f["SOFTCAP"],
        UPCAST=f["UPCAST"], WIDE=f["WIDE"], VEC=L.vec, BLOCK_M=block_m, BLOCK_N=block_n,
        CHUNK_QK=min(DBIAS_CHUNK, L.tiles["BLOCK_DQK"]),
        CHUNK_V=min(DBIAS_CHUNK, L.tiles["BLOCK_DV"]),
        **dict(zip(("ALIBI", "alibi_off", "salibi_b", "salibi_h"), L.alibi_args)),
        HAS_ALIBI=f["HAS_ALIBI"], **_ragged_kwargs(L, ("CU_Q", "CU_KV", "T_q", "T_kv", "bottom_right", "USED_Q", "USED_KV", "HAS_USED_Q", "HAS_USED_KV"), "RAGGED_DB"),
        **dict(cfg.launch_kwargs(dq=True), num_stages=1, num_warps=warps))


def dbias_tiles(cfg: BlockConfig) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, warps) of the dBias kernel: the config's dbias_tiles, else the dQ
    kernel's tiles at most DBIAS_TILE on the dQ kernel's warps."""
    if cfg.dbias_tiles is not None:
        return cfg.dbias_tiles
    return min(cfg.block_m2, DBIAS_TILE), min(cfg.block_n2, DBIAS_TILE), cfg.launch_kwargs(dq=True)["num_warps"]


def _ragged_kwargs(L: Launch, names: tuple[str, ...], flag: str) -> dict:
    """The dBias or dSinks kernel's ragged flag and, ragged, its `names` (a padded launch
    passes the flag off alone: those kernels compile as before they took ragged batches)."""
    if L.graph.ragged is None:   # (and no used lengths: every constexpr is passed, as resources records)
        return {flag: False, **{n: False for n in names if n.startswith("HAS_USED")}}
    values = dict(zip(("CU_Q", "CU_KV", "T_q", "T_kv"), L.ragged), bottom_right=L.flags["bottom_right"],
                  USED_Q=L.used[0], USED_KV=L.used[1], HAS_USED_Q=L.flags["HAS_USED_Q"],
                  HAS_USED_KV=L.flags["HAS_USED_KV"])
    return dict({n: values[n] for n in names}, **{flag: True})


def run_dsinks(L: Launch) -> None:
    """dSinks from the stats and Delta: one program per query head."""
    dsinks = L.mods.get("dsinks")
    if dsinks is None:
        return
    g, stats = L.graph, L.ports["stats"]
    L.kernels.bwd_dsinks[(g.H_q,)](
        stats[0], L.delta, L.mods["sinks"][0], dsinks[0], *stats[1:], *L.mods["sinks"][1:],
        *dsinks[1:], g.B, g.H_q, g.S_q, BLOCK=DSINKS_BLOCK, num_warps=4,
        **_ragged_kwargs(L, ("CU_Q", "T_q", "USED_Q", "HAS_USED_Q"), "RAGGED_DS"))


def launch(graph: Graph, tensors: Mapping[str, torch.Tensor], cfg: BlockConfig,
           kernels: str = KERNELS) -> None:
    """Run preprocess, dK/dV (one or two passes), dQ, then dBias and dSinks where the graph
    has them, of the kernels module `kernels` into tensors['dq'|'dk'|'dv'|'dbias'|'dsinks']."""
    run(prepare(graph, tensors, cfg, kernels=kernels))


def run(L: Launch, overlap: bool = True) -> None:
    """launch() of a prepared Launch. With `overlap`, on a GPU, the dQ kernel (and a second
    dK/dV pass) runs on a side stream beside the first dK/dV pass (beside())."""
    run_preprocess(L)
    side = side_stream(L.delta.device) if overlap and L.dq_scratch is None else None
    if side is None:
        run_dkdv(L)
        run_dq(L)
    elif len(dkdv_passes(L.graph, L.cfg)) == 1:
        beside(side, lambda: run_dkdv(L), lambda: run_dq(L))
    else:
        beside(side, lambda: run_dkdv(L, only="dk"),
               lambda: (run_dkdv(L, only="dv"), run_dq(L)))
    run_dbias(L)
    run_dsinks(L)
