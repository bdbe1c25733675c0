"""Score-modifier ports and attributes in the graph records and their JSON codec (issue 19):
a graph without them keeps its JSON and id; with them it round-trips; a bad field is named."""
from __future__ import annotations

import json

import pytest

from bundlegen import ids
from bundlegen.graph import (BundleError, DataSpec, KNOWN_PORTS, Case, case_from_json,
                             dbias_dims, dense_graph, with_modifiers)

PLAIN = dense_graph(B=2, H_q=4, S_q=8, S_kv=12, D_qk=8)


def _case(graph, bias_values="randn", seed=3):
    cid = ids.case_id("claim", graph, "randn", None, seed, bias_values=bias_values)
    return Case(id=cid, purpose="claim", items=("X",), graph=graph,
                data=DataSpec(seed=seed, bias_values=bias_values))


def _reload(case):
    return case_from_json(json.loads(json.dumps(case.to_json())), "f.json")


def test_a_graph_without_modifiers_keeps_its_json_and_id():
    text = json.dumps(PLAIN.to_json(), sort_keys=True)
    assert "softcap" not in text and "bias" not in text and "sinks" not in text
    assert "bias_values" not in json.dumps(_case(PLAIN).to_json())
    assert PLAIN.input_ports == ("q", "k", "v", "o", "do", "stats")
    assert PLAIN.output_ports == ("dq", "dk", "dv") and PLAIN.modifiers == frozenset()


@pytest.mark.parametrize("bias", ["full", "batch", "head", "both"])
def test_modifier_ports_round_trip(bias):
    g = with_modifiers(PLAIN, bias=bias, dbias=True, sinks=True, dsinks=True, softcap=30)
    case = _reload(_case(g, "alibi"))
    assert case.graph == g and case.data.bias_values == "alibi"
    assert g.input_ports[-2:] == ("bias", "sinks") and g.output_ports[-2:] == ("dbias", "dsinks")
    assert g.modifiers == {"bias", "dbias", "sinks", "softcap"}
    broadcast = {"full": (), "batch": (0,), "head": (1,), "both": (0, 1)}[bias]
    assert [a for a, s in enumerate(g.tensors["bias"].strides) if s == 0] == list(broadcast)
    assert g.tensors["dbias"].dims == dbias_dims(g.tensors["bias"])
    assert all(g.tensors["dbias"].dims[a] == 1 for a in broadcast)
    assert g.tensors["sinks"].dims == (4,) and g.tensors["dsinks"].dtype == "fp32"


def test_bias_values_are_part_of_the_id():
    g = with_modifiers(PLAIN, bias="batch")
    assert _case(g, "alibi").id != _case(g, "randn").id
    assert _case(g).id == ids.case_id("claim", g, "randn", None, 3)


def test_modifier_helpers_refuse_a_gradient_without_its_input():
    with pytest.raises(ValueError):
        with_modifiers(PLAIN, dbias=True)
    with pytest.raises(ValueError):
        with_modifiers(PLAIN, dsinks=True)


@pytest.mark.parametrize("edit, field", [
    (lambda raw: raw["graph"]["attributes"].update(softcap="30"), "graph.attributes.softcap"),
    (lambda raw: raw["graph"]["attributes"].update(softcap=True), "graph.attributes.softcap"),
    (lambda raw: raw["data"].update(bias_values="cosine"), "data.bias_values"),
    (lambda raw: raw["graph"]["tensors"].update(mask=raw["graph"]["tensors"]["bias"]),
     "graph.tensors.mask"),
    (lambda raw: raw["graph"]["tensors"]["sinks"].update(dims=[4.0]), "graph.tensors.sinks.dims[0]"),
])
def test_a_bad_modifier_field_is_named(edit, field):
    raw = json.loads(json.dumps(_case(with_modifiers(PLAIN, bias="full", sinks=True, softcap=5)).to_json()))
    edit(raw)
    with pytest.raises(BundleError) as info:
        case_from_json(raw, "f.json")
    assert info.value.field == field and info.value.case_id == raw["id"]


def test_known_ports_name_every_modifier_port():
    assert {"bias", "dbias", "sinks", "dsinks"} <= set(KNOWN_PORTS)
