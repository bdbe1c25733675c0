"""Stable case ids and data seeds: the generator names cases with them, and the bundle
loader checks every case against its id, so a case edited after generation cannot pass
under an id (and claims) that belong to other content.

A case id is the first 12 hex digits of the sha256 of the case's identity: its purpose,
graph, input distribution and expected rejection. Items, group, tolerance class, cost and
level are left out, so recalibrating tolerances or the cost model, or tracing a case to
one more item, never renames a case (claims are keyed by case id). The tolerance class
still decides a verdict, so the bundle loader checks it on its own: it applies the plan's
class rule (bundlegen.tolerance_rule) to the case's graph with the manifest's classes, and
refuses a case naming another class. The data seed is a function of the id; a case given
any other seed (hand-written bundles, tests) has the seed in its identity too.
"""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # graph.py checks ids when it loads a case: no import cycle at run time
    from bundlegen.graph import Graph, Rejection

ID_HEX_DIGITS = 12
SEED_MODULUS = 2 ** 31


def _compact(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_key(graph: Graph, distribution: str, rejection: Rejection | None,
                bias_values: str = "randn") -> str:
    """What two plan entries must share to be one case (their items are merged)."""
    return _compact({"graph": graph.to_json(), "distribution": distribution,
                     "expected_rejection": None if rejection is None else rejection.to_json(),
                     **_bias_values(bias_values)})


def case_id(purpose: str, graph: Graph, distribution: str, rejection: Rejection | None,
            seed: int | None = None, *, bias_values: str = "randn") -> str:
    """The id of this content; with a `seed` other than the id's own (seed_of), the seed is
    part of the identity. Bias values other than the default are part of it too."""
    identity = {"purpose": purpose, "graph": graph.to_json(), "distribution": distribution,
                "expected_rejection": None if rejection is None else rejection.to_json(),
                **_bias_values(bias_values)}
    base = _digest(identity)
    if seed is None or seed == seed_of(base):
        return base
    return _digest({**identity, "seed": seed})


def _bias_values(bias_values: str) -> dict:
    """Left out when default: cases without a structured bias keep their ids."""
    return {} if bias_values == "randn" else {"bias_values": bias_values}


def _digest(identity: dict) -> str:
    return hashlib.sha256(_compact(identity).encode("utf-8")).hexdigest()[:ID_HEX_DIGITS]


def seed_of(case_id_: str) -> int:
    """The case's data seed: a function of its id only."""
    return int(case_id_[:8], 16) % SEED_MODULUS
