"""Stable case ids and data seeds.

A case id is the first 12 hex digits of the sha256 of the case's identity: its purpose,
graph, input distribution and expected rejection. Items, group, tolerance class, cost,
level and seed are left out, so recalibrating tolerances or the cost model, or tracing a
case to one more item, never renames a case (claims are keyed by case id).
"""
from __future__ import annotations

import hashlib
import json

from bundlegen.graph import Graph, Rejection

ID_HEX_DIGITS = 12
SEED_MODULUS = 2 ** 31


def _compact(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_key(graph: Graph, distribution: str, rejection: Rejection | None) -> str:
    """What two plan entries must share to be one case (their items are merged)."""
    return _compact({"graph": graph.to_json(), "distribution": distribution,
                     "expected_rejection": None if rejection is None else rejection.to_json()})


def case_id(purpose: str, graph: Graph, distribution: str, rejection: Rejection | None) -> str:
    identity = {"purpose": purpose, "graph": graph.to_json(), "distribution": distribution,
                "expected_rejection": None if rejection is None else rejection.to_json()}
    return hashlib.sha256(_compact(identity).encode("utf-8")).hexdigest()[:ID_HEX_DIGITS]


def seed_of(case_id_: str) -> int:
    """The case's data seed: a function of its id only."""
    return int(case_id_[:8], 16) % SEED_MODULUS
