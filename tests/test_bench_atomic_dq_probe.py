"""bench/atomic_dq_probe.py: the atomic-dQ backward it times is checked against a float64
autograd reference (the interpreter on the CPU: D 64 / 128, causal and not, fp16 and bf16,
both dQ flavours). Run as its own process: it picks the interpreter before importing Triton."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_probe_backward_matches_the_float64_reference():
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"} | {"CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "atomic_dq_probe.py"), "--check"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "check: PASSED" in out.stdout
    assert out.stdout.count("\nok ") + out.stdout.startswith("ok ") == 32
