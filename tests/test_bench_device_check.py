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


def test_speed_profile_names_known_rows_and_matching_candidates():
    from bench import speed_batch as SB
    args = DC.parse_args(["--speed-profile", "--dry-run"])
    cmd = DC.speed_command(args, 300)
    cases = cmd[cmd.index("--cases") + 1:cmd.index("--candidates")]
    assert set(cases) == set(DC.PROFILE_CASES) <= set(SB.CASES)
    assert cmd[cmd.index("--budget-s") + 1] == "300"
    assert SB.parse_args(cmd[2:]).candidates == DC.profile_candidates()


def test_speed_profile_leaves_the_speed_step_room():
    out = subprocess.run([sys.executable, "bench/device_check.py", "--speed-profile", "--total-s", "150",
                          "--cold-s", "120", "--dry-run"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "leaves the speed step under" in out.stderr


def test_speed_profile_gives_the_speed_step_what_the_cold_start_left(tmp_path, monkeypatch):
    """Both steps share one new Triton cache; the speed step's budget is --total-s less the
    cold start's seconds; the summary reads the steps' JSON."""
    calls = []

    def fake_step(name, cmd, limit, log, record, out, env=None):
        calls.append((name, cmd, limit, env))
        if name == "cold":
            (out / "cold_start.json").write_text(json.dumps({"total_s": 50.0, "prepare_s": 45.0, "jobs": 16,
                                                             "target_s": 60.0, "met": True}))
        else:
            (out / "speed_batch.json").write_text(json.dumps({
                "rows": {"d128-full": {"ratios": {"torch-cudnn": 0.8}}},
                "profiles": {"d128-full": {"launches": [{"kernel": "bwd_dkdv", "share": 0.6}],
                                           "bound": "bwd_dkdv 60 % of the time"}},
                "best": {"d128-full": {"dq": {"label": "table", "describe": "T", "ms": 1.0}}}}))
        return 0

    ticks = iter([0.0, 100.0])
    monkeypatch.setattr(DC, "run_step", fake_step)
    monkeypatch.setattr(DC.time, "monotonic", lambda: next(ticks))
    args = DC.parse_args(["--speed-profile", "--out", str(tmp_path), "--total-s", "500"])
    assert DC.speed_profile(args) == 0
    (cold, cold_cmd, cold_limit, env), (speed, cmd, limit, env2) = calls
    assert env == env2 and Path(env["TRITON_CACHE_DIR"]).is_dir() and not any(Path(env["TRITON_CACHE_DIR"]).iterdir())
    assert cold_cmd[cold_cmd.index("--cache-dir") + 1] == env["TRITON_CACHE_DIR"]
    assert float(cmd[cmd.index("--budget-s") + 1]) == 500 - 100 - DC.SPEED_GRACE_S and limit == 500 - 100
    lines = DC.profile_summary(tmp_path)
    assert lines == ["cold start: 50.0 s (prepare 45.0 s, 16 processes; target 60.0 s met: True)",
                     "d128-full: /torch-cudnn 0.80", "  split: bwd_dkdv 60 %; bound: bwd_dkdv 60 % of the time",
                     "  best dq: table T 1.000 ms"]
    Path(env["TRITON_CACHE_DIR"]).rmdir()


def test_speed_profile_tries_every_candidate_of_its_rows_but_the_dropped():
    """A candidate made for a profiled row that the selection leaves out would never reach
    the device (the fused dBias one did, while the selection was globs without "fused *"):
    only PROFILE_DROPPED's, each with its reason, stay off; each of those names a candidate."""
    from bench import speed_batch as SB
    picked = DC.profile_candidates()
    left_out = {c.label for c in SB.CANDIDATES if set(c.cases) & set(DC.PROFILE_CASES)
                and not SB.wanted(c, tuple(picked))}
    assert left_out == set(DC.PROFILE_DROPPED) and all(DC.PROFILE_DROPPED.values())
    assert "fused dbias" in picked and "previous drop dkdv" in picked
