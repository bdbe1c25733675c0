"""How the kernels address the user's tensors: a storage's base pointer and, apart, the
offset and strides of the view (scaled by VEC where every io row is aligned), a ragged
graph's [T, H, D] ports as [1, H, T, D] token-major views, and its offsets as device
tensors. Nothing is copied or made contiguous (launch.py, which launches the kernels, hands
them these arguments)."""
from __future__ import annotations

from typing import Mapping

import torch

from bundlegen.graph import OFFSET_PORTS, Graph
from bundlegen.engines.triton.tile_plan import ALIGN_BYTES, VEC, rows_aligned

IO_PORTS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")
PORTS = IO_PORTS + ("stats",)


def storage_base(t: torch.Tensor) -> torch.Tensor:
    """A one-element view at the start of t's storage: the kernels get the storage's base
    pointer (always allocation-aligned, so one compiled variant) and t's offset separately.
    Nothing is copied."""
    return t.as_strided((1,), (1,), 0)


def vec_for(tensors: Mapping[str, torch.Tensor]) -> int:
    """VEC when every io tensor has aligned rows on an aligned storage; else 1 (scalar
    access, any strides)."""
    for port in IO_PORTS:
        t = tensors[port]
        if (t.untyped_storage().data_ptr() % ALIGN_BYTES
                or not rows_aligned(t.shape, t.stride(), t.storage_offset())):
            return 1
    return VEC


def addr(t: torch.Tensor, vec: int) -> tuple:
    """(base, offset, stride_b, stride_h, stride_s, stride_d), offset and strides / vec."""
    return (storage_base(t), *(x // vec for x in (t.storage_offset(), *t.stride())))


def stats_addr(t: torch.Tensor) -> tuple:
    """Stats [B, H_q, S_q, 1]: (base, offset, stride_b, stride_h, stride_s), never scaled."""
    return (storage_base(t), t.storage_offset(), *t.stride()[:3])


def token_major(t: torch.Tensor) -> torch.Tensor:
    """A ragged port [T, H, D] as the [1, H, T, D] view the kernels address: its batch stride
    is the token stride, so batch index = first token of a sequence gives its row base. A
    view of the same storage (as_strided; nothing is copied)."""
    T, H, D = t.shape
    s_t, s_h, s_d = t.stride()
    return t.as_strided((1, H, T, D), (s_t, s_h, s_t, s_d), t.storage_offset())


def kernel_views(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ports as the kernels address them: [B, H, S, D] as given, or token_major views of a
    ragged graph's ports."""
    if graph.ragged is None:
        return {p: tensors[p] for p in PORTS}
    return {p: token_major(tensors[p]) for p in PORTS}


def offsets(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> tuple:
    """(cu_seqlens_q, cu_seqlens_kv, T_q, T_kv) for the kernels: the device offset tensors and
    the token rows in storage they are bounded by; all None for a padded graph (Triton then
    compiles the dense variants, which have none of these arguments)."""
    if graph.ragged is None:
        return None, None, None, None
    cu = []
    for name in OFFSET_PORTS:
        t = tensors.get(name)
        if t is None or t.dtype != torch.int32 or t.shape != (graph.B + 1,):
            raise ValueError(f"a ragged graph needs {name}, int32 [B+1] = [{graph.B + 1}], beside "
                             f"the ports; got {None if t is None else (t.dtype, tuple(t.shape))}")
        if t.device != tensors["q"].device:
            raise ValueError(f"{name} is on {t.device}, the ports on {tensors['q'].device}")
        cu.append(t)
    return cu[0], cu[1], graph.T_q, graph.T_kv


def plain_addr(t: torch.Tensor | None) -> tuple | None:
    """(base, offset, strides...) unscaled (the modifier ports), or None without the port."""
    return None if t is None else (storage_base(t), t.storage_offset(), *t.stride())
