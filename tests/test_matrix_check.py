"""`bundlegen matrix` writes the workspace's support matrix; `--check` passes when it is
current and fails (exit 1, a short diff) when the claims or the file drift."""
import argparse
import shutil

from bundlegen.claims import matrix_command
from bundlegen.claims.store import ClaimSet, claims_path, write_claim_set
from bundlegen.workspace import builtin_bundle_root


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


def test_check_detects_drift(tmp_path, capsys, monkeypatch):
    output = workspace(tmp_path, monkeypatch)
    assert matrix_command.main(_args(check=True)) == 1        # no file yet
    assert matrix_command.main(_args()) == 0
    first = output.read_text(encoding="utf-8")
    assert first.startswith("# Support matrix")
    assert "| torch-flash | sm90 |" in first and "torch-math" in first and "triton" not in first
    assert matrix_command.main(_args(check=True)) == 0
    assert matrix_command.main(_args()) == 0
    assert output.read_text(encoding="utf-8") == first            # deterministic

    write_claim_set(claims_path("torch-flash"), ClaimSet("torch-flash", claims={"sm90": frozenset({"abc"})}))
    assert (tmp_path / "engines/torch_flash/claims.json").is_file()
    capsys.readouterr()
    assert matrix_command.main(_args(check=True)) == 1
    out = capsys.readouterr().out
    assert "has drifted" in out and "+| torch-flash | sm90 | 1 | 0 |" in out

    matrix_command.main(_args())
    output.write_text(output.read_text(encoding="utf-8") + "hand edit\n", encoding="utf-8")
    assert matrix_command.main(_args(check=True)) == 1
    assert "-hand edit" in capsys.readouterr().out


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
