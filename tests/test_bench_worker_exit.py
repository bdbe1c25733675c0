"""bench/worker_exit.py on the CPU: it starts the workers, runs a case in each, stops them
both ways a run does (pool.close_all) and reports each way."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_benchmark_stops_the_workers_both_ways_and_reports_each(tmp_path):
    out = tmp_path / "exit.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "worker_exit.py"), "--engine", "torch-math",
                           "--device", "cpu", "--workers", "2", "--repeat", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rounds = json.loads(out.read_text())["rounds"]
    assert [r["wait"] for r in rounds] == [True, False]
    for r in rounds:
        assert 0 <= r["stop_s"] <= r["run_pays_s"] and r["until_exited_s"] >= r["stop_s"]
    assert "not waiting" in done.stdout and "waiting for the exits" in done.stdout
