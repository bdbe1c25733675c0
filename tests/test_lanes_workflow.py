"""The GitHub Actions workflow `bundlegen lanes --emit github-actions` writes for an adopter's
workspace: it installs what lanes.yaml says (by default bundlegen and the workspace's own
package), keeps pip's and Triton's caches, shows the junit in the job summary and uploads
the results; it passes a workflow linter (GitHub's workflow schema, as check-jsonschema
ships it), and its run lines work when run here."""
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

BIN = Path(sys.executable).parent
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


LANES = """\
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


def test_the_emitted_workflow_passes_the_linter_and_its_run_lines_work_here(tmp_path, monkeypatch):
    root = adopter(tmp_path, LANES)
    path = emit(root, monkeypatch)
    linted = lint(path)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    (job,) = yaml.safe_load(path.read_text())["jobs"].values()
    steps = job["steps"]
    by_name = {s.get("name"): s for s in steps}
    # install: bundlegen with the extra the report needs, then the adopter's own package
    install = by_name["install bundlegen and the workspace (lanes.yaml install)"]["run"].splitlines()
    assert install == ['python -m pip install "bundlegen[report]"', "python -m pip install -e ."]
    caches = [s for s in steps if s.get("uses", "").startswith("actions/cache@")]
    assert [c["with"]["path"] for c in caches] == ["~/.cache/pip", "~/.triton/cache"]
    assert "hashFiles(" in caches[0]["with"]["key"] and "steps.triton-key.outputs.key" in caches[1]["with"]["key"]
    names = [s.get("name") for s in steps]
    assert names.index("pip's cache") < names.index("install torch")          # restored before pip runs
    assert names.index("the Triton kernels' digest") < names.index("Triton's cache") < names.index("bundlegen run")
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert "always()" in upload["if"]

    # the run lines of shard 1 of 8, as the runner would run them (not the installs: no network here)
    entry = job["strategy"]["matrix"]["include"][0]
    output, summary = tmp_path / "github_output", tmp_path / "step_summary"
    env = {**os.environ, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
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
    assert ran == ["the Triton kernels' digest", "bundlegen run", "junit in the job summary", "HTML report"]
    assert re.fullmatch(r"key=[0-9a-f]{16}\n", output.read_text())
    assert "| quick |" in summary.read_text()
    for artifact in entry["artifacts"].splitlines():
        assert (root / artifact).exists(), artifact
    assert (root / entry["out"] / "report" / "index.html").is_file()


def test_the_linter_catches_a_broken_workflow(tmp_path, monkeypatch):
    """The linter is not a rubber stamp: a step that both uses an action and runs a line fails."""
    path = emit(adopter(tmp_path, LANES), monkeypatch)
    doc = yaml.safe_load(path.read_text())
    (job,) = doc["jobs"].values()
    job["steps"][0]["run"] = "true"
    path.write_text(yaml.safe_dump(doc))
    assert lint(path).returncode != 0


def test_install_lines_come_from_lanes_yaml(tmp_path, monkeypatch):
    root = adopter(tmp_path, "install: [pip install my-wheelhouse/bundlegen.whl, pip install .]\n" + textwrap.dedent(LANES))
    (job,) = yaml.safe_load(emit(root, monkeypatch).read_text())["jobs"].values()
    runs = [s.get("run") for s in job["steps"]]
    assert "pip install my-wheelhouse/bundlegen.whl\npip install ." in runs
    assert load_lanes(root / "lanes.yaml").install == ("pip install my-wheelhouse/bundlegen.whl", "pip install .")


def test_without_a_package_the_default_installs_bundlegen_alone(tmp_path, monkeypatch):
    root = adopter(tmp_path, "lanes: {cpu-triton: {engine: triton, device: cpu, level: quick}}\n")
    (root / "pyproject.toml").unlink()
    (job,) = yaml.safe_load(emit(root, monkeypatch).read_text())["jobs"].values()
    install = next(s["run"] for s in job["steps"] if s.get("name", "").startswith("install bundlegen"))
    assert install == 'python -m pip install "bundlegen[triton]"'


@pytest.mark.parametrize("top", ["install: []", "install: pip install x", "lock: [1]", "colour: red"])
def test_malformed_top_level_keys_are_one_line_errors(tmp_path, top):
    from bundlegen.harness.lanes import LanesError

    root = adopter(tmp_path, top + "\n" + textwrap.dedent(LANES))
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
