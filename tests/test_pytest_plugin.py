"""The pytest plugin: cases collected through a collector per bundle file, counted in the
header, selected by -k / -m, stopped by -x, run with their verdict as the outcome; a
malformed file is a collection error; bad options are one usage error."""
from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bundlegen.results_file import read_results

# Imported here, before any pytester in-process run: modules first imported inside such a
# run are dropped after it while their package keeps the stale attribute, and a later
# isolated run in this process could then not pickle their classes.
import bundlegen.harness.case  # noqa: F401
import bundlegen.harness.executor  # noqa: F401
import bundlegen.harness.workers.worker  # noqa: F401
from bundlegen import reasons as R
from bundlegen.graph import Rejection
from bundlegen.workspace import builtin_bundle_root
from tests import harness_support as S
from tests.graph_factory import make_case, make_graph

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]
NO_XDIST = ("-p", "no:xdist")


def _probe():
    return make_case(make_graph(left=0, S_q=9, S_kv=12, D_qk=8, D_v=8), purpose="probe",
                     rejection=Rejection("frontend", R.LEFT_BOUND_NONPOSITIVE))


@pytest.fixture
def bundles(tmp_path):
    """quick/a.json: a good case, an fp32 case (declined), a probe, a case the bad engines break."""
    S.write_bundle(tmp_path / "bundles", "quick", "a",
                   [S.case_of(1), S.case_of(2, dtype="fp32"), _probe(), S.bad_case(3)])
    return tmp_path / "bundles"


def args(bundles, engine=S.TorchMathEngine, *extra):
    return ["--bundlegen-level=quick", f"--bundlegen-engine={S.engine_ref(engine)}",
            "--bundlegen-device=cpu", f"--bundlegen-bundles={bundles}", "--bundlegen-no-isolation",
            f"--bundlegen-out={Path(bundles).parent / 'pytest-out'}", *NO_XDIST, *extra]


def _builtin_quick_ids() -> list[str]:
    """Every case id of the built-in quick bundles, read straight from the files."""
    files = sorted((builtin_bundle_root() / "quick" / "sdpa_bwd").glob("*.json"))
    return [f"quick/sdpa_bwd/{f.name}::{case['id']}"
            for f in files for case in json.loads(f.read_text(encoding="utf-8"))["cases"]]


# ----------------------------------------------------------------------------- collection
def test_collect_only_lists_every_builtin_quick_case(pytester):
    expected = _builtin_quick_ids()
    result = pytester.runpytest_inprocess("--bundlegen-level", "quick", "--bundlegen-engine",
                                          "torch-math", "--co", "-q", *NO_XDIST)
    listed = [line for line in result.outlines if "::" in line]
    assert listed == expected
    result.stdout.fnmatch_lines([f"{len(expected)} tests collected in *"])
    assert result.ret == 0


def test_header_counts_the_cases_and_the_selection(pytester):
    n = len(_builtin_quick_ids())
    result = pytester.runpytest_inprocess("--bundlegen-level=quick", "--bundlegen-engine=torch-math", "--co", *NO_XDIST)
    result.stdout.fnmatch_lines([f"collected {n} items", "<BundleFile quick/sdpa_bwd/axes.json>",
                                 "  <BundleCaseItem *>"])
    probes = [i for i in _builtin_quick_ids() if "probes.json" in i]
    result = pytester.runpytest_inprocess("--bundlegen-level=quick", "--bundlegen-engine=torch-math", "--co", "-k", "probes", *NO_XDIST)
    result.stdout.fnmatch_lines([f"collected {n} items / {n - len(probes)} deselected / {len(probes)} selected"])


def test_bundles_come_from_the_workspace(pytester):
    pytester.makefile(".toml", bundlegen='bundles = "mine"\n')
    S.write_bundle(pytester.path / "mine", "quick", "only", [S.case_of(1), S.case_of(2)])
    result = pytester.runpytest_inprocess("--bundlegen-level=quick", "--bundlegen-engine=torch-math", "--co", "-q", *NO_XDIST)
    assert [line for line in result.outlines if "::" in line] == \
        [f"quick/sdpa_bwd/only.json::{S.case_of(i).id}" for i in (1, 2)]


def test_a_malformed_file_is_a_collection_error_naming_file_case_and_field(bundles, pytester):
    (bundles / "quick" / "sdpa_bwd" / "broken.json").write_text("{")
    path = S.write_bundle(bundles, "quick", "halfbad", [S.case_of(4), S.case_of(5)])
    raw = json.loads(path.read_text())
    raw["cases"][1]["data"]["seed"] = "x"
    path.write_text(json.dumps(raw))
    bad_id = S.case_of(5).id
    result = pytester.runpytest_inprocess(*args(bundles, S.TorchMathEngine, "--co"))
    result.stdout.fnmatch_lines([
        "collected 5 items / 2 errors",
        "*ERROR collecting quick/sdpa_bwd/broken.json*",
        "error:bundle: *broken.json: case -: field -: bad JSON*",
        "*ERROR collecting quick/sdpa_bwd/halfbad.json*",
        f"error:bundle: *halfbad.json: case {bad_id}: field data.seed: *",
        "*short test summary*", "ERROR quick/sdpa_bwd/broken.json",
        f"ERROR quick/sdpa_bwd/halfbad.json::{bad_id}:data.seed"])
    assert result.ret == pytest.ExitCode.INTERRUPTED
    # the good cases, halfbad's included, still run when asked to go on
    result = pytester.runpytest_inprocess(*args(bundles, S.TorchMathEngine, "--continue-on-collection-errors"))
    result.assert_outcomes(passed=4, skipped=1, errors=2)


def test_an_unexpected_collection_fault_keeps_its_traceback(bundles, pytester, monkeypatch):
    from bundlegen.harness import pytest_plugin

    def boom(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(pytest_plugin.BundleFile, "collect", boom)
    result = pytester.runpytest_inprocess(*args(bundles, S.TorchMathEngine, "--co"))
    result.stdout.fnmatch_lines(["*ERROR collecting quick/sdpa_bwd/a.json*", "E   RuntimeError: boom"])


# ----------------------------------------------------------------------------- running
def test_a_real_run_of_builtin_quick_cases_on_torch_math(tmp_path):
    """In a fresh process, with crash isolation (pytester's in-process runs reload modules)."""
    from bundlegen.harness.bundles import load_level

    cases = load_level(builtin_bundle_root(), "quick").cases
    cheapest = sorted((c for c in cases if c.purpose == "claim"), key=lambda c: c.cost.predicted_s)[:2]
    probe = next(c for c in cases if c.purpose == "probe")
    chosen = [*cheapest, probe]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--bundlegen-level=quick", "--bundlegen-engine=torch-math",
         "--bundlegen-device=cpu", "-rA", "-k", " or ".join(c.id for c in chosen), *NO_XDIST],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    assert f"3 passed, {len(cases) - 3} deselected" in out, out[-3000:]
    for c in chosen:
        assert f"PASSED quick/sdpa_bwd/{c.group}.json::{c.id}" in out, out[-3000:]


def test_verdicts_become_outcomes(bundles, pytester):
    result = pytester.runpytest_inprocess(*args(bundles, S.WritesNaN, "-rA"))
    result.assert_outcomes(failed=1, passed=2, skipped=1)
    records = read_results(bundles.parent / "pytest-out" / "results.jsonl")
    assert {r["case_id"]: r["verdict"] for r in records} == {
        S.case_of(1).id: "pass", S.case_of(2, dtype="fp32").id: "declined", _probe().id: "rejected",
        S.bad_case(3).id: "fail:nan"}
    result.stdout.fnmatch_lines([f"_* quick/sdpa_bwd/a.json::{S.bad_case(3).id} _*",
                                 "fail:nan: NaN/Inf where the oracle is finite*",
                                 f"PASSED quick/sdpa_bwd/a.json::{S.case_of(1).id}",
                                 "SKIPPED*declined: dtype-not-served*",
                                 f"FAILED quick/sdpa_bwd/a.json::{S.bad_case(3).id}*"])


def test_dash_x_stops_at_the_first_failure(tmp_path, pytester):
    S.write_bundle(tmp_path, "quick", "a", [S.bad_case(3), S.case_of(1), S.case_of(2)])
    result = pytester.runpytest_inprocess(*args(tmp_path, S.WritesNaN, "-x"))
    result.assert_outcomes(failed=1)


def test_dash_m_selects_by_purpose_and_level(bundles, pytester):
    S.write_bundle(bundles, "pr", "b", [S.case_of(6), S.case_of(7)])
    common = [f"--bundlegen-bundles={bundles}", "--bundlegen-level=pr", "--bundlegen-engine=torch-math", "--co", "-q",
              "--strict-markers", *NO_XDIST]
    result = pytester.runpytest_inprocess(*common, "-m", "probe")
    assert [line for line in result.outlines if "::" in line] == [f"quick/sdpa_bwd/a.json::{_probe().id}"]
    result = pytester.runpytest_inprocess(*common, "-m", "pr and claim")
    assert [line for line in result.outlines if "::" in line] == \
        [f"pr/sdpa_bwd/b.json::{S.case_of(i).id}" for i in (6, 7)]
    result = pytester.runpytest_inprocess("--bundlegen-level=quick", "--bundlegen-engine=torch-math", "--markers", *NO_XDIST)
    result.stdout.fnmatch_lines_random(["@pytest.mark.probe: *", "@pytest.mark.claim: *",
                                        "@pytest.mark.regression: *", "@pytest.mark.quick: *"])


@pytest.mark.parametrize("option, message", [
    ("--bundlegen-engine=no-such-engine", "--bundlegen-engine: unknown engine 'no-such-engine'*"),
    ("--bundlegen-engine=tests.harness_support:Nothing", "--bundlegen-engine: cannot load engine*"),
    ("--bundlegen-device=gpu", "--bundlegen-device: *gpu*"),
    ("--bundlegen-device=cuda:99", "--bundlegen-device: cuda:99: * GPU* visible*"),
    ("--bundlegen-level=weekly", "--bundlegen-level: unknown level 'weekly'*"),
])
def test_a_bad_option_is_one_usage_error(bundles, pytester, option, message):
    result = pytester.runpytest_inprocess(*args(bundles, S.TorchMathEngine, option))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "collected" not in result.stdout.str()   # stopped before any case


def test_pytest_plugin_under_xdist(bundles, tmp_path):
    junit = tmp_path / "plugin.xml"
    plugin = [a for a in args(bundles, S.WritesNaN) if a not in NO_XDIST]
    proc = subprocess.run([sys.executable, "-m", "pytest", *plugin, "-n", "2", "-q", f"--junitxml={junit}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 failed, 2 passed, 1 skipped" in proc.stdout, proc.stdout[-3000:]
    assert len(list(ET.parse(junit).getroot().iter("testcase"))) == 4
    per_worker = sorted((tmp_path / "pytest-out").glob("results-gw*.jsonl"))
    assert per_worker and sum(len(read_results(f)) for f in per_worker) == 4


def test_each_xdist_worker_takes_its_own_gpu(monkeypatch):
    import torch

    from bundlegen.harness import pytest_plugin

    class Config:
        def getoption(self, name):
            return {"bundlegen_device": "cuda"}[name]

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert pytest_plugin._device(Config()) == "cuda:1"
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert pytest_plugin._device(Config()) == "cuda"


def test_plugin_is_inert_without_a_level(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    pytester.runpytest_inprocess(*NO_XDIST).assert_outcomes(passed=1)
    proc = subprocess.run([sys.executable, "-c", "import sys, bundlegen.harness.pytest_plugin; "
                           "assert 'torch' not in sys.modules"], cwd=REPO, timeout=60)
    assert proc.returncode == 0


def test_a_session_whose_cases_were_all_declined_does_not_pass(tmp_path, pytester):
    S.write_bundle(tmp_path, "quick", "a", [S.case_of(1), S.case_of(2)])
    result = pytester.runpytest_inprocess(*args(tmp_path, S.DeclinesEverything))
    result.assert_outcomes(skipped=2)
    assert result.ret == 5
    result.stdout.fnmatch_lines(["*bundlegen: nothing was tested (2 cases, all declined or skipped)*"])
    result = pytester.runpytest_inprocess(*args(tmp_path, S.DeclinesEverything, "--bundlegen-allow-empty"))
    assert result.ret == 0
    result = pytester.runpytest_inprocess(*args(tmp_path, S.TorchMathEngine))
    assert result.ret == 0


def test_the_engine_is_required(tmp_path, pytester):
    """A CI line that forgets the engine is a usage error, not a run of some default engine."""
    S.write_bundle(tmp_path, "quick", "a", [S.case_of(1)])
    given = [a for a in args(tmp_path) if not a.startswith("--bundlegen-engine")]
    result = pytester.runpytest_inprocess(*given)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--bundlegen-level needs --bundlegen-engine*"])


def test_the_terminal_summary_says_why_cases_were_not_run(tmp_path, pytester):
    S.write_bundle(tmp_path, "quick", "a", [S.case_of(1), S.case_of(2)])
    result = pytester.runpytest_inprocess(*args(tmp_path, S.DeclinesEverything))
    result.stdout.fnmatch_lines(["*bundlegen: why cases were not run*", "2 declined: head-dim-not-served*"])
