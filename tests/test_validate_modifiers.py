"""Frontend rules of the score-modifier ports and the softcap (issue 19): each bad graph
gets its own reason code at its field; every well-formed variant is accepted."""
from __future__ import annotations

import dataclasses

import pytest

from bundlegen import reasons as R
from bundlegen.graph import TensorSpec, dense_graph, ragged_graph, with_modifiers
from bundlegen.validate import frontend_finding, launch_reason

BASE = dense_graph(B=2, H_q=4, H_k=2, S_q=8, S_kv=12, D_qk=8, dtype="bf16")
FULL = with_modifiers(BASE, bias="full", dbias=True, sinks=True, dsinks=True, softcap=30.0)


def _port(graph, port, **fields):
    tensors = dict(graph.tensors)
    tensors[port] = dataclasses.replace(tensors[port], **fields)
    return dataclasses.replace(graph, tensors=tensors)


def _drop(graph, port):
    return dataclasses.replace(graph, tensors={p: t for p, t in graph.tensors.items() if p != port})


def _cap(graph, cap):
    return dataclasses.replace(graph, attributes=dataclasses.replace(graph.attributes, softcap=cap))


@pytest.mark.parametrize("kind", ["full", "batch", "head", "both"])
@pytest.mark.parametrize("extras", [dict(), dict(dbias=True), dict(dbias=True, sinks=True, dsinks=True, softcap=5)])
def test_well_formed_modifiers_are_accepted(kind, extras):
    assert frontend_finding(with_modifiers(BASE, bias=kind, **extras)) is None


BAD = {
    "dbias-without-bias": (_drop(FULL, "bias"), R.DBIAS_WITHOUT_BIAS, "graph.tensors.dbias"),
    "dsinks-without-sinks": (_drop(FULL, "sinks"), R.DSINKS_WITHOUT_SINKS, "graph.tensors.dsinks"),
    "bias-rank": (_port(FULL, "bias", dims=(2, 4, 8), strides=(384, 96, 12)), R.BAD_RANK,
                  "graph.tensors.bias.dims"),
    "bias-negative-stride": (_port(FULL, "bias", strides=(384, 96, 12, -1)), R.NEGATIVE_STRIDE,
                             "graph.tensors.bias.strides"),
    "bias-dtype": (_port(FULL, "bias", dtype="fp16"), R.DTYPE_MISMATCH, "graph.tensors.bias.dtype"),
    "dbias-dtype": (_port(FULL, "dbias", dtype="fp32"), R.DTYPE_MISMATCH, "graph.tensors.dbias.dtype"),
    "sinks-dtype": (_port(FULL, "sinks", dtype="bf16"), R.SINKS_DTYPE, "graph.tensors.sinks.dtype"),
    "dsinks-dtype": (_port(FULL, "dsinks", dtype="fp16"), R.SINKS_DTYPE, "graph.tensors.dsinks.dtype"),
    "bias-seq-swapped": (_port(FULL, "bias", dims=(2, 4, 12, 8)), R.BIAS_DIMS_MISMATCH,
                         "graph.tensors.bias.dims"),
    "bias-head-count": (_port(FULL, "bias", dims=(2, 2, 8, 12)), R.BIAS_DIMS_MISMATCH,
                        "graph.tensors.bias.dims"),
    "bias-broadcast-row": (_port(FULL, "bias", strides=(384, 96, 0, 1)), R.BIAS_BROADCAST_AXIS,
                           "graph.tensors.bias.strides"),
    "dbias-not-reduced": (with_modifiers(BASE, bias="batch").tensors["bias"], None, None),
    "dbias-reduced-wrongly": (_port(with_modifiers(BASE, bias="full", dbias=True), "dbias",
                                    dims=(1, 4, 8, 12)), R.DBIAS_DIMS_MISMATCH, "graph.tensors.dbias.dims"),
    "dbias-overlap": (_port(FULL, "dbias", strides=(384, 96, 6, 1)), R.DBIAS_OVERLAP,
                      "graph.tensors.dbias.strides"),
    "dbias-zero-stride": (_port(FULL, "dbias", strides=(0, 96, 12, 1)), R.DBIAS_OVERLAP,
                          "graph.tensors.dbias.strides"),
    "sinks-dims": (_port(FULL, "sinks", dims=(2,)), R.SINKS_DIMS_MISMATCH, "graph.tensors.sinks.dims"),
    "dsinks-dims": (_port(FULL, "dsinks", dims=(8,)), R.SINKS_DIMS_MISMATCH, "graph.tensors.dsinks.dims"),
    "dsinks-overlap": (_port(FULL, "dsinks", strides=(0,)), R.DSINKS_OVERLAP, "graph.tensors.dsinks.strides"),
    "softcap-zero": (_cap(FULL, 0.0), R.SOFTCAP_NONPOSITIVE, "graph.attributes.softcap"),
    "softcap-negative": (_cap(FULL, -5.0), R.SOFTCAP_NONPOSITIVE, "graph.attributes.softcap"),
    "softcap-inf": (_cap(FULL, float("inf")), R.SOFTCAP_NONFINITE, "graph.attributes.softcap"),
    "softcap-nan": (_cap(FULL, float("nan")), R.SOFTCAP_NONFINITE, "graph.attributes.softcap"),
}
# a batch-broadcast bias whose dbias keeps the batch axis (dims not reduced)
_b = with_modifiers(BASE, bias="batch")
BAD["dbias-not-reduced"] = (
    dataclasses.replace(_b, tensors={**_b.tensors, "dbias": TensorSpec(dims=(2, 4, 8, 12),
                                                                       strides=(384, 96, 12, 1), dtype="bf16")}),
    R.DBIAS_DIMS_MISMATCH, "graph.tensors.dbias.dims")


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_modifier_gets_its_own_reason(name):
    graph, code, field = BAD[name]
    finding = frontend_finding(graph)
    assert finding is not None and (finding.reason, finding.field) == (code, field)
    assert launch_reason(graph) == code


RAGGED = ragged_graph((0, 5, 12), H_q=2, D_qk=8)


@pytest.mark.parametrize("port, spec", [
    ("bias", TensorSpec(dims=(2, 2, 7, 7), strides=(98, 49, 7, 1), dtype="fp16")),
    ("sinks", TensorSpec(dims=(2,), strides=(1,), dtype="fp32")),
])
def test_modifiers_on_a_ragged_graph_are_valid(port, spec):
    """The ragged bias is the padded [B, H_q, max_seqlen_q, max_seqlen_kv]; only a dropout
    mask stays padded-only (test_ragged_modifiers)."""
    graph = dataclasses.replace(RAGGED, tensors={**RAGGED.tensors, port: spec})
    assert frontend_finding(graph) is None
    assert frontend_finding(_cap(RAGGED, 5.0)) is None
    assert frontend_finding(RAGGED) is None
