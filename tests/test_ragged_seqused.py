"""Padded varlen (Ragged.seqused_q / seqused_kv): the record and its JSON, the frontend and
device rules of used lengths, the oracle's per-sequence rows, the harness's canaries in
padding rows, the engines that serve it (torch-math, the Triton interpreter) or decline it,
the plan's axis and probes, and the seqused-ignored mutant."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.graph import Rejection, graph_from_json, ragged_graph
from bundlegen.graph_codec import FieldReader
from bundlegen.harness import materialize as M
from bundlegen.harness import oracle_ragged
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import decline_reason, run_case
from bundlegen.validate import frontend_finding, good_sequences, launch_reason
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.engines.triton.capabilities import ROWS
from bundlegen.engines.triton.engine import TritonEngine
from bundlegen.generator import build_default, ragged
from bundlegen.mutants import catalog as C
from bundlegen.mutants.triton_source import Edit, Patch, Patched
from bundlegen.plans import sdpa_bwd
from tests.graph_factory import make_case
from tests.harness_support import LOOSE
from tests.triton_tiles import small_tile

CU_Q, CU_KV = (0, 10, 16, 30), (0, 12, 20, 33)


def _graph(**kw):
    kw = {"seqused_q": (7, 6, 0), "seqused_kv": (12, 3, 9), **kw}
    return ragged_graph(CU_Q, CU_KV, **kw)


def _case(graph, rejection=None, seed=2):
    return dataclasses.replace(make_case(graph, seed=seed, purpose="claim" if rejection is None else "probe",
                                         rejection=rejection), tolerance_class="fp16-r256")


# ----------------------------------------------------------------------------- record and rules
def test_the_json_has_used_lengths_only_when_set_and_reads_back():
    plain = ragged_graph(CU_Q, CU_KV).to_json()["ragged"]
    assert "seqused_q" not in plain and "seqused_kv" not in plain
    g = _graph(seqused_q=None)
    raw = json.loads(json.dumps(g.to_json()))
    assert raw["ragged"]["seqused_kv"] == [12, 3, 9] and "seqused_q" not in raw["ragged"]
    back = graph_from_json(raw, FieldReader("t.json"), "graph")
    assert back.ragged == g.ragged and back.ragged.seqused_ports == ("seqused_kv",)
    launched = g.as_launched().ragged
    assert launched.seqused_kv == () and launched.seqused_q is None and launched.cu_seqlens_q is None


@pytest.mark.parametrize("kw, reason, field", [
    (dict(seqused_kv=(12, 3)), R.RAGGED_SEQUSED_COUNT, "graph.ragged.seqused_kv"),
    (dict(seqused_q=(7, -1, 0)), R.RAGGED_SEQUSED_NEGATIVE, "graph.ragged.seqused_q[1]"),
    (dict(seqused_kv=(12, 9, 9)), R.RAGGED_SEQUSED_PAST_RANGE, "graph.ragged.seqused_kv[1]"),
])
def test_frontend_rules_of_used_lengths(kw, reason, field):
    finding = frontend_finding(_graph(**kw))
    assert (finding.reason, finding.field) == (reason, field)
    if reason != R.RAGGED_SEQUSED_COUNT:   # values only the device sees: a launch path cannot check them
        assert frontend_finding(_graph(**kw), offsets_on_device=True) is None
        assert reason in R.DEVICE
    assert launch_reason(_graph(**kw).as_launched()) is None


def test_a_bad_used_length_makes_its_sequence_bad():
    assert good_sequences(_graph()) == (0, 1, 2)
    assert good_sequences(_graph(seqused_q=(7, 9, 0))) == (0, 2)
    assert good_sequences(_graph(seqused_kv=(-1, 3, 9))) == (1, 2)


def test_the_oracle_attends_the_used_rows():
    seqs = oracle_ragged.sequences(_graph(), (0, 1, 2))
    assert [(s.q0, s.q1, s.k0, s.k1) for s in seqs] == [(0, 7, 0, 12), (10, 16, 12, 15), (16, 16, 20, 29)]


# ----------------------------------------------------------------------------- harness
def test_padding_rows_of_inputs_hold_the_canary_and_outputs_keep_theirs():
    m = M.materialize(_case(_graph()), "cpu")
    for port, rows in (("q", range(7, 10)), ("do", range(28, 30)), ("k", range(15, 20)), ("v", range(29, 33))):
        spec = m.case.graph.tensors[port]
        bits = M.view_of(m.storages[port].view(M.BITS_DTYPES[spec.dtype]), spec)[rows.start:rows.stop]
        assert bool((bits == M.canary_bits(spec.dtype, output=False)).all()), port
    assert range(7, 10) in m.unaddressed.silent["dq"] and range(29, 33) in m.unaddressed.silent["dv"]
    assert set(m.tensors) >= {"seqused_q", "seqused_kv"} and m.tensors["seqused_q"].dtype == torch.int32


@pytest.mark.parametrize("engine_cls", [TorchMathEngine, small_tile(TritonEngine)])
@pytest.mark.parametrize("kw", [dict(), dict(seqused_q=None, H_q=4, H_k=2, alignment="BOTTOM_RIGHT", right=0),
                                dict(seqused_kv=None, layout="htd", left=5, right=0)])
def test_engines_serve_used_lengths_and_the_ignoring_mutant_fails(engine_cls, kw):
    case = _case(_graph(**kw))
    assert run_case(case, engine_cls("cpu"), LOOSE).verdict == V.PASS
    bad = run_case(case, C.by_name("seqused-ignored").wrap(engine_cls("cpu")), LOOSE)
    assert bad.verdict in (V.FAIL_GUARD, V.FAIL_NAN), bad.detail


@pytest.mark.parametrize("engine_cls", [TorchMathEngine, small_tile(TritonEngine)])
def test_dbias_and_dsinks_see_only_the_used_rows(engine_cls):
    """The dBias and dSinks kernels walk each sequence's used lengths, as dQ, dK, dV do:
    a padding row read there is a NaN canary in dBias or dSinks."""
    from bundlegen.graph import with_modifiers
    graph = with_modifiers(_graph(alignment="BOTTOM_RIGHT", right=0), bias="full", dbias=True,
                           sinks=True, dsinks=True)
    assert run_case(_case(graph), engine_cls("cpu"), LOOSE).verdict == V.PASS


def test_an_engine_or_a_row_without_seqused_declines_it():
    class NoSeqused(TorchMathEngine):
        seqused = False
    reason = decline_reason(NoSeqused("cpu"), _graph())
    assert reason.startswith(R.SEQUSED_NOT_SERVED) and "seqused_q, seqused_kv" in reason
    assert decline_reason(NoSeqused("cpu"), ragged_graph(CU_Q, CU_KV)) is None
    assert all(row.mismatch(_graph().as_launched()) is None for row in ROWS.values())
    without = dataclasses.replace(ROWS["sm90"], seqused=False)
    assert without.mismatch(_graph().as_launched()).startswith(R.SEQUSED_NOT_SERVED)


#: the kernels without the used-length bound (a used length taken as it is): a device probe
#: whose last sequence claims rows past the storage catches it (one claiming the next
#: sequence's rows may be overwritten by that sequence's own programs, which the
#: interpreter runs later)
USED_UNBOUNDED = Patch("kernels", (Edit("        ok, n = ok & (used >= 0) & (used <= n), used\n", "        n = used\n"),))


@pytest.mark.parametrize("item", ["PRB-RAGGED-DEVICE-SEQUSED-PAST-Q-END", "PRB-RAGGED-DEVICE-SEQUSED-PAST-KV-END"])
def test_device_probes_of_used_lengths_catch_an_unbounded_kernel(item):
    probe = next(p for p in sdpa_bwd.RAGGED_PROBES if p.item == item)
    graph = ragged.graph_of(sdpa_bwd.PLAN, probe.spec)
    case = _case(graph, Rejection("device", probe.reason))
    engine = small_tile(TritonEngine)
    assert run_case(case, engine("cpu"), LOOSE).verdict == V.CONTAINED
    bad = run_case(case, Patched(engine("cpu"), USED_UNBOUNDED), LOOSE)
    assert bad.verdict in (V.FAIL_ESCAPED, V.FAIL_CORRUPTED), bad.detail


# ----------------------------------------------------------------------------- the plan
def test_the_plan_pads_every_sequence_and_probes_each_rule():
    gen = build_default()
    cases = [c for c in gen.at_level("quick") if c.graph.ragged is not None]
    both = next(c for c in cases if "AX-RAGGED-SEQUSED-BOTH" in c.items)
    rag = both.graph.ragged
    assert rag.seqused_q == tuple(max(0, n - 7) for n in rag.lengths_q)
    assert rag.seqused_kv == tuple(max(0, n - 7) for n in rag.lengths_kv)
    kv = next(c for c in cases if "AX-RAGGED-SEQUSED-KV" in c.items).graph.ragged
    assert kv.seqused_q is None and kv.seqused_kv is not None
    probes = {c.expected_rejection.reason for c in cases if c.purpose == "probe"
              and c.items[0].startswith("PRB-RAGGED-") and "SEQUSED" in c.items[0]}
    assert probes == {R.RAGGED_SEQUSED_COUNT, R.RAGGED_SEQUSED_NEGATIVE, R.RAGGED_SEQUSED_PAST_RANGE}


def test_the_graph_line_names_the_used_lengths():
    from bundlegen.describe import ragged_text
    assert "used_q=(7,6,0) used_kv=(12,3,9)" in ragged_text(_graph())
    assert "used_kv=hidden" in ragged_text(_graph(seqused_q=None).as_launched())
    assert "used_" not in ragged_text(ragged_graph(CU_Q, CU_KV))
