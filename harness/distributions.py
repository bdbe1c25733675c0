"""Input values from a case's seed and distribution (DESIGN section 2, `data`), made on
the CPU so every device sees the same bits.

q, k, v, do are each drawn in their generated shape (a broadcast axis, stride 0, is drawn
with size 1) and rounded to the io dtype. A tensor is drawn in chunks of CHUNK_ELEMS
elements (flat, row-major); chunk c of port p (index in GENERATED_PORTS) has its own
torch.Generator seeded from (case seed, p, c) by `chunk_seed`, so the values depend on the
seed and the shape only, never on whether one thread or a pool of min(torch's threads,
MAX_THREADS) threads draws the chunks (torch releases the GIL while it draws).
- `randn`: standard normal.
- `small-int`: integers in {-2, -1, 1, 2}, half of them zeroed: exact in every io dtype
  (three random bits per element: magnitude, sign, kept).
- score-modifier inputs (`draw_modifiers`, whatever the distribution): a bias is standard
  normal (port index 4) or ALiBi (`alibi_bias`); sinks are SINK_SCALE * standard normal
  (port index 5), fp32; a dropout_mask keeps each entry with probability 1 - p (uniform
  draws, port index 6; `dropout_keep`).
- `shifted-logits`: Q and K share an offset along the all-ones direction, opposite in
  sign, with their own parts made orthogonal to it, so every scaled score is about
  -SHIFTED_LOGIT: LSE is below -88.7 for every row (an fp32 exp(s) alone underflows).
  V and dO are standard normal. (Its chunks are whole rows of the head dim.)
- `l2-grad`: dO as an L2 loss gives it, correlated with O: dO = O - T for a target
  T = L2_TARGET_SPREAD * rowmax|O| * N(0, 1), so Delta = rowsum(dO * O) = |O|^2 - T.O sits
  well away from zero (reduction-precision defects in Delta and in the sums that use it
  show). q, k, v are standard normal; dO's draw is T's N(0, 1), and `do_from_o` forms dO
  once the oracle's forward gave O (`needs_o`), from O as rounded to the io dtype, in
  float32 elementwise arithmetic and an exact max, so every device gets the same bits.
- `large-do`: dO = LARGE_DO * N(0, 1) (|dO| of order 1e3), q, k, v standard normal: dP =
  dO V^T reaches LARGE_DO * sqrt(D) typically and several times that at its largest, towards
  fp16's 65504 (an fp16 dP or dS loses digits there; the gradients stay well inside it).
- `overflow-dp`: dO = LARGE_DO * N, V = OVERFLOW_V * N, Q and K = SMALL_QK * N: dP is of
  order LARGE_DO * OVERFLOW_V * sqrt(D), past fp16's range, while the scores are tiny (P
  nearly uniform over the kept keys) so dS = P (dP - Delta) and every gradient stay inside
  it. An engine that holds dP in fp16 must decline such a case or serve it in a wider type.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.graph import BIAS_VALUES, DISTRIBUTIONS, Graph
from bundlegen.mask import diagonal_shift

GENERATED_PORTS = ("q", "k", "v", "do")
#: the chunk-seed port index of each modifier input (after GENERATED_PORTS')
MODIFIER_PORT_INDEX = {"bias": 4, "sinks": 5, "dropout_mask": 6}
#: sink logits are drawn N(0, SINK_SCALE^2): comparable to the scores they compete with
SINK_SCALE = 2.0
#: about where every scaled score of a shifted-logits case sits; LSE adds at most
#: log(S_kv) + ~1 to it, so LSE stays below -88.7 up to S_kv ~ 2^25
SHIFTED_LOGIT = 110.0
#: elements drawn from one generator (a shifted-logits chunk is rounded down to whole rows)
CHUNK_ELEMS = 1 << 18
#: the most threads drawing chunks at once
MAX_THREADS = 16
#: l2-grad: the target's spread against each row's largest |O| (Delta's mean |O|^2 stays
#: several times its spread T.O)
L2_TARGET_SPREAD = 0.5
#: large-do and overflow-dp: dO's scale (|dO| of order 1e3)
LARGE_DO = 1024.0
#: overflow-dp: V's scale (dP of order LARGE_DO * OVERFLOW_V * sqrt(D), past 65504 from D 8
#: on) and Q's and K's (scores of order 1e-3: P nearly uniform)
OVERFLOW_V = 32.0
SMALL_QK = 1.0 / 64
#: the scale of each generated port of a scaled-normal distribution (ports not named: 1)
SCALED_PORTS = {
    "large-do": {"do": LARGE_DO},
    "overflow-dp": {"q": SMALL_QK, "k": SMALL_QK, "v": OVERFLOW_V, "do": LARGE_DO},
}
#: distributions whose dO is formed from O (do_from_o), after the oracle's forward
DO_FROM_O = frozenset({"l2-grad"})
#: a case with fewer elements to draw than this draws them on the calling thread
THREADED_MIN_ELEMS = 1 << 18


def generated_shape(dims: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """The dims with every broadcast axis (stride 0, longer than 1) drawn as size 1."""
    return tuple(1 if s == 0 and d > 1 else d for d, s in zip(dims, strides))


def chunk_seed(seed: int, port_index: int, chunk_index: int) -> int:
    """The seed of one chunk's generator: a hash of (case seed, port, chunk), 63 bits."""
    digest = hashlib.blake2b(f"{seed}/{port_index}/{chunk_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def default_threads() -> int:
    """torch's intra-op threads (a worker sharing the host gets its share of the cores),
    at most MAX_THREADS."""
    return max(1, min(torch.get_num_threads(), os.cpu_count() or 1, MAX_THREADS))


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=default_threads(), thread_name_prefix="bundlegen-fill")
        return _pool


def _run(tasks: list[Callable[[], None]], threads: int) -> None:
    """Run every task: on this thread when one thread is asked for, else on the shared pool
    (each task only draws random numbers into its own slice, so the order does not matter)."""
    if threads <= 1 or len(tasks) <= 1:
        for task in tasks:
            task()
        return
    for f in [_executor().submit(task) for task in tasks]:
        f.result()


def generate_inputs(graph: Graph, distribution: str, seed: int, *, threads: int | None = None,
                    chunk_elems: int = CHUNK_ELEMS) -> dict[str, torch.Tensor]:
    """port -> CPU tensor in the io dtype with the port's generated shape (expand it to the
    logical dims). `threads` (default min(torch's threads, MAX_THREADS); 1 draws on this thread)
    changes the speed only. Where dO is formed from O (`needs_o`), 'do' holds the draw
    `do_from_o` takes, not dO."""
    drawn = draw_inputs(graph, distribution, seed, threads=threads, chunk_elems=chunk_elems)
    return {port: values.to(TORCH_DTYPES[graph.tensors[port].dtype], copy=True)
            for port, values in drawn.items()}


def draw_inputs(graph: Graph, distribution: str, seed: int, *, threads: int | None = None,
                chunk_elems: int = CHUNK_ELEMS) -> dict[str, torch.Tensor]:
    """generate_inputs before the rounding to the io dtype: float32 values (copying them
    into an io-dtype tensor rounds them exactly as generate_inputs does). They live in
    buffers this thread's next call reuses: copy them before drawing again."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r} (known: {', '.join(DISTRIBUTIONS)})")
    threads = default_threads() if threads is None else max(1, threads)
    tasks: list[Callable[[], None]] = []
    draws: dict[str, _Draw] = {}
    for index, port in enumerate(GENERATED_PORTS):
        spec = graph.tensors[port]
        shape = generated_shape(spec.dims, spec.strides)
        if distribution == "small-int":
            draw = _SmallInt(shape, index)
        elif distribution == "shifted-logits" and port in ("q", "k"):
            draw = _Shifted(shape, index, graph, 1.0 if port == "q" else -1.0)
        elif port in SCALED_PORTS.get(distribution, {}):
            draw = _Scaled(shape, index, SCALED_PORTS[distribution][port])
        else:
            draw = _Normal(shape, index)
        tasks += draw.tasks(seed, index, chunk_elems)
        draws[port] = draw
    total = sum(d.numel for d in draws.values())
    _run(tasks, threads if total >= THREADED_MIN_ELEMS else 1)
    # elementwise work on whole tensors, on torch's own intra-op threads
    return {port: draw.values() for port, draw in draws.items()}


#: draw buffers kept from one call to the next (per thread, port and kind): a run then does
#: not page in fresh memory for every case (slow in a VM); a larger one is allocated per call
SCRATCH_MAX_BYTES = 1 << 30
_scratch = threading.local()


def _buffer(slot: tuple, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of numel elements, reused by this thread's next call with the same slot."""
    if numel * dtype.itemsize > SCRATCH_MAX_BYTES:
        return torch.empty(numel, dtype=dtype)
    buffers = _scratch.__dict__.setdefault("buffers", {})
    buf = buffers.get((slot, dtype))
    if buf is None or buf.numel() < numel:
        buf = buffers[(slot, dtype)] = torch.empty(numel, dtype=dtype)
    return buf[:numel]


class _Draw:
    """One port's draws: buffers filled chunk by chunk (`tasks`), then `values` (float32, in
    a reused buffer: valid until the next draw for the same port)."""
    row = 1  # a chunk is a whole number of these elements

    def __init__(self, shape: tuple[int, ...], slot: int):
        self.shape, self.numel, self.slot = shape, math.prod(shape), slot

    def buffer(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        return _buffer((self.slot, name), self.numel, dtype)

    def tasks(self, seed: int, port_index: int, chunk_elems: int) -> list[Callable[[], None]]:
        step = max(self.row, chunk_elems // self.row * self.row)
        return [functools.partial(self._fill, a, min(self.numel, a + step), chunk_seed(seed, port_index, c))
                for c, a in enumerate(range(0, self.numel, step))]

    def _fill(self, a: int, b: int, chunk_seed_: int) -> None:
        raise NotImplementedError

    def values(self) -> torch.Tensor:
        raise NotImplementedError


class _Normal(_Draw):
    def __init__(self, shape, slot):
        super().__init__(shape, slot)
        self.x = self.buffer("normal", torch.float32)

    def _fill(self, a, b, s):
        self.x[a:b].normal_(generator=torch.Generator().manual_seed(s))

    def values(self):
        return self.x.view(self.shape)


class _Scaled(_Normal):
    """factor * N(0, 1); a power-of-two factor keeps the scaled values exact in float32."""

    def __init__(self, shape, slot, factor: float):
        super().__init__(shape, slot)
        self.factor = factor

    def values(self):
        return self.x.view(self.shape).mul_(self.factor)   # in place: x is a scratch


class _SmallInt(_Draw):
    """One draw of 3 random bits per element: magnitude, sign, keep."""

    def __init__(self, shape, slot):
        super().__init__(shape, slot)
        self.bits = self.buffer("bits", torch.uint8)

    def _fill(self, a, b, s):
        self.bits[a:b].random_(0, 8, generator=torch.Generator().manual_seed(s))

    def values(self):
        return self.buffer("values", torch.float32).copy_(_small_int(self.bits)).view(self.shape)


class _Shifted(_Normal):
    def __init__(self, shape, slot, graph: Graph, sign: float):
        super().__init__(shape, slot)
        self.row = max(1, shape[-1]) if shape else 1  # whole rows: the mean is per row
        self.graph, self.sign = graph, sign

    def values(self):
        return _shifted(self.x.view(self.shape), self.graph, self.sign)  # in place


def _small_int(bits: torch.Tensor) -> torch.Tensor:
    """bit 0: magnitude 1 or 2; bit 1: sign; bit 2: zeroed (half of them)."""
    bits = bits.to(torch.int16)
    magnitude = (bits & 1) + 1
    sign = ((bits >> 1) & 1) * 2 - 1
    keep = (bits >> 2) & 1
    return magnitude * sign * keep


def _shifted(x: torch.Tensor, graph: Graph, sign: float) -> torch.Tensor:
    """c * (x - mean_d x) + sign * alpha, in place (x standard normal, float32; the io dtype
    rounds far coarser than float32 does): the scores of two such rows are scale * c^2 * (x~ . y~) - scale * alpha^2 * D = N(0, ~1) - SHIFTED_LOGIT."""
    scale, d = graph.attributes.attn_scale, graph.D_qk
    alpha = math.sqrt(SHIFTED_LOGIT / (scale * d))
    c = 1.0 / math.sqrt(scale * math.sqrt(d))
    return x.sub_(x.mean(dim=-1, keepdim=True)).mul_(c).add_(sign * alpha)  # in place: x is a scratch


def needs_o(distribution: str) -> bool:
    """dO of this distribution is formed from O (`do_from_o`) after the oracle's forward."""
    return distribution in DO_FROM_O


def do_from_o(o: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """l2-grad's dO in float32: O - L2_TARGET_SPREAD * rowmax|O| * noise. `o`: O as the
    engine reads it (the io dtype, logical dims, any device); `noise`: dO's float32 draw in
    O's shape. Every step is an exactly rounded elementwise op or an exact max, so the bits
    do not depend on the device; a row with no kept key (O = 0) gets dO = 0."""
    o32 = o.to(torch.float32)
    spread = o32.abs().amax(dim=-1, keepdim=True).mul_(L2_TARGET_SPREAD)
    return o32 - spread * noise.to(device=o32.device, dtype=torch.float32)


def alibi_bias(H_q: int, S_q: int, S_kv: int, alignment: str) -> torch.Tensor:
    """float32 [1, H_q, S_q, S_kv]: -slope_h * |i + shift - j| with slope_h = 2^(-8 (h+1) / H_q)
    and shift the diagonal's (S_kv - S_q bottom-right, 0 top-left)."""
    slopes = torch.pow(2.0, -8.0 * torch.arange(1, H_q + 1, dtype=torch.float64) / H_q)
    i = torch.arange(S_q, dtype=torch.float64).view(-1, 1) + diagonal_shift(S_q, S_kv, alignment)
    j = torch.arange(S_kv, dtype=torch.float64).view(1, -1)
    return (-slopes.view(-1, 1, 1) * (i - j).abs()).to(torch.float32).unsqueeze(0)


def draw_modifiers(graph: Graph, bias_values: str, seed: int) -> dict[str, torch.Tensor]:
    """The modifier inputs the graph has, float32 in their logical dims (a broadcast axis
    expanded, not copied): 'bias' (randn or ALiBi) and 'sinks'. Rounded to a port's dtype
    as they are written."""
    if bias_values not in BIAS_VALUES:
        raise ValueError(f"unknown bias values {bias_values!r} (known: {', '.join(BIAS_VALUES)})")
    out = {}
    if "bias" in graph.tensors:
        spec = graph.tensors["bias"]
        if bias_values == "alibi":
            values = alibi_bias(graph.H_q, graph.S_q, graph.S_kv, graph.attributes.diagonal_alignment)
        else:
            values = _standard_normal(generated_shape(spec.dims, spec.strides), seed,
                                      MODIFIER_PORT_INDEX["bias"])
        out["bias"] = values.expand(spec.dims)
    if "sinks" in graph.tensors:
        out["sinks"] = _standard_normal((graph.H_q,), seed, MODIFIER_PORT_INDEX["sinks"]) * SINK_SCALE
    if "dropout_mask" in graph.tensors:
        spec = graph.tensors["dropout_mask"]
        out["dropout_mask"] = dropout_keep(generated_shape(spec.dims, spec.strides), seed,
                                           graph.attributes.dropout_probability).expand(spec.dims)
    if "alibi_slopes" in graph.tensors:
        spec = graph.tensors["alibi_slopes"]
        out["alibi_slopes"] = alibi_slopes(generated_shape(spec.dims, spec.strides), graph.H_q).expand(spec.dims)
    return out


def alibi_slopes(dims: tuple[int, ...], H_q: int) -> torch.Tensor:
    """float32 slopes of dims [H_q] or [B, H_q] (B is 1 for a slopes port broadcast over the
    batch by stride 0): 2^(-8 (h+1) / H_q) (BLOOM's and
    FlashAttention's geometric slopes), halved for each sequence b of the [B, H_q] form
    (2^-b), so a slope read for the wrong head or sequence differs. Finite by construction:
    the frontend cannot see values (docs/CONTRACTS.md, "Score modifiers")."""
    slopes = torch.pow(2.0, -8.0 * torch.arange(1, H_q + 1, dtype=torch.float64) / H_q)
    if len(dims) == 2:
        slopes = slopes.view(1, H_q) * torch.pow(2.0, -torch.arange(dims[0], dtype=torch.float64)).view(-1, 1)
    return slopes.to(torch.float32)


def dropout_keep(shape: tuple[int, ...], seed: int, p: float, chunk_elems: int = CHUNK_ELEMS) -> torch.Tensor:
    """A float32 keep mask (1 kept, 0 dropped), each entry kept with probability 1 - p:
    chunk c drawn uniform from chunk_seed(seed, dropout_mask's port index, c)."""
    x = torch.empty(math.prod(shape), dtype=torch.float32)
    index = MODIFIER_PORT_INDEX["dropout_mask"]
    for c, a in enumerate(range(0, x.numel(), chunk_elems)):
        x[a:a + chunk_elems].uniform_(generator=torch.Generator().manual_seed(chunk_seed(seed, index, c)))
    return (x >= p).to(torch.float32).view(shape)


def _standard_normal(shape: tuple[int, ...], seed: int, port_index: int,
                     chunk_elems: int = CHUNK_ELEMS) -> torch.Tensor:
    """A fresh float32 tensor, chunk c drawn from chunk_seed(seed, port_index, c)."""
    x = torch.empty(math.prod(shape), dtype=torch.float32)
    for c, a in enumerate(range(0, x.numel(), chunk_elems)):
        x[a:a + chunk_elems].normal_(generator=torch.Generator().manual_seed(chunk_seed(seed, port_index, c)))
    return x.view(shape)
