"""bench/before_engine.py: the Triton engine at a git revision as a package of its own that
launches its own launcher and kernels, run beside the current engine (CPU interpreter)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO_ROOT / "bench" / "before_engine.py")

PROBE = """
import sys, torch
from bundlegen.engines.registry import engine_class
from bundlegen.engines.triton.engine import TritonEngine
from bundlegen.graph import dense_graph
from bench.engine_speed import empty_as

before = engine_class(sys.argv[1])("cpu")
assert before.launch_module == "triton_before.launch", before.launch_module
assert before.kernels_module == "triton_before.kernels" and before.launches_own_modules()
graph = dense_graph(B=1, H_q=2, H_k=1, H_v=1, S_q=40, S_kv=56, D_qk=16, dtype="fp16", right=0)
torch.manual_seed(0)
inputs = {p: empty_as(s, "cpu") for p, s in graph.tensors.items()}
for t in inputs.values():
    t.copy_(torch.randn(t.shape))
inputs["stats"].abs_().add_(2.0)
grads = []
for engine in (TritonEngine("cpu"), before):
    tensors = {p: t.clone() for p, t in inputs.items()}
    engine.run(graph, tensors)
    grads.append([tensors[p].float() for p in ("dq", "dk", "dv")])
import triton_before.kernels
print("loaded", triton_before.kernels.__file__)
print("diff", max(float((a - b).abs().max()) for a, b in zip(*grads)))
"""


def test_the_copy_of_a_revision_runs_its_own_kernels_beside_the_engine(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, "--rev", "HEAD", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    package = tmp_path / "triton_before"
    copied = {p.name for p in package.iterdir()}
    assert {"kernels.py", "launch.py", "configs.py", "warm.py", "engine_before.py"} <= copied
    for source in package.glob("*.py"):
        assert "from bundlegen.engines.triton" not in source.read_text(), source
    run = subprocess.run([sys.executable, "-c", PROBE, "triton_before.engine_before:BeforeEngine"],
                         capture_output=True, text=True, timeout=600, cwd=REPO_ROOT,
                         env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert f"loaded {package / 'kernels.py'}" in run.stdout
    diff = float(run.stdout.split("diff ")[1])
    assert diff < 1e-2, run.stdout   # the same math; a change in progress may move last bits


def test_an_unknown_revision_is_refused_with_its_name(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, "--rev", "no-such-rev", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "no-such-rev" in done.stderr
