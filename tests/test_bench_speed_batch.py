"""bench/speed_batch.py without a GPU: its plan and arguments, the ratios and the best
candidate it reports, a record that is never half-written, and a budget that stops it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench import speed_batch as SB  # noqa: E402


def test_every_candidate_names_known_cases_and_changes_one_kernel():
    assert set(SB.CASES) >= {"d128-full", "d128-causal", "d128-bias-dbias", "ragged-d128-full"}
    for cand in SB.CANDIDATES:
        assert cand.cases and set(cand.cases) <= set(SB.CASES), cand.label
        table = SB.table_config(SB.CASES[cand.cases[0]], SB.graph_for(SB.CASES[cand.cases[0]]))
        cfg = cand.config(table)
        other = ("block_m2", "block_n2") if cand.kernel == "dkdv" else ("block_m1", "block_n1")
        assert all(getattr(cfg, f) == getattr(table, f) for f in other), cand.label


def test_ratios_are_peer_time_over_triton_time():
    row = {"cells": {"triton": {"ms": 2.0}, "torch-cudnn": {"ms": 1.0}, "flex": {"ms": 3.0},
                     "torch-flash": {"note": "declined"}}}
    assert SB.ratios(row) == {"torch-cudnn": 0.5, "flex": 1.5}


def test_summary_names_the_fastest_candidate_per_case_and_kernel(tmp_path):
    rec = SB.Record(tmp_path / "r.json", {}, {}, None)
    for label, ms in (("a", 2.0), ("b", 1.0)):
        rec.put("candidates", f"d128-full/{label}", {"kernel": "dq", "ms": ms, "table_ms": 2.0,
                                                     "speedup": 2.0 / ms, "max_rel_diff": 0.0})
    rec.put("candidates", "d128-full/c", {"error": "precompile failed"})
    (line,) = SB.summary(rec)
    assert line.startswith("best dq for d128-full: b 1.000 ms, 2.00x")
    assert json.loads((tmp_path / "r.json").read_text())["candidates"]["d128-full/c"]["error"]
    assert not (tmp_path / "r.tmp").exists()


def test_budget_stops_before_the_margin():
    b = SB.Budget(10.0, 4.0, start=0.0)
    assert SB.Budget(10.0, 4.0, start=__import__("time").monotonic()).allows()
    assert not b.allows()   # started long ago: nothing left


@pytest.mark.parametrize("args", [["--cases", "nope"], ["--budget-s", "5", "--margin-s", "10"],
                                  ["--candidates", "no such label*"]])
def test_bad_arguments_exit_2(args):
    out = subprocess.run([sys.executable, "bench/speed_batch.py", *args], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "speed_batch.py: error:" in out.stderr


def test_list_prints_every_row():
    out = subprocess.run([sys.executable, "bench/speed_batch.py", "--list"], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True)
    assert [line.split()[0] for line in out.stdout.splitlines()] == list(SB.CASES)


def test_previous_candidates_are_the_config_before_the_score_configs():
    """A `previous` candidate runs the table config without its modifiers / dropout configs
    (what those launches ran before), and every candidate changes that config, never the
    one the launch switches to."""
    previous = [c for c in SB.CANDIDATES if c.label.startswith(SB.PREVIOUS)]
    assert {c.kernel for c in previous} == {"dkdv", "dq"}
    for cand in previous:
        for name in cand.cases:
            case = SB.CASES[name]
            table = SB.table_config(case, SB.graph_for(case))
            cfg = cand.config(table)
            assert cfg.switches() == (cfg,) and cfg == SB.bare(table) != table, (cand.label, name)


def test_summary_puts_the_table_against_the_config_it_replaced(tmp_path):
    rec = SB.Record(tmp_path / "r.json", {}, {}, None)
    rec.put("candidates", "d128-bias/previous mods dkdv", {"kernel": "dkdv", "ms": 3.0, "table_ms": 2.0,
                                                           "speedup": 2 / 3, "max_rel_diff": 0.0})
    lines = SB.summary(rec)
    assert lines[0] == "table for d128-bias dkdv: 2.000 ms against 3.000 ms before (1.50x; max rel diff 0.0e+00)"


def test_candidates_globs_keep_the_matching_labels():
    out = subprocess.run([sys.executable, "bench/speed_batch.py", "--list", "--cases", "d128-drop-port",
                          "--candidates", "previous*"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("candidates: 2 (previous drop dkdv, previous drop dq)")


def test_best_config_keeps_the_table_unless_a_candidate_beats_it(tmp_path):
    rec = SB.Record(tmp_path / "r.json", {}, {}, None)
    rec.put("candidates", "d128-full/table", {"config": {}, "ms": {"dkdv": 2.0, "dq": 1.0},
                                              "describe": {"dkdv": "T1", "dq": "T2"}})
    for label, kernel, ms in (("a", "dkdv", 1.5), ("b", "dq", 1.2), ("c", "dkdv", 1.8)):
        rec.put("candidates", f"d128-full/{label}", {"kernel": kernel, "ms": ms, "table_ms": 2.0, "speedup": 2.0 / ms,
                                                     "max_rel_diff": 0.0, "describe": label.upper()})
    best = SB.best_config(rec, "d128-full")
    assert best["dkdv"]["label"] == "a" and best["dkdv"]["describe"] == "A"
    assert best["dq"] == {"label": "table", "ms": 1.0, "describe": "T2"}
    rec.put("best", "d128-full", best)
    rec.put("profiles", "d128-full", {"bound": "bwd_dkdv 60 % of the time"})
    assert SB.summary(rec)[-1] == ("row d128-full: bound: bwd_dkdv 60 % of the time | best: dkdv a A 1.500 ms; "
                                   "dq table T2 1.000 ms")


def test_a_dbias_candidate_changes_the_dbias_kernel_alone_and_its_dbias_is_the_tables(monkeypatch):
    """launch.dbias_tiles: the candidate's (M, N, warps) reach the dBias launch (and no other
    launch changes); on the interpreter its dBias equals the table config's."""
    from dataclasses import replace

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import torch

    from bundlegen.engines.triton import launch as L
    from bundlegen.engines.triton import warm
    cand = next(c for c in SB.CANDIDATES if c.label == "dbias 64x64 w8")
    case = SB.Case("d64-bias-dbias", D=64, mod="bias-dbias", B=1, H_q=2, H_kv=2, S=128)
    graph = SB.graph_for(case)
    table = SB.table_config(case, graph)
    launches = {}
    for name, cfg in (("table", SB.bare(table)), ("cand", cand.config(table))):
        rec = warm._Launches()
        L.run(replace(L.prepare(graph.as_launched(), L.meta_tensors(graph), cfg), kernels=rec))
        launches[name] = {n: kw for n, _, kw in rec.calls}
    assert {k: launches["cand"]["bwd_dbias"][k] for k in ("BLOCK_M", "BLOCK_N", "num_warps")} == {
        "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 8}
    assert launches["table"]["bwd_dbias"]["BLOCK_M"] == 32
    assert {n: kw for n, kw in launches["cand"].items() if n != "bwd_dbias"} == {
        n: kw for n, kw in launches["table"].items() if n != "bwd_dbias"}
    tensors = SB.tensors_for(case, graph, torch.device("cpu"))
    out = {}
    for name, cfg in (("table", SB.bare(table)), ("cand", cand.config(table))):
        for p in ("dq", "dk", "dv", "dbias"):
            tensors[p].zero_()
        _, stages = SB.triton_stages(graph, tensors, cfg)
        stages["backward"]()   # the dBias kernel reads the preprocess's Delta
        out[name] = tensors["dbias"].float().clone()
    assert out["table"].abs().max() > 0
    torch.testing.assert_close(out["cand"], out["table"], rtol=2e-2, atol=2e-2)


def _res(spill, shared=1000, warps=4, blocks=2):
    return {"registers": 200, "spill_bytes": spill, "shared_bytes": shared, "num_warps": warps,
            "occupancy": {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps, "limited_by": ["registers"]}}


def test_drop_lines_name_the_candidates_whose_own_kernel_spills_or_cannot_fit():
    rows = [("c", "table", "dkdv/d128/vec8/narrow/dense", _res(0)),
            ("c", "table", "dq/d128/vec8/narrow/dense", _res(0)),
            ("c", "a", "dkdv/d128/vec8/narrow/dense", _res(0)),
            ("c", "a", "dq/d128/vec8/narrow/dense", _res(64)),       # not the kernel a changes
            ("c", "b", "dq/d128/vec8/narrow/dense", _res(0, shared=300_000)),
            ("c", "d", "dbias/d128/vec8/narrow/dense", {"error": "out of resources"})]
    lines = SB.drop_lines(rows, {"a": "dkdv", "b": "dq", "d": "dbias"})
    assert lines == ["drop c / b: dq/d128/vec8/narrow/dense shared memory 300000 > 232448",
                     "drop c / d: dbias/d128/vec8/narrow/dense does not compile: out of resources"]
    # a spill the table's kernel does not have (known to the check or not) drops it
    rows[2] = ("c", "a", "dkdv/d128/vec8/narrow/dense", _res(192))
    assert SB.drop_lines(rows, {"a": "dkdv", "b": "dq", "d": "dbias"})[0].startswith(
        "drop c / a: dkdv/d128/vec8/narrow/dense")
