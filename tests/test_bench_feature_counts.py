"""bench/feature_counts.py: a case belongs to a feature when an item names it, not when the
item is the feature's absence (AX-BIAS-NONE, AX-SINKS-OFF); the latest record per case counts."""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "bench"))

import feature_counts as FC  # noqa: E402


def test_a_feature_item_counts_and_its_absence_does_not():
    assert FC.belongs(["AX-BIAS-ALIBI", "AX-DTYPE-BF16"], "BIAS")
    assert FC.belongs(["SHP-MODIFIERS-ALL"], "MODIFIERS")
    assert FC.belongs(["AX-SOFTCAP-CAP5"], "SOFTCAP")
    assert not FC.belongs(["AX-BIAS-NONE", "AX-SINKS-OFF"], "BIAS")
    assert not FC.belongs(["AX-BIAS-NONE", "AX-SINKS-OFF"], "SINKS")
    assert not FC.belongs(["AX-DBIAS-ON"], "BIAS")          # a word of its own, not a prefix


def test_counts_take_the_latest_record_per_case_and_decline_codes(tmp_path):
    rows = [
        {"engine": "e", "case_id": "a", "items": ["AX-BIAS-FULL"], "verdict": "fail:numeric"},
        {"engine": "e", "case_id": "a", "items": ["AX-BIAS-FULL"], "verdict": "pass"},
        {"engine": "e", "case_id": "b", "items": ["AX-BIAS-HEAD"], "verdict": "declined",
         "reason": "modifier-not-served: bias"},
        {"engine": "e", "case_id": "c", "items": ["AX-BIAS-NONE"], "verdict": "pass"},
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    verdicts, declines = FC.counts([path], "BIAS")
    assert dict(verdicts["e"]) == {"pass": 1, "declined": 1}
    assert dict(declines["e"]) == {"modifier-not-served": 1}
