"""Which tolerance class a graph takes: the class of its io dtype whose reduction bound is
the smallest that covers the graph's longest reduction. The plan names every case's class
with this rule (its `tolerance_rule`), and the bundle loader applies it again to each loaded
case with the classes the manifest's tolerance TOML holds, so a case whose
`tolerance_class` was edited (a looser class than its graph takes) is refused at load: the
case id leaves the class out (recalibrating never renames a case), so without this the id
check could not see the edit."""
from __future__ import annotations

from typing import Mapping

from bundlegen.graph import Graph
from bundlegen.tolerance import Tolerance


def longest_reduction(graph: Graph) -> int:
    """The longest sum any gradient element takes: over keys (dQ), over query rows of a
    whole GQA group (dK, dV), over the head dims (dP, Delta), over the batches and heads a
    dBias sums (its broadcast axes) and over every query row of a head (dSinks)."""
    group = max(graph.H_q // graph.H_k, graph.H_q // graph.H_v)
    longest = max(graph.S_q * group, graph.S_kv, graph.D_qk, graph.D_v)
    t = graph.tensors
    if "dbias" in t and len(t["dbias"].dims) == 4:
        summed = [n for n, kept in zip((graph.B, graph.H_q), t["dbias"].dims[:2]) if kept == 1]
        longest = max(longest, 1 if not summed else summed[0] * (summed[1] if len(summed) > 1 else 1))
    if "dsinks" in t:
        longest = max(longest, graph.B * graph.S_q)
    return longest


class NoClass(ValueError):
    """No class of the graph's dtype covers its longest reduction (or none has its dtype)."""


def class_for(graph: Graph, classes: Mapping[str, Tolerance]) -> str:
    """The name of the class `graph` takes among `classes`; NoClass when none covers it."""
    of_dtype = sorted((tc.max_reduction, name) for name, tc in classes.items() if tc.dtype == graph.dtype)
    if not of_dtype:
        raise NoClass(f"no tolerance class for dtype {graph.dtype!r}")
    length = longest_reduction(graph)
    for bound, name in of_dtype:
        if length <= bound:
            return name
    raise NoClass(f"no tolerance class for a reduction of {length} (longest bound {of_dtype[-1][0]})")
