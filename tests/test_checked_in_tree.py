"""The checked-in generated files agree with their sources: CI fails on drift."""
import argparse
from pathlib import Path

from bundlegen.claims import matrix_command

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_support_matrix_is_current(capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    args = argparse.Namespace(check=True, bundles=None, plan=None, claims_root=None)
    rc = matrix_command.main(args)
    assert rc == 0, capsys.readouterr().out
