"""Fault injection (issue 13): bundles corrupted in each way a fault sweep found, and
engines that break their contract. Each becomes a named verdict charged to the right
party; the run goes on, never hangs, and never passes what it did not check."""
from __future__ import annotations

import json
import os
import threading
import xml.etree.ElementTree as ET

import pytest

from bundlegen import reasons as R
from bundlegen import ids
from bundlegen.graph import BundleError, Rejection, FieldReader, graph_from_json, load_bundle
from bundlegen.harness import verdicts as V
from bundlegen.harness.results import read_results
from bundlegen.harness.level import run_level
from tests import harness_support as S
from tests.graph_factory import make_case, make_graph

SMALL = dict(B=1, H_q=2, H_k=1, H_v=1, S_q=9, S_kv=12, D_qk=8, D_v=8)


def _raw(seed: int, **graph) -> dict:
    return S.case_of(seed, **graph).to_json()


def _write(tmp_path, group: str, cases: list, text: str | None = None):
    path = tmp_path / "bundles" / "quick" / "sdpa_bwd" / f"{group}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    S.write_manifest(tmp_path / "bundles")
    doc = {"version": 1, "plan": "sdpa_bwd", "level": "quick", "group": group, "cases": cases}
    path.write_text(json.dumps(doc) if text is None else text)
    return path


def _run(tmp_path, engine=S.TorchMathEngine, **kwargs):
    summary = run_level("quick", S.engine_ref(engine), device="cpu", bundles=tmp_path / "bundles",
                        out=tmp_path / "out", isolation=False, config=S.LOOSE, repeat=1, **kwargs)
    return summary, read_results(summary.results_path)


def _drop(port):
    def edit(raw):
        del raw["graph"]["tensors"][port]
    return edit


def _tensor(port, **fields):
    def edit(raw):
        raw["graph"]["tensors"][port].update(fields)
    return edit


def _attr(**fields):
    def edit(raw):
        raw["graph"]["attributes"].update(fields)
    return edit


def _with_content_id(raw: dict) -> dict:
    """`raw` under the id of its (edited) content: as if a generator had written it; a
    graph the loader refuses to decode keeps its id (the load refuses it before the id)."""
    try:
        graph = graph_from_json(raw["graph"], FieldReader("-"))
    except BundleError:
        return raw
    raw["id"] = ids.case_id(raw["purpose"], graph, raw["data"]["distribution"], None, raw["data"]["seed"])
    return raw


def test_a_case_edited_after_generation_is_refused_by_its_id(tmp_path):
    raw = _raw(1)
    raw["graph"]["attributes"]["attn_scale"] = 0.5
    _write(tmp_path, "edited", [raw])
    _, (record,) = _run(tmp_path)
    assert record["verdict"] == V.ERROR_BUNDLE
    assert "field id: does not match the case's content" in record["detail"]


def test_a_bundle_edited_between_two_loads_is_read_anew(tmp_path):
    """load_bundle keeps what it parsed (a process reads the same files again and again), keyed
    by the file's text: the same path edited in place is parsed again, its errors with it."""
    sound, edited = _raw(1), _raw(2)
    path = _write(tmp_path, "same", [sound])
    (first,), errors = load_bundle(path)[0].cases, load_bundle(path)[1]
    assert first.id == sound["id"] and errors == []
    edited["graph"]["attributes"]["attn_scale"] = 0.5
    _write(tmp_path, "same", [edited])
    bundle, (error,) = load_bundle(path)
    assert bundle.cases == () and error.case_id == edited["id"] and error.field == "id"
    _write(tmp_path, "same", [sound])
    assert load_bundle(path)[0].cases == (first,)


#: name -> (edit of a sound claim case, the field its error must name)
CASE_FAULTS = {
    "missing-q": (_drop("q"), "graph.tensors.q"),
    "missing-v": (_drop("v"), "graph.tensors.v"),
    "rank-0": (_tensor("k", dims=[], strides=[]), "graph.tensors.k.dims"),
    "rank-3": (_tensor("o", dims=[1, 2, 9], strides=[144, 72, 8]), "graph.tensors.o.dims"),
    "dims-overflow-a-float": (_tensor("q", dims=[10 ** 200, 2, 9, 8]), "graph.tensors.q"),
    "stride-2-70": (_tensor("dk", strides=[2 ** 70, 96, 8, 1]), "graph.tensors.dk"),
    "offset-past-int64": (_tensor("v", offset=2 ** 64), "graph.tensors.v"),
}


def test_every_corrupted_case_is_a_bundle_error_naming_port_and_field(tmp_path):
    for n, (name, (edit, _)) in enumerate(sorted(CASE_FAULTS.items())):
        raw = _raw(n + 1)
        edit(raw)
        _write(tmp_path, name, [_with_content_id(raw), _raw(100 + n)])
    summary, records = _run(tmp_path)
    by_group = {}
    for r in records:
        by_group.setdefault(r["group"], []).append(r)
    for n, (name, (_, field)) in enumerate(sorted(CASE_FAULTS.items())):
        bad, good = sorted(by_group[name], key=lambda r: r["verdict"] == V.PASS)
        assert bad["verdict"] == V.ERROR_BUNDLE, (name, bad)
        assert f"field {field}" in bad["detail"] and f"{name}.json" in bad["detail"], bad["detail"]
        assert good["verdict"] == V.PASS
    assert summary.exit_code == V.EXIT_FAILED


@pytest.mark.parametrize("name, text, message", [
    ("deep", '{"version": 1, "cases": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),
    ("huge-int", '{"version": 1' + "0" * 5000 + "}", "bad JSON"),
    ("not-json", "{", "bad JSON"),
])
def test_a_file_that_is_not_a_bundle_is_an_error_and_the_others_run(tmp_path, name, text, message):
    _write(tmp_path, "a-good", [_raw(1)])
    _write(tmp_path, name, [], text=text)
    summary, records = _run(tmp_path)
    verdicts = {r["group"]: r for r in records}
    assert verdicts["a-good"]["verdict"] == V.PASS
    assert verdicts[name]["verdict"] == V.ERROR_BUNDLE and message in verdicts[name]["detail"]


def test_a_huge_dropout_probability_is_one_case_error_and_the_run_goes_on(tmp_path):
    """10**400 overflows float(): one case error naming the field, never an aborted run."""
    huge = _raw(2)
    huge["graph"]["attributes"]["dropout_probability"] = 10 ** 400
    _write(tmp_path, "a-good", [_raw(1)])
    _write(tmp_path, "huge", [huge])
    summary, records = _run(tmp_path)
    verdicts = {r["group"]: r for r in records}
    assert verdicts["a-good"]["verdict"] == V.PASS
    assert verdicts["huge"]["verdict"] == V.ERROR_BUNDLE
    assert "dropout_probability" in verdicts["huge"]["detail"]


@pytest.mark.parametrize("items, message", [
    ([], "empty: a case must trace to at least one plan item"),
    (["AX-X"] * 100_000, "100000 entries, more than the 256"),
    (["X" * 1000], "an item name of 1 to 128 characters"),
])
def test_a_case_with_no_items_or_too_many_is_a_case_error(tmp_path, items, message):
    bad = _raw(2)
    bad["items"] = items
    _write(tmp_path, "a-good", [_raw(1)])
    _write(tmp_path, "bad", [bad])
    from bundlegen.harness.bundles import load_level
    loaded = load_level(tmp_path / "bundles", "quick")
    assert [c.group for c in loaded.cases] == ["a-good"]
    (error,) = loaded.errors
    assert error.field.startswith("items") and message in str(error)


def test_a_device_probe_reaching_past_the_guard_band_is_refused_at_load(tmp_path):
    """The generator refuses to write such a probe; the loader refuses to run one."""
    from bundlegen.graph import ragged_graph
    from bundlegen.harness.bundles import load_level
    rejection = Rejection("device", R.RAGGED_NEGATIVE_OFFSET)
    near = make_case(ragged_graph((-3, 10, 25), (0, 10, 20), H_q=2, D_qk=16, T_q=25), purpose="probe",
                     rejection=rejection)
    far = make_case(ragged_graph((-3000, 10, 25), (0, 10, 20), H_q=2, D_qk=16, T_q=25), purpose="probe",
                    rejection=rejection)
    _write(tmp_path, "probes", [near.to_json(), far.to_json()])
    loaded = load_level(tmp_path / "bundles", "quick")
    assert [c.id for c in loaded.cases] == [near.id]
    (error,) = loaded.errors
    assert error.case_id == far.id and error.field == "graph.ragged" and "guard band" in str(error)


def test_a_dotfile_in_a_level_folder_is_not_a_bundle(tmp_path):
    _write(tmp_path, "a-good", [_raw(1)])
    _write(tmp_path, ".hidden", [_raw(3)])
    summary, records = _run(tmp_path)
    assert {r["group"] for r in records} == {"a-good"}


def test_a_fifo_named_like_a_bundle_does_not_hang_the_loader(tmp_path):
    path = tmp_path / "quick.json"
    os.mkfifo(path)
    outcome = {}
    reader = threading.Thread(target=lambda: outcome.update(error=_load_error(path)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the loader blocked on a FIFO"
    assert "not a regular file" in outcome["error"]


def _load_error(path) -> str:
    try:
        load_bundle(path)
    except Exception as exc:  # noqa: BLE001 - the message is what the test reads
        return str(exc)
    return ""


def test_a_probe_naming_an_unknown_reason_code_is_a_bundle_error(tmp_path):
    probe = make_case(make_graph(left=0, **SMALL), purpose="probe",
                      rejection=Rejection("frontend", "no-such-code")).to_json()
    _write(tmp_path, "p", [probe])
    _, (record,) = _run(tmp_path)
    assert record["verdict"] == V.ERROR_BUNDLE and "field expected_rejection.reason" in record["detail"]


@pytest.mark.parametrize("case_id", ["abc\n", "abc def", "", "../x"])
def test_an_id_that_is_not_a_plain_name_is_refused(tmp_path, case_id):
    raw = _raw(1)
    raw["id"] = case_id
    _write(tmp_path, "ids", [raw])
    _, (record,) = _run(tmp_path)
    assert record["verdict"] == V.ERROR_BUNDLE and "field id" in record["detail"]


def test_bounds_far_past_the_sequence_are_unbounded_not_a_crash(tmp_path):
    _write(tmp_path, "far", [_raw(1, left=10 ** 30, right=10 ** 30)])
    _, (record,) = _run(tmp_path)
    assert record["verdict"] == V.PASS, record["detail"]


class AnswersTrue(S.TorchMathEngine):
    name = "answers-true"

    def is_applicable(self, graph):
        return True


class ReplacesItsOutputs(S.TorchMathEngine):
    """Computes right, but into tensors of its own (never the harness's buffers)."""
    name = "replaces-outputs"

    def run(self, graph, tensors):
        import torch
        for port in ("dq", "dk", "dv"):
            tensors[port] = torch.zeros(tensors[port].shape, dtype=torch.float32)


def test_is_applicable_answering_true_is_a_crash_and_the_run_finishes(tmp_path):
    _write(tmp_path, "a", [_raw(1), _raw(2)])
    summary, records = _run(tmp_path, engine=AnswersTrue)
    assert {r["verdict"] for r in records} == {V.CRASHED}
    assert "returned True: expected None or a non-empty reason string" in records[0]["detail"]
    ET.parse(summary.junit_path)
    again, _ = _run(tmp_path, engine=AnswersTrue, resume=True)
    assert again.resumed == 2


def test_an_engine_that_replaces_its_outputs_fails(tmp_path):
    _write(tmp_path, "a", [_raw(1)])
    _, (record,) = _run(tmp_path, engine=ReplacesItsOutputs)
    assert record["verdict"] == V.CRASHED and "does not support item assignment" in record["detail"]


def test_frontend_findings_name_the_field_of_every_rule():
    from bundlegen.validate import frontend_finding
    from bundlegen.graph import dense_graph

    assert frontend_finding(dense_graph()) is None
    finding = frontend_finding(dense_graph(left=0))
    assert (finding.reason, finding.field) == (R.LEFT_BOUND_NONPOSITIVE, "graph.attributes.left_bound")
    finding = frontend_finding(dense_graph(strides={"dv": (2 ** 62, 1, 1, 1)}))
    assert (finding.reason, finding.field) == (R.SPAN_OVERFLOW, "graph.tensors.dv")


def test_a_case_past_its_levels_memory_ceiling_is_skipped_before_allocating(tmp_path):
    far = S.case_of(1, offsets={"q": 750_000_000})
    S.write_bundle(tmp_path / "bundles", "quick", "far", [far, S.case_of(2)])
    summary, records = _run(tmp_path)
    verdicts = {r["case_id"]: r for r in records}
    assert verdicts[S.case_of(2).id]["verdict"] == V.PASS
    skipped = verdicts[far.id]
    assert skipped["verdict"] == V.SKIPPED
    assert skipped["detail"].startswith("too large: needs 1.4 GiB at its peak, the quick level allows 16 MiB")
