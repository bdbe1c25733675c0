"""bench/runtime_band_probe.py: its copy of the kernels (the band code always compiled, an
absent bound passed as one past every |j - i - shift|) computes the engine's gradients
bitwise on the CPU interpreter, and its kernel count says how many fewer Triton would
compile. Each run is its own process: the interpreter is chosen before Triton is imported,
and the count needs the kernels as compiled for a GPU."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROBE = str(REPO_ROOT / "bench" / "runtime_band_probe.py")


def _run(flag: str, interpret: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, PROBE, flag], env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_copy_computes_the_engines_gradients_bitwise():
    out = _run("--check", interpret=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if "max |copy - engine|" in line]
    assert len(lines) == 8 and all(line.endswith(" 0.0e+00") for line in lines)


def test_the_count_drops_the_band_kinds():
    out = _run("--count", interpret=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    found = re.search(r"(\d+) kernels with the band flags, (\d+) without", out.stdout)
    assert found, out.stdout
    with_flags, without = map(int, found.groups())
    assert 0 < without < with_flags
