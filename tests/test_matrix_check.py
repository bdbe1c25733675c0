"""`bundlegen matrix` writes SUPPORT_MATRIX.md; `--check` passes when it is current and fails
(exit 1, a short diff) when the claims or the file drift."""
import argparse

from bundlegen.claims import matrix_command
from bundlegen.claims.store import ClaimSet, claims_path, write_claim_set


def _args(tmp_path, check=False):
    return argparse.Namespace(check=check, output=tmp_path / "SUPPORT_MATRIX.md",
                              bundles=tmp_path / "bundles", claims_root=tmp_path / "engines")


def test_check_detects_drift(tmp_path, capsys):
    args = _args(tmp_path)
    assert matrix_command.main(_args(tmp_path, check=True)) == 1        # no file yet
    assert matrix_command.main(args) == 0
    first = args.output.read_text(encoding="utf-8")
    assert first.startswith("# Support matrix")
    assert matrix_command.main(_args(tmp_path, check=True)) == 0
    assert matrix_command.main(args) == 0
    assert args.output.read_text(encoding="utf-8") == first            # deterministic

    write_claim_set(claims_path("torch-flash", args.claims_root),
                    ClaimSet("torch-flash", claims={"sm90": frozenset({"abc"})}))
    capsys.readouterr()
    assert matrix_command.main(_args(tmp_path, check=True)) == 1
    out = capsys.readouterr().out
    assert "has drifted" in out and "+| torch-flash | sm90 | 1 | 0 |" in out

    matrix_command.main(args)
    args.output.write_text(args.output.read_text(encoding="utf-8") + "hand edit\n", encoding="utf-8")
    assert matrix_command.main(_args(tmp_path, check=True)) == 1
    assert "-hand edit" in capsys.readouterr().out
