"""bench/compile_stages.py: the kernels of a level are counted as warm.py compiles them, every
backend stage of each sample compile is timed, and the floor is kernels x seconds / processes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bundlegen.engines.triton.aot import compile_env

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO_ROOT / "bench" / "compile_stages.py")


def _run(args: list[str], cwd: Path, interpret: bool = False) -> subprocess.CompletedProcess:
    """The script in a process of its own: Triton is imported in one mode per process, and
    the engine tests import it under the interpreter."""
    env = compile_env()
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


def test_quick_level_counts_stages_and_floor(tmp_path):
    out = tmp_path / "stages.json"
    proc = _run(["--levels", "quick", "--dims", "64", "--jobs", "4",
                 "--bundles", str(REPO_ROOT / "bundles"), "--json", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(out.read_text())
    counts = figures["counts"]
    assert counts["kernels"] == sum(counts["by_kernel"].values()) > 0
    # launches that differ only in integers Triton does not specialise are one kernel
    assert counts["variants"] < counts["kernels"] < counts["launches"]
    assert {"bwd_dkdv", "bwd_dq", "bwd_preprocess"} <= set(counts["by_kernel"])
    assert [s["kernel"] for s in figures["samples"]] == ["dq", "dkdv", "dq-ragged", "dkdv-ragged"]
    for sample in figures["samples"]:
        stages = sample["stages"]
        assert {"ttir", "ttgir", "llir", "ptx", "cubin"} <= set(stages)
        assert all(stages[s] > 0 for s in ("ttgir", "llir", "cubin"))
        assert abs(sum(stages.values()) - sample["seconds"]) < 1e-6
    per_kernel = sum(s["seconds"] for s in figures["samples"]) / len(figures["samples"])
    assert abs(figures["floor_s"] - counts["kernels"] * per_kernel / 4) < 1e-6
    assert f"{counts['kernels']} kernels" in proc.stdout


def test_a_missing_level_and_the_interpreter_are_refused_by_name(tmp_path):
    proc = _run(["--levels", "quick", "--bundles", str(tmp_path)], tmp_path)
    assert proc.returncode == 2
    assert "no quick level there" in proc.stderr
    proc = _run(["--bundles", str(REPO_ROOT / "bundles")], tmp_path, interpret=True)
    assert proc.returncode == 2
    assert "TRITON_INTERPRET is set" in proc.stderr
