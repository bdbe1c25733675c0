"""What `bundlegen generate` writes: byte-identical bundles, --check, the TOML block."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

from bundlegen.graph import canonical_json, load_bundle
from bundlegen.generator import build, build_default, command, report, write
from bundlegen.generator.paths import REPO_ROOT, engine_toml_relpath
from bundlegen.plans import sdpa_bwd


@pytest.fixture(scope="module")
def generated():
    return build_default()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _copy_checked_in(generated, dest: Path) -> None:
    shutil.copytree(REPO_ROOT / "bundles", dest / "bundles")
    for directory in generated.plan.engine_toml_dirs.values():
        rel = engine_toml_relpath(directory)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, dest / rel)


def _args(root: Path, **flags) -> argparse.Namespace:
    return argparse.Namespace(root=root, dry_run=flags.get("dry_run", False),
                              report=flags.get("report", False), check=flags.get("check", False))


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
        assert rel == f"bundles/{raw['level']}/sdpa_bwd/{raw['group']}.json"
        bundle, errors = load_bundle(rel, text=text)
        assert errors == []
        for case in bundle.cases:
            assert case == by_id[case.id]
            seen += 1
    assert seen == len(generated.cases)


# ----------------------------------------------------------------------------- --check
def test_check_passes_on_the_checked_in_tree(capsys):
    assert command.main(_args(REPO_ROOT, check=True)) == 0
    assert "match the plan" in capsys.readouterr().out


def test_check_fails_on_a_hand_edited_bundle(generated, tmp_path, capsys):
    _copy_checked_in(generated, tmp_path)
    assert command.run(_args(tmp_path, check=True), generated) == 0
    target = tmp_path / "bundles/quick/sdpa_bwd/regressions.json"
    raw = json.loads(target.read_text(encoding="utf-8"))
    raw["cases"][0]["graph"]["tensors"]["dq"]["strides"][3] = 2
    target.write_text(canonical_json(raw), encoding="utf-8")
    capsys.readouterr()
    assert command.run(_args(tmp_path, check=True), generated) == 1
    err = capsys.readouterr().err
    assert "bundles/quick/sdpa_bwd/regressions.json: 1 case(s) differ" in err


def test_check_fails_on_missing_stale_and_toml_drift(generated, tmp_path):
    _copy_checked_in(generated, tmp_path)
    (tmp_path / "bundles/pr/sdpa_bwd/pairs-core.json").unlink()
    (tmp_path / "bundles/pr/sdpa_bwd/extra.json").write_text("{}\n", encoding="utf-8")
    toml = tmp_path / engine_toml_relpath("triton")
    toml.write_text(toml.read_text(encoding="utf-8").replace("rtol = 0.03125", "rtol = 0.05", 1),
                    encoding="utf-8")
    drift = "\n".join(write.check(generated, tmp_path))
    assert "pairs-core.json: missing" in drift
    assert "extra.json: not produced by the plan" in drift
    assert "engines/triton/engine.toml: tolerance block differs" in drift


def test_write_then_check_round_trips_and_removes_stale_files(generated, tmp_path):
    stale = tmp_path / "bundles/full/sdpa_bwd/old.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}\n", encoding="utf-8")
    result = write.write(generated, tmp_path)
    assert result.removed == ("bundles/full/sdpa_bwd/old.json",) and not stale.exists()
    assert write.check(generated, tmp_path) == []
    assert write.write(generated, tmp_path).written == ()


def test_dry_run_report_writes_nothing(generated, tmp_path, capsys):
    assert command.run(_args(tmp_path, dry_run=True, report=True), generated) == 0
    assert list(tmp_path.iterdir()) == []
    out = capsys.readouterr().out
    assert out == report.render(generated)


def test_report_shows_what_the_issue_asks_for(generated):
    text = report.render(generated)
    nightly = next(p for p in generated.proofs if p.level == "nightly")
    assert f"nightly: all-pairs: {nightly.total} of {nightly.total}" in text
    assert "legality violations in written cases: 0" in text
    assert "0 without cases, 0 cases without items" in text
    for rule in sdpa_bwd.RULES:
        assert rule.name in text
    for gated in sdpa_bwd.GATED:
        assert gated.item in text and gated.gate in text


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


# ----------------------------------------------------------------------------- TOML block
ENGINE_FILE = """# hand-written header, kept as is
[meta]
name = "triton"   # trailing comment

# BEGIN sdpa_bwd tolerance classes (generated by bundlegen generate; do not edit)
[[tolerance_overrides]]
filters = { plan = "sdpa_bwd", tolerance_class = "stale" }
rtol = 1.0
atol = 1.0
# END sdpa_bwd tolerance classes

[[tolerance_overrides]]
filters = { plan = "sdpa_bwd", id = "abc*" }   # an engine author's own row
rtol = 0.5
atol = 0.0

[[test_skips]]
filters = { id = "abc123def456" }
reason = "TICKET-12: what goes wrong"
"""


def test_toml_block_round_trips_without_touching_other_lines():
    plan = sdpa_bwd.PLAN
    block = write.tolerance_block(plan)
    new = write.splice_block(ENGINE_FILE, block, "triton", plan.name)
    old_lines, new_lines = ENGINE_FILE.splitlines(keepends=True), new.splitlines(keepends=True)
    begin = old_lines.index(write.begin_marker(plan.name) + "\n")
    end = old_lines.index(write.end_marker(plan.name) + "\n")
    tail = len(old_lines) - end - 1
    assert new_lines[:begin] == old_lines[:begin]
    assert new_lines[len(new_lines) - tail:] == old_lines[end + 1:]
    assert write.extract_block(new, plan.name) == block
    assert write.splice_block(new, block, "triton", plan.name) == new        # idempotent
    rows = tomlkit.parse(new)["tolerance_overrides"]
    generated_rows = [r for r in rows if "tolerance_class" in r["filters"]]
    assert [(r["filters"]["tolerance_class"], r["rtol"], r["atol"]) for r in generated_rows] == [
        (c.name, c.rtol, c.atol) for c in plan.tolerance_classes.values()]
    assert all(r["filters"]["plan"] == "sdpa_bwd" for r in generated_rows)
    assert rows[-1]["filters"]["id"] == "abc*"        # the author's row still comes last


def test_toml_block_is_appended_or_a_file_created():
    plan = sdpa_bwd.PLAN
    block = write.tolerance_block(plan)
    created = write.splice_block(None, block, "torch-math", plan.name)
    assert created.startswith('[meta]\nname = "torch-math"\n\n') and created.endswith(block)
    appended = write.splice_block('[meta]\nname = "x"\n', block, "x", plan.name)
    assert appended == '[meta]\nname = "x"\n\n' + block
    with pytest.raises(ValueError):
        write.splice_block(block + block, block, "x", plan.name)   # two BEGIN lines


def test_checked_in_toml_files_carry_the_block(generated):
    for directory in generated.plan.engine_toml_dirs.values():
        text = (REPO_ROOT / engine_toml_relpath(directory)).read_text(encoding="utf-8")
        assert write.extract_block(text, "sdpa_bwd") == write.tolerance_block(generated.plan)
        assert "tolerance_overrides" in tomlkit.parse(text)
