"""Nothing on disk is trusted (issue 45, item 2): a file that is not a regular file is
refused wherever one is read (no hang on a FIFO, no traceback on a folder or a dangling
link); a case record with a misspelt or duplicated key, a number no float holds, or an
integer past what a graph can address is refused at load with one error while the other
cases run; a tolerance class edited after generation is refused at load."""
from __future__ import annotations

import json
import os
import threading

import pytest

from bundlegen import safe_read
from bundlegen.graph import BundleError, load_bundle
from bundlegen.harness import verdicts as V
from bundlegen.harness.bundles import load_level
from bundlegen.harness.level import run_level
from bundlegen.harness.results import bundles_digest, read_results
from bundlegen.manifest import load_manifest, manifest_name
from bundlegen.tolerances import tolerances_name
from bundlegen.workspace import WorkspaceError, find_workspace
from tests import harness_support as S

SMALL = dict(B=1, H_q=2, H_k=1, H_v=1, S_q=9, S_kv=12, D_qk=8, D_v=8)
PLAN = "sdpa_bwd"


def _in_thread(call, seconds: float = 60):
    """call()'s result or exception; fails when it is still running after `seconds`
    (a FIFO read blocks forever)."""
    outcome = {}

    def body():
        try:
            outcome["value"] = call()
        except BaseException as exc:   # noqa: BLE001 - the test reads what was raised
            outcome["error"] = exc
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call} blocked"
    return outcome


def _make(path, kind: str) -> None:
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(path.parent / "nowhere")


KINDS = ["folder", "fifo", "dangling link"]


# ----------------------------------------------------------------------------- the one reader
@pytest.mark.parametrize("kind, words", [("folder", "a folder"), ("fifo", "a FIFO"),
                                         ("dangling link", "a dangling link")])
def test_only_a_regular_file_is_read(tmp_path, kind, words):
    path = tmp_path / "x.json"
    _make(path, kind)
    outcome = _in_thread(lambda: safe_read.read_bytes(path), 10)
    assert isinstance(outcome.get("error"), safe_read.NotRegularFile), outcome
    assert words in str(outcome["error"]) and str(path) in str(outcome["error"])
    regular = tmp_path / "ok.json"
    regular.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(regular)
    assert safe_read.read_text(link) == "{}"


def test_a_digest_over_files_takes_a_fifo_without_blocking(tmp_path):
    """The resume digest read every bundle file: a FIFO named as one hung the run."""
    good = tmp_path / "a.json"
    good.write_text("{}")
    fifo = tmp_path / "b.json"
    os.mkfifo(fifo)
    outcome = _in_thread(lambda: bundles_digest([good, fifo], tmp_path), 10)
    assert "value" in outcome, outcome


# ----------------------------------------------------------------------------- a run
def _root_with_good_case(tmp_path):
    root = tmp_path / "bundles"
    S.write_bundle(root, "quick", "a-good", [S.case_of(1, **SMALL)])
    return root


def _run(tmp_path, root, config=S.LOOSE):
    summary = run_level("quick", S.engine_ref(S.TorchMathEngine), device="cpu", bundles=root,
                        out=tmp_path / "out", isolation=False, config=config, repeat=1)
    return summary, read_results(summary.results_path)


@pytest.mark.parametrize("kind", KINDS)
def test_a_bundle_that_is_not_a_regular_file_is_an_error_and_the_others_run(tmp_path, kind):
    """Before: a folder or dangling link named *.json was a traceback before any case ran,
    and a FIFO hung the run forever (the resume digest read it)."""
    root = _root_with_good_case(tmp_path)
    _make(root / "quick" / PLAN / "bad.json", kind)
    outcome = _in_thread(lambda: _run(tmp_path, root), 300)
    assert "value" in outcome, outcome.get("error")
    summary, records = outcome["value"]
    by_group = {r["group"]: r for r in records}
    assert by_group["a-good"]["verdict"] == V.PASS
    detail = by_group["bad"]["detail"]
    assert by_group["bad"]["verdict"] == V.ERROR_BUNDLE, by_group["bad"]
    assert "not a regular file" in detail or "dangling link" in detail, detail
    assert summary.exit_code == V.EXIT_FAILED


@pytest.mark.parametrize("name", [manifest_name(PLAN), tolerances_name(PLAN)])
def test_a_manifest_or_tolerance_file_that_is_a_fifo_is_refused_naming_it(tmp_path, name):
    root = _root_with_good_case(tmp_path)
    (root / name).unlink()
    os.mkfifo(root / name)
    outcome = _in_thread(lambda: load_manifest(root), 10)
    error = outcome.get("error")
    assert isinstance(error, BundleError), outcome
    assert "a FIFO" in str(error) and name in str(error)


# ----------------------------------------------------------------------------- case records
def _raw(seed: int, **graph) -> dict:
    return S.case_of(seed, **{**SMALL, **graph}).to_json()


def _bundle_text(cases: list) -> str:
    return json.dumps({"version": 1, "plan": PLAN, "level": "quick", "group": "g", "cases": cases})


def _errors(tmp_path, text: str) -> list[BundleError]:
    path = tmp_path / "g.json"
    path.write_text(text)
    bundle, errors = load_bundle(path)
    return bundle, errors


def _edit(raw: dict, where: str, value) -> dict:
    *parents, last = where.split(".")
    obj = raw
    for key in parents:
        obj = obj[key]
    obj[last] = value
    return raw


@pytest.mark.parametrize("where, value, field, message", [
    ("graph.attributes.left_bnd", 3, "graph.attributes.left_bnd", "unknown key"),
    ("graph.tensors.q.offest", 0, "graph.tensors.q.offest", "unknown key"),
    ("data.sead", 1, "data.sead", "unknown key"),
    ("tolerance_klass", "bf16-r256k", "tolerance_klass", "unknown key"),
    ("graph.attributes.softcap", 10 ** 400, "graph.attributes.softcap", "finite"),
    ("graph.attributes.attn_scale", 10 ** 400, "graph.attributes.attn_scale", "finite"),
    ("graph.attributes.attn_scale", -(10 ** 400), "graph.attributes.attn_scale", "finite"),
    ("graph.tensors.q.dims", [1, 2, 2 ** 63, 8], "graph.tensors.q.dims[2]", "past what a graph can address"),
    ("graph.tensors.dk.strides", [-(2 ** 63), 96, 8, 1], "graph.tensors.dk.strides[0]", "past what a graph"),
    ("graph.tensors.v.offset", 2 ** 63, "graph.tensors.v.offset", "past what a graph can address"),
    ("graph.tensors.v.strides", [96, 96, 2 ** 60, 1], "graph.tensors.v", "past what a graph can address"),
    ("data.seed", -1, "data.seed", "0 to 2^63"),
])
def test_a_bad_case_record_is_one_error_and_its_neighbour_loads(tmp_path, where, value, field, message):
    bad = _edit(_raw(1), where, value)
    bundle, errors = _errors(tmp_path, _bundle_text([bad, _raw(2)]))
    assert [c.id for c in bundle.cases] == [_raw(2)["id"]]
    (error,) = errors
    assert error.field == field and message in error.message and error.case_id == bad["id"], error


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('"attn_scale": ', '"attn_scale": 1e-9, "attn_scale": ', 1), "duplicate key 'attn_scale'"),
    (lambda t: t.replace('"version": 1', '"version": 1, "version": 1', 1), "duplicate key 'version'"),
    (lambda t: t.replace('"group": "g"', '"group": "g", "levle": "quick"', 1), "field levle: unknown key"),
    (lambda t: t.replace('"seed": ', '"seed": NaN, "x": ', 1), "NaN is not a JSON number"),
])
def test_a_bundle_text_the_standard_decoder_would_take_loosely_is_refused(tmp_path, edit, message):
    text = _bundle_text([_raw(1)])
    changed = edit(text)
    assert changed != text
    path = tmp_path / "g.json"
    path.write_text(changed)
    with pytest.raises(BundleError, match=message) as info:
        load_bundle(path)
    assert info.value.file == str(path)


def test_softcap_past_a_float_is_one_error_not_an_abort_of_the_run(tmp_path):
    """Before: `softcap` written as the integer 10^400 raised OverflowError at load and
    the whole run stopped before any case ran."""
    root = _root_with_good_case(tmp_path)
    bad = S.case_of(2, **SMALL).to_json()
    bad["graph"]["attributes"]["softcap"] = 10 ** 400
    path = root / "quick" / PLAN / "b-softcap.json"
    path.write_text(json.dumps({"version": 1, "plan": PLAN, "level": "quick", "group": "b-softcap",
                                "cases": [bad]}))
    summary, records = _run(tmp_path, root)
    by_group = {r["group"]: r for r in records}
    assert by_group["a-good"]["verdict"] == V.PASS
    assert by_group["b-softcap"]["verdict"] == V.ERROR_BUNDLE
    assert "graph.attributes.softcap" in by_group["b-softcap"]["detail"]


# ----------------------------------------------------------------------------- tolerance class
def test_a_tolerance_class_edited_after_generation_is_refused_at_load(tmp_path):
    """The id leaves the class out (recalibrating never renames a case), so the loader
    applies the plan's class rule again to the graph, with the manifest's classes: a case
    naming a 3x looser class than its graph takes is an error, its neighbour loads."""
    root = tmp_path / "bundles"
    S.write_bundle(root, "quick", "g", [S.case_of(1, **SMALL), S.case_of(2, **SMALL)])
    path = root / "quick" / PLAN / "g.json"
    doc = json.loads(path.read_text())
    honest = doc["cases"][0]["tolerance_class"]
    assert honest == "bf16-r256"
    doc["cases"][0]["tolerance_class"] = "bf16-r256k"      # rtol 3x the honest one's
    path.write_text(json.dumps(doc))
    loaded = load_level(root, "quick")
    assert [c.id for c in loaded.cases] == [doc["cases"][1]["id"]]
    (error,) = loaded.errors
    assert error.field == "tolerance_class" and error.case_id == doc["cases"][0]["id"]
    assert "'bf16-r256k'" in error.message and "'bf16-r256'" in error.message


def test_every_checked_in_case_names_the_class_its_graph_takes():
    from bundlegen.workspace import builtin_bundle_root

    manifest = load_manifest(builtin_bundle_root())
    loaded = load_level(builtin_bundle_root(), manifest.level_names[-1])
    assert loaded.errors == () and len(loaded.cases) > 1000


# ----------------------------------------------------------------------------- workspace
@pytest.mark.parametrize("kind", KINDS)
def test_a_workspace_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    _make(tmp_path / "bundlegen.toml", kind)
    outcome = _in_thread(lambda: find_workspace(tmp_path), 10)
    assert isinstance(outcome.get("error"), WorkspaceError), outcome
    assert "bundlegen.toml" in str(outcome["error"])


@pytest.mark.parametrize("text, words", [
    ('plans = ["../my_plan.py"]\n', "plans: '../my_plan.py' is not a module name"),
    ('bundels = "b"\n', "bundels: unknown key"),
    ('plans = "my_plan"\n', "plans: expected a list of strings"),
])
def test_a_workspace_file_with_a_bad_key_names_file_and_key(tmp_path, text, words):
    (tmp_path / "bundlegen.toml").write_text(text)
    with pytest.raises(WorkspaceError, match="bundlegen.toml") as info:
        find_workspace(tmp_path)
    assert words in str(info.value)
