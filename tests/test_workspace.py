"""Workspaces: finding one, its keys and errors, where engine configuration is read from,
engine names; and a kernel project's whole adoption path (docs/ADOPTING.md) in a
temporary workspace with an outside engine, leaving bundlegen's own tree untouched."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from bundlegen import workspace as W
from bundlegen.engines.registry import EngineNotFound, engine_class

REPO = Path(__file__).resolve().parents[1]


def test_the_nearest_workspace_file_wins(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.bundlegen]\nmatrix = "M.md"\n')
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    ws = W.find_workspace(inner)
    assert ws.root == tmp_path.resolve() and ws.matrix == tmp_path.resolve() / "M.md"
    (tmp_path / "a" / W.CONFIG_NAME).write_text('engines = ["cfg"]\n')
    ws = W.find_workspace(inner)
    assert ws.root == (tmp_path / "a").resolve()
    assert ws.engine_dirs == ((tmp_path / "a").resolve() / "cfg",)


def test_a_pyproject_without_the_table_is_no_workspace(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert W.find_workspace(tmp_path) is None
    with pytest.raises(W.WorkspaceError, match="is not inside one"):
        W.require_workspace("harvest", tmp_path)


@pytest.mark.parametrize("text, where", [
    ('bundle = "b"\n', "bundle: unknown key"),
    ('engines = "e"\n', "engines: expected a list"),
    ('engines = []\n', "engines: name at least one"),
    ('matrix = 3\n', "matrix: expected a path"),
    ('matrix = \n', W.CONFIG_NAME),
])
def test_a_malformed_workspace_file_names_file_and_key(tmp_path, text, where):
    (tmp_path / W.CONFIG_NAME).write_text(text)
    with pytest.raises(W.WorkspaceError) as err:
        W.find_workspace(tmp_path)
    assert str(tmp_path / W.CONFIG_NAME) in str(err.value) and where in str(err.value)
    assert "\n" not in str(err.value)


def test_engine_configuration_comes_from_the_workspace_then_the_package(tmp_path):
    (tmp_path / W.CONFIG_NAME).write_text('engines = ["cfg"]\n')
    assert W.engine_config_dir("triton", start=tmp_path) == W.builtin_engine_dir("triton")
    (tmp_path / "cfg" / "triton").mkdir(parents=True)
    assert W.engine_config_dir("triton", start=tmp_path) == tmp_path.resolve() / "cfg" / "triton"
    assert W.engine_config_dir("triton", explicit=tmp_path / "x", start=tmp_path) == tmp_path / "x"
    assert W.engine_config_dir("no-such-engine", start=tmp_path) is None


@pytest.mark.parametrize("name", ["../../x", "a/b", "Triton", "-x", "", "x y", "a_b"])
def test_engine_names_that_are_not_folder_names_are_refused(name):
    with pytest.raises(W.WorkspaceError):
        W.engine_dir_name(name)
    with pytest.raises(EngineNotFound):
        engine_class(name)


# ----------------------------------------------------------------------------- adoption
def _skeleton() -> str:
    text = (REPO / "docs" / "ADOPTING.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith('"""my_engine.py')]
    assert len(blocks) == 1
    return blocks[0]


def _tree_state() -> str:
    """What git sees of bundlegen's own tree (tracked changes and untracked files)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def _bundlegen(args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(["bundlegen", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"bundlegen {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_engine_skeleton_is_about_thirty_lines():
    assert len(_skeleton().splitlines()) <= 40


def test_a_kernel_project_runs_harvests_and_renders_its_matrix_in_its_own_workspace(tmp_path):
    before = _tree_state()
    (tmp_path / W.CONFIG_NAME).write_text('engines = ["bundlegen-engines"]\nmatrix = "SUPPORT_MATRIX.md"\n')
    (tmp_path / "my_engine.py").write_text(_skeleton())
    _bundlegen(["run", "--level", "quick", "--engine", "my_engine:MyEngine", "--device", "cpu",
                "--quiet", "-k", "AX-MASK-*", "--out", "out/quick"], cwd=tmp_path)
    records = [json.loads(line) for line in (tmp_path / "out/quick/results.jsonl").read_text().splitlines()]
    assert {r["engine"] for r in records} == {"my-engine"}
    verdicts = {r["verdict"] for r in records}
    assert "pass" in verdicts and "declined" in verdicts and not verdicts - {"pass", "declined"}

    # out/ is what the next run overwrites: harvest refuses to cite it and says how to keep it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    refused = subprocess.run(["bundlegen", "harvest", "out/quick/results.jsonl", "--min-runs", "1"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and not (tmp_path / "bundlegen-engines").exists(), refused.stdout
    keep = refused.stdout.split("keep it as evidence first: ")[1].split(" and harvest ")[0]
    assert keep == ("mkdir -p evidence/quick && cp out/quick/results.jsonl out/quick/run.json "
                    "evidence/quick/"), refused.stdout
    subprocess.run(["bash", "-e", "-c", keep], cwd=tmp_path, check=True, timeout=60)
    _bundlegen(["harvest", "evidence/quick/results.jsonl", "--min-runs", "1"], cwd=tmp_path)
    claims = json.loads((tmp_path / "bundlegen-engines/my_engine/claims.json").read_text())
    passed = sorted(r["case_id"] for r in records if r["verdict"] == "pass")
    assert claims["engine"] == "my-engine" and claims["claims"]["cpu"] == passed

    _bundlegen(["matrix"], cwd=tmp_path)
    matrix = (tmp_path / "SUPPORT_MATRIX.md").read_text()
    assert "my-engine" in matrix
    assert _bundlegen(["matrix", "--check"], cwd=tmp_path)
    assert _tree_state() == before


def test_a_kernel_project_generates_and_runs_its_own_plan(tmp_path):
    before = _tree_state()
    (tmp_path / W.CONFIG_NAME).write_text('plans = ["my_plan"]\nbundles = "my-bundles"\n')
    (tmp_path / "my_plan.py").write_text(
        "import dataclasses\n"
        "from bundlegen.plans.sdpa_bwd import PLAN as BUILTIN\n"
        "PLAN = dataclasses.replace(BUILTIN, name='my_plan')\n")
    out = _bundlegen(["generate"], cwd=tmp_path)
    assert "my_plan" in out
    assert (tmp_path / "my-bundles" / "my_plan.manifest.json").is_file()
    assert sorted(p.name for p in (tmp_path / "my-bundles" / "quick" / "my_plan").glob("*.json"))
    assert "match the plan" in _bundlegen(["generate", "--check"], cwd=tmp_path)
    _bundlegen(["run", "--level", "quick", "--engine", "torch-math", "--device", "cpu", "--quiet",
                "-k", "AX-DTYPE-FP16 and AX-MASK-NONE", "--out", "out/q"], cwd=tmp_path)
    records = [json.loads(line) for line in (tmp_path / "out/q/results.jsonl").read_text().splitlines()]
    assert records and all(r["verdict"] == "pass" and r["file"].startswith("quick/my_plan/") for r in records)
    assert _tree_state() == before
