"""Input values from a case's seed and distribution (DESIGN section 2, `data`), made on
the CPU so every device sees the same bits.

One torch.Generator seeded with the case seed draws q, k, v, do in that order, each in
its generated shape (a broadcast axis, stride 0, is drawn with size 1), and each is
rounded to the io dtype.
- `randn`: standard normal.
- `small-int`: integers in {-2, -1, 1, 2}, half of them zeroed: exact in every io dtype.
- `shifted-logits`: Q and K share an offset along the all-ones direction, opposite in
  sign, with their own parts made orthogonal to it, so every scaled score is about
  -SHIFTED_LOGIT: LSE is below -88.7 for every row (an fp32 exp(s) alone underflows).
  V and dO are standard normal.
"""
from __future__ import annotations

import math

import torch

from bundlegen.graph import DISTRIBUTIONS, Graph

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GENERATED_PORTS = ("q", "k", "v", "do")
#: about where every scaled score of a shifted-logits case sits; LSE adds at most
#: log(S_kv) + ~1 to it, so LSE stays below -88.7 up to S_kv ~ 2^25
SHIFTED_LOGIT = 110.0


def generated_shape(dims: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """The dims with every broadcast axis (stride 0, longer than 1) drawn as size 1."""
    return tuple(1 if s == 0 and d > 1 else d for d, s in zip(dims, strides))


def _small_int(shape, gen: torch.Generator) -> torch.Tensor:
    magnitude = torch.randint(1, 3, shape, generator=gen)
    sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
    keep = torch.rand(shape, generator=gen) < 0.5
    return (magnitude * sign * keep).to(torch.float32)


def _shifted(shape, gen: torch.Generator, graph: Graph, sign: float) -> torch.Tensor:
    """c * (x - mean_d x) + sign * alpha: the scores of two such rows are
    scale * c^2 * (x~ . y~) - scale * alpha^2 * D = N(0, ~1) - SHIFTED_LOGIT."""
    scale, d = graph.attributes.attn_scale, graph.D_qk
    alpha = math.sqrt(SHIFTED_LOGIT / (scale * d))
    c = 1.0 / math.sqrt(scale * math.sqrt(d))
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    x = x - x.mean(dim=-1, keepdim=True)
    return (c * x + sign * alpha).to(torch.float32)


def generate_inputs(graph: Graph, distribution: str, seed: int) -> dict[str, torch.Tensor]:
    """port -> CPU tensor in the io dtype with the port's generated shape (expand it to the
    logical dims)."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r} (known: {', '.join(DISTRIBUTIONS)})")
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for port in GENERATED_PORTS:
        spec = graph.tensors[port]
        shape = generated_shape(spec.dims, spec.strides)
        if distribution == "small-int":
            values = _small_int(shape, gen)
        elif distribution == "shifted-logits" and port in ("q", "k"):
            values = _shifted(shape, gen, graph, 1.0 if port == "q" else -1.0)
        else:
            values = torch.randn(shape, generator=gen, dtype=torch.float32)
        out[port] = values.to(TORCH_DTYPES[spec.dtype])
    return out
