"""What a launch's tiles are, from the graph, the config and the tensors: the head-dim tiles
(one padded tile, or two column chunks), whether every tile is whole (EVEN), whether the
streamed tiles load through tensor descriptors (TMA), and whether tile offsets need 64
bits (WIDE). Pure functions of sizes and strides; launch.py turns them into flags.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from bundlegen.graph import Graph
from bundlegen.engines.triton.configs import CHUNK, BlockConfig, block_d, two_chunk_tiles

VEC = 8                       # fp16/bf16 elements per 16 bytes: the vectorised layout (VEC)
TILE_OFFSET_LIMIT = 2 ** 31   # a tile whose offsets reach this needs 64-bit offsets (WIDE)
#: the tiles a kernel streams through its loop: Q and dO (dK/dV kernel), K and V (dQ kernel)
STREAMED_PORTS = ("q", "do", "k", "v")


def launched_view(spec, ragged: bool) -> tuple[tuple, tuple]:
    """(dims, strides) of a port's TensorSpec as the kernels address it: a ragged [T, H, D]
    port as the launcher's [1, H, T, D] view (addressing.token_major); score-shaped ports (bias,
    dropout mask) and padded ones as declared."""
    if not ragged or len(spec.dims) == 4:
        return spec.dims, spec.strides
    (T, H, D), (s_t, s_h, s_d) = spec.dims, spec.strides
    return (1, H, T, D), (s_t, s_h, s_t, s_d)


def graph_needs_wide(graph: Graph, cfg: BlockConfig) -> bool:
    """needs_wide from the graph's declared strides (its ports as launched_view addresses
    them; sinks, slopes and the dropout mask left out, as needs_wide leaves them)."""
    ragged = graph.ragged is not None
    return any(tile_span(*launched_view(t, ragged), cfg) >= TILE_OFFSET_LIMIT
               for port, t in graph.tensors.items() if len(t.dims) >= 3 and port != "dropout_mask")


def tile_span(dims: tuple, strides: tuple, cfg: BlockConfig) -> int:
    """The largest element offset of a port's tiles from its head's row 0: the kernels put the
    rows of the Q and dO tiles (dK/dV kernel) and of the K and V tiles (dQ kernel) into the
    tile offsets, whose rows reach the sequence rounded up to the tiles."""
    rows = -(-dims[2] // cfg.most_rows) * cfg.most_rows or cfg.most_rows
    return (rows - 1) * strides[2] + (dims[3] - 1) * strides[3]   # masked lanes never load


def needs_wide(tensors: Mapping[str, torch.Tensor], cfg: BlockConfig,
               scores: Mapping[str, torch.Tensor] | None = None) -> bool:
    """True when some tile spans TILE_OFFSET_LIMIT elements or more (tile_span): the offsets
    inside a tile are then computed in 64 bits (the offset of a head's row 0 always is).
    `scores`: the bias / dbias, whose tiles are [rows, rows] blocks of their last two axes."""
    rows = cfg.most_rows
    for t in tensors.values():
        if tile_span(t.shape, t.stride(), cfg) >= TILE_OFFSET_LIMIT:
            return True
    for t in (scores or {}).values():
        _, _, s_i, s_j = t.stride()
        if (min(rows, t.shape[2]) - 1) * s_i + (min(rows, t.shape[3]) - 1) * s_j >= TILE_OFFSET_LIMIT:
            return True
    return False


def head_tiles(graph: Graph, cfg: BlockConfig) -> dict[str, int]:
    """The head-dim tiles: one padded tile per head dim (BLOCK_DQK2 = BLOCK_DV2 = 0), or, where
    the config asks for two chunks and configs.two_chunk_tiles applies, CHUNK columns plus a
    second chunk's tile."""
    chunks = two_chunk_tiles(graph.D_qk, graph.D_v) if cfg.two_chunks else None
    if chunks is None:
        return dict(BLOCK_DQK=block_d(graph.D_qk), BLOCK_DV=block_d(graph.D_v), BLOCK_DQK2=0,
                    BLOCK_DV2=0)
    return dict(BLOCK_DQK=CHUNK, BLOCK_DV=CHUNK, BLOCK_DQK2=chunks[0], BLOCK_DV2=chunks[1])


def whole_tiles(graph: Graph, cfg: BlockConfig, tiles: Mapping[str, int]) -> bool:
    """EVEN of the dK/dV and dQ kernels: no tile of theirs crosses a sequence's end or the
    head dims' (S_q and S_kv multiples of every tile's rows, head dims equal to their one
    tile; never ragged), so they load and store without masks."""
    if graph.ragged is not None or tiles["BLOCK_DQK2"] or tiles["BLOCK_DV2"]:
        return False
    dv_pass = cfg.dv_pass or (cfg.block_m1, cfg.block_n1)
    q_rows = (cfg.block_m1, cfg.block_m2, dv_pass[0])
    kv_rows = (cfg.block_n1, cfg.block_n2, dv_pass[1])
    return (all(graph.S_q % r == 0 for r in q_rows) and all(graph.S_kv % r == 0 for r in kv_rows)
            and graph.D_qk == tiles["BLOCK_DQK"] and graph.D_v == tiles["BLOCK_DV"])


def descriptor_loads(graph: Graph, cfg: BlockConfig, tiles: Mapping[str, int], vec: int,
                     tensors: Mapping[str, torch.Tensor]) -> bool:
    """TMA of the dK/dV and dQ kernels: their streamed tiles (STREAMED_PORTS) loaded through
    tensor descriptors, where the config asks for it (BlockConfig.tma) and the hardware's
    rules hold: a padded graph (a descriptor spans one [B, H, S, D] box), one head-dim
    chunk, every io tensor VEC-aligned (16-byte base and strides, head-dim stride 1), and
    every dim and stride of the streamed ports positive."""
    if not cfg.tma or graph.ragged is not None or tiles["BLOCK_DQK2"] or vec != VEC:
        return False
    return streams_take_descriptors((tensors[p].shape, tensors[p].stride())
                                    for p in STREAMED_PORTS)


def streams_take_descriptors(dims_and_strides) -> bool:
    """The streamed ports' part of descriptor_loads, from their (dims, strides) as the
    kernels address them: every dim and stride positive (no empty axis, no broadcast)."""
    return all(min(dims) > 0 and min(strides) > 0 for dims, strides in dims_and_strides)


#: the alignment of a storage base every allocation gives (16-byte vector loads need it)
ALIGN_BYTES = 16


def rows_aligned(dims, strides, offset: int) -> bool:
    """A tensor whose rows start and step in whole 16-byte groups (given an aligned base):
    offset and batch/head/sequence strides multiples of VEC, head-dim stride 1, head dim a
    multiple of VEC."""
    return (dims[3] % VEC == 0 and strides[3] == 1 and offset % VEC == 0
            and all(s % VEC == 0 for s in strides[:3]))


def score_vec(cfg: BlockConfig, flags: Mapping[str, Any], read: list[torch.Tensor]) -> int:
    """SCORE_VEC of the dK/dV and dQ kernels: VEC where the config reads the bias and dropout
    mask tiles row by row (BlockConfig.score_rows), the launch is VEC-aligned, dense and
    narrow, and the ports it reads tiles of (`read`) have rows that start and step in whole
    16-byte groups like the io tensors' (rows_aligned, on an aligned storage): then
    tile_ops.score_tile reads them in vectors, their offset and strides divided by VEC
    (score_args). Else 1 (element by element, any strides; also every launch without such a
    port, whose kernels compile as before)."""
    if not (read and cfg.score_rows and flags["VEC"] > 1 and not flags["WIDE"] and not flags["RAGGED"]):
        return 1
    aligned = all(t.untyped_storage().data_ptr() % ALIGN_BYTES == 0
                  and rows_aligned(t.shape, t.stride(), t.storage_offset()) for t in read)
    return flags["VEC"] if aligned else 1
