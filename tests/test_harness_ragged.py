"""The harness on ragged graphs (DESIGN section 10): the per-sequence oracle, the rows that
must keep the canary, and the verdicts of device probes (bad offsets only device code sees).

The engine here is an independent per-sequence backward written out from the formulas
(float64, explicit GQA expansion), with switchable defects; it reads the offsets from the
device tensors, as the contract says, since the graph it is handed has none."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bundlegen.engines.base import Engine
from bundlegen.graph import Rejection, ragged_graph
from bundlegen.harness import verdicts as V
from bundlegen.harness import materialize as M
from bundlegen.harness.case import run_case
from bundlegen.mask import keep_mask
from bundlegen import reasons as R
from tests.graph_factory import make_case
from tests.harness_support import LOOSE


class SeqwiseEngine(Engine):
    name = "seqwise-test"
    ragged = True

    def __init__(self, device="cpu", defect: str | None = None, decline: str | None = None):
        super().__init__(device)
        self.defect, self.decline, self.seen = defect, decline, []

    def archs(self):
        return ("cpu",)

    def is_applicable(self, graph):
        self.seen.append(graph)
        return self.decline

    def run(self, graph, t):
        self.seen.append(graph)
        cq, ck = t["cu_seqlens_q"].tolist(), t["cu_seqlens_kv"].tolist()
        T_q, T_kv = t["q"].shape[0], t["k"].shape[0]
        for b in range(graph.B):
            q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
            bad = not (0 <= q0 <= q1 <= T_q and 0 <= k0 <= k1 <= T_kv
                       and q1 - q0 <= graph.S_q and k1 - k0 <= graph.S_kv)
            if bad:
                if self.defect == "unbounded":   # the seed-001 defect: raw token base
                    self._rows(t["dq"], q0, q1).fill_(0)
                continue
            self._sequence(graph, t, q0, q1, k0, k1)
        if self.defect == "write-outside":
            t["dq"][T_q - 1].fill_(0)
        if self.defect == "corrupt-first":
            t["dq"][cq[0]].add_(1.0)

    @staticmethod
    def _rows(x, r0, r1):
        """Rows [r0, r1) of a [T, H, D] view with no bounds check (may leave the view)."""
        return torch.as_strided(x, (r1 - r0, *x.shape[1:]), x.stride(),
                                x.storage_offset() + r0 * x.stride(0))

    def _sequence(self, graph, t, q0, q1, k0, k1):
        f = torch.float64
        q, do, o = (t[p][q0:q1].to(f).transpose(0, 1) for p in ("q", "do", "o"))
        k, v = (t[p][k0:k1].to(f).transpose(0, 1) for p in ("k", "v"))
        lse = t["stats"][q0:q1, :, 0].to(f).transpose(0, 1)
        H_q, gk, gv = q.shape[0], q.shape[0] // k.shape[0], q.shape[0] // v.shape[0]
        ke, ve = k.repeat_interleave(gk, 0), v.repeat_interleave(gv, 0)
        scale = graph.attributes.attn_scale
        s = scale * q @ ke.transpose(1, 2)
        keep = keep_mask(q1 - q0, k1 - k0, graph.attributes)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
        p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(p), p)
        dv = p.transpose(1, 2) @ do
        ds = p * (do @ ve.transpose(1, 2) - (do * o).sum(-1, keepdim=True))
        dq = scale * ds @ ke
        dk = scale * ds.transpose(1, 2) @ q
        dk = dk.unflatten(0, (-1, gk)).sum(1)
        dv = dv.unflatten(0, (-1, gv)).sum(1)
        t["dq"][q0:q1] = dq.transpose(0, 1).to(t["dq"].dtype)
        t["dk"][k0:k1] = dk.transpose(0, 1).to(t["dk"].dtype)
        t["dv"][k0:k1] = dv.transpose(0, 1).to(t["dv"].dtype)


def _case(graph, rejection=None, seed=3):
    purpose = "claim" if rejection is None else "probe"
    return dataclasses.replace(make_case(graph, seed=seed, purpose=purpose, rejection=rejection),
                               tolerance_class="fp16-r256")


RAGGED = [
    dict(cu_seqlens_q=(0, 5, 5, 17), cu_seqlens_kv=(0, 9, 12, 12)),     # empty q, empty kv
    dict(cu_seqlens_q=(0, 1, 8), cu_seqlens_kv=(0, 7, 9), alignment="BOTTOM_RIGHT", right=0),
    dict(cu_seqlens_q=(0, 6, 13), cu_seqlens_kv=(0, 11, 14), H_q=4, H_k=2, H_v=1, D_v=8, left=3, right=0),
    dict(cu_seqlens_q=(0, 6, 13), layout="htd"),
]


@pytest.mark.parametrize("kwargs", RAGGED)
def test_a_right_per_sequence_engine_passes_and_sees_no_offsets(kwargs):
    engine = SeqwiseEngine()
    outcome = run_case(_case(ragged_graph(**kwargs)), engine, LOOSE)
    assert outcome.verdict == V.PASS, outcome.detail
    assert engine.seen and all(g.ragged.cu_seqlens_q is None for g in engine.seen)


def test_rows_outside_every_sequence_must_keep_the_canary():
    graph = ragged_graph((2, 7, 12), (0, 4, 9), T_q=15, T_kv=11)   # q rows 0-1, 12-14 and kv 9-10 silent
    assert run_case(_case(graph), SeqwiseEngine(), LOOSE).verdict == V.PASS
    bad = run_case(_case(graph), SeqwiseEngine(defect="write-outside"), LOOSE)
    assert bad.verdict == V.FAIL_GUARD and "dq" in bad.detail


def test_a_query_row_with_no_key_must_get_a_written_zero():
    graph = ragged_graph((0, 4, 9), (0, 6, 6))      # the second sequence has no key

    class Lazy(SeqwiseEngine):
        def _sequence(self, graph, t, q0, q1, k0, k1):
            if k1 > k0:
                super()._sequence(graph, t, q0, q1, k0, k1)

    assert run_case(_case(graph), SeqwiseEngine(), LOOSE).verdict == V.PASS
    assert run_case(_case(graph), Lazy(), LOOSE).verdict == V.FAIL_NAN


def test_a_wrong_sequence_fails_numerically():
    graph = ragged_graph((0, 4, 9))
    assert run_case(_case(graph), SeqwiseEngine(defect="corrupt-first"), LOOSE).verdict == V.FAIL_NUMERIC


# --------------------------------------------------------------------------- device probes
def test_device_probe_verdicts():
    graph = ragged_graph((0, 16, 64), (0, 16, 48), H_q=1, D_qk=16, T_q=32, T_kv=48,
                         max_seqlen_q=48, max_seqlen_kv=48)
    probe = _case(graph, Rejection("device", R.RAGGED_OFFSET_PAST_STORAGE))
    contained = run_case(probe, SeqwiseEngine(), LOOSE)
    assert contained.verdict == V.CONTAINED, contained.detail
    escaped = run_case(probe, SeqwiseEngine(defect="unbounded"), LOOSE)
    assert escaped.verdict == V.FAIL_ESCAPED and "dq" in escaped.detail, escaped.detail
    corrupted = run_case(probe, SeqwiseEngine(defect="corrupt-first"), LOOSE)
    assert corrupted.verdict == V.FAIL_CORRUPTED, corrupted.detail
    declined = run_case(probe, SeqwiseEngine(decline=R.RAGGED_NOT_SERVED), LOOSE)
    assert declined.verdict == V.REJECTED and V.REJECTED not in V.FAILING


def test_a_device_probe_must_break_the_rule_it_names():
    graph = ragged_graph((0, 16, 64), (0, 16, 48), H_q=1, D_qk=16, T_q=32, T_kv=48,
                         max_seqlen_q=48, max_seqlen_kv=48)
    wrong = _case(graph, Rejection("device", R.RAGGED_NEGATIVE_OFFSET))
    assert run_case(wrong, SeqwiseEngine(), LOOSE).verdict == V.ERROR_BUNDLE
    fine = _case(ragged_graph((0, 16, 32)), Rejection("device", R.RAGGED_OFFSET_PAST_STORAGE))
    assert run_case(fine, SeqwiseEngine(), LOOSE).verdict == V.ERROR_BUNDLE


def test_a_frontend_visible_bad_offset_is_rejected_by_the_frontend():
    graph = ragged_graph((0, 9, 4, 12))
    probe = _case(graph, Rejection("frontend", R.RAGGED_OFFSETS_DECREASE))
    assert run_case(probe, SeqwiseEngine(), LOOSE).verdict == V.REJECTED


def test_an_engine_that_changes_the_offsets_modified_an_input():
    class Scribbler(SeqwiseEngine):
        def run(self, graph, t):
            super().run(graph, t)
            t["cu_seqlens_q"][1] += 1

    outcome = run_case(_case(ragged_graph((0, 4, 9))), Scribbler(), LOOSE)
    assert outcome.verdict == V.FAIL_INPUT_MODIFIED and "cu_seqlens_q" in outcome.detail


def test_the_oracle_judges_only_good_sequences_of_a_device_probe():
    graph = ragged_graph((-4, 8, 20), (0, 8, 20), H_q=1, D_qk=16, T_q=20, T_kv=20,
                         max_seqlen_q=12, max_seqlen_kv=12)
    m = M.materialize(_case(graph, Rejection("device", R.RAGGED_NEGATIVE_OFFSET)), "cpu")
    assert m.judged_rows["dq"].tolist() == list(range(8, 20))
    assert bool((m.forward.lse[:8] == float("-inf")).all())


def test_an_engine_that_does_not_say_it_serves_ragged_graphs_is_never_asked():
    class Padded(SeqwiseEngine):
        ragged = False

    engine = Padded()
    outcome = run_case(_case(ragged_graph((0, 4, 9))), engine, LOOSE)
    assert outcome.verdict == V.DECLINED and outcome.reason.startswith(R.RAGGED_NOT_SERVED)
    assert engine.seen == []


def test_a_nan_carried_from_an_input_guard_into_an_output_guard_is_caught():
    """The kernel defect of seed 001 reads a sequence's rows from before q's storage (the
    input canary, a NaN) and writes what it computes before dq's: NaN keeps its payload,
    so only distinct input and output canaries tell the write apart."""
    class CarriesTheGuard(SeqwiseEngine):
        def run(self, graph, t):
            super().run(graph, t)
            self._rows(t["dq"], -2, 0).copy_(self._rows(t["q"], -2, 0))

    graph = ragged_graph((0, 4, 9), H_q=1, D_qk=16)
    outcome = run_case(_case(graph), CarriesTheGuard(), LOOSE)
    assert outcome.verdict == V.FAIL_GUARD and "dq" in outcome.detail, outcome.detail
