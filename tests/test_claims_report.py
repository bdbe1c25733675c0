"""`bundlegen report RESULTS --html out/`: index.html with the margin, pair-coverage and
cost plots, from a small results fixture; pair coverage counts only validated cases."""
import argparse
import json

from bundlegen.claims import report_command
from bundlegen.claims.report import AxisValues, core_axes, pair_counts, write_report

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
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(rec("a")) + "\n", encoding="utf-8")
    args = argparse.Namespace(results=[str(tmp_path)], html=tmp_path / "html", bundles=None, plan=None)
    assert report_command.main(args) == 0
    html = (tmp_path / "html" / "index.html").read_text(encoding="utf-8")
    assert "pairs_triton.png" in html          # the manifest's core axes
    assert report_command.main(argparse.Namespace(results=[str(tmp_path / "no.jsonl")], html=tmp_path,
                                                  bundles=None, plan=None)) == 2


def test_command_reads_gzipped_results(tmp_path):
    import gzip

    path = tmp_path / "results.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps(rec("a")) + "\n")
    args = argparse.Namespace(results=[str(path)], html=tmp_path / "html", bundles=None, plan=None)
    assert report_command.main(args) == 0
    assert "1 results from 1 file(s)" in (tmp_path / "html" / "index.html").read_text(encoding="utf-8")


def test_core_axes_come_from_the_manifest():
    from bundlegen.manifest import load_manifest
    from bundlegen.workspace import builtin_bundle_root

    axes = core_axes(load_manifest(builtin_bundle_root()))
    assert [a.name for a in axes][:2] == ["dtype", "heads"] and axes[0].items == ("AX-DTYPE-BF16", "AX-DTYPE-FP16")
