"""The records a bundle holds: one SDPA-backward graph per case, and the case around it.

DESIGN section 2: ports q, k, v, o, do, stats (inputs) and dq, dk, dv (outputs), each with
its own dims, strides (in elements) and storage offset. Records are frozen; the JSON codec
here is the only place that turns bundle text into records, and every error it raises
names the file, the case id and the field at fault.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from bundlegen import reasons, safe_read, strict_json

INPUT_PORTS = ("q", "k", "v", "o", "do", "stats")
#: the index tensors of a ragged graph, handed to engines beside the ports (int32, [B+1],
#: on the engine's device): the only place an engine may read the sequence offsets from
OFFSET_PORTS = ("cu_seqlens_q", "cu_seqlens_kv")
OUTPUT_PORTS = ("dq", "dk", "dv")
#: the ports every graph has
PORTS = INPUT_PORTS + OUTPUT_PORTS
#: score-modifier ports (docs/CONTRACTS.md, "Score modifiers"), present only in a graph
#: that has them: bias [B|1-by-stride-0, H_q|.., S_q, S_kv] (io dtype), sinks [H_q] (fp32);
#: dbias (the bias's dims, 1 on its broadcast axes) and dsinks [H_q] (fp32) need their input;
#: dropout_mask [B|1-by-stride-0, H_q|.., S_q, S_kv] (io dtype, keep = 1, drop = 0) comes
#: with dropout_probability p in (0, 1): kept entries of P are scaled by 1 / (1 - p)
MODIFIER_INPUT_PORTS = ("bias", "sinks", "dropout_mask")
MODIFIER_OUTPUT_PORTS = ("dbias", "dsinks")
#: every port a bundle may name
KNOWN_PORTS = INPUT_PORTS + MODIFIER_INPUT_PORTS + OUTPUT_PORTS + MODIFIER_OUTPUT_PORTS
#: the score modifiers an engine may serve (Engine.score_modifiers): the four ports by
#: name, and the softcap attribute
MODIFIERS = ("bias", "dbias", "sinks", "softcap")
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
RAGGED_KEYS = ("cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv")
DATA_KEYS = ("seed", "distribution", "bias_values")
#: every integer of a graph that addresses memory (a dim, stride, offset, sequence offset or
#: length) is below this in magnitude, and so is every element a port addresses: engines
#: index with 64-bit integers (window bounds are not addresses: far past the sequence they
#: mean unbounded)
INT64_LIMIT = 2 ** 63
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


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
    path does (a host check of them would need a device-to-host copy)."""
    cu_seqlens_q: tuple[int, ...] | None
    cu_seqlens_kv: tuple[int, ...] | None
    max_seqlen_q: int
    max_seqlen_kv: int
    batch: int

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

    def to_json(self) -> dict:
        return {"cu_seqlens_q": None if self.cu_seqlens_q is None else list(self.cu_seqlens_q),
                "cu_seqlens_kv": None if self.cu_seqlens_kv is None else list(self.cu_seqlens_kv),
                "max_seqlen_q": self.max_seqlen_q, "max_seqlen_kv": self.max_seqlen_kv}


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
        used = {p for p in ("bias", "dbias", "sinks") if p in self.tensors}
        if self.attributes.softcap is not None:
            used.add("softcap")
        return frozenset(used)

    def as_launched(self) -> "Graph":
        """The graph an engine is handed: a ragged graph's offsets removed (they reach the
        engine only as device tensors); a padded graph unchanged."""
        if self.ragged is None or self.ragged.cu_seqlens_q is None:
            return self
        hidden = dataclasses.replace(self.ragged, cu_seqlens_q=None, cu_seqlens_kv=None)
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


# ----------------------------------------------------------------------------- decoding
class _Reader:
    """Typed field access that raises BundleError naming where it was."""

    def __init__(self, file: str, case_id: str = "?"):
        self.file, self.case_id = file, case_id

    def fail(self, fieldname: str, message: str) -> BundleError:
        return BundleError(message, file=self.file, case_id=self.case_id, field=fieldname)

    def get(self, obj: Any, key: str, types: type | tuple, where: str, *, optional: bool = False):
        if not isinstance(obj, dict):
            raise self.fail(where, f"expected an object, got {type(obj).__name__}")
        name = f"{where}.{key}" if where else key
        if key not in obj:
            if optional:
                return None
            raise self.fail(name, "missing")
        value = obj[key]
        if value is None and optional:
            return None
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise self.fail(name, f"expected {_type_names(types)}, got bool")
        if not isinstance(value, types):
            raise self.fail(name, f"expected {_type_names(types)}, got {type(value).__name__}")
        return value

    def int_list(self, obj: dict, key: str, where: str) -> tuple[int, ...]:
        values = self.get(obj, key, list, where)
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int):
                raise self.fail(f"{where}.{key}[{i}]", f"expected int, got {type(v).__name__}")
            self.addressable(v, f"{where}.{key}[{i}]")
        return tuple(values)

    def only(self, obj: Any, keys: tuple[str, ...], where: str) -> None:
        """Refuse a key the record does not have: a misspelt one (`left_bnd`) would
        otherwise be dropped and its field left at its default."""
        if not isinstance(obj, dict):
            raise self.fail(where or "-", f"expected an object, got {type(obj).__name__}")
        for key in obj:
            if key not in keys:
                name = f"{where}.{key}" if where else key
                raise self.fail(name, f"unknown key (known: {', '.join(keys)})")

    def addressable(self, value: int, name: str) -> int:
        if not -INT64_LIMIT < value < INT64_LIMIT:
            raise self.fail(name, "an integer past what a graph can address (|n| < 2^63)")
        return value

    def integer(self, obj: Any, key: str, where: str, *, optional: bool = False) -> int | None:
        """An int field within what a graph can address."""
        value = self.get(obj, key, int, where, optional=optional)
        return None if value is None else self.addressable(value, f"{where}.{key}" if where else key)

    def finite(self, obj: Any, key: str, where: str, *, optional: bool = False) -> float | None:
        """A number field as a finite float: an integer too large for a float (10^400) or
        a NaN is refused here, not left to crash or to poison a verdict later."""
        value = self.get(obj, key, (int, float), where, optional=optional)
        if value is None:
            return None
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise self.fail(f"{where}.{key}" if where else key, "expected a finite number")
        return number


def _type_names(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)


def tensor_from_json(raw: Any, r: _Reader, where: str) -> TensorSpec:
    r.only(raw, TENSOR_KEYS, where)
    dims = r.int_list(raw, "dims", where)
    strides = r.int_list(raw, "strides", where)
    if len(strides) != len(dims):
        raise r.fail(f"{where}.strides", f"has {len(strides)} entries for {len(dims)} dims")
    for i, d in enumerate(dims):
        if d < 0:
            raise r.fail(f"{where}.dims[{i}]", f"negative dim {d}")
    dtype = r.get(raw, "dtype", str, where)
    if dtype not in DTYPES:
        raise r.fail(f"{where}.dtype", f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    offset = r.integer(raw, "offset", where, optional=True) or 0
    spec = TensorSpec(dims=dims, strides=strides, dtype=dtype, offset=offset)
    if spec.storage_elements >= INT64_LIMIT or spec.offset + sum(
            (d - 1) * s for d, s in zip(dims, strides) if s < 0 and d > 0) <= -INT64_LIMIT:
        raise r.fail(where, "addresses elements past what a graph can address (2^63)")
    return spec


def graph_from_json(raw: Any, r: _Reader, where: str = "graph") -> Graph:
    r.only(raw, GRAPH_KEYS, where)
    tensors_raw = r.get(raw, "tensors", dict, where)
    tensors = {}
    for port in sorted(tensors_raw):
        if port not in KNOWN_PORTS:
            raise r.fail(f"{where}.tensors.{port}", f"unknown port (known: {', '.join(KNOWN_PORTS)})")
        tensors[port] = tensor_from_json(tensors_raw[port], r, f"{where}.tensors.{port}")
    a = r.get(raw, "attributes", dict, where)
    aw = f"{where}.attributes"
    r.only(a, ATTRIBUTE_KEYS, aw)
    scale = r.finite(a, "attn_scale", aw)
    alignment = r.get(a, "diagonal_alignment", str, aw, optional=True) or "TOP_LEFT"
    attrs = Attributes(
        attn_scale=scale, diagonal_alignment=alignment,
        left_bound=r.get(a, "left_bound", int, aw, optional=True),
        right_bound=r.get(a, "right_bound", int, aw, optional=True),
        dropout_probability=r.get(a, "dropout_probability", (int, float), aw, optional=True),
        deterministic_algorithm=bool(r.get(a, "deterministic_algorithm", bool, aw, optional=True)),
        softcap=r.finite(a, "softcap", aw, optional=True))
    ragged = None
    rag = r.get(raw, "ragged", dict, where, optional=True)
    if rag is not None:
        rw = f"{where}.ragged"
        r.only(rag, RAGGED_KEYS, rw)
        cq, ck = r.int_list(rag, "cu_seqlens_q", rw), r.int_list(rag, "cu_seqlens_kv", rw)
        ragged = Ragged(cu_seqlens_q=cq, cu_seqlens_kv=ck,
                        max_seqlen_q=r.integer(rag, "max_seqlen_q", rw),
                        max_seqlen_kv=r.integer(rag, "max_seqlen_kv", rw),
                        batch=len(cq) - 1)
    return Graph(tensors=tensors, attributes=attrs, ragged=ragged)


def case_from_json(raw: Any, file: str, level: str = "", group: str = "") -> Case:
    r = _Reader(file)
    if not isinstance(raw, dict):
        raise r.fail("cases[]", f"expected an object, got {type(raw).__name__}")
    case_id = r.get(raw, "id", str, "")
    if not _ID_RE.fullmatch(case_id):
        raise r.fail("id", f"invalid id {case_id!r}: letters, digits, '_', '.', '-' only")
    r.case_id = case_id
    r.only(raw, CASE_KEYS, "")
    purpose = r.get(raw, "purpose", str, "")
    if purpose not in PURPOSES:
        raise r.fail("purpose", f"unknown purpose {purpose!r} (known: {', '.join(PURPOSES)})")
    items = r.get(raw, "items", list, "")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise r.fail(f"items[{i}]", f"expected str, got {type(item).__name__}")
    graph = graph_from_json(r.get(raw, "graph", dict, ""), r)
    d = r.get(raw, "data", dict, "")
    r.only(d, DATA_KEYS, "data")
    seed = r.get(d, "seed", int, "data")
    if not 0 <= seed < INT64_LIMIT:
        raise r.fail("data.seed", "expected a whole number from 0 to 2^63 - 1")
    dist = r.get(d, "distribution", str, "data", optional=True) or "randn"
    if dist not in DISTRIBUTIONS:
        raise r.fail("data.distribution", f"unknown distribution {dist!r}")
    bias_values = r.get(d, "bias_values", str, "data", optional=True) or "randn"
    if bias_values not in BIAS_VALUES:
        raise r.fail("data.bias_values", f"unknown bias values {bias_values!r} "
                                         f"(known: {', '.join(BIAS_VALUES)})")
    rej_raw = r.get(raw, "expected_rejection", dict, "", optional=True)
    rejection = None
    if rej_raw is not None:
        r.only(rej_raw, ("by", "reason"), "expected_rejection")
        by = r.get(rej_raw, "by", str, "expected_rejection")
        if by not in REJECTION_LAYERS:
            raise r.fail("expected_rejection.by", f"unknown layer {by!r}")
        reason = r.get(rej_raw, "reason", str, "expected_rejection")
        known = {"frontend": reasons.FRONTEND, "engine": reasons.ENGINE,
                 "device": reasons.DEVICE}[by]
        if reason not in known:
            raise r.fail("expected_rejection.reason", f"{reason!r} is not a {by} reason code")
        rejection = Rejection(by=by, reason=reason)
    if (purpose == "probe") != (rejection is not None):
        raise r.fail("expected_rejection", "a probe needs one and only probes may have one")
    c = r.get(raw, "cost", dict, "", optional=True) or {}
    r.only(c, ("flops", "bytes", "predicted_s"), "cost")
    cost = Cost(flops=r.integer(c, "flops", "cost", optional=True) or 0,
                bytes=r.integer(c, "bytes", "cost", optional=True) or 0,
                predicted_s=r.finite(c, "predicted_s", "cost", optional=True) or 0.0)
    from bundlegen import ids

    content_id = ids.case_id(purpose, graph, dist, rejection, seed, bias_values=bias_values)
    if content_id != case_id:
        raise r.fail("id", f"does not match the case's content, whose id is {content_id} "
                           "(edited after generation? run `bundlegen generate`)")
    return Case(id=case_id, purpose=purpose, items=tuple(items), graph=graph,
                data=DataSpec(seed=seed, distribution=dist, bias_values=bias_values),
                tolerance_class=r.get(raw, "tolerance_class", str, "", optional=True),
                expected_rejection=rejection, cost=cost, level=level, group=group)


@dataclass(frozen=True)
class Bundle:
    level: str
    group: str
    cases: tuple[Case, ...]
    plan: str = "sdpa_bwd"

    def to_json(self) -> dict:
        return {"version": BUNDLE_VERSION, "plan": self.plan, "level": self.level,
                "group": self.group, "cases": [c.to_json() for c in self.cases]}


def load_bundle(path, text: str | None = None) -> tuple[Bundle, list[BundleError]]:
    """Read one bundle file. A bad file raises BundleError; a bad case is returned as an
    error beside the good cases, so one malformed case never hides the others."""
    file = str(path)
    r = _Reader(file, "-")
    try:
        if text is None:
            text = safe_read.read_text(path)
        raw = strict_json.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise r.fail("-", f"cannot read: {exc}") from None
    except strict_json.JSONError as exc:
        raise r.fail("-", str(exc)) from None
    if not isinstance(raw, dict):
        raise r.fail("-", "top level is not an object")
    r.only(raw, BUNDLE_KEYS, "")
    version = r.get(raw, "version", int, "")
    if version != BUNDLE_VERSION:
        raise r.fail("version", f"unsupported version {version}")
    level = r.get(raw, "level", str, "")
    group = r.get(raw, "group", str, "")
    plan = r.get(raw, "plan", str, "")
    cases, errors, seen = [], [], set()
    for i, case_raw in enumerate(r.get(raw, "cases", list, "")):
        try:
            case = case_from_json(case_raw, file, level, group)
        except BundleError as exc:
            if exc.case_id == "?" and isinstance(case_raw, dict) and isinstance(case_raw.get("id"), str):
                exc = BundleError(exc.message, file=file, case_id=case_raw["id"], field=exc.field)
            elif exc.case_id == "?":
                exc = BundleError(exc.message, file=file, case_id=f"#{i}", field=exc.field)
            errors.append(exc)
            continue
        if case.id in seen:
            errors.append(BundleError("duplicate id", file=file, case_id=case.id, field="id"))
            continue
        seen.add(case.id)
        cases.append(case)
    return Bundle(level=level, group=group, cases=tuple(cases), plan=plan), errors


def default_scale(d_qk: int) -> float:
    return 1.0 / math.sqrt(d_qk)


#: Axis order from outermost to innermost, as indices into [B, H, S, D].
LAYOUT_ORDERS = {"bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3)}


def port_dims(B: int, H_q: int, H_k: int, H_v: int, S_q: int, S_kv: int, D_qk: int,
              D_v: int) -> dict[str, tuple[int, int, int, int]]:
    """The logical dims of every port (DESIGN section 2)."""
    return {"q": (B, H_q, S_q, D_qk), "k": (B, H_k, S_kv, D_qk), "v": (B, H_v, S_kv, D_v),
            "o": (B, H_q, S_q, D_v), "do": (B, H_q, S_q, D_v), "stats": (B, H_q, S_q, 1),
            "dq": (B, H_q, S_q, D_qk), "dk": (B, H_k, S_kv, D_qk), "dv": (B, H_v, S_kv, D_v)}


def dense_graph(B: int = 1, H_q: int = 2, H_k: int | None = None, H_v: int | None = None,
                S_q: int = 16, S_kv: int | None = None, D_qk: int = 16, D_v: int | None = None,
                dtype: str = "fp16", layout: str = "bhsd", scale: float | None = None,
                alignment: str = "TOP_LEFT", left: int | None = None, right: int | None = None,
                dropout: float | None = None, strides: Mapping[str, tuple[int, ...]] | None = None,
                offsets: Mapping[str, int] | None = None) -> Graph:
    """A graph from sizes: every port packed in `layout` (stats packed [B, H_q, S_q, 1],
    fp32); H_k defaults to H_q, H_v to H_k, S_kv to S_q, D_v to D_qk. `strides` and
    `offsets` override any port's strides or offset by name."""
    H_k = H_q if H_k is None else H_k
    H_v = H_k if H_v is None else H_v
    S_kv = S_q if S_kv is None else S_kv
    D_v = D_qk if D_v is None else D_v
    strides, offsets = dict(strides or {}), dict(offsets or {})
    tensors = {}
    for port, d in port_dims(B, H_q, H_k, H_v, S_q, S_kv, D_qk, D_v).items():
        order = LAYOUT_ORDERS["bhsd" if port == "stats" else layout]
        tensors[port] = TensorSpec(dims=d, strides=tuple(strides.get(port, packed_strides(d, order))),
                                   dtype="fp32" if port == "stats" else dtype,
                                   offset=offsets.get(port, 0))
    attrs = Attributes(attn_scale=default_scale(D_qk) if scale is None else scale,
                       diagonal_alignment=alignment, left_bound=left, right_bound=right,
                       dropout_probability=dropout)
    return Graph(tensors=tensors, attributes=attrs)


#: bias broadcast kinds: which of the bias's axes 0 (batch) and 1 (heads) have stride 0
BIAS_BROADCASTS = {"full": (), "batch": (0,), "head": (1,), "both": (0, 1)}


def with_modifiers(graph: Graph, *, bias: str | None = None, dbias: bool = False,
                   sinks: bool = False, dsinks: bool = False,
                   softcap: float | None = None, dropout: float | None = None,
                   dropout_mask: str | None = "full") -> Graph:
    """`graph` (padded) with score-modifier ports added, each packed: a bias broadcast as
    BIAS_BROADCASTS[bias] (zero strides on its broadcast axes), its dbias summed over them
    (dims 1 there), sinks / dsinks [H_q] fp32; `softcap` sets the attribute; `dropout` sets
    dropout_probability and, unless `dropout_mask` is None, adds the dropout_mask port
    broadcast as BIAS_BROADCASTS[dropout_mask]."""
    B, H_q, S_q, S_kv = graph.B, graph.H_q, graph.S_q, graph.S_kv
    tensors = dict(graph.tensors)
    if bias is not None:
        axes = BIAS_BROADCASTS[bias]
        reduced = tuple(1 if a in axes else d for a, d in enumerate((B, H_q, S_q, S_kv)))
        strides = tuple(0 if a in axes else s for a, s in enumerate(packed_strides(reduced)))
        tensors["bias"] = TensorSpec(dims=(B, H_q, S_q, S_kv), strides=strides, dtype=graph.dtype)
        if dbias:
            tensors["dbias"] = TensorSpec(dims=reduced, strides=packed_strides(reduced),
                                          dtype=graph.dtype)
    elif dbias:
        raise ValueError("dbias needs a bias")
    if sinks:
        tensors["sinks"] = TensorSpec(dims=(H_q,), strides=(1,), dtype="fp32")
        if dsinks:
            tensors["dsinks"] = TensorSpec(dims=(H_q,), strides=(1,), dtype="fp32")
    elif dsinks:
        raise ValueError("dsinks needs sinks")
    attrs = graph.attributes if softcap is None else dataclasses.replace(graph.attributes,
                                                                         softcap=float(softcap))
    if dropout is not None:
        attrs = dataclasses.replace(attrs, dropout_probability=float(dropout))
        if dropout_mask is not None:
            axes = BIAS_BROADCASTS[dropout_mask]
            stored = tuple(1 if a in axes else d for a, d in enumerate((B, H_q, S_q, S_kv)))
            strides = tuple(0 if a in axes else s for a, s in enumerate(packed_strides(stored)))
            tensors["dropout_mask"] = TensorSpec(dims=(B, H_q, S_q, S_kv), strides=strides,
                                                 dtype=graph.dtype)
    return dataclasses.replace(graph, tensors=tensors, attributes=attrs)


def dbias_dims(bias: TensorSpec) -> tuple[int, ...]:
    """The dims a dBias for `bias` must have: 1 on every axis the bias broadcasts (stride
    0 on an axis longer than 1), the bias's length elsewhere."""
    return tuple(1 if s == 0 and d > 1 else d for d, s in zip(bias.dims, bias.strides))


#: Token-major storage orders of a ragged graph's [T, H, D] ports, outermost first:
#: "thd" token by token (FlashAttention's varlen layout), "htd" head by head.
RAGGED_LAYOUT_ORDERS = {"thd": (0, 1, 2), "htd": (1, 0, 2)}
#: a ragged graph's stats [T_q, H_q, 1] head by head: FlashAttention's [H, total_q] LSE
RAGGED_STATS_ORDER = (1, 0, 2)


def ragged_port_dims(T_q: int, T_kv: int, H_q: int, H_k: int, H_v: int, D_qk: int,
                     D_v: int) -> dict[str, tuple[int, int, int]]:
    """The logical dims of every port of a ragged graph (DESIGN section 10)."""
    return {"q": (T_q, H_q, D_qk), "k": (T_kv, H_k, D_qk), "v": (T_kv, H_v, D_v),
            "o": (T_q, H_q, D_v), "do": (T_q, H_q, D_v), "stats": (T_q, H_q, 1),
            "dq": (T_q, H_q, D_qk), "dk": (T_kv, H_k, D_qk), "dv": (T_kv, H_v, D_v)}


def ragged_graph(cu_seqlens_q, cu_seqlens_kv=None, *, H_q: int = 2, H_k: int | None = None,
                 H_v: int | None = None, D_qk: int = 16, D_v: int | None = None,
                 dtype: str = "fp16", layout: str = "thd", scale: float | None = None,
                 alignment: str = "TOP_LEFT", left: int | None = None, right: int | None = None,
                 max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
                 T_q: int | None = None, T_kv: int | None = None,
                 strides: Mapping[str, tuple[int, ...]] | None = None,
                 offsets: Mapping[str, int] | None = None) -> Graph:
    """A ragged graph from its offsets: every port packed in `layout` (stats head by head,
    fp32); T_q / T_kv default to the last offset, cu_seqlens_kv to cu_seqlens_q, the
    max_seqlens to the longest lengths. `strides` and `offsets` override any port's."""
    cu_seqlens_kv = cu_seqlens_q if cu_seqlens_kv is None else cu_seqlens_kv
    H_k = H_q if H_k is None else H_k
    H_v = H_k if H_v is None else H_v
    D_v = D_qk if D_v is None else D_v
    T_q = cu_seqlens_q[-1] if T_q is None else T_q
    T_kv = cu_seqlens_kv[-1] if T_kv is None else T_kv
    strides, offsets = dict(strides or {}), dict(offsets or {})
    tensors = {}
    for port, d in ragged_port_dims(T_q, T_kv, H_q, H_k, H_v, D_qk, D_v).items():
        order = RAGGED_STATS_ORDER if port == "stats" else RAGGED_LAYOUT_ORDERS[layout]
        tensors[port] = TensorSpec(dims=d, strides=tuple(strides.get(port, packed_strides(d, order))),
                                   dtype="fp32" if port == "stats" else dtype,
                                   offset=offsets.get(port, 0))
    attrs = Attributes(attn_scale=default_scale(D_qk) if scale is None else scale,
                       diagonal_alignment=alignment, left_bound=left, right_bound=right)
    return Graph(tensors=tensors, attributes=attrs,
                 ragged=Ragged.of(cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv))
