"""The bundle manifest (bundlegen.manifest): the checked-in one reads back to its own text;
malformed input names the file and the field; a root with several plans needs a choice."""
from __future__ import annotations

import json
import shutil

import pytest

from bundlegen.graph import BundleError
from bundlegen.harness import bundles as B
from bundlegen.manifest import load_manifest, manifest_path, manifest_text, plans_in, read_manifest
from bundlegen.tolerances import text_digest, tolerances_name
from bundlegen.workspace import builtin_bundle_root

NAME = "sdpa_bwd.manifest.json"


@pytest.fixture
def raw():
    return json.loads((builtin_bundle_root() / NAME).read_text(encoding="utf-8"))


def write(root, raw, name=NAME):
    """The manifest `raw` as `name` in `root`, with the built-in tolerance TOML beside it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(json.dumps(raw), encoding="utf-8")
    toml = builtin_bundle_root() / tolerances_name("sdpa_bwd")
    (root / toml.name).write_bytes(toml.read_bytes())
    return root / name


def _as_plan(root, raw, plan):
    """`raw` as the manifest of `plan`, with a tolerance TOML of its own written into `root`."""
    toml = (builtin_bundle_root() / tolerances_name("sdpa_bwd")).read_text(encoding="utf-8").replace(
        'plan = "sdpa_bwd"', f'plan = "{plan}"')
    root.mkdir(parents=True, exist_ok=True)
    (root / tolerances_name(plan)).write_text(toml, encoding="utf-8")
    return {**raw, "plan": plan, "tolerances": {**raw["tolerances"], "file": tolerances_name(plan),
                                                "digest": text_digest(toml)}}


def test_the_checked_in_manifest_reads_back_to_its_text():
    manifest = load_manifest(builtin_bundle_root())
    assert manifest_text(manifest) == (builtin_bundle_root() / NAME).read_text(encoding="utf-8")
    assert manifest.levels_upto("pr") == ("quick", "pr")
    with pytest.raises(ValueError, match="unknown level 'weekly'"):
        manifest.levels_upto("weekly")
    assert "AX-DTYPE-BF16" in manifest.default_items()


@pytest.mark.parametrize("change, field, message", [
    (lambda r: r.pop("tolerances"), "tolerances", "missing"),
    (lambda r: r["tolerances"].update(digest="sha256:" + "0" * 64), "tolerances.digest", "its sha256 differs"),
    (lambda r: r["tolerances"]["classes"].pop(), "tolerances.classes", "holds"),
    (lambda r: r["tolerances"].update(file="../elsewhere.toml"), "tolerances.file",
     "expected 'sdpa_bwd.tolerances.toml'"),
    (lambda r: r["cost_model"]["cpu"].pop("overhead_s"), "cost_model.cpu.overhead_s", "expected a number"),
    (lambda r: r["levels"][1].update(name=3), "levels[1].name", "expected str"),
    (lambda r: r["levels"].append(dict(r["levels"][0])), "levels", "distinct level names"),
    # a level names a folder under the bundle root, and the plan orders the levels
    (lambda r: r["levels"][1].update(name="../escape"), "levels[1].name", "not a level name"),
    (lambda r: r["levels"][0].update(name="/abs"), "levels[0].name", "not a level name"),
    (lambda r: r["levels"].reverse(), "levels[1]", "levels go lowest first"),
    (lambda r: r["axes"][0]["items"].pop(), "axes[0]", "pair up"),
    (lambda r: r["sections"][0]["items"][0].pop("title"), "sections[0].items[0].title", "missing"),
    (lambda r: r.update(min_claim_margin=True), "min_claim_margin", "expected a number"),
    (lambda r: r.update(version=1), "version", "unsupported version 1"),
    (lambda r: r.update(plan="other"), "plan", "is 'other' but the file is named"),
    # a misspelt key is refused, not ignored
    (lambda r: r.update(left_bnd=1), "left_bnd", "unknown key"),
    (lambda r: r["levels"][0].update(per_case_byts=1), "levels[0].per_case_byts", "unknown key"),
    (lambda r: r["cost_model"]["cpu"].update(bytes_per_sec=1e9), "cost_model.cpu.bytes_per_sec", "unknown key"),
    (lambda r: r["cost_model"].update(tpu=r["cost_model"]["cpu"]), "cost_model.tpu", "unknown key"),
    (lambda r: r["tolerances"].update(rtol=1e9), "tolerances.rtol", "unknown key"),
    (lambda r: r["gates"][0].update(planned=1), "gates[0].planned", "unknown key"),
    # limits and rates that would skip every case
    (lambda r: r["levels"][0].update(per_case_bytes=0), "levels[0].per_case_bytes", "whole number > 0"),
    (lambda r: r["levels"][0].update(per_case_bytes=-1), "levels[0].per_case_bytes", "whole number > 0"),
    (lambda r: r["levels"][0].update(per_case_seconds=0), "levels[0].per_case_seconds", "number > 0"),
    (lambda r: r["levels"][0].update(per_case_cpu_seconds=0), "levels[0].per_case_cpu_seconds", "number > 0"),
    (lambda r: r.update(cpu_case_limit_s=0), "cpu_case_limit_s", "number > 0"),
    (lambda r: r.update(cpu_case_limit_s=10 ** 400), "cpu_case_limit_s", "finite"),
    (lambda r: r["cost_model"]["cpu"].update(bytes_per_s=0), "cost_model.cpu.bytes_per_s", "below the floor"),
    (lambda r: r["cost_model"]["cpu"].update(engine_flops_per_s=1e-9), "cost_model.cpu.engine_flops_per_s",
     "below the floor"),
    (lambda r: r["cost_model"]["h200"].update(oracle_flops_per_s=0.5), "cost_model.h200.oracle_flops_per_s",
     "below the floor"),
    (lambda r: r["cost_model"].pop("cpu"), "cost_model.cpu", "missing"),
])
def test_malformed_manifest_names_file_and_field(tmp_path, raw, change, field, message):
    change(raw)
    path = write(tmp_path, raw)
    with pytest.raises(BundleError, match=message) as info:
        load_manifest(tmp_path)
    assert info.value.field == field and info.value.file == str(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("edit, message", [
    # the standard decoder keeps the last of two equal keys: a looser second value would hide
    (lambda t: t.replace('"cpu_case_limit_s": 30.0', '"cpu_case_limit_s": 30.0, "cpu_case_limit_s": 1e-9'),
     "duplicate key 'cpu_case_limit_s'"),
    (lambda t: t.replace('"cpu_case_limit_s": 30.0', '"cpu_case_limit_s": NaN'), "NaN is not a JSON number"),
    (lambda t: t.replace('"gates": [', '"gates": ' + "[" * 100_000 + "]" * 100_000 + ', "x": ['),
     "nested too deep"),
])
def test_a_manifest_text_the_standard_decoder_would_take_loosely_is_refused(tmp_path, raw, edit, message):
    write(tmp_path, raw)
    text = json.dumps(raw)
    assert '"cpu_case_limit_s": 30.0' in text and '"gates": [' in text
    (tmp_path / NAME).write_text(edit(text), encoding="utf-8")
    with pytest.raises(BundleError, match=message) as info:
        load_manifest(tmp_path)
    assert info.value.file == str(tmp_path / NAME) and "\n" not in str(info.value)


def test_unreadable_manifest_names_the_file(tmp_path):
    (tmp_path / NAME).write_text("{not json", encoding="utf-8")
    with pytest.raises(BundleError, match="bad JSON at line 1") as info:
        load_manifest(tmp_path)
    assert info.value.file == str(tmp_path / NAME)


def test_choosing_the_plan_of_a_root(tmp_path, raw):
    with pytest.raises(BundleError, match="not a generated bundle root"):
        manifest_path(tmp_path)
    write(tmp_path, raw)
    assert load_manifest(tmp_path).plan == "sdpa_bwd"
    write(tmp_path, _as_plan(tmp_path, raw, "other"), "other.manifest.json")
    assert plans_in(tmp_path) == ("other", "sdpa_bwd")
    with pytest.raises(BundleError, match=r"several plans \(other, sdpa_bwd\): choose one with --plan"):
        load_manifest(tmp_path)
    assert load_manifest(tmp_path, "other").plan == "other"
    with pytest.raises(BundleError, match=r"no manifest for plan 'nope' \(plans there: other, sdpa_bwd\)"):
        load_manifest(tmp_path, "nope")


def test_the_harness_loads_the_chosen_plans_bundles(tmp_path, raw):
    root = tmp_path / "bundles"
    shutil.copytree(builtin_bundle_root(), root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    quick = sum(len(json.loads(p.read_text(encoding="utf-8"))["cases"])
                for p in (root / "quick" / "sdpa_bwd").glob("*.json"))
    (root / "quick" / "sdpa_bwd").rename(root / "quick" / "tiny")
    for level in ("pr", "nightly", "full"):
        shutil.rmtree(root / level)
    (root / NAME).rename(root / "tiny.manifest.json")
    write(root, _as_plan(root, raw, "tiny"), "tiny.manifest.json")
    headers = B.load_level(root, "full")        # the files still say plan sdpa_bwd
    assert headers.cases == () and {e.field for e in headers.errors} == {"plan"}
    for path in (root / "quick" / "tiny").glob("*.json"):
        path.write_text(path.read_text(encoding="utf-8").replace('"plan": "sdpa_bwd"', '"plan": "tiny"'),
                        encoding="utf-8")
    loaded = B.load_level(root, "full")
    assert loaded.manifest.plan == "tiny" and len(loaded.cases) == quick > 100 and not loaded.errors
    assert all(c.tolerance_class for c in loaded.cases)
    with pytest.raises(BundleError, match="no manifest for plan 'sdpa_bwd'"):
        B.load_level(root, "quick", "sdpa_bwd")


def test_run_with_several_plans_needs_plan(tmp_path, capsys):
    from bundlegen.cli import main
    from tests import harness_support as S

    root = tmp_path / "bundles"
    S.write_bundle(root, "quick", "a", [S.case_of(1)])
    shutil.copy(root / NAME, root / "other.manifest.json")
    argv = ["run", "--level", "quick", "--engine", "torch-math", "--device", "cpu", "--bundles", str(root),
            "--out", str(tmp_path / "out"), "--no-isolation", "--quiet"]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())      # rich wraps the line
    assert "field plan: holds several plans (other, sdpa_bwd): choose one with --plan" in err
    assert main([*argv, "--plan", "sdpa_bwd"]) == 0
    record = json.loads((tmp_path / "out" / "results.jsonl").read_text(encoding="utf-8"))
    assert record["tolerance"]["source"] == f"manifest class {record['tolerance_class']}"


def test_the_manifest_lists_the_boundary_classes():
    from bundlegen.plans import sdpa_bwd
    manifest = load_manifest(builtin_bundle_root())
    section = next(s for s in manifest.sections if s.title == "boundary classes")
    assert [(i.id, i.title) for i in section.items] == [(c.item, c.title) for c in sdpa_bwd.BOUNDARY_CLASSES]


# ----------------------------------------------------------------------------- the tolerance TOML
TOML = tolerances_name("sdpa_bwd")


def _with_toml(root, raw, text):
    """`raw` and a tolerance TOML of `text` in `root`, the manifest recording its digest."""
    write(root, raw)
    (root / TOML).write_text(text, encoding="utf-8")
    raw["tolerances"]["digest"] = text_digest(text)
    (root / NAME).write_text(json.dumps(raw), encoding="utf-8")


def test_the_harness_numbers_come_from_the_toml(tmp_path, raw):
    """Change a class's rtol in the TOML (and the digest to match): the manifest loader
    returns the TOML's number, so the TOML is where the harness reads it."""
    text = (builtin_bundle_root() / TOML).read_text(encoding="utf-8")
    block = text.index("[classes.bf16-r256]")
    at = text.index("\nrtol = 0.03125", block) + 1
    _with_toml(tmp_path, raw, text[:at] + "rtol = 0.5" + text[at + len("rtol = 0.03125"):])
    classes = load_manifest(tmp_path).tolerance_classes
    assert classes["bf16-r256"].rtol == 0.5
    assert classes["bf16-r1k"].rtol == load_manifest(builtin_bundle_root()).tolerance_classes["bf16-r1k"].rtol


@pytest.mark.parametrize("old, new, field, message", [
    ("rtol = 0.03125", 'rtol = "x"', "classes.bf16-r256.rtol", "expected a finite number"),
    ("atol = 1e-05", "atol = -1.0", "classes.bf16-r256.atol", "expected a finite number"),
    ('dtype = "bf16"', "dtype = 16", "classes.bf16-r256.dtype", "expected one of"),
    ("max_reduction = 256", "max_reduction = 0", "classes.bf16-r256.max_reduction", "whole number"),
    ('plan = "sdpa_bwd"', 'plan = "other"', "plan", "expected 'sdpa_bwd'"),
    ("[classes.bf16-r256]", "[classes.bf16-r256", "-", "bad TOML"),
    # numbers that would pass a wrong gradient, or nothing
    ("rtol = 0.03125", "rtol = 1e9", "classes.bf16-r256.rtol", "more than 1"),
    ("rtol = 0.03125", "rtol = nan", "classes.bf16-r256.rtol", "expected a finite number"),
    ("rtol = 0.03125", "rtol = inf", "classes.bf16-r256.rtol", "expected a finite number"),
    ("rtol = 0.03125", "rtol = 0.0", "classes.bf16-r256.rtol", "expected a finite number > 0"),
    ("atol = 1e-05", "atol = nan", "classes.bf16-r256.atol", "expected a finite number"),
    ("atol = 1e-05", "atol = 2.0", "classes.bf16-r256.atol", "more than 1"),
    ('dtype = "bf16"', 'dtype = "bf8"', "classes.bf16-r256.dtype", "expected one of"),
    ('plan = "sdpa_bwd"', 'plan = "sdpa_bwd"\nrtol = 1e9', "rtol", "unknown key"),
])
def test_a_malformed_toml_names_its_file_and_field(tmp_path, raw, old, new, field, message):
    text = (builtin_bundle_root() / TOML).read_text(encoding="utf-8")
    block = text.index("[classes.bf16-r256]")
    at = text.index(f"\n{old}", block - 1 if old != 'plan = "sdpa_bwd"' else 0) + 1    # a line, not a comment
    _with_toml(tmp_path, raw, text[:at] + new + text[at + len(old):])
    with pytest.raises(BundleError, match=message) as info:
        load_manifest(tmp_path)
    assert info.value.field == field and info.value.file == str(tmp_path / TOML)


def test_a_missing_toml_names_the_manifest_field(tmp_path, raw):
    write(tmp_path, raw)
    (tmp_path / TOML).unlink()
    with pytest.raises(BundleError, match="cannot read") as info:
        load_manifest(tmp_path)
    assert info.value.field == "tolerances.file" and info.value.file == str(tmp_path / NAME)
