"""`bundlegen run` over small bundles in a tmp dir (the pytest plugin: test_pytest_plugin.py)."""
from __future__ import annotations

import pytest

from bundlegen import reasons as R
from bundlegen.cli import main
from bundlegen.graph import Rejection
from tests import harness_support as S
from tests.graph_factory import make_case, make_graph


@pytest.fixture
def bundles(tmp_path):
    probe = make_case(make_graph(left=0, S_q=9, S_kv=12, D_qk=8, D_v=8), purpose="probe",
                      rejection=Rejection("frontend", R.LEFT_BOUND_NONPOSITIVE))
    S.write_bundle(tmp_path / "bundles", "quick", "a",
                   [S.case_of(1), S.case_of(2, dtype="fp32"), probe, S.bad_case(3)])
    return tmp_path / "bundles"


def cli(bundles, engine, *extra):
    return main(["run", "--level", "quick", "--engine", S.engine_ref(engine), "--device", "cpu",
                 "--bundles", str(bundles), "--out", str(bundles.parent / "out"),
                 "--no-isolation", "--quiet", *extra])


def test_run_prints_the_summary_and_exits_by_verdict(bundles, capsys):
    assert cli(bundles, S.TorchMathEngine) == 0
    out = capsys.readouterr().out
    for word in ("quick", "total", "pass", "rejected", "declined", "wall s", "predicted s"):
        assert word in out
    assert cli(bundles, S.WritesNaN) == 1
    assert (bundles.parent / "out" / "results.jsonl").is_file()
    assert (bundles.parent / "out" / "junit.xml").is_file()


@pytest.mark.parametrize("extra, message", [
    (["--shard", "3/2"], "--shard"), (["--level", "weekly"], "unknown level")])
def test_usage_errors_exit_2(bundles, capsys, extra, message):
    assert cli(bundles, S.TorchMathEngine, *extra) == 2
    assert message in capsys.readouterr().err


def test_unknown_engine_exits_2(bundles, capsys):
    assert main(["run", "--level", "quick", "--engine", "no-such-engine", "--device", "cpu",
                 "--bundles", str(bundles), "--out", str(bundles.parent / "o")]) == 2
    assert "unknown engine" in capsys.readouterr().err
