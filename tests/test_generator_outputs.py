"""What `bundlegen generate` writes: byte-identical bundles and their manifest, --check,
and only into the current workspace."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bundlegen.cli import main as cli
from bundlegen.graph import BundleError, canonical_json, load_bundle
from bundlegen.manifest import load_manifest, manifest_text, read_manifest
from bundlegen.generator import build, build_default, command, report, write
from bundlegen.plans import sdpa_bwd
from bundlegen.workspace import builtin_bundle_root

REPO_ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "sdpa_bwd.manifest.json"
TOLERANCES = "sdpa_bwd.tolerances.toml"


@pytest.fixture(scope="module")
def generated():
    return build_default()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _copy_checked_in(dest: Path) -> Path:
    """The checked-in bundle root, copied to dest/bundles."""
    shutil.copytree(REPO_ROOT / "bundles", dest / "bundles", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return dest / "bundles"


def _args(**flags) -> argparse.Namespace:
    return argparse.Namespace(dry_run=flags.get("dry_run", False), report=flags.get("report", False),
                              check=flags.get("check", False))


# ----------------------------------------------------------------------------- determinism
def test_regeneration_is_byte_identical(generated, tmp_path):
    write.write(generated, tmp_path / "a")
    write.write(build(), tmp_path / "b")
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert a == b and len(a) > 4


def test_regeneration_does_not_depend_on_string_hashing(generated, tmp_path):
    """allpairspy and every set/dict the generator uses must not follow PYTHONHASHSEED."""
    script = ("import sys; from pathlib import Path; from generator import build, write; "
              "write.write(build(), Path(sys.argv[1]))")
    env = {**os.environ, "PYTHONHASHSEED": "4242", "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "other")], check=True, env=env, cwd=REPO_ROOT)
    write.write(generated, tmp_path / "here")
    assert _tree(tmp_path / "here") == _tree(tmp_path / "other")


def test_bundles_are_canonical_and_load_back(generated):
    texts = write.bundle_texts(generated)
    by_id = {c.id: c for c in generated.cases}
    seen = 0
    for rel, text in texts.items():
        raw = json.loads(text)
        assert canonical_json(raw) == text
        assert rel == f"{raw['level']}/sdpa_bwd/{raw['group']}.json"
        bundle, errors = load_bundle(rel, text=text)
        assert errors == []
        for case in bundle.cases:
            assert case == by_id[case.id]
            seen += 1
    assert seen == len(generated.cases)


# ----------------------------------------------------------------------------- --check
def test_every_case_names_its_tolerance_class(generated):
    """Probes too: the bundle is the contract, the harness never asks the plan."""
    assert all(c.tolerance_class in generated.plan.tolerance_classes for c in generated.cases)
    assert any(c.purpose == "probe" for c in generated.cases)


def test_manifest_carries_what_the_harness_claims_and_mutants_need(generated):
    texts = write.planned_texts(generated)
    manifest = read_manifest(MANIFEST, text=texts[MANIFEST], tolerances_text=texts[TOLERANCES])
    plan = generated.plan
    assert manifest.plan == "sdpa_bwd" and manifest.level_names == tuple(lv.name for lv in plan.levels)
    assert manifest.levels[0].per_case_cpu_seconds == plan.levels[0].per_case_cpu_seconds
    assert {k: (t.rtol, t.atol) for k, t in manifest.tolerance_classes.items()} == {
        k: (t.rtol, t.atol) for k, t in plan.tolerance_classes.items()}
    assert manifest.cost_model == plan.cost_model
    assert manifest.min_claim_margin == sdpa_bwd.MIN_CLAIM_MARGIN
    assert manifest.cpu_case_limit_s == sdpa_bwd.CPU_CASE_LIMIT_S
    assert [a.name for a in manifest.axes] == [a.name for a in plan.padded.axes] + [
        f"ragged-{a.name}" for a in plan.ragged.axes]
    assert [a.name for a in manifest.axes if a.core] == [a.name for a in plan.padded.axes if a.core]
    assert {g.item for g in manifest.gates} == {g.item for g in plan.gated}
    listed = {i for a in manifest.axes for i in a.items} | {i.id for s in manifest.sections for i in s.items}
    assert listed <= set(generated.items)
    assert manifest_text(manifest) == texts[MANIFEST]          # reads back to the same text


def test_manifest_digest_follows_the_bundles(generated):
    texts = write.bundle_texts(generated)
    before = write.build_manifest(generated, texts).digest
    rel = sorted(texts)[0]
    changed = {**texts, rel: texts[rel].replace('"version": 1', '"version": 1 ', 1)}
    assert write.build_manifest(generated, changed).digest != before
    assert before.startswith("sha256:") and before == write.build_manifest(generated).digest


def test_check_passes_on_the_checked_in_tree(capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    assert command.main(_args(check=True)) == 0
    assert "match the plan" in capsys.readouterr().out


def test_check_fails_on_a_hand_edited_bundle(generated, tmp_path, capsys):
    root = _copy_checked_in(tmp_path)
    assert command.run(_args(check=True), [generated], root) == 0
    target = root / "quick/sdpa_bwd/regressions.json"
    raw = json.loads(target.read_text(encoding="utf-8"))
    raw["cases"][0]["graph"]["tensors"]["dq"]["strides"][3] = 2
    target.write_text(canonical_json(raw), encoding="utf-8")
    capsys.readouterr()
    assert command.run(_args(check=True), [generated], root) == 1
    err = capsys.readouterr().err
    assert "quick/sdpa_bwd/regressions.json: 1 case(s) differ" in err


def test_check_fails_on_missing_stale_and_manifest_drift(generated, tmp_path):
    root = _copy_checked_in(tmp_path)
    (root / "pr/sdpa_bwd/pairs-core.json").unlink()
    (root / "pr/sdpa_bwd/extra.json").write_text("{}\n", encoding="utf-8")
    manifest = root / MANIFEST
    raw = json.loads(manifest.read_text(encoding="utf-8"))
    raw["tolerances"]["digest"] = "sha256:" + "0" * 64        # not the TOML's
    manifest.write_text(canonical_json(raw), encoding="utf-8")
    toml = root / TOLERANCES
    toml.write_text(toml.read_text(encoding="utf-8").replace("rtol = 0.03125", "rtol = 0.05", 1), encoding="utf-8")
    drift = "\n".join(write.check(generated, root))
    assert "pairs-core.json: missing" in drift
    assert "extra.json: not produced by the plan" in drift
    assert f"{MANIFEST}: differs in tolerances" in drift
    assert f"{TOLERANCES}: differs from the plan's tolerance classes" in drift
    toml.unlink()
    assert f"{TOLERANCES}: missing" in "\n".join(write.check(generated, root))
    manifest.unlink()
    assert f"{MANIFEST}: missing" in "\n".join(write.check(generated, root))


def test_write_then_check_round_trips_and_removes_stale_files(generated, tmp_path):
    stale = tmp_path / "full/sdpa_bwd/old.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}\n", encoding="utf-8")
    result = write.write(generated, tmp_path)
    assert result.removed == ("full/sdpa_bwd/old.json",) and not stale.exists()
    assert (tmp_path / MANIFEST).is_file() and load_manifest(tmp_path).plan == "sdpa_bwd"
    assert write.check(generated, tmp_path) == []
    assert write.write(generated, tmp_path).written == ()


def test_dry_run_report_writes_nothing(generated, tmp_path, capsys):
    assert command.run(_args(dry_run=True, report=True), [generated], None) == 0
    assert list(tmp_path.iterdir()) == []
    out = capsys.readouterr().out
    assert out == report.render(generated, written=False)


# ----------------------------------------------------------------------------- workspaces
def test_generate_writes_into_the_current_workspace_only(tmp_path, monkeypatch, capsys):
    (tmp_path / "bundlegen.toml").write_text('bundles = "out/bundles"\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    builtin = _tree(builtin_bundle_root())
    assert cli(["generate"]) == 0
    written = tmp_path / "out/bundles"
    assert (written / MANIFEST).is_file() and (written / "quick/sdpa_bwd/axes.json").is_file()
    assert _tree(written) == {k: v for k, v in builtin.items() if not k.endswith((".py", ".pyc"))}
    assert cli(["generate", "--check"]) == 0
    assert _tree(builtin_bundle_root()) == builtin


def test_generate_outside_a_workspace_refuses_but_the_dry_run_report_works(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli(["generate"]) == 2
    err = capsys.readouterr().err
    assert "is not inside one" in err and len(err.strip().splitlines()) == 1
    assert cli(["generate", "--check"]) == 2
    capsys.readouterr()
    assert cli(["generate", "--dry-run", "--report"]) == 0
    assert "all-pairs" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_a_workspace_plan_is_imported_from_the_workspace_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "bundlegen.toml").write_text('plans = ["no_such_plan_module"]\n')
    monkeypatch.chdir(tmp_path)
    assert cli(["generate", "--dry-run"]) == 2
    assert "cannot import 'no_such_plan_module'" in capsys.readouterr().err
    (tmp_path / "no_such_plan_module.py").write_text("X = 1\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli(["generate", "--dry-run"]) == 2
    assert "no_such_plan_module: defines no PLAN" in capsys.readouterr().err


def test_report_shows_what_the_issue_asks_for(generated):
    text = report.render(generated)
    nightly = next(p for p in generated.proofs if p.level == "nightly")
    assert f"nightly: all-pairs: {nightly.total} of {nightly.total}" in text
    assert "legality violations in written cases: 0" in text
    assert "0 without cases, 0 cases without items" in text
    for rule in sdpa_bwd.RULES:
        assert rule.name in text
    flowing = " ".join(text.split())    # a line over 120 columns is folded at spaces
    for gated in sdpa_bwd.GATED:
        assert gated.item in text and gated.gate in flowing


def test_report_predicts_each_level_run_with_its_start(generated):
    """run s = the level's and lower levels' predicted case seconds + the run start."""
    lines = report.render(generated).splitlines()
    header = next(line for line in lines if line.startswith("level ") and "run s" in line)
    columns = header.split("  ")
    columns = [c.strip() for c in columns if c.strip()]
    start = generated.plan.cost_model["h200"].run_start_s
    assert start > 0
    for level in generated.plan.levels:
        row = next(line for line in lines if line.startswith(level.name + " "))
        cells = row.split()
        cumulative, run = float(cells[columns.index("cumul s")]), float(cells[columns.index("run s")])
        assert run == pytest.approx(cumulative + start, abs=0.1)   # both cells rounded to 0.1




# ----------------------------------------------------------------------------- corrupted trees, unsafe targets
def test_check_reads_files_as_a_run_does(generated, tmp_path):
    """A CRLF tolerance TOML (its digest the LF one's) is refused by every run: --check
    reports it too, and a FIFO, a folder or bytes that are not UTF-8 are one drift line each,
    with no hang and no traceback."""
    import os
    import signal
    root = _copy_checked_in(tmp_path)
    toml = root / TOLERANCES
    toml.write_bytes(toml.read_bytes().replace(b"\n", b"\r\n"))
    assert any(line.startswith(f"{TOLERANCES}: differs") for line in write.check(generated, root))
    toml.unlink()
    os.mkfifo(toml)
    (root / MANIFEST).write_bytes(b"\xff\xfe not utf-8")
    bundle = root / "quick/sdpa_bwd/regressions.json"
    bundle.write_text('{"cases": [{"id": []}]}', encoding="utf-8")
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("--check hung")))
    signal.alarm(90)   # a FIFO read blocks forever; the whole tree's check takes seconds
    try:
        drift = "\n".join(write.check(generated, root))
    finally:
        signal.alarm(0)
    assert f"{TOLERANCES}: cannot read" in drift and "FIFO" in drift
    assert f"{MANIFEST}: cannot read" in drift
    assert "quick/sdpa_bwd/regressions.json: not a bundle" in drift


def test_write_refuses_a_fifo_and_a_symlink_out_of_the_root_and_writes_atomically(generated, tmp_path):
    import os
    from bundlegen.safe_write import UnsafeWrite
    root = tmp_path / "root"
    write.write(generated, root)
    toml = root / TOLERANCES
    toml.write_text("stale\n", encoding="utf-8")
    os.link(toml, tmp_path / "old")                  # an in-place write would change this one too
    write.write(generated, root)
    assert (tmp_path / "old").read_text(encoding="utf-8") == "stale\n"
    assert not [p for p in root.iterdir() if p.name.startswith(".")]     # no temporary file left
    outside = tmp_path / "outside.toml"
    outside.write_text("theirs\n", encoding="utf-8")
    toml.unlink()
    toml.symlink_to(outside)
    with pytest.raises(UnsafeWrite, match="refusing to write outside"):
        write.write(generated, root)
    assert outside.read_text(encoding="utf-8") == "theirs\n"
    toml.unlink()
    os.mkfifo(toml)
    with pytest.raises(UnsafeWrite, match="a FIFO, not a regular file"):
        write.write(generated, root)


def test_report_sets_each_cost_class_beside_its_last_measurement(generated):
    """Per cost class and level: the level's prediction, and the last calibration's cases,
    measured and predicted seconds from plan.cost_measured, with its source."""
    from bundlegen.cost import predict

    text = report.render(generated)
    lines, words = text.splitlines(), " ".join(text.split())    # a long line is folded at 120 columns
    plan = generated.plan
    for name, measured in plan.cost_measured.items():
        assert f" {name}: measured from {measured.source}" in words
        for level, cases, seconds, there in measured.levels:
            row = next(line.split() for line in lines if line.split()[:2] == [name, level])
            own = generated.only_level(level)
            predicted = sum(predict(c.graph, name, plan.cost_model, probe=c.purpose == "probe").predicted_s
                            for c in own)
            assert float(row[2]) == pytest.approx(predicted, abs=0.06)
            assert row[3:6] == [str(cases), f"{seconds:.1f}", f"{there:.1f}"]
            assert row[6] == f"{(there - seconds) / seconds:+.0%}"
    unmeasured = sorted(set(plan.cost_model) - set(plan.cost_measured))
    assert all(f"  {name}: not measured yet" in lines for name in unmeasured)
