"""`bundlegen matrix` writes the workspace's support matrix; `--check` passes when it is
current and every claim is backed by the results its claims.json cites, and fails (exit 1)
when the file drifts or a claim's evidence is missing, changed, unbacked or not a complete run."""
import argparse
import gzip
import json
import shutil
from pathlib import Path

from bundlegen.claims import harvest_command, matrix_command
from bundlegen.claims.cases import bundle_cases
from bundlegen.claims.harvest import run_json_of
from bundlegen.claims.store import claims_path, read_claim_set, write_claim_set
from bundlegen.manifest import load_manifest
from bundlegen.workspace import builtin_bundle_root

REPO_ROOT = Path(__file__).resolve().parents[1]


def workspace(tmp_path, monkeypatch):
    """A workspace whose only engine folder holds torch-flash and torch-math configs."""
    (tmp_path / "bundlegen.toml").write_text('engines = ["engines"]\nmatrix = "docs/MATRIX.md"\n')
    for name in ("torch_flash", "torch_math"):
        (tmp_path / "engines" / name).mkdir(parents=True)
        (tmp_path / "engines" / name / "engine.toml").write_text("[meta]\n")
    (tmp_path / "docs").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path / "docs" / "MATRIX.md"


def _args(check=False):
    return argparse.Namespace(check=check, bundles=None, plan=None, claims_root=None)


def _harvest(results, min_runs=1):
    return harvest_command.main(argparse.Namespace(results=[str(r) for r in results], min_runs=min_runs,
                                                   min_orders=1, min_margin=None, plan=None, prune=True,
                                                   claims_root=None, dry_run=False))


def quick_run(path, engine="torch-flash", drop=0, fail=()):
    """A results file holding a record for every quick case of the built-in bundles (the
    first `drop` claim cases left out; the `fail` ones failing), as a complete run writes."""
    root = builtin_bundle_root()
    cases = bundle_cases(root, "sdpa_bwd", load_manifest(root).level_names)
    quick = sorted(dict(cases.levels)["quick"])
    claimable = [c for c in quick if c in cases.case_items]
    left_out = set(claimable[:drop])
    records = []
    for cid in quick:
        if cid in left_out:
            continue
        probe = cid not in cases.case_items
        verdict = "rejected" if probe else ("fail:numeric" if cid in fail else "pass")
        records.append({"case_id": cid, "engine": engine, "arch": "sm90", "purpose": "probe" if probe else "claim",
                        "verdict": verdict, "margin": None if probe else 10.0, "level": "quick"})
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    return path, claimable


def test_check_detects_drift(tmp_path, capsys, monkeypatch):
    output = workspace(tmp_path, monkeypatch)
    assert matrix_command.main(_args(check=True)) == 1        # no file yet
    assert matrix_command.main(_args()) == 0
    first = output.read_text(encoding="utf-8")
    assert first.startswith("# Support matrix")
    assert "torch-flash sm90" in first and "torch-math" in first and "triton" not in first
    assert "| torch-flash |" not in first                     # never run: no column
    assert matrix_command.main(_args(check=True)) == 0
    assert matrix_command.main(_args()) == 0
    assert output.read_text(encoding="utf-8") == first            # deterministic

    path, claimable = quick_run(tmp_path / "runs" / "flash.results.jsonl.gz")
    _harvest([path])
    capsys.readouterr()
    assert matrix_command.main(_args(check=True)) == 1
    out = capsys.readouterr().out
    assert "has drifted" in out and f"+| torch-flash | sm90 | quick | {len(claimable)} | 0 | 0 | 1 | 1 |" in out
    assert "+Levels covered: quick of quick, pr, nightly, full; the cases of the other levels are not counted." in out
    assert "claims:" not in out                                   # the evidence holds

    matrix_command.main(_args())
    # every quick case passed: no cell is partial for the levels the run did not cover
    grid = [line for line in output.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    assert any("✅" in line for line in grid) and not [line for line in grid if "🟡" in line]
    output.write_text(output.read_text(encoding="utf-8") + "hand edit\n", encoding="utf-8")
    assert matrix_command.main(_args(check=True)) == 1
    assert "-hand edit" in capsys.readouterr().out


def _check(capsys):
    capsys.readouterr()
    rc = matrix_command.main(_args(check=True))
    return rc, capsys.readouterr().out


def test_check_fails_when_a_claims_evidence_is_removed_or_changed(tmp_path, capsys, monkeypatch):
    workspace(tmp_path, monkeypatch)
    results, claimable = quick_run(tmp_path / "runs" / "flash.results.jsonl.gz")
    assert _harvest([results]) == 0
    matrix_command.main(_args())
    assert _check(capsys) == (0, _check(capsys)[1])
    assert "every claim is backed" in _check(capsys)[1]
    cited = read_claim_set(claims_path("torch-flash"), "torch-flash").evidence["sm90"].results
    assert [(s.path, s.level) for s in cited] == [("runs/flash.results.jsonl.gz", "")]

    saved = results.read_bytes()
    results.unlink()
    rc, out = _check(capsys)
    assert rc == 1 and "torch-flash sm90: cites runs/flash.results.jsonl.gz, which is missing" in out
    assert f"{len(claimable)} claims not backed by the cited results" in out

    quick_run(results, fail=claimable[:1])          # the same file, one claimed case now failing
    rc, out = _check(capsys)
    assert rc == 1 and "which has changed since the harvest (sha256)" in out
    results.write_bytes(saved)
    assert _check(capsys)[0] == 0


def test_check_fails_on_a_claim_no_cited_run_backs(tmp_path, capsys, monkeypatch):
    workspace(tmp_path, monkeypatch)
    results, claimable = quick_run(tmp_path / "runs" / "flash.results.jsonl.gz", fail=["zzz"])
    _harvest([results])
    path = claims_path("torch-flash")
    held = read_claim_set(path, "torch-flash")
    forged = dict(held.claims)
    forged["sm90"] = held.claims["sm90"] | {"0123456789ab"}
    write_claim_set(path, type(held)(held.engine, forged, held.declines, held.unclaimed, held.evidence))
    matrix_command.main(_args())
    rc, out = _check(capsys)
    assert rc == 1 and "1 claims not backed by the cited results (min runs 1, min margin 1.5): 0123456789ab" in out
    assert "1 claims name cases not in the bundles: 0123456789ab" in out

    no_evidence = type(held)(held.engine, held.claims, held.declines, held.unclaimed, {})
    write_claim_set(path, no_evidence)
    matrix_command.main(_args())
    rc, out = _check(capsys)
    assert rc == 1 and f"torch-flash sm90: {len(claimable)} claims cite no results file" in out


def test_check_fails_when_claims_come_from_an_incomplete_run(tmp_path, capsys, monkeypatch):
    workspace(tmp_path, monkeypatch)
    results, _ = quick_run(tmp_path / "runs" / "flash.results.jsonl.gz", drop=1)
    _harvest([results])
    matrix_command.main(_args())
    rc, out = _check(capsys)
    assert rc == 1 and "claims quick cases but no cited results file is a complete run of quick" in out

    # the same records from a `-k` run that its run.json says finished: declared, accepted
    (tmp_path / "runs" / "flash.run.json").write_text(json.dumps(
        {"level": "quick", "complete": True, "selection": "-k 'AX-*'", "versions": {"torch": "2.11.0"}}))
    _harvest([results])
    matrix_command.main(_args())
    assert _check(capsys)[0] == 0
    text = (tmp_path / "docs" / "MATRIX.md").read_text(encoding="utf-8")
    assert "| torch-flash | sm90 | 2.11.0 | unknown | unknown | unknown |" in text
    assert "| quick -k 'AX-*' |" in text


def test_a_whole_run_of_bundles_that_grew_since_still_backs_its_claims(tmp_path, capsys, monkeypatch):
    """Cases added to the plan after a run: the run's own run.json says it ran the whole
    level and counted the records it holds, so its claims stay backed; a run.json that
    counted more cases than the file holds (a record lost) is still incomplete."""
    workspace(tmp_path, monkeypatch)
    results, _ = quick_run(tmp_path / "runs" / "flash.results.jsonl.gz", drop=1)
    held = sum(1 for _ in gzip.open(results, "rt", encoding="utf-8"))
    run_json = tmp_path / "runs" / "flash.run.json"

    def ran(cases):
        run_json.write_text(json.dumps({"level": "quick", "complete": True, "selection": "all",
                                        "cases": cases, "versions": {"torch": "2.11.0"}}))
        _harvest([results])
        matrix_command.main(_args())
        return _check(capsys)

    assert ran(held)[0] == 0
    rc, out = ran(held + 1)
    assert rc == 1 and "claims quick cases but no cited results file is a complete run of quick" in out


def test_the_checked_in_claims_fail_without_their_evidence(tmp_path, capsys, monkeypatch):
    """This repository's torch-math claims, in a workspace of their own: backed while the
    results files they cite are there (each with its run.json, which says how many cases a
    whole run of bundles that grew since counted), not once one of them is removed."""
    workspace(tmp_path, monkeypatch)
    claims = read_claim_set(REPO_ROOT / "engines" / "torch_math" / "claims.json", "torch-math")
    write_claim_set(tmp_path / "engines" / "torch_math" / "claims.json", claims)
    for source in claims.evidence["sm90"].results:
        (tmp_path / source.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / source.path, tmp_path / source.path)
        run_json = run_json_of(REPO_ROOT / source.path)
        if run_json.is_file():
            shutil.copy(run_json, run_json_of(tmp_path / source.path))
    matrix_command.main(_args())
    rc, out = _check(capsys)
    assert rc == 0, out
    fresh = [s.path for s in claims.evidence["sm90"].results if s.level == "full"]
    assert fresh and all(path.startswith("evidence/") for path in fresh)
    (tmp_path / fresh[0]).unlink()
    rc, out = _check(capsys)
    assert rc == 1 and f"torch-math sm90: cites {fresh[0]}, which is missing" in out


def test_matrix_outside_a_workspace_refuses(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert matrix_command.main(_args()) == 2
    assert "matrix writes into a workspace" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_a_bundle_root_with_several_plans_needs_plan(tmp_path, capsys, monkeypatch):
    workspace(tmp_path, monkeypatch)
    root = tmp_path / "bundles"
    shutil.copytree(builtin_bundle_root(), root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    shutil.copy(root / "sdpa_bwd.manifest.json", root / "other.manifest.json")
    assert matrix_command.main(_args()) == 2
    out = capsys.readouterr().out
    assert "several plans (other, sdpa_bwd): choose one with --plan" in out and len(out.splitlines()) == 1
    assert matrix_command.main(argparse.Namespace(check=False, bundles=None, plan="sdpa_bwd", claims_root=None)) == 0


def test_drop_retired_removes_only_the_claims_of_cases_the_bundles_no_longer_hold(tmp_path, capsys, monkeypatch):
    workspace(tmp_path, monkeypatch)
    results, claimable = quick_run(tmp_path / "runs" / "flash.results.jsonl.gz")
    _harvest([results])
    path = claims_path("torch-flash")
    held = read_claim_set(path, "torch-flash")
    retired = "0123456789ab"    # a case a changed plan retired: in no bundle
    claims = {"sm90": held.claims["sm90"] | {retired}}
    unclaimed = {"sm90": {**held.unclaimed.get("sm90", {}), retired: "margin under the harvest rule"}}
    write_claim_set(path, type(held)(held.engine, claims, held.declines, unclaimed, held.evidence))
    matrix_command.main(_args())
    rc, out = _check(capsys)
    assert rc == 1 and f"1 claims name cases not in the bundles: {retired}" in out
    assert "--drop-retired" in out

    capsys.readouterr()
    assert matrix_command.main(argparse.Namespace(**vars(_args()), drop_retired=True)) == 0
    assert f"torch-flash: dropped 1 claims and 1 declines and notes of retired cases from {path}" \
        in capsys.readouterr().out
    after = read_claim_set(path, "torch-flash")
    assert after.claims["sm90"] == held.claims["sm90"] and len(held.claims["sm90"]) == len(claimable)
    assert retired not in after.not_claimed("sm90")
    assert _check(capsys)[0] == 0
