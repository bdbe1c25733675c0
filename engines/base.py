"""The engine interface (DESIGN section 6).

An engine is built for one device, says which archs it targets, declines what it cannot
serve with a reason code from bundlegen.reasons (detail may follow after ': '), and
writes dQ, dK, dV into the harness's preallocated, declared-stride outputs.
"""
from __future__ import annotations

import abc
from typing import Mapping, Sequence

import torch

from bundlegen.cost import CPU_RUNS, GPU_RUNS, DeterminismRuns
from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.graph import Graph, dense_graph


def arch_of(device: torch.device | str) -> str:
    """The arch name claims and skips are keyed by: 'sm90', 'sm120', 'gfx942', 'cpu', ..."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    gcn = getattr(props, "gcnArchName", "") or ""
    if torch.version.hip and gcn:
        return gcn.split(":")[0]
    return f"sm{props.major}{props.minor}"


class Engine(abc.ABC):
    #: registry name, e.g. "triton"
    name: str = ""
    #: repeated runs on the same inputs give bitwise equal outputs
    deterministic: bool = True
    #: serves ragged graphs (DESIGN section 10). An engine that leaves this False is never
    #: asked about one: the harness declines it for the engine with `ragged-not-served`, so
    #: an engine written for padded graphs never meets a token-major port.
    ragged: bool = False
    #: serves padded ragged graphs (per-sequence used lengths, Ragged.seqused_*): run()
    #: then finds tensors['seqused_q'|'seqused_kv'] (int32 [B] on the device) for each side
    #: that has them, and must neither read a sequence's rows past its used length nor
    #: write their outputs. The harness declines such graphs for the others with
    #: `seqused-not-served`.
    seqused: bool = False
    #: has a deterministic backward it switches to when a graph asks for one
    #: (graph.attributes.deterministic_algorithm); an engine that is always deterministic
    #: needs none. The harness declines such graphs for the others.
    deterministic_mode: bool = False
    #: the score modifiers it serves, a subset of bundlegen.graph.MODIFIERS ("bias",
    #: "dbias", "sinks", "softcap"; docs/CONTRACTS.md, "Score modifiers"). The harness
    #: declines a graph using any other with `modifier-not-served` before is_applicable,
    #: so an engine written before them never meets a bias port. run() then also finds
    #: tensors['bias'|'sinks'] (inputs; bias may have zero strides) and
    #: tensors['dbias'|'dsinks'] (outputs, to be written whole) when the graph has them,
    #: and the cap in graph.attributes.softcap.
    score_modifiers: frozenset[str] = frozenset()
    #: what prepare() builds is shared by every process of the host on the same arch (a disk
    #: cache, as Triton's): once a run's first worker has prepared, the run's other workers
    #: of that arch do not repeat it
    prepare_shared: bool = False
    #: draws its own dropout mask (a counter-based generator) for a graph with
    #: dropout_probability > 0 and no dropout_mask port, and tells it through
    #: drawn_dropout_mask(graph) before and after run(); the harness judges the run against
    #: the oracle with that mask (docs/CONTRACTS.md, "Dropout"). Optional: an engine that
    #: draws none declines such graphs.
    draws_dropout_mask: bool = False

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.arch = arch_of(self.device)

    def determinism_runs(self) -> DeterminismRuns:
        """How often the harness runs this engine on a case (bundlegen.cost.DeterminismRuns):
        a GPU's count, or a CPU engine's few. An engine whose device behaves otherwise (a
        serial interpreter) says so here."""
        return CPU_RUNS if self.device.type == "cpu" else GPU_RUNS

    @abc.abstractmethod
    def archs(self) -> tuple[str, ...]:
        """Every arch this engine is configured for (run here or not)."""

    @abc.abstractmethod
    def is_applicable(self, graph: Graph) -> str | None:
        """None, or the first reason this engine cannot serve `graph` on its device."""

    @abc.abstractmethod
    def run(self, graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
        """Compute dq, dk, dv from q, k, v, o, do, stats and write them into
        tensors['dq'|'dk'|'dv'] (views with the declared dims and strides)."""

    def drawn_dropout_mask(self, graph: Graph) -> torch.Tensor | None:
        """The keep mask ([B, H_q, S_q, S_kv], 1 kept, 0 dropped) run() draws for `graph`
        from the engine's seed and offset."""
        return None

    def warm_up(self) -> None:
        """Called once per process before the first case, so that no case is billed for
        one-time set-up (a JIT runtime, a BLAS handle, a driver context): one tiny fp16
        backward, when this engine serves it."""
        graph = tiny_graph()
        if self.is_applicable(graph) is not None:
            return
        tensors = {port: torch.zeros(spec.dims, device=self.device, dtype=TORCH_DTYPES[spec.dtype])
                   for port, spec in graph.tensors.items()}
        self.run(graph, tensors)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def prepare(self, graphs: Sequence[Graph]) -> None:
        """Called once per run, after warm_up and before the first case, with the graph of
        every case the run will execute: an engine may build ahead, in parallel, what those
        cases need (a JIT engine compiles its kernel variants). Nothing by default."""


def tiny_graph(S: int = 16, D: int = 16) -> Graph:
    """One batch, one head, S x D, fp16, packed, no mask: what warm_up runs."""
    return dense_graph(B=1, H_q=1, S_q=S, D_qk=D, dtype="fp16")
