"""The kill runner and `bundlegen mutate` over small bundles in a tmp dir (torch-math, CPU)."""
from __future__ import annotations

import json

import pytest

from bundlegen import reasons as R
from bundlegen.cli import main
from bundlegen.graph import Rejection
from bundlegen.harness import verdicts as V
from bundlegen.mutants import catalog as C
from bundlegen.mutants.kill import KILLED, NOT_APPLICABLE, SURVIVED, kill_matrix, load_cases, order_cases
from tests import harness_support as S
from tests.graph_factory import make_case, make_graph, packed_strides

SMALL = dict(B=2, H_q=2, H_k=2, H_v=2, S_q=9, S_kv=12, D_qk=8, D_v=8)


def _placed(case, group):
    import dataclasses
    return dataclasses.replace(case, level="quick", group=group)


def plain_case(seed=1):
    return _placed(make_case(make_graph(**SMALL), seed=seed), "a")


def do_bshd_case():
    """dO stored BSHD while O is BHSD: what do-strides-as-o misreads."""
    strides = {"do": packed_strides((2, 2, 9, 8), (0, 2, 1, 3))}
    return _placed(make_case(make_graph(out_strides=strides, **SMALL), seed=2), "a")


def zero_stride_probe():
    graph = make_graph(out_strides={"dq": (0, 9 * 8, 8, 1)}, **SMALL)
    return _placed(make_case(graph, purpose="probe",
                             rejection=Rejection("engine", R.ZERO_STRIDE_OUTPUT)), "probes")


@pytest.fixture
def bundles(tmp_path):
    root = tmp_path / "bundles"
    S.write_bundle(root, "quick", "a", [plain_case(), do_bshd_case()])
    S.write_bundle(root, "quick", "probes", [zero_stride_probe()])
    return root


MUTANTS = C.select(["do-strides-as-o", "accepts-zero-stride-outputs", "stats-batch-head-swapped"])


def test_each_mutant_is_killed_by_its_case(bundles):
    cases = load_cases("quick", bundles)
    matrix = kill_matrix(MUTANTS, "torch-math", cases, level="quick", device="cpu")
    by = {r.name: r for r in matrix.results}
    assert by["do-strides-as-o"].status == KILLED
    assert by["do-strides-as-o"].kill.case_id == do_bshd_case().id
    assert by["do-strides-as-o"].kill.verdict == V.FAIL_NUMERIC
    assert by["accepts-zero-stride-outputs"].kill.verdict == V.REJECTION_ACCEPTED
    assert by["accepts-zero-stride-outputs"].kill.check == "rejection probe"
    assert by["accepts-zero-stride-outputs"].cases_run == 1      # probes first, then it stops
    assert by["stats-batch-head-swapped"].status == NOT_APPLICABLE
    assert matrix.exit_code == 0 and matrix.count(KILLED) == 2 and matrix.applicable == 2
    record = matrix.to_json()
    by_json = {m["name"]: m for m in record["mutants"]}
    assert record["killed"] == 2 and by_json["do-strides-as-o"]["kill"]["case_id"] == do_bshd_case().id
    json.dumps(record, allow_nan=False)


def test_a_mutant_survives_when_its_killing_case_is_gone(bundles):
    cases = [c for c in load_cases("quick", bundles) if c.id != do_bshd_case().id]
    matrix = kill_matrix(C.select(["do-strides-as-o"]), "torch-math", cases, level="quick", device="cpu")
    (result,) = matrix.results
    assert result.status == SURVIVED and result.kill is None and result.cases_run == len(cases)
    assert matrix.exit_code == 1


def test_cases_the_correct_engine_fails_kill_nothing(tmp_path):
    """WritesNaN fails its bad cases by itself: its dv-extra-row mutant failing them too
    is no kill."""
    bad = _placed(S.bad_case(3), "a")
    matrix = kill_matrix(C.select(["dv-extra-row"]), S.engine_ref(S.WritesNaN), [bad],
                         level="quick", device="cpu")
    (result,) = matrix.results
    assert result.status == SURVIVED and result.baseline_failures == (bad.id,)


def test_all_kills_and_first_kill(bundles):
    cases = load_cases("quick", bundles)
    (every,) = kill_matrix(C.select(["dv-extra-row"]), "torch-math", cases, device="cpu",
                           first_kill_only=False).results
    assert {k.case_id for k in every.kills} == {plain_case().id, do_bshd_case().id}
    assert every.cases_run == 3
    (first,) = kill_matrix(C.select(["dv-extra-row"]), "torch-math", cases, device="cpu").results
    assert len(first.kills) == 1 and first.kill.verdict == V.FAIL_GUARD


def test_order_probes_and_preferred_items_first(bundles):
    cases = load_cases("quick", bundles)
    assert order_cases(cases, "cpu")[0].purpose == "probe"
    import dataclasses
    tagged = [dataclasses.replace(c, items=("REG-X",)) if c.id == do_bshd_case().id else c for c in cases]
    assert order_cases(tagged, "cpu", ("REG-*",))[0].id == do_bshd_case().id


def test_isolated_workers_build_mutants_by_name(bundles):
    cases = load_cases("quick", bundles)
    matrix = kill_matrix(C.select(["do-strides-as-o"]), "torch-math", cases, device="cpu", isolation=True)
    assert matrix.results[0].kill.case_id == do_bshd_case().id


# ----------------------------------------------------------------------------- the command
def mutate(bundles, *extra):
    return main(["mutate", "--engine", "torch-math", "--level", "quick", "--device", "cpu",
                 "--bundles", str(bundles), "--quiet", *extra])


def test_mutate_prints_the_matrix_and_writes_json(bundles, tmp_path, capsys):
    path = tmp_path / "kill.json"
    assert mutate(bundles, "--mutant", "do-strides-as-o", "--mutant", "accepts-zero-stride-outputs",
                  "--json", str(path)) == 0
    out = capsys.readouterr().out
    assert "kill matrix" in out and "do-strides-as-o" in out and "2 of 2 mutants killed" in out
    record = json.loads(path.read_text())
    assert [m["status"] for m in record["mutants"]] == ["killed", "killed"]


def test_mutate_exits_1_when_a_mutant_survives(bundles, capsys):
    assert mutate(bundles, "--mutant", "do-strides-as-o", "-k", "probes") == 1
    assert "SURVIVED: do-strides-as-o" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--mutant", "no-such-mutant"], "unknown mutant"), (["--level", "weekly"], "unknown level")])
def test_mutate_usage_errors_exit_2(bundles, capsys, extra, message):
    assert mutate(bundles, *extra) == 2
    assert message in capsys.readouterr().err


def test_mutate_list(capsys):
    assert main(["mutate", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in C.NAMES)


def test_the_check_behind_a_broken_claim():
    from bundlegen.mutants.kill import Kill

    def kill(verdict, detail):
        return Kill("c", "quick", "a", "claim", (), verdict, detail)
    assert kill(V.CLAIM_BROKEN, "claimed on sm90 but fail:nan: NaN/Inf").check == "no NaN/Inf (claimed case)"
    assert kill(V.CLAIM_BROKEN, "claimed on sm90 but declined (x)").check == "claim (declined)"
    assert kill(V.FAIL_GUARD, "canary").check == "guard canaries"


def test_every_failing_verdict_but_a_bad_bundle_kills():
    """A new failing verdict (e.g. the device probes' fail:escaped) must count as a kill."""
    from bundlegen.harness import verdicts as V
    from bundlegen.mutants.kill import CHECK_OF_VERDICT
    assert set(CHECK_OF_VERDICT) == set(V.FAILING) - {V.ERROR_BUNDLE}


# ----------------------------------------------------------------------------- level by level
@pytest.fixture
def two_levels(tmp_path):
    """quick: the plain case and the zero-stride probe; pr: the dO-BSHD case (what kills
    do-strides-as-o), so that mutant is first killed at pr."""
    import dataclasses
    root = tmp_path / "bundles"
    S.write_bundle(root, "quick", "a", [plain_case()])
    S.write_bundle(root, "quick", "probes", [zero_stride_probe()])
    S.write_bundle(root, "pr", "a", [dataclasses.replace(do_bshd_case(), level="pr")])
    return root


def _levels_mutate(root, *extra):
    return main(["mutate", "--engine", "torch-math", "--levels", "quick,pr", "--device", "cpu",
                 "--bundles", str(root), "--quiet", "--mutant", "do-strides-as-o",
                 "--mutant", "accepts-zero-stride-outputs", *extra])


def test_levels_report_the_first_killing_level(two_levels, tmp_path, capsys):
    path = tmp_path / "levels.json"
    # both mutants must die at quick: do-strides-as-o dies only at pr, so it is late (exit 1)
    assert _levels_mutate(two_levels, "--json", str(path)) == 1
    out = capsys.readouterr().out
    assert "kill matrix by level: quick, pr" in out
    assert "first killed at quick 1, pr 1 of 2 mutants" in out
    assert "LATE (not killed by their killed_by level): do-strides-as-o" in out
    record = json.loads(path.read_text())
    first = {m["name"]: m["first_level"] for m in record["mutants"]}
    assert first == {"do-strides-as-o": "pr", "accepts-zero-stride-outputs": "quick"}
    assert record["late"] == ["do-strides-as-o"]
    # pr ran over its own case only, and only for the mutant quick left alive
    pr = record["matrices"][1]
    assert pr["level"] == "pr" and pr["cases"] == 1 and [m["name"] for m in pr["mutants"]] == ["do-strides-as-o"]


def test_levels_exit_0_when_each_dies_by_its_level(two_levels, capsys):
    import dataclasses
    pr_only = C.by_name("do-strides-as-o")
    from unittest import mock
    with mock.patch.object(C, "CATALOG", tuple(dataclasses.replace(m, killed_by="pr") if m is pr_only else m
                                                for m in C.CATALOG)):
        assert _levels_mutate(two_levels) == 0
    assert "LATE" not in capsys.readouterr().out


def test_levels_usage_errors(two_levels, capsys):
    assert main(["mutate", "--engine", "torch-math", "--levels", "pr,quick", "--device", "cpu",
                 "--bundles", str(two_levels), "--quiet"]) == 2
    assert "lowest first" in capsys.readouterr().err
    assert main(["mutate", "--engine", "torch-math", "--levels", "quick", "--level", "quick",
                 "--device", "cpu", "--bundles", str(two_levels), "--quiet"]) == 2
    assert "not both" in capsys.readouterr().err
