"""Bundle text to records: the only place that reads a bundle's JSON, and every error it
raises names the file, the case id and the field at fault (a bad file raises BundleError, a
bad case comes back as an error beside the good ones)."""
from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from bundlegen import reasons, safe_read, strict_json
from bundlegen.graph_records import (ATTRIBUTE_KEYS, BIAS_VALUES, BUNDLE_KEYS, BUNDLE_VERSION, CASE_KEYS,
                                     DATA_KEYS, DISTRIBUTIONS, DTYPES, GRAPH_KEYS, INT64_LIMIT, KNOWN_PORTS,
                                     PURPOSES, RAGGED_KEYS, REJECTION_LAYERS, SEQUSED_PORTS, TENSOR_KEYS, Attributes,
                                     Bundle, BundleError, Case, Cost, DataSpec, Graph, Ragged, Rejection,
                                     TensorSpec)

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: the most plan items one case may trace to (a generated case traces to at most a few
#: dozen), and the longest item name: every result record copies a case's items
MAX_CASE_ITEMS = 256
MAX_ITEM_CHARS = 128


class FieldReader:
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


def tensor_from_json(raw: Any, r: FieldReader, where: str) -> TensorSpec:
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


def graph_from_json(raw: Any, r: FieldReader, where: str = "graph") -> Graph:
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
        dropout_probability=r.finite(a, "dropout_probability", aw, optional=True),
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
                        batch=len(cq) - 1,
                        **{p: r.int_list(rag, p, rw) for p in SEQUSED_PORTS if p in rag})
    return Graph(tensors=tensors, attributes=attrs, ragged=ragged)


def case_from_json(raw: Any, file: str, level: str = "", group: str = "") -> Case:
    r = FieldReader(file)
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
    if not items:
        raise r.fail("items", "empty: a case must trace to at least one plan item")
    if len(items) > MAX_CASE_ITEMS:
        raise r.fail("items", f"{len(items)} entries, more than the {MAX_CASE_ITEMS} a case may trace to")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise r.fail(f"items[{i}]", f"expected str, got {type(item).__name__}")
        if not 0 < len(item) <= MAX_ITEM_CHARS:
            raise r.fail(f"items[{i}]", f"expected an item name of 1 to {MAX_ITEM_CHARS} characters, "
                                        f"got {len(item)}")
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


#: bundles parsed in this process: (file, SHA-256 of its text) -> (bundle, case errors). A
#: process that reads the same files again (the matrix and claims commands read every level's
#: bundles per call; a test session calls them many times) parses each once; keyed by the
#: text, so a file that changed is parsed anew. The records are frozen dataclasses; the four
#: levels' built-in bundles held here take about 36 MiB.
_PARSED: dict[tuple[str, str], tuple[Bundle, tuple[BundleError, ...]]] = {}
_PARSED_MOST = 256


def load_bundle(path, text: str | None = None) -> tuple[Bundle, list[BundleError]]:
    """Read one bundle file. A bad file raises BundleError; a bad case is returned as an
    error beside the good cases, so one malformed case never hides the others."""
    file = str(path)
    try:
        if text is None:
            text = safe_read.read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise FieldReader(file, "-").fail("-", f"cannot read: {exc}") from None
    key = (file, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MOST:
            _PARSED.clear()
        bundle, errors = _parse_bundle(file, text)
        _PARSED[key] = bundle, tuple(errors)
    bundle, errors = _PARSED[key]
    return bundle, list(errors)


def _parse_bundle(file: str, text: str) -> tuple[Bundle, list[BundleError]]:
    """load_bundle's work on a file's text (what _PARSED keeps)."""
    r = FieldReader(file, "-")
    try:
        raw = strict_json.loads(text)
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
