"""`TritonEngine`: this project's Triton SDPA backward (DESIGN section 6).

Serves the declared layout natively or declines with the first reason from its arch's
Capabilities row; never copies or re-lays-out the user's tensors. Deterministic: dK/dV
accumulate in registers over the GQA group, dQ has its own kernel (no atomics anywhere).
`TritonAtomicDqEngine` is the same kernels with dQ added by the dK pass with atomics.
Ragged (THD / varlen) graphs run natively too: `run` hands the launcher the
`cu_seqlens_q` / `cu_seqlens_kv` device tensors from `tensors`, which only the kernels read
(and bound: a sequence whose offsets leave the storage is skipped); nothing here reads them.
Score modifiers (bias / dBias, sinks / dSinks, softcap, ALiBi slopes) are served natively on padded graphs
(launch.py, kernels.py); the arch's Capabilities row declines what it cannot serve.
Dropout comes through the dropout_mask port, or, without one, the kernels draw the mask
themselves from the engine's seed and Philox offset (dropout_draw.py): fixed per engine, so
a graph's mask depends on them and the graph's sizes alone, never on torch's RNG or on the
cases run before it; `drawn_dropout_mask` tells it.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Mapping

import torch

from bundlegen import reasons as R
from bundlegen.cost import SERIAL_RUNS, DeterminismRuns
from bundlegen.extras import require
from bundlegen.validate import launch_reason
from bundlegen.graph import MODIFIERS, Graph
from bundlegen.engines.base import Engine
from bundlegen.engines.triton import configs
from bundlegen.engines.triton.capabilities import INTERPRET_HINT, ROWS
from bundlegen.engines.triton.dropout_seed import DEFAULT_OFFSET, DEFAULT_SEED, LIMIT


def interpret_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def triton_mode_error() -> str | None:
    """Why Triton cannot run in the mode TRITON_INTERPRET asks for in this process: Triton
    decorates its own library when it is imported, so the variable must be set (or unset)
    before then. None when Triton is not imported yet or was imported in this mode."""
    lang = sys.modules.get("triton.language")
    if lang is None:
        return None
    from triton.runtime.interpreter import InterpretedFunction
    imported_interpreted = isinstance(lang.cdiv, InterpretedFunction)
    if imported_interpreted == interpret_enabled():
        return None
    was = "with" if imported_interpreted else "without"
    return (f"Triton was imported {was} TRITON_INTERPRET=1 and the setting has changed since; "
            "set it before the process imports Triton")


def use_interpreter_unless_told_otherwise() -> None:
    """Off a GPU the kernels run in the Triton interpreter: select it, unless the user set
    TRITON_INTERPRET (then their setting stands) or Triton is already imported (then the
    mode is fixed, and is_applicable says so)."""
    if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"


def atomic_dq_serves(graph: Graph, arch: str) -> bool:
    """Whether an atomic-dQ engine adds this graph's dQ with atomics: on an arch whose
    configs say so (configs.ArchConfigs.atomic_dq), head dims up to one
    CHUNK (wider tiers hold two [N, D] accumulators already: with a third operand tile their
    dK passes spill or pass sm90's shared memory), padded graphs (dQ's rows come from the
    scratch in one copy, and only the kernels may read the offsets that say which rows are
    a ragged batch's sequences), not a graph that asks for a deterministic backward, and not
    one with dropout (no atomic dK pass with dropout is resource-checked). The others run the
    dQ kernel."""
    table = configs.ARCHS.get(arch)
    return (table is not None and table.atomic_dq
            and configs.block_d(max(graph.D_qk, graph.D_v)) <= configs.CHUNK
            and graph.ragged is None and not graph.attributes.deterministic_algorithm
            and not graph.attributes.dropout_probability)


def banded(graph: Graph) -> bool:
    """A left or right bound (causal, windows): configs.config_for's `banded`."""
    a = graph.attributes
    return a.left_bound is not None or a.right_bound is not None


class TritonEngine(Engine):
    name = "triton"
    deterministic = True
    ragged = True          # capabilities rows say which ragged graphs each arch serves
    seqused = True         # likewise the used lengths of a padded varlen batch
    #: served natively (kernels: HAS_BIAS, SOFTCAP, bwd_dbias, bwd_dsinks); the capabilities
    #: rows say which combinations each arch serves
    score_modifiers = frozenset(MODIFIERS)
    prepare_shared = True   # prepare compiles into Triton's disk cache (warm.compile_missing)
    #: the modules this engine launches with: the launcher and the @triton.jit kernels
    launch_module = "bundlegen.engines.triton.launch"
    kernels_module = "bundlegen.engines.triton.kernels"
    #: dQ added by the dK pass with atomics (TritonAtomicDqEngine), not by the dQ kernel
    atomic_dq = False
    #: a graph with dropout and no dropout_mask port: the kernels draw the mask (DRAWN_DROPOUT)
    draws_dropout_mask = True

    def __init__(self, device: torch.device | str = "cpu", dropout_seed: int = DEFAULT_SEED,
                 dropout_offset: int = DEFAULT_OFFSET):
        super().__init__(device)
        for name, value in (("dropout_seed", dropout_seed), ("dropout_offset", dropout_offset)):
            if not 0 <= value < LIMIT:
                raise ValueError(f"{name} {value} outside [0, 2^31)")
        #: what the kernels draw a mask from (dropout_draw.py); the same for every graph
        self.dropout_draw = (int(dropout_seed), int(dropout_offset))
        #: Launch.variant -> the config that fits it, where the table's ran out of resources
        self._fitted: dict[tuple, configs.BlockConfig] = {}
        if self.device.type != "cuda":
            use_interpreter_unless_told_otherwise()
        # the kernels need Triton: without the extra, one line says which to install. Here, not
        # at import: the first import of Triton fixes its interpreter mode, selected just above
        require("triton")

    def archs(self) -> tuple[str, ...]:
        return tuple(ROWS)

    def determinism_runs(self) -> DeterminismRuns:
        """Off a GPU the kernels run in the Triton interpreter, one program at a time
        (bundlegen.cost.SERIAL_RUNS); on a GPU, the GPU's count."""
        return SERIAL_RUNS if self.device.type != "cuda" else super().determinism_runs()

    def is_applicable(self, graph: Graph) -> str | None:
        if self.device.type != "cuda":
            if not interpret_enabled():
                return f"{R.DEVICE_NOT_SERVED}: {INTERPRET_HINT}"
            mode_error = triton_mode_error()
            if mode_error is not None:
                return f"{R.DEVICE_NOT_SERVED}: {mode_error}"
        invalid = launch_reason(graph)
        if invalid:
            return invalid
        row = ROWS.get(self.arch)
        if row is None:
            return f"{R.ARCH_NOT_SERVED}: {self.arch} (configured: {', '.join(ROWS)})"
        return row.mismatch(graph)

    def prepare(self, graphs) -> None:
        """Compile the variants these graphs need, and warm_up's, in parallel
        (engines/triton/warm.py); the interpreter compiles nothing. warm.py compiles this
        package's modules: an engine given other modules compiles their variants on use."""
        if self.device.type != "cuda" or not self.launches_own_modules():
            return
        from bundlegen.engines.base import tiny_graph
        from bundlegen.engines.triton import warm
        warm.compile_missing(str(self.device), self.arch,
                             [g for g in [tiny_graph(), *graphs] if self.is_applicable(g) is None],
                             atomic_dq=self.atomic_dq)

    def warm_up(self) -> None:
        """The tiny backward of Engine.warm_up once prepare has compiled its kernels. Before
        that (an empty Triton cache), only the GPU's context is made: compiling three kernels
        here would hold up every worker's start (on an H200 a cold run's workers took about
        twice as long to start as warm ones when they compiled them), and prepare compiles
        them with the cases' variants, in parallel. Kernels of other modules (no compile
        plan) compile here."""
        if (self.device.type == "cuda" and self.launches_own_modules()
                and not self._tiny_compiled()):
            torch.cuda.synchronize(self.device)   # makes the context
            return
        super().warm_up()

    def _tiny_compiled(self) -> bool:
        from bundlegen.engines.base import tiny_graph
        from bundlegen.engines.triton import warm
        return warm.has_compiled(self.arch, tiny_graph(), atomic_dq=self.atomic_dq)

    def launches_own_modules(self) -> bool:
        """True when this engine launches the modules of this package (warm.py's)."""
        return (self.launch_module, self.kernels_module) == (TritonEngine.launch_module,
                                                             TritonEngine.kernels_module)

    def uses_atomic_dq(self, graph: Graph) -> bool:
        return self.atomic_dq and atomic_dq_serves(graph, self.arch)

    def config(self, graph: Graph) -> configs.BlockConfig:
        """The table's block config for this device, head dims and band (a launch that runs
        out of resources with it falls back per variant: `run`)."""
        return configs.config_for(self.arch, graph.D_qk, graph.D_v, banded(graph),
                                  self.uses_atomic_dq(graph))

    def _prepare(self, launcher, graph: Graph, tensors, cfg: configs.BlockConfig):
        return launcher.prepare(graph, tensors, cfg, kernels=self.kernels_module,
                                atomic_dq=self.uses_atomic_dq(graph), draw=self.dropout_draw)

    def drawn_dropout_mask(self, graph: Graph) -> torch.Tensor | None:
        """The keep mask run() draws for a graph with dropout and no dropout_mask port
        (uint8 [B, H_q, S_q, S_kv], sequence-local on a ragged graph), from the kernels'
        own generator on this device; None for any other graph."""
        if not graph.attributes.dropout_probability or "dropout_mask" in graph.tensors:
            return None
        from bundlegen.engines.triton.dropout_draw import drawn_keep_mask
        launcher = importlib.import_module(self.launch_module)
        kernels = launcher.kernels_module(self.kernels_module)
        return drawn_keep_mask(kernels, graph, *self.dropout_draw, self.device)

    def run(self, graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
        """Launch with the table's config; a variant that runs out of resources with it runs
        the next smaller one (configs.shrink) from then on. Keyed per variant (not per head-dim
        tier), so a case's config, and so its bits, never depend on the cases before it."""
        reason = self.is_applicable(graph)
        if reason is not None:
            raise ValueError(f"triton engine cannot serve this graph: {reason}")
        launcher = importlib.import_module(self.launch_module)
        table = self.config(graph)
        L = self._prepare(launcher, graph, tensors, table)
        variant = L.variant
        fitted = self._fitted.get(variant)
        if fitted is not None:
            L = self._prepare(launcher, graph, tensors, fitted)
        while True:
            try:
                launcher.run(L)
            except Exception as exc:  # noqa: BLE001 - only resource exhaustion is retried
                smaller = configs.shrink(L.cfg) if launcher.out_of_resources(exc) else None
                if smaller is None:
                    raise
                print(f"triton: {graph.dtype} D {graph.D_qk}/{graph.D_v} ran out of resources with "
                      f"{_tiles(L.cfg)}; this variant runs {_tiles(smaller)}", file=sys.stderr)
                L = self._prepare(launcher, graph, tensors, smaller)
                continue
            if L.cfg not in table.switches():   # (prepare's own switches)
                self._fitted[variant] = L.cfg
            return


class TritonAtomicDqEngine(TritonEngine):
    """The `triton` kernels with dQ added by the dK pass with atomics into an fp32 scratch
    (kernels.bwd_dkdv ATOMIC_DQ): no dQ kernel, five matrix multiplies per block pair instead
    of seven (what FlashAttention 2 and 3 and cuDNN do by default). The order of the additions
    changes from run to run, so dQ's last bits do too: not deterministic (the harness runs
    a case once). Graphs atomic_dq_serves leaves out run the `triton` kernels.
    Not a built-in name: on the H200 it ran slower than the deterministic kernels at D 128
    (`python bench/engine_speed.py --atomic-dq` times both);
    `--engine bundlegen.engines.triton.engine:TritonAtomicDqEngine`."""
    name = "triton-atomic-dq"
    deterministic = False
    deterministic_mode = True
    atomic_dq = True


def _tiles(cfg: configs.BlockConfig) -> str:
    return (f"tiles {cfg.block_m1}x{cfg.block_n1} / {cfg.block_m2}x{cfg.block_n2}, "
            f"{cfg.num_stages} stage(s)")
