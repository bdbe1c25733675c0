"""`bundlegen report RESULTS --html out/`: index.html with the margin, pair-coverage and
cost plots, from a small results fixture; pair coverage counts only validated cases."""
import argparse
import json

import pytest

from bundlegen.claims import report_command
from bundlegen.claims.report import AxisValues, pair_counts, write_report

AXES = [AxisValues("dtype", ("AX-DTYPE-BF16", "AX-DTYPE-FP16"), ("bf16", "fp16")),
        AxisValues("mask", ("AX-MASK-NONE", "AX-MASK-CAUSAL"), ("none", "causal"))]


def rec(case, engine="triton", verdict="pass", items=("AX-DTYPE-BF16", "AX-MASK-NONE"), margin=4.0):
    out = {p: {"margin": margin, "max_abs_err": 1e-3, "normalized_error": 1 / margin} for p in ("dq", "dk", "dv")}
    return {"case_id": case, "engine": engine, "arch": "sm90", "verdict": verdict, "purpose": "claim",
            "items": list(items), "outputs": out if verdict == "pass" else {}, "margin": margin,
            "predicted_s": 0.01, "wall_s": 0.02}


def test_pair_counts_only_validated():
    records = [rec("a"), rec("b", items=("AX-DTYPE-FP16", "AX-MASK-CAUSAL")),
               rec("c", verdict="declined", items=("AX-DTYPE-BF16", "AX-MASK-CAUSAL")),
               rec("a")]                       # the same case twice counts once
    labels, counts = pair_counts(records, AXES)
    assert labels == ["dtype=bf16", "dtype=fp16", "mask=none", "mask=causal"]
    assert counts[0][2] == 1 and counts[1][3] == 1
    assert counts[0][3] == 0                  # bf16 x causal: only declined
    assert counts[0][1] == -1                 # same axis


def test_report_writes_html_and_plots(tmp_path):
    runs = [[rec("a"), rec("b", engine="torch-flash", margin=0.5), rec("c", verdict="declined")]]
    index = write_report(runs, ["r.jsonl"], tmp_path / "out", min_margin=1.5, axes=AXES)
    html = index.read_text(encoding="utf-8")
    for name in ("margins.png", "cost.png", "pairs_triton.png", "pairs_torch-flash.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name
        assert name in html
    assert "<td>triton</td><td>sm90</td>" in html


def test_command(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(rec("a")) + "\n", encoding="utf-8")
    args = argparse.Namespace(results=[str(tmp_path)], html=tmp_path / "html")
    assert report_command.main(args) == 0
    assert (tmp_path / "html" / "index.html").is_file()
    assert report_command.main(argparse.Namespace(results=[str(tmp_path / "no.jsonl")], html=tmp_path)) == 2
