"""run_level end to end, in-process: the verdict of every kind of case, lower levels,
the CPU size rule, results/JUnit/summary, resume, shards and -k, malformed bundles."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from bundlegen import reasons as R
from bundlegen.graph import Rejection
from bundlegen.harness import verdicts as V
from bundlegen.harness.config import EngineConfig
from bundlegen.harness.results import read_results
from bundlegen.harness.level import run_level
from tests import harness_support as S
from tests.graph_factory import make_case, make_graph

ZERO_STRIDE_DV = {"dv": (8, 8, 0, 1)}  # dv [1, 1, 12, 8]: every row on the same memory


def probe(by, reason, seed=1, **graph):
    small = dict(B=1, H_q=2, H_k=1, H_v=1, S_q=9, S_kv=12, D_qk=8, D_v=8)
    return make_case(make_graph(**{**small, **graph}), seed=seed, purpose="probe",
                     rejection=Rejection(by, reason))


def run(tmp_path, engine=S.TorchMathEngine, level="quick", config=S.LOOSE, **kwargs):
    return run_level(level, S.engine_ref(engine), device="cpu", bundles=tmp_path / "bundles",
                     out=tmp_path / "out", isolation=False, config=config, **kwargs)


def by_id(summary):
    return {r["case_id"]: r for r in read_results(summary.results_path)}


def test_every_verdict_of_a_mixed_level(tmp_path):
    good = S.case_of(1)
    fp32 = S.case_of(2, dtype="fp32")
    claimed_fp32 = S.case_of(3, dtype="fp32", D_qk=16)
    skipped = replace(S.case_of(4), items=("AX-SKIPME",))
    not_a_probe = S.case_of(5, left=0)
    frontend_ok = probe("frontend", R.LEFT_BOUND_NONPOSITIVE, left=0)
    frontend_wrong_code = probe("frontend", R.SCALE_NONPOSITIVE, seed=2, left=0)
    frontend_valid = probe("frontend", R.SCALE_NONPOSITIVE, seed=3)
    engine_probe = probe("engine", R.ZERO_STRIDE_OUTPUT, out_strides=ZERO_STRIDE_DV)
    S.write_bundle(tmp_path / "bundles", "quick", "mixed", [
        good, fp32, claimed_fp32, skipped, not_a_probe, frontend_ok, frontend_wrong_code,
        frontend_valid, engine_probe])
    config = replace(S.LOOSE, claims={"cpu": frozenset({claimed_fp32.id})},
                     skips=(S.skip_row({"item": "AX-SKIP*"}, "TICKET-7: flaky"),))
    summary = run(tmp_path, config=config)
    got = by_id(summary)
    assert {cid: r["verdict"] for cid, r in got.items()} == {
        good.id: V.PASS, fp32.id: V.DECLINED, claimed_fp32.id: V.CLAIM_BROKEN,
        skipped.id: V.SKIPPED, not_a_probe.id: V.ERROR_BUNDLE, frontend_ok.id: V.REJECTED,
        frontend_wrong_code.id: V.REJECTION_ACCEPTED, frontend_valid.id: V.REJECTION_ACCEPTED,
        engine_probe.id: V.REJECTED}
    assert got[fp32.id]["reason"].startswith(R.DTYPE_NOT_SERVED)
    assert "declined" in got[claimed_fp32.id]["detail"]
    assert got[skipped.id]["detail"] == "TICKET-7: flaky"
    assert got[not_a_probe.id]["detail"].startswith(f"quick/sdpa_bwd/mixed.json: case {not_a_probe.id}: field graph.attributes.left_bound: fails frontend validation (left-bound-nonpositive)")
    assert got[engine_probe.id]["reason"] == R.ZERO_STRIDE_OUTPUT
    assert R.SCALE_NONPOSITIVE in got[frontend_wrong_code.id]["detail"]
    record = got[good.id]
    for key in ("run_id", "level", "group", "purpose", "items", "engine", "arch", "device",
                "tolerance_class", "outputs", "margin", "predicted_s", "wall_s", "oracle_s", "engine_s",
                "materialize_s", "check_s"):
        assert key in record
    assert all(record[k] > 0 for k in ("oracle_s", "materialize_s", "engine_s", "check_s"))
    assert record["oracle_s"] + record["materialize_s"] + record["engine_s"] + record["check_s"] <= record["wall_s"]
    assert got[fp32.id]["check_s"] is None and got[fp32.id]["oracle_s"] is None  # declined: no phases
    assert summary.levels[0].phases["oracle_s"] == pytest.approx(record["oracle_s"])
    assert (record["level"], record["group"], record["engine"], record["arch"]) == \
        ("quick", "mixed", "torch-math", "cpu")
    assert record["margin"] > 1 and set(record["outputs"]) == {"dq", "dk", "dv"}
    assert summary.exit_code == 1 and summary.counts()[V.PASS] == 1

    suites = ET.parse(summary.junit_path).getroot()
    quick = suites.find("testsuite[@name='quick']")
    assert quick.get("tests") == "9" and quick.get("failures") == "3" and quick.get("errors") == "1"
    assert quick.get("skipped") == "2"


def test_engine_probe_accepted_fails_the_run(tmp_path):
    S.write_bundle(tmp_path / "bundles", "quick", "probes",
                   [probe("engine", R.ZERO_STRIDE_OUTPUT, out_strides=ZERO_STRIDE_DV)])
    summary = run(tmp_path, engine=S.AcceptsEverything)
    assert summary.counts() == {V.REJECTION_ACCEPTED: 1} and summary.exit_code == 1


def test_engine_probe_declined_with_another_code_is_rejected_with_a_note(tmp_path):
    S.write_bundle(tmp_path / "bundles", "quick", "probes",
                   [probe("engine", R.ZERO_STRIDE_OUTPUT, out_strides=ZERO_STRIDE_DV)])
    summary = run(tmp_path, engine=S.DeclinesEverything)
    (record,) = by_id(summary).values()
    assert record["verdict"] == V.REJECTED and R.HEAD_DIM_NOT_SERVED in record["detail"]
    assert summary.failing == 0   # not a failure; a run of probes alone tested nothing (exit 5)
    assert summary.exit_code == V.EXIT_NOTHING_TESTED


def test_a_failing_claimed_case_is_claim_broken_and_keeps_the_check(tmp_path):
    bad = S.bad_case()
    S.write_bundle(tmp_path / "bundles", "quick", "g", [bad])
    summary = run(tmp_path, engine=S.WritesNaN,
                  config=replace(S.LOOSE, claims={"cpu": frozenset({bad.id})}))
    (record,) = by_id(summary).values()
    assert record["verdict"] == V.CLAIM_BROKEN and V.FAIL_NAN in record["detail"]


def test_a_level_includes_the_lower_levels(tmp_path):
    quick, pr = S.case_of(1), S.case_of(2)
    S.write_bundle(tmp_path / "bundles", "quick", "a", [quick])
    S.write_bundle(tmp_path / "bundles", "pr", "a", [pr])
    assert set(by_id(run(tmp_path, level="pr"))) == {quick.id, pr.id}
    assert set(by_id(run(tmp_path, level="quick"))) == {quick.id}
    levels = [s.level for s in run(tmp_path, level="pr").levels]
    assert levels == ["quick", "pr"]
    with pytest.raises(ValueError, match="unknown level"):
        run(tmp_path, level="weekly")


def test_cases_too_large_for_the_cpu_are_skipped_by_the_cost_model(tmp_path, monkeypatch):
    from bundlegen.harness import materialize as M

    huge = S.case_of(1, B=4, H_q=32, H_k=32, H_v=32, S_q=16384, S_kv=16384, D_qk=128, D_v=128)
    small = S.case_of(2)
    real = M.materialize

    def never_the_huge_one(case, device, *args, **kwargs):
        assert case.id != huge.id, "the huge case reached materialize"
        return real(case, device, *args, **kwargs)
    monkeypatch.setattr(M, "materialize", never_the_huge_one)
    # at `full`, whose per-case byte ceiling (64 GiB) the huge case fits: the CPU rule decides
    S.write_bundle(tmp_path / "bundles", "full", "sizes", [huge, small])
    summary = run(tmp_path, level="full")
    got = by_id(summary)
    assert got[huge.id]["verdict"] == V.SKIPPED and got[huge.id]["detail"] == V.TOO_LARGE_FOR_CPU
    assert got[huge.id]["predicted_s"] > got[small.id]["predicted_s"] > 0
    assert got[small.id]["verdict"] == V.PASS
    assert summary.levels[-1].predicted_s == pytest.approx(
        got[huge.id]["predicted_s"] + got[small.id]["predicted_s"])


def test_resume_runs_only_the_cases_not_yet_recorded(tmp_path):
    cases = [S.case_of(seed) for seed in range(1, 5)]
    S.write_bundle(tmp_path / "bundles", "quick", "a", cases)
    first = run(tmp_path)
    assert first.ran == 4
    lines = first.results_path.read_text().splitlines(keepends=True)
    # a run killed half way: two whole lines and a torn third
    first.results_path.write_text("".join(lines[:2]) + lines[2][:40])
    again = run(tmp_path, resume=True)
    assert (again.ran, again.resumed) == (2, 2)
    records = read_results(again.results_path)
    assert [r["case_id"] for r in records] == [c.id for c in cases]
    assert len({r["run_id"] for r in records[:2]} | {r["run_id"] for r in records[2:]}) == 2
    assert sum(s.cases for s in again.levels) == 4
    fresh = run(tmp_path)  # without --resume the file starts over
    assert fresh.ran == 4 and len(read_results(fresh.results_path)) == 4


def test_shards_partition_the_cases_and_k_selects(tmp_path):
    cases = [replace(S.case_of(seed), items=(f"AX-{seed}",)) for seed in range(1, 7)]
    S.write_bundle(tmp_path / "bundles", "quick", "a", cases)
    S.write_bundle(tmp_path / "bundles", "quick", "b", [S.case_of(9)])
    seen = []
    for index in (1, 2, 3):
        seen += list(by_id(run(tmp_path, shard=(index, 3), repeat=1)))
    assert sorted(seen) == sorted([c.id for c in cases] + [S.case_of(9).id])
    assert set(by_id(run(tmp_path, pattern="AX-3", repeat=1))) == {cases[2].id}
    assert set(by_id(run(tmp_path, pattern="quick/b/*", repeat=1))) == {S.case_of(9).id}


# ----------------------------------------------------------------------------- malformed
def _case_json(seed):
    return S.case_of(seed).to_json()


def _set(obj, path, value):
    *parents, last = path
    for key in parents:
        obj = obj[key]
    if value is _DELETE:
        del obj[last]
    else:
        obj[last] = value
    return obj


_DELETE = object()
DEFECTS = {  # name -> (change to a good case's JSON, field the error must name)
    "missing-field": (("data",), _DELETE, "data"),
    "wrong-type": (("data", "seed"), "seven", "data.seed"),
    "negative-dim": (("graph", "tensors", "q", "dims", 2), -9, "graph.tensors.q.dims[2]"),
    "stride-count": (("graph", "tensors", "k", "strides"), [1, 2, 3], "graph.tensors.k.strides"),
    "unknown-dtype": (("graph", "tensors", "v", "dtype"), "fp8", "graph.tensors.v.dtype"),
    "path-in-id": (("id",), "../etc/passwd", "id"),
}


def test_malformed_bundles_are_named_recorded_and_do_not_stop_the_others(tmp_path):
    root = tmp_path / "bundles" / "quick" / "sdpa_bwd"
    good = S.case_of(100)
    S.write_bundle(tmp_path / "bundles", "quick", "a-good", [good])
    expected = {}
    for n, (name, (path, value, field)) in enumerate(sorted(DEFECTS.items())):
        raw = _case_json(n + 1)
        case_id = raw["id"] if name != "path-in-id" else "../etc/passwd"
        _set(raw, path, value)
        doc = {"version": 1, "plan": "sdpa_bwd", "level": "quick", "group": name,
               "cases": [raw, _case_json(50 + n)]}  # the second case of each file is sound
        (root / f"{name}.json").write_text(json.dumps(doc))
        expected[name] = (case_id, field)
    (root / "bad-json.json").write_text('{"version": 1, "cases": [')
    summary = run(tmp_path, repeat=1)
    records = read_results(summary.results_path)
    errors = {r["group"]: r for r in records if r["verdict"] == V.ERROR_BUNDLE}
    assert set(errors) == set(DEFECTS) | {"bad-json"}
    for name, (case_id, field) in expected.items():
        detail = errors[name]["detail"]
        assert f"{name}.json" in detail and f"case {case_id}" in detail and f"field {field}:" in detail, detail
        assert errors[name]["file"].endswith(f"{name}.json")
    assert "bad JSON" in errors["bad-json"]["detail"]
    passed = {r["case_id"] for r in records if r["verdict"] == V.PASS}
    assert passed == {good.id} | {S.case_of(50 + n).id for n in range(len(DEFECTS))}
    assert summary.exit_code == 1 and len(summary.bundle_errors) == len(DEFECTS) + 1


def test_a_header_that_disagrees_with_the_path_is_an_error(tmp_path):
    path = S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(1)])
    path.write_text(path.read_text().replace('"level": "quick"', '"level": "pr"'))
    (record,) = read_results(run(tmp_path).results_path)
    assert record["verdict"] == V.ERROR_BUNDLE and "field level:" in record["detail"]


def test_the_summary_reads_records_without_phase_fields():
    """Results from before materialize_s / check_s existed still summarise (as 0)."""
    from bundlegen.harness.results import PHASES, phase_line, summarize
    old = {"case_id": "a", "level": "quick", "verdict": V.PASS, "wall_s": 1.0, "oracle_s": 0.5,
           "engine_s": 0.25}
    new = {"case_id": "b", "level": "quick", "verdict": V.PASS, "wall_s": 2.0, "oracle_s": 0.25,
           "materialize_s": 0.5, "engine_s": 0.5, "check_s": 0.5}
    (level,) = summarize([old, new, {"case_id": "c", "level": "quick", "verdict": V.DECLINED,
                                      "oracle_s": None, "check_s": None}], ["quick"])
    assert level.phases == {"materialize_s": 0.5, "oracle_s": 0.75, "engine_s": 0.75, "check_s": 0.5}
    assert set(level.phases) == set(PHASES)
    assert phase_line([level]) == "materialize 0.5 s, oracle 0.8 s, engine 0.8 s, check 0.5 s"


def test_each_record_reaches_the_os_before_the_next_case_and_close_syncs(tmp_path, monkeypatch):
    """A killed process loses no finished case: each line is flushed on write (fsync only
    once a second, in the writer's thread); the last fsync follows close."""
    import os

    from bundlegen.harness.results import CaseResult, ResultsWriter
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    path = tmp_path / "results.jsonl"
    writer = ResultsWriter(path)
    for n in range(3):
        writer.write(CaseResult("r", f"c{n}", "quick", "g", "claim", (), "e", "cpu", "cpu", "pass"))
        assert [r["case_id"] for r in read_results(path)] == [f"c{i}" for i in range(n + 1)]
    assert synced == []          # three writes inside a second: no fsync yet
    writer.close()
    writer.wait_synced()
    assert len(synced) == 1
    with pytest.raises(ValueError, match="written after close"):
        writer.write(CaseResult("r", "late", "quick", "g", "claim", (), "e", "cpu", "cpu", "pass"))


def test_a_slow_fsync_holds_no_write_up(tmp_path, monkeypatch):
    """The workers record through one lock: an fsync (0.5 s on an H200 host) made in write
    would stall them all. Here fsync blocks until released, and the writes go on meanwhile."""
    import os
    import threading

    from bundlegen.harness.results import CaseResult, ResultsWriter
    entered, release = threading.Event(), threading.Event()

    def blocking_fsync(fd):
        entered.set()
        assert release.wait(30)

    monkeypatch.setattr(os, "fsync", blocking_fsync)
    monkeypatch.setattr(ResultsWriter, "SYNC_INTERVAL_S", 0.01)
    path = tmp_path / "results.jsonl"
    writer = ResultsWriter(path)
    writer.write(CaseResult("r", "c0", "quick", "g", "claim", (), "e", "cpu", "cpu", "pass"))
    assert entered.wait(30)      # the writer's thread is inside fsync
    for n in range(1, 4):
        writer.write(CaseResult("r", f"c{n}", "quick", "g", "claim", (), "e", "cpu", "cpu", "pass"))
    assert [r["case_id"] for r in read_results(path)] == ["c0", "c1", "c2", "c3"]
    writer.close()               # returns with the fsync still blocked
    release.set()
    writer.wait_synced()
