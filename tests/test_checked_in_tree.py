"""The checked-in generated files agree with their sources: CI fails on drift."""
import argparse

from bundlegen.claims import matrix_command
from bundlegen.claims.matrix import BUNDLE_ROOT, MATRIX_PATH


def test_support_matrix_is_current(capsys):
    args = argparse.Namespace(check=True, output=MATRIX_PATH, bundles=BUNDLE_ROOT, claims_root=None)
    rc = matrix_command.main(args)
    assert rc == 0, capsys.readouterr().out
