"""bench/device_check.py without a GPU: the levels step selects exactly the changed cases and
the sample groups, bad arguments exit 2, and a step past its limit is stopped and recorded."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench import device_check as DC  # noqa: E402


def test_selection_is_every_changed_case_and_the_sample_groups():
    from bundlegen.harness.bundles import load_level
    cases = load_level(REPO_ROOT / "bundles", DC.LEVEL).cases
    terms = DC.selection_terms(cases)
    picked = {c.id for c in DC.selected_cases(cases, terms)}
    changed = {c.id for c in cases if DC.changed(c)}
    sample = {c.id for c in cases if any(g in c.group for g in DC.SAMPLE_GROUPS)}
    assert changed and sample
    assert picked == changed | sample
    assert len(" or ".join(terms)) < 4000   # a few dozen terms, not hundreds of ids


@pytest.mark.parametrize("args", [["--device", "tpu"], ["--levels-s", "0"], ["--max-cases", "0"]])
def test_bad_arguments_exit_2(args):
    out = subprocess.run([sys.executable, "bench/device_check.py", *args, "--dry-run"], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "device_check.py: error:" in out.stderr


def test_a_step_past_its_limit_is_stopped_and_recorded(tmp_path):
    record = {"steps": {}}
    rc = DC.run_step("slow", [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                     1.0, tmp_path / "slow.log", record, tmp_path)
    assert rc == 124
    saved = json.loads((tmp_path / "device_check.json").read_text())
    assert saved["steps"]["slow"]["exit"] == 124 and saved["steps"]["slow"]["seconds"] < 30
    assert "started" in (tmp_path / "slow.log").read_text()


def test_speed_step_names_known_rows_and_candidates():
    from bench import speed_batch as SB
    args = DC.parse_args(["--dry-run"])
    cmd = DC.speed_command(args)
    cases = cmd[cmd.index("--cases") + 1:cmd.index("--candidates")]
    assert set(cases) == set(DC.SPEED_CASES) <= set(SB.CASES)
    assert SB.parse_args(cmd[2:]).candidates == list(DC.SPEED_CANDIDATES)   # every glob matches
