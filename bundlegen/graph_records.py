"""The records a bundle holds: one SDPA-backward graph per case, and the case around it.

DESIGN section 2: ports q, k, v, o, do, stats (inputs) and dq, dk, dv (outputs), each with
its own dims, strides (in elements) and storage offset. Records are frozen; the one text
form they are written in is canonical_json. bundlegen.graph_codec turns bundle text back
into these records.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

INPUT_PORTS = ("q", "k", "v", "o", "do", "stats")
#: the index tensors of a ragged graph, handed to engines beside the ports (int32, [B+1],
#: on the engine's device): the only place an engine may read the sequence offsets from
OFFSET_PORTS = ("cu_seqlens_q", "cu_seqlens_kv")
#: a padded ragged graph's per-sequence used lengths (int32, [B], on the engine's device),
#: handed beside the offsets for each side the graph has them on (Ragged.seqused_*)
SEQUSED_PORTS = ("seqused_q", "seqused_kv")
OUTPUT_PORTS = ("dq", "dk", "dv")
#: the ports every graph has
PORTS = INPUT_PORTS + OUTPUT_PORTS
#: score-modifier ports (docs/CONTRACTS.md, "Score modifiers"), present only in a graph
#: that has them: bias [B|1-by-stride-0, H_q|.., S_q, S_kv] (io dtype), sinks [H_q] (fp32);
#: dbias (the bias's dims, 1 on its broadcast axes) and dsinks [H_q] (fp32) need their input;
#: dropout_mask [B|1-by-stride-0, H_q|.., S_q, S_kv] (io dtype, keep = 1, drop = 0) comes
#: with dropout_probability p in (0, 1): kept entries of P are scaled by 1 / (1 - p);
#: alibi_slopes [H_q] or [B, H_q] (fp32): ALiBi from the indices, -slope * |i - j + shift|
MODIFIER_INPUT_PORTS = ("bias", "sinks", "dropout_mask", "alibi_slopes")
MODIFIER_OUTPUT_PORTS = ("dbias", "dsinks")
#: every port a bundle may name
KNOWN_PORTS = INPUT_PORTS + MODIFIER_INPUT_PORTS + OUTPUT_PORTS + MODIFIER_OUTPUT_PORTS
#: the score modifiers an engine may serve (Engine.score_modifiers): the four ports by
#: name, and the softcap attribute
MODIFIERS = ("bias", "dbias", "sinks", "softcap", "alibi_slopes")
#: values a bias input is filled with (DataSpec.bias_values): normal draws, or ALiBi
BIAS_VALUES = ("randn", "alibi")
DTYPES = ("bf16", "fp16", "fp32")
ALIGNMENTS = ("TOP_LEFT", "BOTTOM_RIGHT")
PURPOSES = ("claim", "probe", "regression")
DISTRIBUTIONS = ("randn", "small-int", "shifted-logits", "l2-grad", "large-do", "overflow-dp")
#: who must stop a probe: bundlegen's frontend, the engine's is_applicable, or (bad ragged
#: offsets no host code sees) the engine's device code, judged by what it touches
REJECTION_LAYERS = ("frontend", "engine", "device")
BUNDLE_VERSION = 1
#: the keys each record of a bundle may have, and nothing else
BUNDLE_KEYS = ("version", "plan", "level", "group", "cases")
CASE_KEYS = ("id", "purpose", "items", "graph", "data", "tolerance_class", "expected_rejection", "cost")
GRAPH_KEYS = ("tensors", "attributes", "ragged")
TENSOR_KEYS = ("dims", "strides", "offset", "dtype")
ATTRIBUTE_KEYS = ("attn_scale", "diagonal_alignment", "left_bound", "right_bound", "dropout_probability",
                  "deterministic_algorithm", "softcap")
RAGGED_KEYS = ("cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv", "seqused_q", "seqused_kv")
DATA_KEYS = ("seed", "distribution", "bias_values")
#: every integer of a graph that addresses memory (a dim, stride, offset, sequence offset or
#: length) is below this in magnitude, and so is every element a port addresses: engines
#: index with 64-bit integers (window bounds are not addresses: far past the sequence they
#: mean unbounded)
INT64_LIMIT = 2 ** 63


class BundleError(ValueError):
    """A malformed bundle: names the file, the case id and the field."""

    def __init__(self, message: str, *, file: str = "?", case_id: str = "?", field: str = "?"):
        self.file, self.case_id, self.field, self.message = file, case_id, field, message
        super().__init__(f"{file}: case {case_id}: field {field}: {message}")


def packed_strides(dims: tuple[int, ...], order: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Contiguous strides of `dims` stored with its axes nested as `order` (outermost
    first; default: as given)."""
    strides, step = [0] * len(dims), 1
    for axis in reversed(order if order is not None else range(len(dims))):
        strides[axis] = step
        step *= dims[axis]
    return tuple(strides)


@dataclass(frozen=True)
class TensorSpec:
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    offset: int = 0

    @property
    def storage_elements(self) -> int:
        """Elements from storage start to one past the last addressed element."""
        if any(d == 0 for d in self.dims):
            return self.offset
        return self.offset + 1 + sum((d - 1) * s for d, s in zip(self.dims, self.strides))

    def to_json(self) -> dict:
        return {"dims": list(self.dims), "strides": list(self.strides),
                "offset": self.offset, "dtype": self.dtype}


@dataclass(frozen=True)
class Attributes:
    attn_scale: float
    diagonal_alignment: str = "TOP_LEFT"
    left_bound: int | None = None
    right_bound: int | None = None
    dropout_probability: float | None = None
    #: the node asks for a deterministic backward (FlashAttention's `deterministic=True`,
    #: cuDNN's deterministic algorithm): re-runs must be bitwise equal; an engine without
    #: such a mode declines
    deterministic_algorithm: bool = False
    #: cap * tanh(s / cap) on the scaled scores (Gemma 2's logit softcap); None: off
    softcap: float | None = None

    def to_json(self) -> dict:
        out = {"attn_scale": self.attn_scale, "diagonal_alignment": self.diagonal_alignment,
               "left_bound": self.left_bound, "right_bound": self.right_bound,
               "dropout_probability": self.dropout_probability}
        if self.deterministic_algorithm:   # left out when off: other graphs keep their ids
            out["deterministic_algorithm"] = True
        if self.softcap is not None:       # likewise
            out["softcap"] = self.softcap
        return out


@dataclass(frozen=True)
class Ragged:
    """A packed variable-length batch (DESIGN section 10). Sequence b holds query tokens
    [cu_seqlens_q[b], cu_seqlens_q[b+1]) and key tokens [cu_seqlens_kv[b], cu_seqlens_kv[b+1])
    of the token-major ports ([T, H, D]). max_seqlen_q / max_seqlen_kv bound every
    sequence's length (engines size their grids by them; a longer sequence makes the graph
    invalid, a bound above the longest length is valid). Tokens before cu_seqlens[0] and
    from cu_seqlens[B] on belong to no sequence: nothing is read for them and their output
    rows are never written.

    The offsets are device data: an engine gets the graph as launched (`Graph.as_launched`),
    whose offsets are None, and reads them from the `cu_seqlens_*` tensors, as a real launch
    path does (a host check of them would need a device-to-host copy).

    Padded varlen (FlashAttention 3's seqused_q / seqused_k): `seqused_q[b]` (and
    `seqused_kv[b]`) is how many of sequence b's rows, from its first, are used; the rest of
    its cu_seqlens range is padding, never read, its output rows never written. None: the
    side has no used lengths (every row of the range is used). Device data like the offsets:
    as launched a side that has them holds () (present, values only on the device)."""
    cu_seqlens_q: tuple[int, ...] | None
    cu_seqlens_kv: tuple[int, ...] | None
    max_seqlen_q: int
    max_seqlen_kv: int
    batch: int
    seqused_q: tuple[int, ...] | None = None
    seqused_kv: tuple[int, ...] | None = None

    @staticmethod
    def of(cu_seqlens_q, cu_seqlens_kv, max_seqlen_q: int | None = None,
           max_seqlen_kv: int | None = None) -> "Ragged":
        """From offsets; a max_seqlen left out is the longest length (0 when none is positive)."""
        cq, ck = tuple(cu_seqlens_q), tuple(cu_seqlens_kv)
        longest = lambda cu: max([0, *(b - a for a, b in zip(cu, cu[1:]))])
        return Ragged(cu_seqlens_q=cq, cu_seqlens_kv=ck,
                      max_seqlen_q=longest(cq) if max_seqlen_q is None else max_seqlen_q,
                      max_seqlen_kv=longest(ck) if max_seqlen_kv is None else max_seqlen_kv,
                      batch=len(cq) - 1)

    @property
    def lengths_q(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.cu_seqlens_q, self.cu_seqlens_q[1:]))

    @property
    def lengths_kv(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.cu_seqlens_kv, self.cu_seqlens_kv[1:]))

    @property
    def seqused_ports(self) -> tuple[str, ...]:
        """The SEQUSED_PORTS of the sides that have used lengths."""
        return tuple(p for p in SEQUSED_PORTS if getattr(self, p) is not None)

    def used_lengths(self, side: str) -> tuple[int, ...]:
        """Sequence b's used rows on `side` (q or kv): its used length, else its whole range."""
        used = getattr(self, f"seqused_{side}")
        if used is not None:
            return used
        return self.lengths_q if side == "q" else self.lengths_kv

    def to_json(self) -> dict:
        out = {"cu_seqlens_q": None if self.cu_seqlens_q is None else list(self.cu_seqlens_q),
               "cu_seqlens_kv": None if self.cu_seqlens_kv is None else list(self.cu_seqlens_kv),
               "max_seqlen_q": self.max_seqlen_q, "max_seqlen_kv": self.max_seqlen_kv}
        for port in self.seqused_ports:   # left out when absent: other graphs keep their ids
            out[port] = list(getattr(self, port))
        return out


@dataclass(frozen=True)
class Graph:
    tensors: Mapping[str, TensorSpec]
    attributes: Attributes
    #: set for a packed variable-length batch: every port is token-major, [T, H, D]
    #: (stats [T_q, H_q, 1]); None for the padded [B, H, S, D] graph
    ragged: Ragged | None = None

    # Problem sizes, read from q, k and v (validation checks the others agree). A ragged
    # graph's S_q and S_kv are its max_seqlen bounds.
    @property
    def B(self) -> int:
        return self.ragged.batch if self.ragged else self.tensors["q"].dims[0]
    @property
    def H_q(self) -> int: return self.tensors["q"].dims[1]
    @property
    def H_k(self) -> int: return self.tensors["k"].dims[1]
    @property
    def H_v(self) -> int: return self.tensors["v"].dims[1]
    @property
    def S_q(self) -> int:
        return self.ragged.max_seqlen_q if self.ragged else self.tensors["q"].dims[2]
    @property
    def S_kv(self) -> int:
        return self.ragged.max_seqlen_kv if self.ragged else self.tensors["k"].dims[2]
    @property
    def D_qk(self) -> int: return self.tensors["q"].dims[-1]
    @property
    def D_v(self) -> int: return self.tensors["v"].dims[-1]
    @property
    def dtype(self) -> str: return self.tensors["q"].dtype
    @property
    def T_q(self) -> int:
        """Query tokens in storage (a ragged graph's q rows)."""
        return self.tensors["q"].dims[0]
    @property
    def T_kv(self) -> int:
        return self.tensors["k"].dims[0]

    @property
    def input_ports(self) -> tuple[str, ...]:
        """The inputs this graph has: INPUT_PORTS, then its modifier inputs."""
        return INPUT_PORTS + tuple(p for p in MODIFIER_INPUT_PORTS if p in self.tensors)

    @property
    def output_ports(self) -> tuple[str, ...]:
        """The outputs this graph has: OUTPUT_PORTS, then its modifier outputs."""
        return OUTPUT_PORTS + tuple(p for p in MODIFIER_OUTPUT_PORTS if p in self.tensors)

    @property
    def ports(self) -> tuple[str, ...]:
        return self.input_ports + self.output_ports

    @property
    def modifiers(self) -> frozenset[str]:
        """The score modifiers this graph uses (a subset of MODIFIERS); dsinks counts as
        "sinks" (an engine serving sinks writes their gradient when asked)."""
        used = {p for p in ("bias", "dbias", "sinks", "alibi_slopes") if p in self.tensors}
        if self.attributes.softcap is not None:
            used.add("softcap")
        return frozenset(used)

    @property
    def asks_drawn_dropout(self) -> bool:
        """Dropout (p > 0) with no dropout_mask port: the engine is asked to draw its own
        mask (docs/CONTRACTS.md, "Dropout")."""
        return bool(self.attributes.dropout_probability) and "dropout_mask" not in self.tensors

    def as_launched(self) -> "Graph":
        """The graph an engine is handed: a ragged graph's offsets removed (they reach the
        engine only as device tensors); a padded graph unchanged."""
        if self.ragged is None or self.ragged.cu_seqlens_q is None:
            return self
        hidden = dataclasses.replace(self.ragged, cu_seqlens_q=None, cu_seqlens_kv=None,
                                     **{p: () for p in self.ragged.seqused_ports})
        return dataclasses.replace(self, ragged=hidden)

    def to_json(self) -> dict:
        out = {"tensors": {p: self.tensors[p].to_json() for p in sorted(self.tensors)},
               "attributes": self.attributes.to_json()}
        if self.ragged is not None:   # left out when absent: padded graphs keep their ids
            out["ragged"] = self.ragged.to_json()
        return out


@dataclass(frozen=True)
class DataSpec:
    seed: int
    distribution: str = "randn"
    #: what a bias input holds (BIAS_VALUES); only read when the graph has a bias
    bias_values: str = "randn"

    def to_json(self) -> dict:
        out = {"seed": self.seed, "distribution": self.distribution}
        if self.bias_values != "randn":   # left out when default: other cases keep their ids
            out["bias_values"] = self.bias_values
        return out


@dataclass(frozen=True)
class Rejection:
    by: str       # "frontend" | "engine"
    reason: str   # a code from bundlegen.reasons

    def to_json(self) -> dict:
        return {"by": self.by, "reason": self.reason}


@dataclass(frozen=True)
class Cost:
    flops: int = 0
    bytes: int = 0
    predicted_s: float = 0.0

    def to_json(self) -> dict:
        return {"flops": self.flops, "bytes": self.bytes, "predicted_s": self.predicted_s}


@dataclass(frozen=True)
class Case:
    id: str
    purpose: str
    items: tuple[str, ...]
    graph: Graph
    data: DataSpec
    tolerance_class: str | None = None
    expected_rejection: Rejection | None = None
    cost: Cost = field(default_factory=Cost)
    level: str = ""
    group: str = ""

    def to_json(self) -> dict:
        return {"id": self.id, "purpose": self.purpose, "items": list(self.items),
                "graph": self.graph.to_json(), "data": self.data.to_json(),
                "tolerance_class": self.tolerance_class,
                "expected_rejection": None if self.expected_rejection is None
                else self.expected_rejection.to_json(),
                "cost": self.cost.to_json()}


def canonical_json(obj: Any) -> str:
    """Sorted keys, 2-space indent, trailing newline: the one text form of every file we write."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class Bundle:
    level: str
    group: str
    cases: tuple[Case, ...]
    plan: str = "sdpa_bwd"

    def to_json(self) -> dict:
        return {"version": BUNDLE_VERSION, "plan": self.plan, "level": self.level,
                "group": self.group, "cases": [c.to_json() for c in self.cases]}
