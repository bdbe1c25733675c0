"""What the Triton engine serves, one frozen row per target arch (cuDNN-frontend style).

`Capabilities.mismatch(graph)` returns the first reason the row cannot serve the graph, in
a fixed order: dtype, head dim, output layout (zero stride, then overlap), gated features.
Everything else a valid graph can declare is served natively: any strides on inputs
(including zero and non-unit head-dim strides), any stats strides, GQA/MQA with H_k != H_v,
D_qk != D_v, any sequence lengths, every mask and alignment, any positive scale, and ragged
(THD / varlen) batches in any token-major layout (offsets and per-sequence used lengths
read and bounded on the device), and the score modifiers (bias with any strides, broadcast
over batch and / or heads by zero strides; dBias in any layout that addresses each element
once, summed over the bias's broadcast axes; sinks and dSinks; softcap; ALiBi slopes,
kernels' HAS_ALIBI) alone or combined, on padded and ragged graphs (RAGGED with the
modifier constexprs, the dBias and dSinks kernels' RAGGED_DB / RAGGED_DS) with every mask,
GQA / MQA, layout and head dim.
Declined where a compiled variant spills (engines/triton/resources.json): on sm120 a
modifier with H_k != H_v past D 64 (split_pass_modifiers_max_d: its dK pass spills there)
and dBias on a ragged batch below D 256 (ragged_dbias_min_d), on gfx942 a modifier with
unaligned io rows (unaligned_modifiers) and ALiBi's variants at D 64 with 64-bit tile
offsets (wide_alibi_spills).
Dropout, through the dropout_mask port or with the mask drawn by the kernels, is served where
the row says (dropout, drawn_dropout, dropout_spills; on ragged batches ragged_dropout).
"""
from __future__ import annotations

from dataclasses import dataclass

from bundlegen import reasons as R
from bundlegen.graph import MODIFIERS, Graph
from bundlegen.engines.triton.configs import ARCHS as ARCH_CONFIGS, block_d, tier_key
from bundlegen.validate import output_layout_reason

SERVED_DTYPES = frozenset({"fp16", "bf16", "fp32"})   # fp32: tl.dot with ieee precision (kernels._dot)
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class Capabilities:
    arch: str
    dtypes: frozenset[str] = SERVED_DTYPES
    max_head_dim: int = MAX_HEAD_DIM
    #: dropout through the dropout_mask port (kernels' HAS_DROPOUT); off where no dropout
    #: variant has been compiled and resource-checked (resources.json holds none)
    dropout: bool = False
    #: dropout with no dropout_mask port, the mask drawn by the kernels (DRAWN_DROPOUT)
    drawn_dropout: bool = False
    #: dropout (either form) on ragged batches (its variants compile with every modifier,
    #: ALiBi and used lengths: resources.REPRESENTED)
    ragged_dropout: bool = False
    #: dropout declined where its kernel variants spill registers on this arch
    #: (engines/triton/resources.json): (form "port" | "drawn", head-dim tier: the configs'
    #: largest BLOCK_D of the tier, io rows "aligned" | "unaligned": the launcher's VEC 8 or 1)
    dropout_spills: frozenset[tuple[str, int, str]] = frozenset()
    ragged: bool = True            # packed variable-length batches (kernels' RAGGED variants)
    #: padded varlen (per-sequence used lengths, kernels' HAS_USED_Q / HAS_USED_KV)
    seqused: bool = True
    run_here: bool = True          # False: configured, not run by this project (matrix: not run)
    #: score modifiers served (kernels' HAS_BIAS / SOFTCAP variants, bwd_dbias, bwd_dsinks),
    #: any combination of them, on padded graphs
    score_modifiers: frozenset[str] = frozenset(MODIFIERS)
    #: score modifiers on ragged graphs (RAGGED with the modifier constexprs, the dBias and
    #: dSinks kernels' RAGGED_DB / RAGGED_DS)
    ragged_modifiers: bool = True
    #: the largest padded head dim (BLOCK_D) at which graphs with H_k != H_v, whose separate
    #: dK pass is the heaviest kernel, are served with modifiers; None: every head dim
    split_pass_modifiers_max_d: int | None = None
    #: the smallest head-dim tier at which dBias is served on ragged graphs; None: every
    #: tier (the ragged dBias kernel compiles with ALiBi's term: resources.REPRESENTED)
    ragged_dbias_min_d: int | None = None
    #: head-dim tiers whose ALiBi variants spill with 64-bit tile offsets (WIDE): ALiBi slopes,
    #: or any modifier on a ragged graph (one stand-in with ALiBi serves those), declined there
    wide_alibi_spills: frozenset[int] = frozenset()
    #: False: modifiers only where every io port's rows are 16-byte aligned (the VEC 8
    #: variants); the unaligned (VEC 1) modifier variants spill on that arch
    unaligned_modifiers: bool = True
    #: the largest head dim served with fp32 io; None: every head dim. fp32 tiles take twice
    #: the bytes of the 16-bit tiles the configs were sized and resource-checked for
    #: (resources.json holds no fp32 variant), and ieee products run without MMA
    fp32_max_head_dim: int | None = None

    def mismatch(self, graph: Graph) -> str | None:
        if graph.dtype not in self.dtypes:
            return f"{R.DTYPE_NOT_SERVED}: {graph.dtype} (served: {', '.join(sorted(self.dtypes))})"
        if max(graph.D_qk, graph.D_v) > self.max_head_dim:
            return (f"{R.HEAD_DIM_TOO_LARGE}: D_qk={graph.D_qk}, D_v={graph.D_v} "
                    f"(at most {self.max_head_dim})")
        limit = self.fp32_max_head_dim
        if graph.dtype == "fp32" and limit is not None and max(graph.D_qk, graph.D_v) > limit:
            return (f"{R.HEAD_DIM_TOO_LARGE}: D_qk={graph.D_qk}, D_v={graph.D_v} with fp32 io on "
                    f"{self.arch} (at most {limit}: fp32 tiles are not resource-checked past it)")
        layout = output_layout_reason(graph)
        if layout is not None:
            return layout
        if graph.attributes.dropout_probability:   # p = 0 is the plain graph
            if not self.dropout:
                return (f"{R.DROPOUT_NOT_SERVED}: dropout on {self.arch} (no dropout kernel variant "
                        "is resource-checked there: engines/triton/resources.json)")
            if "dropout_mask" not in graph.tensors and not self.drawn_dropout:
                return (f"{R.DROPOUT_NOT_SERVED}: a mask drawn by the kernels on {self.arch} (no "
                        "drawn-dropout variant is resource-checked there)")
            if graph.ragged is not None and not self.ragged_dropout:
                return (f"{R.DROPOUT_NOT_SERVED}: dropout on a ragged batch on {self.arch} (no "
                        "ragged dropout variant is compiled and checked there)")
            if "dbias" in graph.tensors:
                return (f"{R.MODIFIER_COMBINATION_NOT_SERVED}: dbias with dropout (the dBias kernel "
                        "has no dropout variant)")
            spill = self.dropout_spill(graph)
            if spill is not None:
                form, tier, rows = spill
                return (f"{R.DROPOUT_NOT_SERVED}: dropout ({'the mask port' if form == 'port' else 'a drawn mask'}"
                        f") at head-dim tier d{tier} with {rows} io rows on {self.arch} (those kernel "
                        "variants spill registers: engines/triton/resources.json)")
        if graph.ragged is not None and not self.ragged:
            return f"{R.RAGGED_NOT_SERVED}: no ragged kernels for {self.arch}"
        if graph.ragged is not None and graph.ragged.seqused_ports and not self.seqused:
            return (f"{R.SEQUSED_NOT_SERVED}: {', '.join(graph.ragged.seqused_ports)} on {self.arch} (no "
                    "used-length kernel variant is resource-checked there: engines/triton/resources.json)")
        used = graph.modifiers
        missing = used - self.score_modifiers
        if missing:
            return f"{R.MODIFIER_NOT_SERVED}: {', '.join(sorted(missing))} on {self.arch}"
        if used and graph.ragged is not None and not self.ragged_modifiers:
            return (f"{R.MODIFIER_COMBINATION_NOT_SERVED}: {', '.join(sorted(used))} with a ragged "
                    f"batch on {self.arch} (no ragged variant with score modifiers is "
                    "resource-checked there: engines/triton/resources.json)")
        if used and not self.unaligned_modifiers and not _io_rows_aligned(graph):
            return (f"{R.MODIFIER_COMBINATION_NOT_SERVED}: {', '.join(sorted(used))} with io rows "
                    f"not 16-byte aligned on {self.arch} (its unaligned modifier variants spill "
                    "registers: engines/triton/resources.json)")
        limit = self.split_pass_modifiers_max_d
        if (used and limit is not None and graph.H_k != graph.H_v
                and block_d(max(graph.D_qk, graph.D_v)) > limit):
            return (f"{R.MODIFIER_COMBINATION_NOT_SERVED}: {', '.join(sorted(used))} with "
                    f"H_k != H_v at D > {limit} on {self.arch} (its separate dK pass with "
                    "modifiers spills registers there: engines/triton/resources.json)")
        ragged = graph.ragged is not None
        if ragged and "dbias" in graph.tensors and (self.ragged_dbias_min_d or 0) > self.tier(graph):
            return (f"{R.MODIFIER_COMBINATION_NOT_SERVED}: dbias with a ragged batch at head-dim tier "
                    f"d{self.tier(graph)} on {self.arch} (its ragged dBias variants spill registers below "
                    f"d{self.ragged_dbias_min_d}: engines/triton/resources.json)")
        if ((self.tier(graph) in self.wide_alibi_spills) and ("alibi_slopes" in graph.tensors or (ragged and used))
                and _needs_wide(graph, self.arch)):
            return (f"{R.MODIFIER_COMBINATION_NOT_SERVED}: {', '.join(sorted(used))}{' on a ragged batch' * ragged} "
                    f"with 64-bit tile offsets at head-dim tier d{self.tier(graph)} on {self.arch} (those "
                    "variants, compiled with ALiBi's term, spill registers: engines/triton/resources.json)")
        return None

    def tier(self, graph: Graph) -> int:
        """The head-dim tier (the configs' largest BLOCK_D of it) the graph launches with."""
        return ARCH_CONFIGS[self.arch].tier_of(tier_key(graph.D_qk, graph.D_v))

    def dropout_spill(self, graph: Graph) -> tuple[str, int, str] | None:
        """The dropout_spills entry a dropout graph falls in, or None."""
        if not self.dropout_spills:
            return None
        key = ("port" if "dropout_mask" in graph.tensors else "drawn", self.tier(graph),
               "aligned" if _io_rows_aligned(graph) else "unaligned")
        return key if key in self.dropout_spills else None


def _needs_wide(graph: Graph, arch: str) -> bool:
    """Some tile of the graph's launch spans 2^31 elements or more (launch.needs_wide)."""
    from bundlegen.engines.triton.configs import config_for
    from bundlegen.engines.triton.engine import banded
    from bundlegen.engines.triton.tile_plan import graph_needs_wide
    return graph_needs_wide(graph, config_for(arch, graph.D_qk, graph.D_v, banded(graph)))


def _io_rows_aligned(graph: Graph) -> bool:
    """Every io port's rows 16-byte aligned by its strides and offset: the launcher's VEC 8
    (addressing.vec_for; storages are allocation-aligned)."""
    from bundlegen.engines.triton.addressing import IO_PORTS
    from bundlegen.engines.triton.tile_plan import rows_aligned
    from bundlegen.engines.triton.tile_plan import launched_view
    ragged = graph.ragged is not None
    return all(rows_aligned(*launched_view(graph.tensors[p], ragged), graph.tensors[p].offset)
               for p in IO_PORTS)


ROWS: dict[str, Capabilities] = {
    # sm90 with dropout: every head-dim tier runs tiles of its own (configs.py, sm90's
    # BlockConfig.dropout / drawn_dropout; the H200-tuned tiles with the dropout tile on top
    # spilled 552-1432 bytes at D > 128): at D <= 128 at most 8 bytes spill where the mask tile
    # is read in vectors, 448 elsewhere; at D 192 and 256 (split dK and dV passes) nothing in
    # the aligned MHA launches with 32-bit offsets that draw the mask or read it in vectors
    # through descriptors, but 16 bytes in D 256's mask-port dQ; up to 600 bytes where the mask
    # is read element by element, with ALiBi slopes or 64-bit offsets, and up to 968 in D 256's
    # mask-port dK pass of H_k != H_v: all within the known spills of
    # engines/triton/resource_limits.py
    # sm90 ragged dropout: its variants compile and pass the resource check, but no H200 run
    # has served them yet (the support matrix shows what the runs saw): off until one does
    "sm90": Capabilities("sm90", fp32_max_head_dim=128, dropout=True, drawn_dropout=True),
    # sm120: the unaligned dK-only pass with modifiers spilled 56 (D 128) and 32 (D 256) bytes
    # with the sm120 rows of configs.py (`python bench/triton_resources.py`)
    # sm120 with dropout: the mask port's variants spilled 8-64 bytes at D > 64 (dK passes, the
    # dK/dV pass, the unaligned dQ), the drawn mask's aligned dQ 8 bytes at D 256
    "sm120": Capabilities("sm120", run_here=False, split_pass_modifiers_max_d=64, fp32_max_head_dim=128,
                          dropout=True, drawn_dropout=True,
                          dropout_spills=frozenset({
                              ("port", 128, "aligned"), ("port", 128, "unaligned"),
                              ("port", 256, "aligned"), ("port", 256, "unaligned"),
                              ("drawn", 256, "aligned")}),
                          # the ragged dBias kernel (with ALiBi's term) spilled 8-64 bytes at D <= 128;
                          # ragged dropout: its dK/dV, dK and dV passes 8-72 bytes at D <= 128 with
                          # 64-bit tile offsets (no ragged_dropout)
                          ragged_dbias_min_d=256),
    # gfx942: the unaligned (VEC 1) dK/dV and dQ variants with modifiers spilled 16 to 84 bytes
    # of scratch at D <= 128 (2 waves per SIMD: at most 256 VGPRs)
    # gfx942 with dropout at D <= 64: the mask port's unaligned dK/dV and dQ spilled 8-112 bytes,
    # the drawn mask's dQ 80-204 bytes (its wider tiers spill nothing)
    "gfx942": Capabilities("gfx942", run_here=False, unaligned_modifiers=False, fp32_max_head_dim=128,
                           dropout=True, drawn_dropout=True,
                           dropout_spills=frozenset({
                               ("port", 64, "unaligned"), ("drawn", 64, "aligned"),
                               ("drawn", 64, "unaligned")}),
                           # the D 64 dQ with ALiBi's term and 64-bit tile offsets spilled 20 bytes;
                           # ragged dropout: its dQ 104-248 bytes at D 64, 8-12 bytes at D 128 with
                           # 64-bit tile offsets (no ragged_dropout)
                           wide_alibi_spills=frozenset({64})),
    # the Triton interpreter (TRITON_INTERPRET=1)
    "cpu": Capabilities("cpu", dropout=True, drawn_dropout=True, ragged_dropout=True),
}

INTERPRET_HINT = "the Triton interpreter is off: set TRITON_INTERPRET=1, or leave it unset, for the CPU"
