"""What crosses a `bundlegen serve` socket, as JSON (never pickle: unpickling a message runs
whatever code its sender chose, and a socket is only as trustworthy as the checks around it).

A message is a (kind, payload) pair. Payloads are JSON values and the harness's records,
written as tagged objects: a record names its class, which must be one of `RECORDS` (frozen
dataclasses built field by field, so reading a message constructs nothing else); tuples,
frozensets and mappings keep their kind, so a record read back equals the one sent."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from multiprocessing.connection import Connection

from bundlegen.cost import CostCoefficients
from bundlegen.graph import Attributes, Case, Cost, DataSpec, Graph, Ragged, Rejection, TensorSpec
from bundlegen.manifest import AxisItems, Gate, Item, LevelLimits, Manifest, Section
from bundlegen.tolerance import Tolerance
from bundlegen.harness.case import CaseOutcome
from bundlegen.harness.config import EngineConfig, OverrideRow, SkipRow
from bundlegen.harness.library_versions import Clause, Specifier
from bundlegen.harness.workers.serve_key import ServeKey

#: the records a message may hold, by class name
RECORDS = {cls.__name__: cls for cls in (
    ServeKey, EngineConfig, OverrideRow, SkipRow, Specifier, Clause, Manifest, LevelLimits,
    AxisItems, Item, Section, Gate, Tolerance, CostCoefficients, Case, Graph, TensorSpec,
    Attributes, Ragged, DataSpec, Rejection, Cost, CaseOutcome)}
#: the largest message read (a prepare message of every graph of a level fits many times over)
MAX_MESSAGE_BYTES = 256 * 2 ** 20


class WireError(ValueError):
    """A message that is not JSON of the form above, or names a record not in RECORDS."""


def encode(value):
    """`value` as a JSON value (see the module's docstring)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if RECORDS.get(name) is not type(value):
            raise WireError(f"{name} is not a record a message may hold")
        return {"~r": name, "f": {f.name: encode(getattr(value, f.name))
                                  for f in dataclasses.fields(value) if f.init}}
    if isinstance(value, tuple):
        return {"~t": [encode(v) for v in value]}
    if isinstance(value, frozenset):
        return {"~s": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {"~m": [[encode(k), encode(v)] for k, v in value.items()]}
    raise WireError(f"a {type(value).__name__} cannot cross the socket")


def decode(raw):
    """The value `encode` wrote; WireError for anything else."""
    if raw is None or isinstance(raw, (bool, int, float, str)):
        return raw
    if isinstance(raw, list):
        return [decode(v) for v in raw]
    if not isinstance(raw, dict) or len(raw) not in (1, 2):
        raise WireError(f"unexpected {type(raw).__name__} in a message")
    if "~r" in raw:
        cls = RECORDS.get(raw["~r"]) if isinstance(raw["~r"], str) else None
        fields = raw.get("f")
        if cls is None or not isinstance(fields, dict):
            raise WireError(f"unknown record {raw['~r']!r} in a message")
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        if not set(fields) <= known:
            raise WireError(f"{cls.__name__} has no field(s) {sorted(set(fields) - known)}")
        try:
            return cls(**{k: decode(v) for k, v in fields.items()})
        except TypeError as exc:
            raise WireError(f"{cls.__name__}: {exc}") from None
    if len(raw) != 1:
        raise WireError("unexpected object in a message")
    (tag, items), = raw.items()
    if not isinstance(items, list):
        raise WireError(f"unexpected {tag!r} in a message")
    if tag == "~t":
        return tuple(decode(v) for v in items)
    if tag == "~s":
        return frozenset(decode(v) for v in items)
    if tag == "~m":
        if not all(isinstance(kv, list) and len(kv) == 2 for kv in items):
            raise WireError("a mapping's entries are pairs")
        return {decode(k): decode(v) for k, v in items}
    raise WireError(f"unexpected {tag!r} in a message")


def send(conn: Connection, kind: str, payload=None) -> None:
    conn.send_bytes(json.dumps([kind, encode(payload)], separators=(",", ":")).encode())


def recv(conn: Connection) -> tuple[str, object]:
    """The next (kind, payload); WireError for a message not of this module's form, EOFError
    or OSError when the other side is gone."""
    data = conn.recv_bytes(MAX_MESSAGE_BYTES)
    try:
        raw = json.loads(data)
        if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str)):
            raise WireError("a message is [kind, payload]")
        return raw[0], decode(raw[1])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"a message that is not JSON ({exc})") from None
    except RecursionError:
        raise WireError("a message nested too deep") from None
