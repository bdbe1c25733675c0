"""A case in hipDNN's integration-test form (docs/ADOPTING.md, "Running the plan in hipDNN's
harness"): the rules of that form, each in one place, and the mapping of one bundle case onto
it. hipDNN's harness registers a template sweep (`graph.template.json` + `sweep.json`) as one
GTest suite named by the sweep's folder, one test per `cases[].id`; its graphs hold one
`SdpaBackwardAttributes` node whose ports are tensor uids.

What the node has no field for (ragged batches, sinks, softcap, ALiBi slopes, a storage
offset, the deterministic request, values the harness fills instead of drawing) cannot be
exported: `left_out` names why, and `NEEDS_FIELD` names what hipDNN could express but only
with a field our graph does not carry (the dropout forms: hipDNN's dropout needs a scale
tensor, and an engine-drawn mask its seed and offset tensors)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from bundlegen.graph import Case, Graph

#: our level -> hipDNN's tier folder (quick / standard / comprehensive / full)
TIERS: Mapping[str, str] = {"quick": "quick", "pr": "standard", "nightly": "comprehensive", "full": "full"}
OP_FOLDER = "SdpaBackward"
NODE_TYPE = "SdpaBackwardAttributes"
NODE_NAME = "SdpaBackward_0"
#: our dtype -> hipDNN's data_type name (the data SDK's JSON enum)
DATA_TYPES: Mapping[str, str] = {"bf16": "bfloat16", "fp16": "half", "fp32": "float"}
GENERATOR = "bundlegen export hipdnn"
REFERENCE_SOURCE = "graph-only: hipDNN's GPU or CPU reference executor"
FORMAT_VERSION = 1
SWEEP_VERSION = 1
SUPPORT_VERSION = 1
PLATFORM = "linux"

#: port -> (uid, hipDNN node key, tensor name suffix, input side); the uids are fixed, so a
#: template's wiring depends only on which optional ports it has
PORT_UIDS: Mapping[str, tuple[int, str, str, bool]] = {
    "q": (0, "q_tensor_uid", "Q", True), "k": (1, "k_tensor_uid", "K", True),
    "v": (2, "v_tensor_uid", "V", True), "o": (3, "o_tensor_uid", "O", True),
    "do": (4, "do_tensor_uid", "DO", True), "stats": (5, "stats_tensor_uid", "STATS", True),
    "bias": (6, "attn_mask_tensor_uid", "ATTN_MASK", True),
    "dq": (7, "dq_tensor_uid", "DQ", False), "dk": (8, "dk_tensor_uid", "DK", False),
    "dv": (9, "dv_tensor_uid", "DV", False), "dbias": (10, "dbias_tensor_uid", "DBIAS", False),
}
#: the node's optional uid keys we never set (null in every template)
UNSET_INPUTS = ("scale_tensor_uid", "seq_len_q_tensor_uid", "seq_len_kv_tensor_uid", "seed_tensor_uid",
                "offset_tensor_uid", "dropout_mask_tensor_uid", "dropout_scale_tensor_uid",
                "dropout_scale_inv_tensor_uid")
#: optional ports a template may have -> the word its topology name gets
TOPOLOGY_WORDS: Mapping[str, str] = {"bias": "AttnMask", "dbias": "DBias"}
REQUIRED_PORTS = ("q", "k", "v", "o", "do", "stats", "dq", "dk", "dv")

#: why a case is left out: reason code -> the sentence the summary and ADOPTING.md give
LEFT_OUT: Mapping[str, str] = {
    "ragged": "a ragged (packed variable-length) batch: the node has no sequence-offset tensors",
    "sinks": "attention sinks (and dSinks): no port for them",
    "softcap": "a logit softcap: no attribute for it",
    "alibi-slopes": "an ALiBi slopes port: hipDNN's alibi_mask is a flag without slopes",
    "bias-values": "a bias the harness fills (ALiBi values): hipDNN draws every input from the seed",
    "distribution": "an input distribution other than normal draws: hipDNN fills inputs itself",
    "storage-offset": "a tensor at a storage offset (shared or interleaved storage): tensors have no offset field",
    "deterministic": "the deterministic-algorithm request: no attribute for it",
    "dtype": "a dtype hipDNN has no data_type name for (a frontend probe)",
    "missing-port": "a required port missing (a frontend probe): the node has no graph without it",
    "dropout": "dropout: expressible in hipDNN only with a field our graph does not carry (see NEEDS_FIELD)",
}
#: dropout forms hipDNN can express but only with a field our graph does not model
NEEDS_FIELD: Mapping[str, str] = {
    "dropout-mask": "dropout_scale_tensor_uid: hipDNN's dropout with a mask port takes the 1/(1-p) scale as a "
                    "tensor, and fills the mask port from its seed instead of our keep/drop values",
    "drawn-dropout": "seed_tensor_uid and offset_tensor_uid: an engine-drawn mask is seeded by tensors our "
                     "graph does not carry (our judge checks the keep rate instead)",
}
_SANITIZE = re.compile(r"[^A-Za-z0-9_]")


def sanitize(segment: str) -> str:
    """hipDNN's name sanitizing: any character other than [A-Za-z0-9_] becomes `_`."""
    return _SANITIZE.sub("_", segment)


@dataclass(frozen=True)
class Placement:
    """Where a case goes: its sweep folder (relative to the export root) and its case id;
    `gtest_name` is the full name hipDNN registers it under."""
    sweep: str
    case_id: str
    gtest_name: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "gtest_name", gtest_name(self.sweep, self.case_id))


def gtest_name(sweep: str, case_id: str) -> str:
    return "_".join(sanitize(s) for s in sweep.split("/")) + "." + sanitize(case_id)


def left_out(case: Case) -> str | None:
    """The LEFT_OUT code that keeps `case` out of the export, None when it is expressible.
    The first that applies is named, in LEFT_OUT's order."""
    g = case.graph
    checks = (("ragged", g.ragged is not None), ("sinks", "sinks" in g.tensors or "dsinks" in g.tensors),
              ("softcap", g.attributes.softcap is not None), ("alibi-slopes", "alibi_slopes" in g.tensors),
              ("bias-values", "bias" in g.tensors and case.data.bias_values != "randn"),
              ("distribution", case.data.distribution != "randn"),
              ("storage-offset", any(t.offset for t in g.tensors.values())),
              ("deterministic", g.attributes.deterministic_algorithm),
              ("dtype", any(t.dtype not in DATA_TYPES for t in g.tensors.values())),
              ("missing-port", any(p not in g.tensors for p in REQUIRED_PORTS)),
              ("dropout", bool(g.attributes.dropout_probability) or "dropout_mask" in g.tensors))
    return next((code for code, applies in checks if applies), None)


def needs_field(case: Case) -> str | None:
    """The NEEDS_FIELD code of a case left out for its dropout form, else None."""
    g = case.graph
    if "dropout_mask" in g.tensors:
        return "dropout-mask"
    return "drawn-dropout" if g.attributes.dropout_probability else None


def topology(graph: Graph) -> str:
    """The sweep name of a graph's optional ports (one template per topology)."""
    words = [word for port, word in TOPOLOGY_WORDS.items() if port in graph.tensors]
    return "Bundlegen_" + ("_".join(words) if words else "Default")


def placement(case: Case) -> Placement:
    """The sweep folder and case id of an expressible case. The id reads as the shape and
    dtype, and ends in our 12-hex case id, which makes it unique and stable (it changes only
    when the case's identity does, DESIGN section 4); every character survives sanitizing."""
    g = case.graph
    shape = (f"b{g.B}_h{g.H_q}_{g.H_k}_{g.H_v}_s{g.S_q}_{g.S_kv}_d{g.D_qk}_{g.D_v}"
             if len(g.tensors["q"].dims) == 4 and len(g.tensors["k"].dims) == 4
             and len(g.tensors["v"].dims) == 4 else "rank")
    return Placement(sweep=f"{TIERS[case.level]}/{OP_FOLDER}/{topology(g)}",
                     case_id=f"{shape}_{g.dtype}_{case.id}")


def template(graph: Graph) -> dict:
    """graph.template.json of the graph's topology: wiring, uids, names and `virtual` fixed;
    dims, strides, data types and attribute values from each case."""
    ports = [p for p in PORT_UIDS if p in graph.tensors]
    inputs = {key: None for key in UNSET_INPUTS}
    outputs = {}
    for port, (uid, key, _, is_input) in PORT_UIDS.items():
        (inputs if is_input else outputs)[key] = uid if port in graph.tensors else None
    attributes = {"alibi_mask": False, "padding_mask": False, "causal_mask": False,
                  "causal_mask_bottom_right": False,
                  **{key: f"${{case.{key}}}" for key in ("attn_scale_value", "left_bound", "right_bound",
                                                         "diagonal_alignment", "dropout_probability")}}
    tensors = [{"uid": PORT_UIDS[p][0], "name": f"{NODE_NAME}::{PORT_UIDS[p][2]}", "virtual": False,
                "dims": "${case.dims}", "strides": "${case.strides}", "data_type": "${case.data_type}"}
               for p in ports]
    return {"io_data_type": "${case.io_data_type}", "intermediate_data_type": "float",
            "compute_data_type": "float",
            "nodes": [{"name": NODE_NAME, "type": NODE_TYPE, "inputs": inputs, "outputs": outputs,
                       "attributes": attributes}],
            "tensors": tensors}


def case_values(graph: Graph) -> dict:
    """A sweep case's `values`: the attribute values and, per uid, dims, strides and type.
    A bound our graph leaves unbounded is null (the data SDK reads each as an optional); a
    dropout probability is exported as written (an exported graph's is null or 0: off)."""
    a = graph.attributes
    tensors = [{"uid": PORT_UIDS[p][0], "dims": list(graph.tensors[p].dims),
                "strides": list(graph.tensors[p].strides),
                "data_type": DATA_TYPES[graph.tensors[p].dtype]}
               for p in PORT_UIDS if p in graph.tensors]
    return {"io_data_type": DATA_TYPES[graph.dtype], "attn_scale_value": a.attn_scale,
            "left_bound": a.left_bound, "right_bound": a.right_bound,
            "diagonal_alignment": a.diagonal_alignment, "dropout_probability": a.dropout_probability,
            "tensors": tensors}


def case_metadata(case: Case, plan: str, version: str) -> dict:
    """The required metadata (format version, generator, reference source, seed) and ours:
    the plan's items, purpose, tolerance class and, for a probe, its expected rejection."""
    meta = {"format_version": FORMAT_VERSION, "generator": GENERATOR, "generator_version": version,
            "reference_source": REFERENCE_SOURCE, "seed": case.data.seed, "operation": OP_FOLDER,
            "purpose": case.purpose,
            "bundlegen": {"plan": plan, "case_id": case.id, "items": list(case.items), "level": case.level,
                          "group": case.group, "tolerance_class": case.tolerance_class}}
    if case.expected_rejection is not None:
        meta["expected_rejection"] = True
        meta["bundlegen"]["expected_rejection"] = case.expected_rejection.to_json()
    return meta


_ENGINE_NAME = re.compile(r"[A-Z0-9][A-Z0-9_]*")


def store_engine(hipdnn_engine: str) -> str:
    """The bundlegen engine name a hipDNN engine's results and claims are kept under
    (`ASM_SDPA_ENGINE` -> `hipdnn-asm-sdpa-engine`); ValueError for a name that is not a
    hipDNN engine name (upper-case letters, digits and `_`)."""
    if not _ENGINE_NAME.fullmatch(hipdnn_engine):
        raise ValueError(f"engine {hipdnn_engine!r}: expected a hipDNN engine name such as ASM_SDPA_ENGINE "
                         "(upper-case letters, digits and '_')")
    return "hipdnn-" + hipdnn_engine.lower().replace("_", "-")
