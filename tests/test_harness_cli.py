"""`bundlegen run` over small bundles in a tmp dir (the pytest plugin: test_pytest_plugin.py)."""
from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bundlegen import reasons as R
from bundlegen.cli import main
from bundlegen.graph import Rejection
from tests import harness_support as S
from tests.graph_factory import make_case, make_graph

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def bundles(tmp_path):
    probe = make_case(make_graph(left=0, S_q=9, S_kv=12, D_qk=8, D_v=8), purpose="probe",
                      rejection=Rejection("frontend", R.LEFT_BOUND_NONPOSITIVE))
    S.write_bundle(tmp_path / "bundles", "quick", "a",
                   [S.case_of(1), S.declined_case(2), probe, S.bad_case(3)])
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


@pytest.mark.parametrize("selection", [["-k", "no-such-case"], ["-k", "a", "-k", "not a"]])
def test_a_run_that_selects_nothing_is_not_green(bundles, capsys, selection):
    assert cli(bundles, S.TorchMathEngine, *selection) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing was tested (no case was selected)" in err[0]
    assert cli(bundles, S.TorchMathEngine, *selection, "--allow-empty") == 0


def test_a_run_that_selects_nothing_leaves_the_last_runs_files(bundles, capsys):
    out = bundles.parent / "out"
    assert cli(bundles, S.TorchMathEngine) == 0
    before = {name: (out / name).read_bytes() for name in ("results.jsonl", "junit.xml", "run.json")}
    assert before["results.jsonl"]
    capsys.readouterr()
    assert cli(bundles, S.TorchMathEngine, "-k", "no-such-case") == 5   # a mistyped -k
    assert "the out folder is left as it was" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in before} == before
    # an empty run that is accepted is recorded as one (its files replace the last run's)
    assert cli(bundles, S.TorchMathEngine, "-k", "no-such-case", "--allow-empty") == 0
    assert (out / "results.jsonl").read_bytes() == b""


def test_a_run_where_every_case_is_declined_is_not_green(tmp_path, capsys):
    root = tmp_path / "bundles"
    S.write_bundle(root, "quick", "a", [S.case_of(1), S.case_of(2)])
    assert cli(root, S.DeclinesEverything) == 5
    assert "nothing was tested (2 declined; no case judged on its gradients)" in capsys.readouterr().err


@pytest.mark.parametrize("expression, message", [
    ("a or", "ends where a term"), ("(a", "'(' is not closed"), ("a b", "unexpected 'b'"),
    ("and a", "'and' where a term"), ("", "empty expression")])
def test_a_malformed_k_expression_is_a_usage_error(bundles, capsys, expression, message):
    assert cli(bundles, S.TorchMathEngine, "-k", expression) == 2
    assert message in capsys.readouterr().err


def test_k_expressions_combine_terms():
    from bundlegen.harness.selection import selection

    cases = [S.case_of(1, dtype="bf16"), S.case_of(2, dtype="fp16")]
    one, two = (c.id for c in cases)
    picked = lambda *ks: [c.id for c in cases if selection(list(ks))(c)]  # noqa: E731
    assert picked(f"{one} or {two}") == [one, two]
    assert picked(f"not {one}") == [two]
    assert picked(f"({one} or {two}) and not {two}") == [one]
    assert picked(one, two) == []
    assert picked("*") == [one, two]


def test_the_summary_lists_each_failing_case_with_the_command_that_reruns_it(bundles, capsys):
    assert cli(bundles, S.WritesNaN) == 1
    out = capsys.readouterr().out
    bad = S.bad_case(3)
    assert "failing cases (1):" in out and f"fail:nan  {bad.id}  quick/sdpa_bwd/a.json  TEST" in out
    rerun = next(line for line in out.splitlines() if "re-run:" in line).split("re-run: ", 1)[1]
    assert f"-k {bad.id}" in rerun and "--level quick" in rerun
    assert f"explain: bundlegen repro {bad.id} --engine {S.engine_ref(S.WritesNaN)}" in out
    junit = ET.parse(bundles.parent / "out" / "junit.xml").getroot()
    assert f"explain: bundlegen repro {bad.id} --engine {S.engine_ref(S.WritesNaN)}" in \
        junit.find(".//failure").get("message")
    argv = rerun.split()[1:]
    argv[argv.index("--engine") + 1] = S.engine_ref(S.WritesNaN)
    assert main([*argv, "--no-isolation", "--quiet"]) == 1
    assert "failing cases (1):" in capsys.readouterr().out


def test_a_piped_run_prints_plain_progress_lines_and_a_whole_table(bundles):
    proc = subprocess.run([sys.executable, "-m", "bundlegen", "run", "--level", "quick", "--engine",
                           S.engine_ref(S.TorchMathEngine), "--device", "cpu", "--bundles", str(bundles),
                           "--out", str(bundles.parent / "out")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "[4/4] " in proc.stderr and proc.stderr.rstrip().endswith("done")
    header = next(line for line in proc.stdout.splitlines() if "level" in line and "cases" in line)
    assert "rejection-accepted" not in header and "predicted s" in header and "…" not in proc.stdout


def test_control_characters_in_a_bundle_keep_junit_parseable(tmp_path):
    from bundlegen.harness.results import write_junit

    record = {"verdict": "fail:numeric", "level": "quick", "group": "g\x01", "case_id": "a\x1b[31m",
              "detail": "bad \x00 byte \ud800", "wall_s": 0.1, "engine": "e\x0c"}
    write_junit(tmp_path / "junit.xml", [record], ["quick"])
    root = ET.parse(tmp_path / "junit.xml").getroot()
    case = root.find(".//testcase")
    assert case.get("name") == "a\\x1b[31m" and "bad \\x00 byte" in case.find("failure").text


def test_the_summary_says_why_cases_were_declined(tmp_path, capsys):
    root = tmp_path / "bundles"
    S.write_bundle(root, "quick", "a", [S.case_of(1), S.case_of(2)])
    assert cli(root, S.DeclinesEverything) == 5
    assert "not run: 2 declined: head-dim-not-served" in capsys.readouterr().out


def test_decline_reasons_are_counted_top_first_and_all_when_verbose():
    from bundlegen.harness.progress import not_run_reasons

    records = ([{"verdict": "declined", "reason": f"r{i}"} for i in range(7) for _ in range(i + 1)]
               + [{"verdict": "skipped", "detail": "too  large for cpu"}, {"verdict": "pass"}])
    top = not_run_reasons(records, top=2)
    assert top == ["7 declined: r6", "6 declined: r5", "... 6 more reasons (16 cases); --verbose lists all"]
    every = not_run_reasons(records, top=None)
    assert len(every) == 8 and "1 skipped: too large for cpu" in every


def test_version_and_help_import_no_subcommand_nor_torch():
    for flag in ("--version", "--help"):
        code = ("import sys\nfrom bundlegen.cli import main\ntry:\n    main([%r])\nexcept SystemExit:\n    pass\n"
                "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'triton'))\n"
                "assert not heavy, heavy\n" % flag)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr


def test_verbose_switch_turns_on_info_logging(capsys):
    import logging

    from bundlegen.cli import configure_logging

    logger = logging.getLogger("bundlegen")
    try:
        configure_logging(1)
        assert logger.getEffectiveLevel() == logging.INFO
        logging.getLogger("bundlegen.harness.lanes").info("said once")
        assert capsys.readouterr().err == "bundlegen.harness.lanes: INFO: said once\n"   # stderr as captured now
        configure_logging(2)
        assert logger.getEffectiveLevel() == logging.DEBUG and len(logger.handlers) == 1
        configure_logging(0)
        assert logger.getEffectiveLevel() == logging.WARNING
    finally:
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)


def test_verbose_lists_every_decline_reason(tmp_path, capsys, monkeypatch):
    from bundlegen.harness import progress

    monkeypatch.setattr(progress, "TOP_REASONS", 0)
    root = tmp_path / "bundles"
    S.write_bundle(root, "quick", "a", [S.case_of(1), S.case_of(2)])
    assert cli(root, S.DeclinesEverything) == 5
    out = capsys.readouterr().out
    assert "not run: ... 1 more reasons (2 cases); --verbose lists all" in out and "head-dim-not-served" not in out
    assert cli(root, S.DeclinesEverything, "-v") == 5
    assert "not run: 2 declined: head-dim-not-served" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["run", "mutate"])
def test_quiet_has_a_short_form(command):
    """`-q` is `--quiet`, as in pytest and pip."""
    import argparse as A

    module = {"run": "bundlegen.harness.command", "mutate": "bundlegen.mutants.command"}[command]
    import importlib

    parser = A.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    required = {"run": [], "mutate": ["--engine", "triton", "--level", "quick"]}[command]
    assert parser.parse_args([*required, "-q"]).quiet is True
