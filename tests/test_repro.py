"""`bundlegen repro`: case lookup, the worst elements and error pattern of a failure, the
--dump folder and its standalone script, usage errors (torch-math mutants, CPU)."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from bundlegen.cli import main
from bundlegen.harness import diagnose as D
from bundlegen.harness.config import Tolerance
from bundlegen.harness.repro import CaseNotFound, find_case
from bundlegen.harness.results import repro_command
from bundlegen.mutants.catalog import engine_target

#: built-in quick cases: REG-DO-STRIDES-DIFFER (dO in BSHD, O in BHSD) and AX-HEADS-HK1-HV2
DO_BSHD_CASE = "fc37a430bdf1"
HK1_HV2_CASE = "b67d8e51913a"
DO_AS_O = engine_target("torch-math", "do-strides-as-o")
V_AS_K = engine_target("torch-math", "v-indexed-with-k-heads")
TOL = Tolerance(rtol=0.01, atol=0.0, source="test")


def _reference(shape=(1, 4, 256, 8)):
    zeros = {p: torch.zeros(shape, dtype=torch.float64) for p in ("dq", "dk", "dv")}
    ones = {f"mag_{p}": torch.ones(shape, dtype=torch.float64) for p in ("dq", "dk", "dv")}
    return SimpleNamespace(**zeros, **ones)


# ----------------------------------------------------------------------------- the pieces
@pytest.mark.parametrize("indices, length, phrase", [
    ([0, 1, 2, 3], 4, "all 4"),
    ([3], 4, "only 3 (of 4)"),
    (list(range(192, 256)), 256, ">= 192 (64 of 256)"),
    (list(range(0, 16)), 256, "< 16 (16 of 256)"),
    ([5, 6, 7], 256, "in [5, 7] (3 of 256)"),
    ([1, 3], 8, "{1, 3} (2 of 8)"),
    (list(range(0, 40, 2)), 64, "{0, 2, 4, 6, 8, 10, 12, 14, ...} (20 of 64)"),
])
def test_index_phrase(indices, length, phrase):
    assert D.index_phrase(indices, length) == phrase


def test_error_pattern_names_the_head_and_rows_that_are_wrong():
    ref = _reference()
    outputs = {p: torch.zeros(1, 4, 256, 8) for p in ("dq", "dk", "dv")}
    outputs["dq"][0, 3, 192:, :] = 0.5          # only head 3, rows from 192
    outputs["dv"][0, :, 7, 2] = float("nan")    # a NaN counts as wrong
    outputs["dk"][0, 1, 0, 0] = 0.005           # inside the bound (0.01): not wrong
    (dq, dv) = D.error_patterns(outputs, ref, TOL)
    assert dq.line() == "dq: 512 of 8192 elements wrong; b all 1; h only 3 (of 4); s >= 192 (64 of 256); d all 8"
    assert dv.line() == "dv: 4 of 8192 elements wrong; b all 1; h all 4; s only 7 (of 256); d only 2 (of 8)"


def test_worst_elements_come_first_with_index_got_reference_and_bound():
    ref = _reference()
    outputs = {p: torch.zeros(1, 4, 256, 8) for p in ("dq", "dk", "dv")}
    outputs["dk"][0, 2, 100, 5] = 3.0
    outputs["dq"][0, 1, 9, 0] = -2.0
    outputs["dv"][0, 0, 0, 1] = float("inf")
    worst = D.worst_elements(outputs, ref, TOL, count=3)
    assert [(w.port, w.index, w.got) for w in worst] == [
        ("dv", (0, 0, 0, 1), float("inf")), ("dk", (0, 2, 100, 5), 3.0), ("dq", (0, 1, 9, 0), -2.0)]
    assert worst[1].reference == 0.0 and worst[1].bound == pytest.approx(0.01)
    assert worst[1].excess == pytest.approx(300.0)
    assert worst[1].line().startswith("dk[b=0,h=2,s=100,d=5]  got 3  reference 0")


# ----------------------------------------------------------------------------- lookup
def test_find_case_by_id_and_by_unique_prefix():
    assert find_case(DO_BSHD_CASE).id == DO_BSHD_CASE
    assert find_case(DO_BSHD_CASE[:7]).id == DO_BSHD_CASE


@pytest.mark.parametrize("wanted, message", [("zzzz", "no case with this id or id prefix"),
                                              ("4", "the prefix matches")])
def test_find_case_refuses_unknown_and_ambiguous_ids(wanted, message):
    with pytest.raises(CaseNotFound, match=message):
        find_case(wanted)


def test_repro_command_line():
    assert repro_command("abc123", "triton", "cuda") == "bundlegen repro abc123 --engine triton --device cuda"
    assert repro_command("abc123", "torch-math", "cpu") == "bundlegen repro abc123 --engine torch-math"
    assert repro_command("abc", "m.mod:Cls@x y") == "bundlegen repro abc --engine 'm.mod:Cls@x y'"


# ----------------------------------------------------------------------------- the command
def test_repro_of_a_mutant_prints_graph_verdict_worst_elements(capsys):
    assert main(["repro", DO_BSHD_CASE, "--engine", DO_AS_O, "--worst", "3"]) == 1
    out = capsys.readouterr().out
    assert ("graph: bf16 B=2 H_q=2 S_q=128 D=64 scale=0.125 (default) mask=none | q=bhsd k=bhsd "
            "v=bhsd o=bhsd do=[16384,64,128,1] stats=bhsd") in out
    assert "verdict: fail:numeric" in out
    worst = out.split("worst elements:\n")[1].splitlines()
    assert len(worst) == 3 and all(line.strip().startswith(("dq[b=", "dk[b=", "dv[b=")) for line in worst)
    assert all(" bound " in line for line in worst)


def test_repro_pattern_shows_which_heads_a_head_mapping_defect_breaks(capsys):
    # H_v ignored with H_k = 1 < H_v = 2: q heads 2, 3 read V head 0 instead of 1, and
    # dV's head 1 is never written (the canary's NaN)
    assert main(["repro", HK1_HV2_CASE, "--engine", V_AS_K]) == 1
    out = capsys.readouterr().out
    assert "verdict: fail:nan" in out
    assert "  dq: " in out and "; h >= 2 (2 of 4); s all 64" in out


def test_repro_of_a_passing_case_exits_0(capsys):
    assert main(["repro", DO_BSHD_CASE, "--engine", "torch-math"]) == 0
    out = capsys.readouterr().out
    assert "verdict: pass" in out and "error pattern:" not in out


def _run_script(folder):
    return subprocess.run([sys.executable, str(folder / "reproduce.py")], capture_output=True, text=True,
                          cwd=folder.parent, timeout=120)


def test_dump_writes_tensors_and_a_script_that_reproduces_the_failure(tmp_path, capsys):
    bad, good = tmp_path / "bad", tmp_path / "good"
    assert main(["repro", DO_BSHD_CASE, "--engine", DO_AS_O, "--dump", str(bad)]) == 1
    assert main(["repro", DO_BSHD_CASE, "--engine", "torch-math", "--dump", str(good)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in bad.iterdir()) == sorted(
        ["inputs.pt", "outputs.pt", "reference.pt", "case.json", "reproduce.py"])
    inputs = torch.load(bad / "inputs.pt")
    assert set(inputs) == {"q", "k", "v", "o", "do", "stats"} and inputs["q"].shape == (2, 2, 128, 64)
    failed = _run_script(bad)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "reproduced:" in failed.stdout and "dv[" in failed.stdout
    passed = _run_script(good)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "not reproduced" in passed.stdout


def test_the_script_checks_its_own_reference_against_the_dumped_one(tmp_path, capsys):
    folder = tmp_path / "d"
    assert main(["repro", DO_BSHD_CASE, "--engine", DO_AS_O, "--dump", str(folder)]) == 1
    capsys.readouterr()
    reference = torch.load(folder / "reference.pt")
    reference["dk"][0, 0, 0, 0] += 1.0
    torch.save(reference, folder / "reference.pt")
    result = _run_script(folder)
    assert result.returncode == 3 and "differs from the dumped one" in result.stdout


@pytest.mark.parametrize("argv, message", [
    (["repro", "zzzz", "--engine", "torch-math"], "error: case zzzz: no case with this id"),
    (["repro", DO_BSHD_CASE, "--engine", "no-such-engine"], "error: unknown engine 'no-such-engine'"),
    (["repro", DO_BSHD_CASE, "--engine", "torch-math", "--engine-config", "/nonexistent"],
     "error: --engine-config /nonexistent: not a folder"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
