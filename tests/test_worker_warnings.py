"""numpy's floating-point RuntimeWarnings (overflow in a cast, invalid value), which the
Triton interpreter raises while it runs a kernel on the CPU, stay out of the run's output:
printed from a worker they land inside the parent's progress bar. The verdict judges the
numbers; other warnings still print."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from tests import harness_support as S


class OverflowingMath(S.TorchMathEngine):
    """torch-math that, like the interpreter on an fp16 kernel, overflows a numpy cast."""
    name = "overflowing-math"

    def run(self, graph, tensors):
        np.array([1e30], dtype=np.float32).astype(np.float16)          # overflow encountered in cast
        np.array([0.0], dtype=np.float32) / np.array([0.0], dtype=np.float32)   # invalid value
        super().run(graph, tensors)


def test_numpy_float_warnings_of_a_worker_do_not_reach_the_runs_output(tmp_path):
    bundles = tmp_path / "bundles"
    S.write_bundle(bundles, "quick", "a", [S.case_of(1), S.case_of(2)])
    proc = subprocess.run([sys.executable, "-m", "bundlegen", "run", "--level", "quick", "--engine",
                           S.engine_ref(OverflowingMath), "--device", "cpu", "--bundles", str(bundles),
                           "--out", str(tmp_path / "out"), "--no-server"],
                          capture_output=True, text=True, timeout=300, cwd=S.REPO if hasattr(S, "REPO") else None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RuntimeWarning" not in proc.stderr + proc.stdout, proc.stderr
    assert "encountered" not in proc.stderr + proc.stdout
