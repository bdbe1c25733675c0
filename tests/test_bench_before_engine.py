"""bench/before_engine.py: the Triton engine at a git revision as a package of its own that
launches its own launcher and kernels, run as a peer of bench/engine_speed.py beside the
current engine (CPU interpreter)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO_ROOT / "bench" / "before_engine.py")
PEER = "triton_before.engine_before:BeforeEngine"

MODULES = """
import sys
from bundlegen.engines.registry import engine_class
import triton_before.kernels
engine = engine_class(sys.argv[1])("cpu")
print(engine.launch_module, engine.kernels_module, engine.launches_own_modules(),
      triton_before.kernels.__file__)
"""


def test_the_copy_of_a_revision_runs_its_own_kernels_beside_the_engine(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, "--rev", "HEAD", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    package = tmp_path / "triton_before"
    assert {"kernels.py", "launch.py", "configs.py", "warm.py", "engine_before.py"} <= {
        p.name for p in package.iterdir()}
    for source in package.glob("*.py"):
        assert "from bundlegen.engines.triton" not in source.read_text(), source
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO_ROOT}"}
    loaded = subprocess.run([sys.executable, "-c", MODULES, PEER], capture_output=True,
                            text=True, timeout=120, cwd=REPO_ROOT, env=env)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split() == ["triton_before.launch", "triton_before.kernels", "True",
                                     str(package / "kernels.py")]
    out = tmp_path / "speed.json"
    speed = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "engine_speed.py"),
                            "--device", "cpu", "--peers", PEER, "--out", str(out)],
                           capture_output=True, text=True, timeout=600, cwd=REPO_ROOT, env=env)
    assert speed.returncode == 0, speed.stdout[-2000:] + speed.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows
    for row in rows:
        cell = row["cells"][PEER]
        # timed, and the same math as the engine (a change in progress may move last bits)
        assert cell["tflops"] and cell["max_rel_diff"] is not None, (row["label"], cell)
        assert cell["max_rel_diff"] < 1e-2, (row["label"], cell)


def test_an_unknown_revision_is_refused_with_its_name(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, "--rev", "no-such-rev", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "no-such-rev" in done.stderr
