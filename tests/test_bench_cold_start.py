"""bench/cold_start.py without a GPU: it refuses a cache that is not empty, times the load
and the engine's prepare (the interpreter compiles nothing: no verdict on the target), and
records a failed prepare with its seconds and a non-zero exit."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench import cold_start as CS  # noqa: E402


def test_a_cache_with_files_is_not_a_cold_start(tmp_path):
    (tmp_path / "old").write_text("x")
    out = subprocess.run([sys.executable, "bench/cold_start.py", "--cache-dir", str(tmp_path), "--dry-run"],
                         cwd=REPO_ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "not empty" in out.stderr


def test_the_prepare_is_timed_and_a_failure_recorded(tmp_path, monkeypatch):
    from bundlegen.engines.triton.engine import TritonEngine
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))   # main sets it: restored after
    calls = []
    monkeypatch.setattr(TritonEngine, "prepare", lambda self, graphs: calls.append(len(graphs)))
    assert CS.main(["--device", "cpu", "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "r.json")]) == 0
    rec = json.loads((tmp_path / "r.json").read_text())
    assert calls == [rec["graphs"]] and rec["cases"] >= rec["graphs"] > 1000
    assert rec["met"] is None and rec["prepare_s"] >= 0 and rec["total_s"] >= rec["load_s"]

    def fails(self, graphs):
        raise RuntimeError("ptxas died")
    monkeypatch.setattr(TritonEngine, "prepare", fails)
    assert CS.main(["--device", "cpu", "--cache-dir", str(tmp_path / "d"), "--out", str(tmp_path / "r.json")]) == 1
    rec = json.loads((tmp_path / "r.json").read_text())
    assert rec["error"] == "RuntimeError: ptxas died" and "total_s" not in rec
