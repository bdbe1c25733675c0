"""What the three PyTorch SDPA-backward engines (torch-flash, torch-efficient, torch-cudnn)
share: the device facts their rules read, the decline rules, and the adapter around the
aten backward ops.

What the adapter passes as declared and what it presents in the op's own form:
- q, k, v, dO: the harness's views with their declared strides and offsets; the op reads
  them through their strides, as it reads a user's tensors. What a backend cannot read is
  declined (see each engine's RULES), never copied into a friendlier layout.
- O and Stats are the forward's outputs: a PyTorch user never lays them out, autograd hands
  the backward op what the backend's own forward produced. The adapter copies them into
  that form (O: the forward's layout; Stats: the backend's LSE shape, see lse_*).
- dQ, dK, dV: the op returns fresh tensors; they are copied into the declared outputs.
- Score modifiers (torch-efficient: bias and dBias; torch-cudnn: bias): the bias is the
  harness's view, its broadcast axes (stride 0) narrowed to length 1 where the op takes
  broadcast by dims (cudnn) or passed with its zero strides (efficient); a dBias the op
  returns per batch and head is summed over the declared dbias's size-1 axes (what
  autograd's expand backward does for a broadcast attn_mask) and copied in.

Ragged graphs (DESIGN section 10) go to each engine's RAGGED_RULES and `ragged_backward`
(the varlen op); see "ragged graphs" below for the offsets made safe on the device, the
LSE forms and the row-only copy into the outputs.

Device facts (capability, ROCm, cuDNN version) are read once per engine into a frozen
record, so the rules are plain functions of (graph, facts) and testable on a CPU.
"""
from __future__ import annotations

import contextlib

import functools
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import torch

from bundlegen import reasons as R
from bundlegen.graph import Graph, packed_strides
from bundlegen.mask import is_masked
from bundlegen.validate import launch_reason, output_layout_reason
from bundlegen.engines.base import Engine
from bundlegen.engines.fp32_products import ieee_fp32

#: The archs these engines are configured for (the support-matrix columns).
TARGET_ARCHS = ("sm90", "sm120")
AXES = ("B", "H", "S", "D")
#: a ragged graph's port axes (token-major, DESIGN section 10)
RAGGED_AXES = ("T", "H", "D")
INPUT_PORTS_READ_AS_DECLARED = ("q", "k", "v", "do")


# ----------------------------------------------------------------------------- device facts
@dataclass(frozen=True)
class DeviceFacts:
    kind: str                                  # torch device type: "cuda", "cpu", ...
    capability: tuple[int, int] | None = None  # (major, minor) on CUDA
    hip: bool = False                          # a ROCm build (HIP devices report "cuda")
    cudnn_version: int | None = None           # e.g. 91002 for 9.10.2; None without cuDNN

    @property
    def arch(self) -> str:
        if self.kind != "cuda" or self.capability is None:
            return self.kind
        return f"sm{self.capability[0]}{self.capability[1]}"


def device_facts(device: torch.device) -> DeviceFacts:
    device = torch.device(device)
    if device.type != "cuda":
        return DeviceFacts(kind=device.type)
    cudnn = None
    if torch.backends.cudnn.is_available():
        cudnn = torch.backends.cudnn.version()
    return DeviceFacts(kind="cuda", capability=tuple(torch.cuda.get_device_capability(device)),
                       hip=bool(torch.version.hip), cudnn_version=cudnn)


def cuda_facts(major: int, minor: int, cudnn_version: int | None = 91002) -> DeviceFacts:
    """The facts of an NVIDIA GPU of compute capability major.minor (tests, docs)."""
    return DeviceFacts(kind="cuda", capability=(major, minor), cudnn_version=cudnn_version)


# ----------------------------------------------------------------------------- rules
#: A decline rule: None, or a reason string from bundlegen.reasons (optionally ': detail').
Rule = Callable[[Graph, DeviceFacts], "str | None"]


def first_reason(rules: Iterable[Rule], graph: Graph, facts: DeviceFacts) -> str | None:
    for rule in rules:
        reason = rule(graph, facts)
        if reason is not None:
            return reason
    return None


def needs_nvidia_gpu(graph: Graph, facts: DeviceFacts) -> str | None:
    if facts.kind != "cuda":
        return f"{R.DEVICE_NOT_SERVED}: {facts.kind} (the aten op is a CUDA kernel)"
    if facts.hip:
        return f"{R.ARCH_NOT_SERVED}: ROCm builds route this op to AOTriton/CK, not covered here"
    return None


def capability_between(low: tuple[int, int], high: tuple[int, int], source: str) -> Rule:
    def rule(graph: Graph, facts: DeviceFacts) -> str | None:
        if facts.capability is None or not (low <= facts.capability <= high):
            return (f"{R.ARCH_NOT_SERVED}: {facts.arch} (served: sm{low[0]}{low[1]}.."
                    f"sm{high[0]}{high[1]}, {source})")
        return None
    return rule


def draws_only(graph: Graph, facts: DeviceFacts) -> str | None:
    """PyTorch's ops take no mask (a dropout_mask port cannot reach them): they draw their own
    from a Philox seed and offset. The flash and efficient ops' masks are recovered for the
    oracle (engines/torch_drawn_dropout.py), so those engines serve dropout that way."""
    if graph.attributes.dropout_probability and "dropout_mask" in graph.tensors:
        return f"{R.DROPOUT_NOT_SERVED}: the aten op takes no dropout mask (it draws its own)"
    return None


def no_dropout(graph: Graph, facts: DeviceFacts) -> str | None:
    """draws_only, and no drawn mask either where the mask cannot be recovered for the oracle
    (cuDNN's op; the varlen ops)."""
    if graph.asks_drawn_dropout:
        return f"{R.DROPOUT_NOT_SERVED}: the mask this op draws is not recovered for the oracle"
    return draws_only(graph, facts)


def writable_outputs(graph: Graph, facts: DeviceFacts) -> str | None:
    return output_layout_reason(graph)


def dtype_in(served: tuple[str, ...], source: str) -> Rule:
    def rule(graph: Graph, facts: DeviceFacts) -> str | None:
        if graph.dtype not in served:
            return f"{R.DTYPE_NOT_SERVED}: {graph.dtype} (served: {', '.join(served)}; {source})"
        return None
    return rule


def head_dim_stride_one(graph: Graph, facts: DeviceFacts) -> str | None:
    """check_last_dim_stride_equals_1_dense (sdp_utils_cpp.h): q, k, v need stride 1 on D.
    dO is made contiguous (flash, efficient) or permuted (cudnn) by the op itself."""
    for port in ("q", "k", "v"):
        spec = graph.tensors[port]
        if spec.dims[-1] > 1 and spec.strides[-1] != 1:
            return f"{R.HEAD_DIM_STRIDE_NOT_ONE}: {port} stride {spec.strides[-1]} on D"
    return None


def aligned_offsets(elements: Callable[[Graph], int], source: str,
                    ports: tuple[str, ...] = INPUT_PORTS_READ_AS_DECLARED) -> Rule:
    """Every port's storage offset is a multiple of `elements(graph)` elements."""
    def rule(graph: Graph, facts: DeviceFacts) -> str | None:
        n = elements(graph)
        for port in ports:
            offset = graph.tensors[port].offset
            if offset % n:
                return f"{R.MISALIGNED_STRIDE}: {port} offset {offset} not a multiple of {n} ({source})"
        return None
    return rule


def aligned_strides(elements: Callable[[Graph], int], source: str,
                    ports: tuple[str, ...] = INPUT_PORTS_READ_AS_DECLARED,
                    axes_always: tuple[int, ...] = ()) -> Rule:
    """The strides of every axis but D (B, H, S; a ragged graph's T, H) are multiples of
    `elements(graph)`. Axes of length 1 are exempt unless listed in `axes_always` (indices
    into the port's axes: the efficient kernel checks H and S whatever their length)."""
    def rule(graph: Graph, facts: DeviceFacts) -> str | None:
        n = elements(graph)
        names = RAGGED_AXES if graph.ragged is not None else AXES
        for port in ports:
            spec = graph.tensors[port]
            for axis in range(len(spec.dims) - 1):
                if spec.dims[axis] == 1 and axis not in axes_always:
                    continue
                if spec.strides[axis] % n:
                    return (f"{R.MISALIGNED_STRIDE}: {port} stride {spec.strides[axis]} on "
                            f"{names[axis]} not a multiple of {n} ({source})")
        return None
    return rule


def with_bias(rule: Rule) -> Rule:
    """`rule` for a graph with a bias input; nothing to say about one without."""
    def checked(graph: Graph, facts: DeviceFacts) -> str | None:
        return rule(graph, facts) if "bias" in graph.tensors else None
    return checked


def bias_last_dim_contiguous(source: str) -> Rule:
    """The op reads the bias's key axis with stride 1 (a zero stride there is a frontend
    rejection already)."""
    def rule(graph: Graph, facts: DeviceFacts) -> str | None:
        spec = graph.tensors.get("bias")
        if spec is not None and spec.dims[3] > 1 and spec.strides[3] != 1:
            return f"{R.BIAS_LAYOUT_NOT_SERVED}: bias stride {spec.strides[3]} on S_kv, not 1 ({source})"
        return None
    return rule


def bias_broadcast_as_dims(bias: torch.Tensor) -> torch.Tensor:
    """The bias view with every broadcast axis (stride 0, longer than 1) narrowed to length
    1: the same memory, read as a [1|B, 1|H, S_q, S_kv] broadcast by dims."""
    for axis in (0, 1):
        if bias.stride(axis) == 0 and bias.shape[axis] > 1:
            bias = bias.narrow(axis, 0, 1)
    return bias


def write_dbias(out: torch.Tensor, grad: torch.Tensor) -> None:
    """Copy the op's [B, H, S_q, S_kv] bias gradient into the declared dbias, summed (in
    fp32) over the axes where dbias has length 1 and the gradient does not."""
    axes = [a for a in range(4) if out.shape[a] == 1 and grad.shape[a] > 1]
    if axes:
        grad = grad.sum(dim=axes, keepdim=True, dtype=torch.float32)
    if tuple(grad.shape) != tuple(out.shape):
        raise RuntimeError(f"dbias: the op returned shape {tuple(grad.shape)}, "
                           f"the graph declares {tuple(out.shape)}")
    out.copy_(grad)


def elements_per_16_bytes(graph: Graph) -> int:
    return 16 // (4 if graph.dtype == "fp32" else 2)


def kv_heads_equal(source: str) -> Rule:
    def rule(graph: Graph, facts: DeviceFacts) -> str | None:
        if graph.H_k != graph.H_v:
            return f"{R.HV_NOT_HK}: H_k={graph.H_k}, H_v={graph.H_v} ({source})"
        return None
    return rule


def no_gqa(source: str) -> Rule:
    def rule(graph: Graph, facts: DeviceFacts) -> str | None:
        if graph.H_k != graph.H_q or graph.H_v != graph.H_q:
            return f"{R.GQA_NOT_SERVED}: H_q={graph.H_q}, H_k={graph.H_k}, H_v={graph.H_v} ({source})"
        return None
    return rule


def equal_head_dims(source: str) -> Rule:
    def rule(graph: Graph, facts: DeviceFacts) -> str | None:
        if graph.D_qk != graph.D_v:
            return f"{R.UNEQUAL_HEAD_DIMS}: D_qk={graph.D_qk}, D_v={graph.D_v} ({source})"
        return None
    return rule


def causal_only(is_causal_alignment: str, source: str) -> Rule:
    """The SDPA backward ops take one mask switch, is_causal, whose diagonal is aligned
    `is_causal_alignment`. Unmasked and causal (right_bound 0, no left bound) are served;
    the other alignment only where it coincides (S_q == S_kv)."""
    def rule(graph: Graph, facts: DeviceFacts) -> str | None:
        a = graph.attributes
        if not is_masked(a):
            return None
        if not is_causal_only(a):
            return _not_causal(a, "the op takes is_causal only, no window or band")
        if graph.S_q != graph.S_kv and a.diagonal_alignment != is_causal_alignment:
            return (f"{R.ALIGNMENT_NOT_SERVED}: {a.diagonal_alignment} causal with S_q != S_kv "
                    f"(is_causal is {is_causal_alignment} here; {source})")
        return None
    return rule


def is_causal(graph: Graph) -> bool:
    return graph.attributes.right_bound == 0


def is_causal_only(a) -> bool:
    """The one mask an is_causal switch gives: right bound 0, no left bound."""
    return a.left_bound is None and a.right_bound == 0


def _not_causal(a, why: str) -> str:
    return f"{R.MASK_NOT_SERVED}: left_bound={a.left_bound}, right_bound={a.right_bound} ({why})"


# ----------------------------------------------------------------------------- adapter
def bshd_packed_copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh [B, H, S, D] tensor stored as packed [B, S, H, D] (the flash and efficient
    forwards' output layout), holding t's values."""
    B, H, S, D = t.shape
    out = torch.empty((B, S, H, D), dtype=t.dtype, device=t.device).transpose(1, 2)
    out.copy_(t)
    return out


def matching_layout_copy(like: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A fresh tensor of t's shape laid out the way cuDNN's forward allocates O
    (alloc_with_matching_layout, MHA.cpp), holding t's values: empty_like(q) when the shapes
    agree, else q's axis nesting (a stable sort of q's strides, zero strides outermost as
    in the fix of pytorch/pytorch#175764)."""
    if tuple(like.shape) == tuple(t.shape):
        out = torch.empty_like(like, dtype=t.dtype)
    else:
        strides = [s if s != 0 else math.inf for s in like.stride()]
        outer_to_inner = sorted(range(t.dim()), key=lambda axis: (strides[axis], axis), reverse=True)
        out = torch.empty_strided(tuple(t.shape), packed_strides(tuple(t.shape), outer_to_inner),
                                  dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def lse_rows(stats: torch.Tensor) -> torch.Tensor:
    """[B, H, S_q] fp32, packed: the flash forward's LSE, gathered from the declared stats."""
    return stats[..., 0].contiguous()


def lse_padded(stats: torch.Tensor, multiple: int = 32) -> torch.Tensor:
    """[B, H, ceil(S_q / multiple) * multiple] fp32, packed: the efficient forward's LSE. The
    forward writes +inf past S_q, so the backward's exp(s - lse) is 0 for padding rows."""
    B, H, S, _ = stats.shape
    padded = torch.full((B, H, -(-S // multiple) * multiple), math.inf,
                        dtype=torch.float32, device=stats.device)
    padded[:, :, :S] = stats[..., 0]
    return padded


def lse_unit_last(stats: torch.Tensor) -> torch.Tensor:
    """[B, H, S_q, 1] fp32, packed (strides H*S, S, 1, 1): the cudnn forward's LSE."""
    out = torch.empty(tuple(stats.shape), dtype=torch.float32, device=stats.device)
    out.copy_(stats)
    return out


def write_gradients(tensors: Mapping[str, torch.Tensor], dq: torch.Tensor, dk: torch.Tensor,
                    dv: torch.Tensor) -> None:
    for port, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        out = tensors[port]
        if tuple(grad.shape) != tuple(out.shape):
            raise RuntimeError(f"{port}: the op returned shape {tuple(grad.shape)}, "
                               f"the graph declares {tuple(out.shape)}")
        out.copy_(grad)


def no_rng(device: torch.device) -> torch.Tensor:
    """philox seed/offset stand-in: read by the ops only when dropout_p > 0."""
    return torch.zeros((), dtype=torch.int64, device=device)


# Argument names that differ between torch versions, mapped to the names we fill.
_ARG_ALIASES = {"grad_out_": "grad_out", "causal": "is_causal"}


def call_by_schema(op, values: Mapping[str, object]):
    """Call an aten overload with arguments matched by name to its schema, so that a torch
    version which reorders or renames (see _ARG_ALIASES) its arguments still gets the right
    ones. A schema argument we have no value for keeps its default, or fails loudly."""
    args, kwargs = [], {}
    for arg in op._schema.arguments:
        name = _ARG_ALIASES.get(arg.name, arg.name)
        if name in values:
            value = values[name]
        elif arg.has_default_value():
            continue
        else:
            raise TypeError(f"{op._schema.name}: no value for argument {arg.name!r}")
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return op(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def cudnn_lse_has_unit_dim() -> bool:
    """Whether this torch's cudnn forward returns LSE as [B, H, S_q, 1] (torch 2.13) rather
    than [B, H, S_q] (older releases, whose backward unsqueezes it). Read from the op's meta
    kernel, which torch keeps in step with the CUDA one; [B, H, S_q, 1] when it cannot say."""
    try:
        q = torch.empty((1, 1, 8, 8), dtype=torch.float16, device="meta")
        lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, q, q, None, True)[1]
        return lse.dim() == 4
    except Exception:  # noqa: BLE001 - no meta kernel in this build: use the documented form
        return True


# ----------------------------------------------------------------------------- ragged graphs
# A ragged graph (DESIGN section 10) reaches an engine with its offsets only on the device
# (tensors["cu_seqlens_q"|"cu_seqlens_kv"], int32 [B+1]). Nothing here reads them back to the
# host: every helper is a few device ops, so a launch stays asynchronous. The varlen ops
# trust the offsets (no bound checks in their kernels), so the adapter hands them offsets
# made safe first (contained_offsets), and copies only sequence rows into the outputs.

def not_ragged(graph: Graph, facts: DeviceFacts) -> str | None:
    """For the padded-only rule lists: a ragged graph is not what they describe."""
    if graph.ragged is not None:
        return f"{R.RAGGED_NOT_SERVED}: no varlen path in this adapter"
    return None


def no_ragged_modifiers(graph: Graph, facts: DeviceFacts) -> str | None:
    """Every varlen rule list's first rule: the varlen ops take no bias, sinks, softcap or
    slopes (the padded ops' bias has no ragged form there)."""
    if graph.ragged is not None and graph.modifiers:
        return (f"{R.MODIFIER_COMBINATION_NOT_SERVED}: {', '.join(sorted(graph.modifiers))} with a "
                "ragged batch (the varlen op takes no score modifier)")
    return None


def ragged_causal_only(alignments: tuple[str, ...], source: str) -> Rule:
    """A varlen op's mask switch: unmasked, or causal (right_bound 0, no left bound) with its
    diagonal aligned per sequence as one of `alignments`. The other alignment is declined
    even where S_q == S_kv: the per-sequence lengths are device data."""
    def rule(graph: Graph, facts: DeviceFacts) -> str | None:
        a = graph.attributes
        if not is_masked(a):
            return None
        if not is_causal_only(a):
            return _not_causal(a, f"varlen: causal only; {source}")
        if a.diagonal_alignment not in alignments:
            return (f"{R.ALIGNMENT_NOT_SERVED}: {a.diagonal_alignment} causal on a ragged graph "
                    f"(served: {', '.join(alignments)}; {source})")
        return None
    return rule


def contained_offsets(cu: torch.Tensor, tokens: int) -> torch.Tensor:
    """int32 [B+1] on cu's device: cu clamped to [0, tokens] and made non-decreasing
    (running maximum). Every sequence that validate.good_sequences calls good keeps its
    exact rows (its start is the maximum of the offsets up to it, its end the minimum of
    those after it); every other one becomes a (possibly empty) run of rows inside the
    storage that overlaps no other sequence. Sync-free: what a varlen kernel, which trusts
    its offsets, can be given when the offsets are only on the device (a device probe)."""
    clamped = cu.to(torch.int64).clamp(0, tokens)
    return torch.cummax(clamped, dim=0).values.to(torch.int32).contiguous()


@dataclass(frozen=True)
class RaggedRows:
    """Which storage rows (tokens) of one side belong to which sequence, on the device."""
    offsets: torch.Tensor    # int32 [B+1], contained (non-decreasing, inside [0, T])
    lengths: torch.Tensor    # int64 [B]
    in_sequence: torch.Tensor  # bool [T]: offsets[0] <= t < offsets[B]
    sequence: torch.Tensor   # int64 [T]: the sequence row t belongs to (clamped to [0, B-1])
    position: torch.Tensor   # int64 [T]: t - offsets[sequence] (the row inside its sequence)


def ragged_rows(cu: torch.Tensor, tokens: int) -> RaggedRows:
    offsets = contained_offsets(cu, tokens)
    wide = offsets.to(torch.int64)
    batch = wide.numel() - 1
    t = torch.arange(tokens, device=cu.device, dtype=torch.int64)
    sequence = torch.searchsorted(wide[1:].contiguous(), t, right=True).clamp(max=max(batch - 1, 0))
    in_sequence = (t >= wide[0]) & (t < wide[-1])
    return RaggedRows(offsets=offsets, lengths=wide[1:] - wide[:-1], in_sequence=in_sequence,
                      sequence=sequence, position=t - wide[sequence])


def packed_rows_copy(t: torch.Tensor, rows: RaggedRows) -> torch.Tensor:
    """A packed [T, H, D] copy of t (the varlen forwards' output layout) holding t's values
    in sequence rows and 0 elsewhere (rows of no sequence are not read into it)."""
    zero = torch.zeros((), dtype=t.dtype, device=t.device)
    return torch.where(rows.in_sequence[:, None, None], t, zero).contiguous()


def _lse_of_op(lse: torch.Tensor) -> torch.Tensor:
    """Our natural-log LSE in the varlen kernels' form: a row with no kept key is -inf here,
    +inf in theirs (their forwards write +inf, so the backward's exp(s - lse) is 0)."""
    return lse.masked_fill(lse == -math.inf, math.inf)


def lse_heads_tokens(stats: torch.Tensor, rows: RaggedRows) -> torch.Tensor:
    """[H_q, T_q] fp32, packed: FlashAttention's varlen (unpadded) LSE, indexed by the
    token's storage row (mha_varlen_bwd: unpadded_lse, row bidh * total_q + cu_seqlens_q[b]
    + i). Rows of no sequence hold +inf."""
    lse = stats[..., 0].to(torch.float32)
    lse = torch.where(rows.in_sequence[:, None], _lse_of_op(lse), math.inf)
    return lse.transpose(0, 1).contiguous()


def lse_per_sequence(stats: torch.Tensor, rows: RaggedRows, max_seqlen_q: int,
                     multiple: int = 32) -> torch.Tensor:
    """[B, H_q, ceil(max_seqlen_q / multiple) * multiple] fp32, packed: the efficient
    kernel's varlen LSE (its forward allocates [B, H, lse_dim]; the backward reads
    lse[b, h, i] for the i-th query of sequence b). Padding and rows past a sequence's
    length hold +inf."""
    B, H = rows.lengths.numel(), stats.shape[1]
    width = max(-(-max_seqlen_q // multiple) * multiple, multiple)
    i = torch.arange(width, device=stats.device, dtype=torch.int64)
    start = rows.offsets[:-1].to(torch.int64)
    valid = i[None, :] < rows.lengths[:, None]                        # [B, width]
    index = (start[:, None] + i[None, :]).clamp(0, max(stats.shape[0] - 1, 0))
    lse = _lse_of_op(stats[..., 0].to(torch.float32))[index]          # [B, width, H]
    lse = torch.where(valid[:, :, None], lse, math.inf)
    return lse.permute(0, 2, 1).contiguous().reshape(B, H, width)


def write_ragged_gradients(tensors: Mapping[str, torch.Tensor], dq: torch.Tensor,
                           dk: torch.Tensor, dv: torch.Tensor, q_rows: RaggedRows,
                           kv_rows: RaggedRows) -> None:
    """Copy the op's fresh gradients into the declared outputs, sequence rows only: a row
    of no sequence keeps its bits (read and written back unchanged, no host sync to find
    the rows). q rows of a sequence with no keys get dQ = 0, kv rows of a sequence with no
    queries dK = dV = 0, whatever the kernel left there."""
    q_has_keys = kv_rows.lengths[q_rows.sequence] > 0
    kv_has_queries = q_rows.lengths[kv_rows.sequence] > 0
    for port, grad, rows, live in (("dq", dq, q_rows, q_has_keys), ("dk", dk, kv_rows, kv_has_queries),
                                   ("dv", dv, kv_rows, kv_has_queries)):
        out = tensors[port]
        if tuple(grad.shape) != tuple(out.shape):
            raise RuntimeError(f"{port}: the op returned shape {tuple(grad.shape)}, "
                               f"the graph declares {tuple(out.shape)}")
        value = torch.where(live[:, None, None], grad.to(out.dtype), torch.zeros((), dtype=out.dtype,
                                                                               device=out.device))
        out.copy_(torch.where(rows.in_sequence[:, None, None], value, out))


def ragged_inputs(graph: Graph, tensors: Mapping[str, torch.Tensor]) -> tuple[RaggedRows, RaggedRows]:
    return (ragged_rows(tensors["cu_seqlens_q"], graph.T_q),
            ragged_rows(tensors["cu_seqlens_kv"], graph.T_kv))


# ----------------------------------------------------------------------------- engine base
@contextlib.contextmanager
def deterministic_algorithms(on: bool):
    """PyTorch's switch for its deterministic kernels (the flash and efficient backward
    ops read it), on for the block when asked, and put back as it was after."""
    if not on:
        yield
        return
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


class TorchSdpaEngine(Engine):
    """An aten SDPA backward op as an engine: `RULES` decide, `backward` calls the op."""

    deterministic = False   # all three accumulate dQ (or split keys) with atomics
    ragged = True           # every ragged graph meets RAGGED_RULES
    RULES: tuple[Rule, ...] = ()
    #: the rules for a ragged graph (its varlen op); the default declines every one
    RAGGED_RULES: tuple[Rule, ...] = (not_ragged,)

    def __init__(self, device: torch.device | str = "cpu", facts: DeviceFacts | None = None):
        super().__init__(device)
        self.facts = facts if facts is not None else device_facts(self.device)
        if facts is not None:
            self.arch = facts.arch

    def archs(self) -> tuple[str, ...]:
        return TARGET_ARCHS

    def is_applicable(self, graph: Graph) -> str | None:
        rules = (no_ragged_modifiers, *self.RAGGED_RULES) if graph.ragged is not None else self.RULES
        return launch_reason(graph) or first_reason(rules, graph, self.facts)

    def run(self, graph: Graph, tensors: Mapping[str, torch.Tensor]) -> None:
        reason = self.is_applicable(graph)
        if reason is not None:  # a declined graph can fault the GPU (misaligned loads)
            raise ValueError(f"{self.name} cannot serve this graph: {reason}")
        with deterministic_algorithms(graph.attributes.deterministic_algorithm), ieee_fp32(graph.dtype == "fp32"):
            if graph.ragged is not None:
                q_rows, kv_rows = ragged_inputs(graph, tensors)
                dq, dk, dv = self.ragged_backward(graph, tensors, q_rows, kv_rows)
                write_ragged_gradients(tensors, dq, dk, dv, q_rows, kv_rows)
                return
            grads = self.backward(graph, tensors)
        write_gradients(tensors, *grads[:3])
        if "dbias" in tensors:
            write_dbias(tensors["dbias"], grads[3])

    def backward(self, graph: Graph, tensors: Mapping[str, torch.Tensor]):
        """(dq, dk, dv) from the aten op, shaped like the declared outputs, and the bias
        gradient [B, H, S_q, S_kv] fourth when the graph has a dbias."""
        raise NotImplementedError

    def ragged_backward(self, graph: Graph, tensors: Mapping[str, torch.Tensor],
                        q_rows: RaggedRows, kv_rows: RaggedRows):
        """(dq, dk, dv) [T, H, D] from the varlen op; only sequence rows are used."""
        raise NotImplementedError
