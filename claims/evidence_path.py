"""Claims cite results files by path and sha256 (`bundlegen matrix --check` re-reads them),
so a cited file must stay: one under the run's default output folder (`out/`, which the next
`bundlegen run` there overwrites) is refused, with the commands that keep it as evidence."""
from __future__ import annotations

from pathlib import Path

from bundlegen.results_file import DEFAULT_OUT, RUN_NAME, results_file

#: where ADOPTING keeps the results files claims cite
EVIDENCE = Path("evidence")


def transient_problem(results: Path | str, root: Path) -> str | None:
    """None when `results` may be cited; else one line saying how to keep it."""
    path = results_file(results).resolve()
    out = (root / DEFAULT_OUT).resolve()
    if not path.is_relative_to(out):
        return None
    run_dir = path.parent
    keep = EVIDENCE / run_dir.relative_to(out).as_posix().replace("/", "-")
    shown = run_dir.relative_to(root.resolve()).as_posix() if run_dir.is_relative_to(root.resolve()) else run_dir
    return (f"{results}: lies under {DEFAULT_OUT}/, which the next `bundlegen run` overwrites, so the "
            f"claims could not cite it; keep it as evidence first: mkdir -p {keep} && cp {shown}/{path.name} "
            f"{shown}/{RUN_NAME} {keep}/ and harvest {keep}/{path.name}")
