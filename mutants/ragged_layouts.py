"""Mutants of ragged (varlen) layouts: a correct engine that misaddresses a packed token
buffer or the padding of a padded varlen batch. Off their condition each one is the engine
itself. They present the whole engine (WholeEngineWrapper), so the harness offers them
every graph the engine serves and the condition, not a decline, decides where the defect
shows."""
from __future__ import annotations

import dataclasses

from bundlegen.graph import Graph
from bundlegen.mutants.wrappers import WholeEngineWrapper


def packed_slot(graph: Graph, port: str) -> int:
    """The slot size (H * D elements) of a ragged port stored in a packed [T, n, H, D]
    buffer (token stride n * H * D with n >= 2, heads D apart, unit columns), else 0."""
    spec = graph.tensors[port]
    _, H, D = spec.dims
    slot = H * D
    packed = spec.strides[1:] == (D, 1) and spec.strides[0] >= 2 * slot and spec.strides[0] % slot == 0
    return slot if graph.ragged is not None and packed else 0


class PackedDkInVSlot(WholeEngineWrapper):
    """dK written into the V slot of a packed dKV / dQKV buffer: the engine is handed dK's
    view one slot (H_k * D_qk elements) further on, so dK's own slot keeps what it held and
    the next slot (dV's, in one shared buffer) gets dK. Unpacked layouts are untouched; so is
    a buffer whose next slot would pass the storage's end (memory the harness does not own)."""

    def run(self, graph, tensors):
        dk, slot = tensors["dk"], packed_slot(graph, "dk")
        size = dk.untyped_storage().nbytes() // dk.element_size()
        end = dk.storage_offset() + slot + 1 + sum((d - 1) * s for d, s in zip(dk.shape, dk.stride()))
        if slot and end <= size:
            moved = dk.as_strided(dk.shape, dk.stride(), dk.storage_offset() + slot)
            tensors = {**tensors, "dk": moved}
        self.inner.run(graph, tensors)


class SequsedIgnored(WholeEngineWrapper):
    """The used lengths of a padded varlen batch ignored: the engine is handed the graph
    and tensors without seqused, so it attends each sequence's whole cu_seqlens range,
    reads the padding rows (NaN canaries) and writes their output rows. Graphs without
    used lengths are untouched."""

    def run(self, graph, tensors):
        rag = graph.ragged
        if rag is not None and rag.seqused_ports:
            graph = dataclasses.replace(graph, ragged=dataclasses.replace(
                rag, **dict.fromkeys(rag.seqused_ports, None)))
            tensors = {p: t for p, t in tensors.items() if p not in rag.seqused_ports}
        self.inner.run(graph, tensors)
