"""The numbers that judge a run cannot be loosened unseen (bundlegen.tolerance_check): a
tolerance TOML edited within the old bounds with its digest rewritten in the manifest, a
symlink to a looser TOML outside the bundle root, an override row above the error model's
ceiling and a stale generated block in the engine TOML each end the run before a worker
starts, with one line (exit 2); a stale block passes only with --allow-stale-tolerances,
and then every tolerance the run resolves records it. Every refusal here comes before a
worker starts, so no test runs a case."""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from bundlegen.cli import main
from bundlegen.graph import canonical_json
from bundlegen.harness.config import EngineConfigError, checked_for_run, load_engine_config
from bundlegen.manifest import load_manifest, manifest_name
from bundlegen.tolerance import Tolerance
from bundlegen.tolerance_block import BEGIN
from bundlegen.tolerance_check import derivation_mismatches
from bundlegen.tolerances import text_digest, tolerances_name
from bundlegen.workspace import builtin_bundle_root

PLAN = "sdpa_bwd"


def _bundle_root(tmp_path, edit=lambda toml: toml, name="bundles"):
    """The built-in manifest and tolerance TOML in a root of their own, the TOML passed
    through `edit` and its digest rewritten in the manifest (what a hand edit followed by a
    regenerated manifest does)."""
    root = tmp_path / name
    root.mkdir()
    toml = edit((builtin_bundle_root() / tolerances_name(PLAN)).read_text(encoding="utf-8"))
    (root / tolerances_name(PLAN)).write_text(toml, encoding="utf-8")
    raw = json.loads((builtin_bundle_root() / manifest_name(PLAN)).read_text(encoding="utf-8"))
    raw["tolerances"]["digest"] = text_digest(toml)
    (root / manifest_name(PLAN)).write_text(canonical_json(raw), encoding="utf-8")
    return root


def _run(capsys, tmp_path, *argv):
    """A run that selects no case: refused with 2, else it ends 5 at once (never a level's run)."""
    code = main(["run", "--level", "quick", "--engine", "torch-math", "--device", "cpu", "--quiet",
                 "--no-server", "-k", "no-such-case", "--out", str(tmp_path / "out"), *argv])
    return code, capsys.readouterr().err


def _looser(toml: str) -> str:
    """bf16-r256's rtol doubled: within every bound the TOML reader knows."""
    return toml.replace("rtol = 0.03125", "rtol = 0.0625", 1)


def test_a_looser_class_with_its_digest_rewritten_is_refused(tmp_path, capsys):
    root = _bundle_root(tmp_path, _looser)
    code, err = _run(capsys, tmp_path, "--bundles", str(root))
    assert code == 2
    line = err.strip()
    assert "\n" not in line
    assert "sdpa_bwd.tolerances.toml: class bf16-r256: rtol is 0.0625, the plan derives 0.03125" in line


def test_the_unedited_numbers_pass_the_check(tmp_path):
    manifest = load_manifest(_bundle_root(tmp_path))
    assert checked_for_run(load_engine_config(None), manifest).manifest == manifest


def test_a_symlink_to_a_looser_toml_outside_the_root_is_refused(tmp_path, capsys):
    root = _bundle_root(tmp_path)
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text((root / tolerances_name(PLAN)).read_text(encoding="utf-8"), encoding="utf-8")
    (root / tolerances_name(PLAN)).unlink()
    (root / tolerances_name(PLAN)).symlink_to(elsewhere)
    code, err = _run(capsys, tmp_path, "--bundles", str(root))
    assert code == 2 and "leads outside the bundle root" in err and "\n" not in err.strip()


def test_every_numeric_field_of_a_class_is_compared():
    """A field the class record gains later (a judge's k, a floor) is compared with no new
    rule: the comparison walks the record's numeric fields."""
    Judged = dataclasses.make_dataclass("Judged", [("k", float, 3.0), ("floor", int, 2)],
                                        bases=(Tolerance,), frozen=True)
    derived = {"c": Judged(0.1, 1e-5, name="c", dtype="bf16", max_reduction=256)}
    assert derivation_mismatches(derived, derived, "t.toml") == []
    for change in ({"k": 4.0}, {"floor": 3}, {"max_reduction": 512}, {"atol": 2e-5}):
        held = {"c": dataclasses.replace(derived["c"], **change)}
        (line,) = derivation_mismatches(held, derived, "t.toml")
        assert f"{next(iter(change))} is {next(iter(change.values()))!r}" in line
    assert "derives no such class" in derivation_mismatches({"d": derived["c"]}, derived, "t.toml")[0]


def _engine_dir(tmp_path, text: str):
    folder = tmp_path / "engine"
    folder.mkdir(exist_ok=True)
    (folder / "engine.toml").write_text(text, encoding="utf-8")
    return folder


def test_an_override_row_above_the_ceiling_is_refused(tmp_path, capsys):
    folder = _engine_dir(tmp_path, '[[tolerance_overrides]]\nfilters = { dtype = "fp16" }\nrtol = 0.5\natol = 1e-5\n')
    code, err = _run(capsys, tmp_path, "--engine-config", str(folder))
    assert code == 2 and "tolerance_overrides[0]: rtol 0.5 is above the ceiling" in err and "for fp16" in err
    folder = _engine_dir(tmp_path, '[[tolerance_overrides]]\nfilters = { item = "X" }\nrtol = 0.01\natol = 1.0\n')
    code, err = _run(capsys, tmp_path, "--engine-config", str(folder))
    assert code == 2 and "atol 1.0 is above the ceiling" in err


@pytest.fixture
def blocked(tmp_path, monkeypatch):
    """An engine config folder whose engine.toml holds a generated block, written by
    `bundlegen tolerances` inside a workspace."""
    (tmp_path / "bundlegen.toml").write_text('bundles = "ws-bundles"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    folder = _engine_dir(tmp_path, '[meta]\nname = "torch-math"\n')
    assert main(["tolerances", "--engine-toml", str(folder / "engine.toml")]) == 0
    assert BEGIN in (folder / "engine.toml").read_text(encoding="utf-8")
    return folder


def test_a_fresh_block_passes(blocked, capsys):
    config = checked_for_run(load_engine_config(blocked), load_manifest(builtin_bundle_root()))
    assert config.stale_note == ""


def test_a_hand_edited_block_is_refused_naming_both_digests_and_the_fix(blocked, tmp_path, capsys):
    toml = blocked / "engine.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace("rtol = 0.03125", "rtol = 0.0625", 1), encoding="utf-8")
    code, err = _run(capsys, tmp_path, "--engine-config", str(blocked))
    digest = load_manifest(builtin_bundle_root()).tolerances_digest
    assert code == 2 and "\n" not in err.strip()
    assert err.count(digest) == 2 and f"bundlegen tolerances --engine-toml {toml}" in err
    assert "--allow-stale-tolerances" in err


def test_a_block_from_an_older_tolerance_toml_is_refused(blocked, tmp_path, capsys):
    """The plan's numbers moved (a regenerate) and the block was not refreshed."""
    toml = blocked / "engine.toml"
    old = "sha256:" + "0" * 64
    digest = load_manifest(builtin_bundle_root()).tolerances_digest
    toml.write_text(toml.read_text(encoding="utf-8").replace(digest, old), encoding="utf-8")
    code, err = _run(capsys, tmp_path, "--engine-config", str(blocked))
    assert code == 2 and old in err and digest in err


def test_allow_stale_tolerances_records_it_in_every_tolerance(blocked):
    toml = blocked / "engine.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace("rtol = 0.03125", "rtol = 0.0625", 1), encoding="utf-8")
    manifest = load_manifest(builtin_bundle_root())
    with pytest.raises(EngineConfigError, match="does not match the tolerance TOML"):
        checked_for_run(load_engine_config(blocked), manifest)
    config = checked_for_run(load_engine_config(blocked), manifest, allow_stale=True)
    from bundlegen.harness.bundles import load_level
    cases = load_level(builtin_bundle_root(), "quick").cases[:20]
    sources = {config.tolerance_for(case).source for case in cases}
    assert sources and all("stale tolerance block allowed" in s for s in sources)
