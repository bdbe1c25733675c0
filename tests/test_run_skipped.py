"""Skips that can be re-examined (issue 45): `--run-skipped` on `run` and `repro` runs the
cases a [[test_skips]] row skips, and reports each row whose cases all pass now as stale,
in the terminal and in run.json; a row whose defect is still there is not."""
from __future__ import annotations

import json

from bundlegen.cli import main
from bundlegen.harness import verdicts as V
from bundlegen.harness.results import read_results
from tests import harness_support as S

FIXED = [S.case_of(1), S.case_of(2)]     # the defect their row names is gone: they pass
STILL = S.bad_case(3)                   # WritesNaN still writes NaN into this one
OTHER = S.case_of(4)                    # never skipped


def setup(tmp_path):
    S.write_bundle(tmp_path / "bundles", "quick", "g", [*FIXED, STILL, OTHER])
    config = tmp_path / "config"
    config.mkdir()
    ids = ", ".join(f'"{c.id}"' for c in FIXED)
    (config / "engine.toml").write_text(
        '[[tolerance_overrides]]\nrtol = 0.05\natol = 1e-3\n\n'
        f'[[test_skips]]\nticket = "T-1"\nreason = "fixed since"\nfilters = [{{ id = [{ids}] }}]\n\n'
        f'[[test_skips]]\nticket = "T-2"\nreason = "still broken"\nfilters = [{{ id = "{STILL.id}" }}]\n',
        encoding="utf-8")
    return config


def run(tmp_path, config, *extra):
    return main(["run", "--level", "quick", "--engine", S.engine_ref(S.WritesNaN), "--device", "cpu",
                 "--bundles", str(tmp_path / "bundles"), "--out", str(tmp_path / "out"), "--no-isolation",
                 "--quiet", "--engine-config", str(config), *extra])


def verdicts(tmp_path):
    return {r["case_id"]: r["verdict"] for r in read_results(tmp_path / "out" / "results.jsonl")}


def test_without_the_switch_the_rows_skip_their_cases(tmp_path, capsys):
    config = setup(tmp_path)
    assert run(tmp_path, config) == V.EXIT_OK
    assert verdicts(tmp_path) == {**{c.id: V.SKIPPED for c in [*FIXED, STILL]}, OTHER.id: V.PASS}
    assert "stale skip" not in capsys.readouterr().out
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["run_skipped"] is False and record["stale_skips"] == []


def test_run_skipped_runs_them_and_names_the_stale_row_only(tmp_path, capsys):
    config = setup(tmp_path)
    assert run(tmp_path, config, "--run-skipped") == V.EXIT_FAILED   # the defect of T-2 is real
    assert verdicts(tmp_path) == {**{c.id: V.PASS for c in [*FIXED, OTHER]}, STILL.id: V.FAIL_NAN}
    out = capsys.readouterr().out
    assert f"stale skip: {config / 'engine.toml'} test_skips[0] (T-1: fixed since): its 2 case(s) all pass now" \
        in out, out
    assert "test_skips[1]" not in out
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["run_skipped"] is True
    assert record["stale_skips"] == [{"row": 0, "detail": "T-1: fixed since", "cases": 2}]


def test_repro_runs_a_skipped_case_and_says_its_row_is_stale(tmp_path, capsys):
    config = setup(tmp_path)
    args = ["repro", FIXED[0].id, "--engine", S.engine_ref(S.WritesNaN), "--bundles", str(tmp_path / "bundles"),
            "--engine-config", str(config)]
    assert main(args) == V.EXIT_OK
    assert "verdict: skipped" in capsys.readouterr().out
    assert main([*args, "--run-skipped"]) == V.EXIT_OK
    out = capsys.readouterr().out
    assert "verdict: pass" in out and "skipped by: " in out and "test_skips[0] (T-1: fixed since)" in out
    assert "stale skip:" in out
    assert main(["repro", STILL.id, *args[2:], "--run-skipped"]) == V.EXIT_FAILED
    out = capsys.readouterr().out
    assert "verdict: fail:nan" in out and "test_skips[1] (T-2: still broken)" in out and "stale skip" not in out
