"""Engine-config rows that select no case of the plan (harness.dead_rows): `bundlegen run`
warns of each with the row, `bundlegen lanes --check` reports each as an error; a `plan`
filter may name the built-in plan inside a workspace plan that extends it."""
from __future__ import annotations

import dataclasses
import textwrap

from bundlegen.cli import main
from bundlegen.harness.config import EngineConfig, OverrideRow, load_engine_config
from bundlegen.harness.dead_rows import dead_rows
from bundlegen.manifest import Extends, load_manifest
from tests import harness_support as S

LIVE_AND_DEAD = """\
    [[tolerance_overrides]]
    filters = {{ plan = "{plan}" }}
    rtol = 0.05
    atol = 0.05

    [[tolerance_overrides]]
    filters = {{ item = "AX-NO-SUCH-ITEM*" }}
    rtol = 0.05
    atol = 0.05

    [[test_skips]]
    reason = "PROJ-9: gone long ago"
    filters = [{{ id = "0000gone0000" }}]
    """


def _config_dir(tmp_path, plan: str):
    folder = tmp_path / "engine-config"
    folder.mkdir()
    (folder / "engine.toml").write_text(textwrap.dedent(LIVE_AND_DEAD.format(plan=plan)))
    return folder


def test_run_warns_of_each_row_that_selects_no_case_with_the_row(tmp_path, capsys):
    bundles = tmp_path / "bundles"
    S.write_bundle(bundles, "quick", "a", [S.case_of(1)])
    plan = load_manifest(bundles).plan
    code = main(["run", "--level", "quick", "--engine", S.engine_ref(S.TorchMathEngine), "--device", "cpu",
                 "--bundles", str(bundles), "--out", str(tmp_path / "out"), "--no-isolation", "--quiet",
                 "--engine-config", str(_config_dir(tmp_path, plan))])
    assert code == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, warnings
    assert "tolerance_overrides[1]" in warnings[0] and "AX-NO-SUCH-ITEM*" in warnings[0]
    assert "test_skips[0]" in warnings[1] and "PROJ-9: gone long ago" in warnings[1] and "0000gone0000" in warnings[1]
    assert all(f"selects no case of plan {plan}" in w for w in warnings)


def test_a_plan_filter_may_name_the_built_in_plan_inside_an_extension(tmp_path):
    bundles = tmp_path / "bundles"
    S.write_bundle(bundles, "quick", "a", [S.case_of(1)])
    own = load_manifest(bundles)
    case = S.case_of(1)
    row = OverrideRow(filters={"plan": "sdpa_bwd"}, rtol=0.5, atol=0.5, index=0)
    extension = dataclasses.replace(own, plan="my_attention", extends=Extends("sdpa_bwd", "sha256:0"))
    config = EngineConfig(overrides=(row,), manifest=extension)
    assert config.tolerance_for(case).rtol == 0.5
    assert dead_rows(config, [case]) == ()
    # a plan name that is neither the run's nor the one it extends selects nothing
    other = EngineConfig(overrides=(dataclasses.replace(row, filters={"plan": "another"}),), manifest=extension)
    assert other.tolerance_for(case).rtol != 0.5 and len(dead_rows(other, [case])) == 1


def test_lanes_check_reports_an_engine_row_that_selects_no_case(tmp_path, monkeypatch, capsys):
    (tmp_path / "bundlegen.toml").write_text('engines = ["bundlegen-engines"]\n')
    folder = tmp_path / "bundlegen-engines" / "torch_math"
    folder.mkdir(parents=True)
    (folder / "engine.toml").write_text(textwrap.dedent(LIVE_AND_DEAD.format(plan="sdpa_bwd")))
    (tmp_path / "lanes.yaml").write_text(
        'install: ["pip install wheels/bundlegen-1.0-py3-none-any.whl"]\n'
        "lanes: {cpu: {engine: torch-math, device: cpu, level: quick}}\n")
    monkeypatch.chdir(tmp_path)
    assert len(load_engine_config(folder).overrides) == 2
    assert main(["lanes", "--check"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2, out
    assert "tolerance_overrides[1]" in out[0] and "test_skips[0]" in out[1]
    assert all("selects no case of plan sdpa_bwd" in line for line in out)
