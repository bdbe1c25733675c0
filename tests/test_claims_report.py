"""`bundlegen report RESULTS --html OUT`: one self-contained file that leads with the failing
cases (id, items, verdict, worst output, repro command), then the verdict tables, then the
plots (embedded); pair coverage counts only validated cases; the cost plot only cases the
engine ran."""
import argparse
import gzip
import json

from bundlegen.claims import report_command
from bundlegen.manifest import AxisItems
from bundlegen.claims.report import (core_axes, cost_points, failing_cases, pair_counts, repro_command,
                                     worst_output, write_report)

AXES = [AxisItems("dtype", "io dtype", True, "bf16", ("bf16", "fp16"), ("AX-DTYPE-BF16", "AX-DTYPE-FP16")),
        AxisItems("mask", "mask kind", True, "none", ("none", "causal"), ("AX-MASK-NONE", "AX-MASK-CAUSAL"))]


def rec(case, engine="triton", verdict="pass", items=("AX-DTYPE-BF16", "AX-MASK-NONE"), margin=4.0, **extra):
    out = {p: {"margin": margin, "max_abs_err": 1e-3, "normalized_error": 1 / margin} for p in ("dq", "dk", "dv")}
    return {"case_id": case, "engine": engine, "arch": "sm90", "device": "cuda", "verdict": verdict,
            "purpose": "claim", "items": list(items), "outputs": out if verdict in ("pass", "fail:numeric") else {},
            "margin": margin, "predicted_s": 0.01, "wall_s": 0.02, **extra}


def fixture_runs():
    failing = rec("f00dfeedbeef", engine="torch-flash", verdict="fail:numeric", margin=0.25,
                  detail="outside rtol=0.03 atol=1e-05 (dv: margin 0.25)")
    failing["outputs"]["dv"] = {"margin": 0.05, "max_abs_err": 2.5, "worst": {"index": "[0, 1, 3, 7]", "got": 1.5}}
    return [[rec("a"), rec("b", engine="torch-flash", margin=0.5), rec("c", verdict="declined", wall_s=50.0),
             failing, rec("cafe00000001", verdict="crashed", detail="engine raised RuntimeError")]]


def test_pair_counts_only_validated():
    records = [rec("a"), rec("b", items=("AX-DTYPE-FP16", "AX-MASK-CAUSAL")),
               rec("c", verdict="declined", items=("AX-DTYPE-BF16", "AX-MASK-CAUSAL")),
               rec("a")]                       # the same case twice counts once
    labels, counts = pair_counts(records, AXES)
    assert labels == ["dtype=bf16", "dtype=fp16", "mask=none", "mask=causal"]
    assert counts[0][2] == 1 and counts[1][3] == 1
    assert counts[0][3] == 0                  # bf16 x causal: only declined
    assert counts[0][1] == -1                 # same axis


def test_repro_command_is_one_string():
    assert repro_command("abc123def456", "torch-flash", "cuda") == \
        "bundlegen repro abc123def456 --engine torch-flash --device cuda"
    assert repro_command("x", "pkg.mod:My Engine", "cuda:1") == "bundlegen repro x --engine 'pkg.mod:My Engine' --device cuda:1"


def test_failing_cases_with_worst_output_and_repro():
    found = failing_cases(fixture_runs(), ["r.jsonl"])
    assert [(f.case_id, f.verdict) for f in found] == [("f00dfeedbeef", "fail:numeric"), ("cafe00000001", "crashed")]
    numeric = found[0]
    assert numeric.worst == "dv: margin 0.05, max |err| 2.5; worst element index [0, 1, 3, 7], got 1.5"
    assert numeric.repro == "bundlegen repro f00dfeedbeef --engine torch-flash --device cuda"
    assert numeric.items == ("AX-DTYPE-BF16", "AX-MASK-NONE") and numeric.source == "r.jsonl"
    assert found[1].worst is None and found[1].detail == "engine raised RuntimeError"
    assert worst_output({"outputs": {"dq": {"margin": 0.0, "max_abs_err": None}}}) == \
        "dq: margin 0, max |err| not finite (NaN/Inf)"


def test_cost_leaves_out_cases_the_engine_did_not_run():
    records = [rec("a"), rec("d", verdict="declined", wall_s=9.0), rec("s", verdict="skipped"),
               rec("p", verdict="rejected"), rec("f", verdict="fail:nan"),
               rec("cb", verdict="claim-broken", reason="mask-not-served"), rec("cf", verdict="claim-broken")]
    assert cost_points(records) == {"triton": [(0.01, 0.02)] * 3}


def test_report_is_one_file_failing_cases_first(tmp_path):
    index = write_report(fixture_runs(), ["r.jsonl"], tmp_path / "out", min_margin=1.5, axes=AXES)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["index.html"]
    html = index.read_text(encoding="utf-8")
    assert html.startswith("<!doctype html>\n<html lang=\"en\">")
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    assert html.count('<img src="data:image/png;base64,') == 4     # margins, 2 pair maps, cost
    assert "src=\"http" not in html and "<script" not in html
    first = html.index("f00dfeedbeef")
    assert first < html.index("<h2 id=\"verdicts\">") < html.index("<h2 id=\"margins\">") < html.index("<h2 id=\"cost\">")
    assert "bundlegen repro f00dfeedbeef --engine torch-flash --device cuda" in html
    assert "worst element index [0, 1, 3, 7]" in html and "Failing cases (2)" in html
    assert "<td>triton</td><td>sm90</td>" in html


def test_report_with_nothing_failing(tmp_path):
    path = write_report([[rec("a")]], ["r.jsonl"], tmp_path / "r.html", min_margin=1.5, axes=AXES)
    assert path == tmp_path / "r.html"
    assert "No case failed." in path.read_text(encoding="utf-8")


def test_command(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(rec("a")) + "\n", encoding="utf-8")
    args = argparse.Namespace(results=[str(tmp_path)], html=tmp_path / "html", bundles=None, plan=None)
    assert report_command.main(args) == 0
    html = (tmp_path / "html" / "index.html").read_text(encoding="utf-8")
    assert "Pair coverage: triton" in html          # the manifest's core axes
    assert report_command.main(argparse.Namespace(results=[str(tmp_path / "no.jsonl")], html=tmp_path,
                                                  bundles=None, plan=None)) == 2


def test_command_reads_gzipped_results(tmp_path):
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
    assert [a.name for a in axes][:2] == ["dtype", "heads"]
    assert axes[0].items == ("AX-DTYPE-BF16", "AX-DTYPE-FP16", "AX-DTYPE-FP32")


# ----------------------------------------------------------------------------- grouping, graph, the run's spec
def test_failures_grouped_by_engine_then_by_the_item_they_share():
    from bundlegen.claims.report import failure_groups

    records = [rec("r1", verdict="fail:numeric", items=("BASE", "X")), rec("r2", verdict="fail:nan", items=("BASE", "X")),
               rec("r3", verdict="crashed", items=("BASE", "X", "Y")), rec("r4", items=("BASE", "Y")),
               rec("r5", items=("BASE",)), rec("r6", verdict="fail:guard", items=("BASE", "Z")),
               rec("o1", engine="torch-flash", verdict="fail:numeric", items=("BASE",))]
    groups = failure_groups(failing_cases([records], ["r.jsonl"]), records)
    assert [(e.engine, e.count) for e in groups] == [("torch-flash", 1), ("triton", 4)]
    triton = groups[1]
    assert [(g.item, sorted(f.case_id for f in g.cases), g.failing, g.total) for g in triton.groups] == [
        ("X", ["r1", "r2", "r3"], 3, 3), ("Z", ["r6"], 1, 1)]     # r3: X fails more often than Y
    assert groups[0].groups[0].item == "BASE"                    # the only item it holds
    anchors = [e.anchor for e in groups] + [g.anchor for e in groups for g in e.groups]
    assert len(set(anchors)) == len(anchors)


def test_report_leads_with_contents_linking_every_group(tmp_path):
    import re

    html = write_report(fixture_runs(), ["r.jsonl"], tmp_path / "r.html", min_margin=1.5, axes=AXES).read_text()
    contents = html[html.index('<nav class="toc"'):html.index("</nav>")]
    links = re.findall(r'href="#([^"]+)"', contents)
    ids = set(re.findall(r'id="([^"]+)"', html))
    assert {"failing", "verdicts", "margins", "pairs", "cost", "pairs-1", "pairs-2"} <= set(links)
    assert sum(link.startswith("failing-") for link in links) == 4    # 2 engines, one group each
    assert not [link for link in links if link not in ids]
    assert html.index('<nav class="toc"') < html.index("f00dfeedbeef")
    assert "torch-flash on sm90 (1)" in contents and "triton on sm90 (1)" in contents


ENGINE_MODULE = '''from bundlegen.engines.torch_math.engine import TorchMathEngine


class MyMath(TorchMathEngine):
    name = "my-math"
'''


def _report_of_a_failing_case(tmp_path, monkeypatch, spec):
    """A run of `spec` (engine name my-math) whose first quick case failed, and its report:
    the case, the report's text (unescaped) and how to call bundlegen."""
    import html as html_lib
    import shutil
    import sys

    from bundlegen.harness.bundles import load_level
    from bundlegen.workspace import builtin_bundle_root

    case = load_level(builtin_bundle_root(), "quick").cases[0]
    (tmp_path / "mykernels.py").write_text(ENGINE_MODULE, encoding="utf-8")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    failing = rec(case.id, engine="my-math", verdict="fail:numeric", items=case.items, margin=0.5) | {
        "device": "cpu", "arch": "cpu"}
    (run_dir / "results.jsonl").write_text(json.dumps(failing) + "\n", encoding="utf-8")
    (run_dir / "run.json").write_text(json.dumps({"engine": "my-math", "engine_spec": spec, "level": "quick"}),
                                      encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(results=[str(run_dir)], html=tmp_path / "r.html", bundles=builtin_bundle_root(),
                              plan=None)
    assert report_command.main(args) == 0
    page = html_lib.unescape((tmp_path / "r.html").read_text(encoding="utf-8"))
    command = [shutil.which("bundlegen")] if shutil.which("bundlegen") else [sys.executable, "-m", "bundlegen"]
    return case, page, command


def _run_as_printed(printed, command, cwd, env=None):
    import shlex
    import subprocess

    return subprocess.run(command + shlex.split(printed)[1:], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def test_repro_command_uses_the_spec_the_run_was_given_and_works_as_printed(tmp_path, monkeypatch):
    """A `module:Class` engine's records carry its short name, which `bundlegen repro` cannot
    find; the report prints the spec from run.json, and that command runs as printed (here,
    from the adopter's folder holding the module), with the case's graph in one line."""
    from bundlegen.claims.cases import graph_lines
    from bundlegen.workspace import builtin_bundle_root

    case, page, command = _report_of_a_failing_case(tmp_path, monkeypatch, "mykernels:MyMath")
    printed = f"bundlegen repro {case.id} --engine mykernels:MyMath --device cpu"
    assert printed in page and "--engine my-math" not in page
    assert graph_lines(builtin_bundle_root(), "sdpa_bwd", [case.id])[case.id] in page
    done = _run_as_printed(printed, command, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"case {case.id}" in done.stdout and "verdict: pass" in done.stdout
    short = _run_as_printed(f"bundlegen repro {case.id} --engine my-math --device cpu", command, tmp_path)
    assert short.returncode != 0 and "unknown engine" in short.stdout + short.stderr


def test_repro_command_of_an_entry_point_engine_works_as_printed(tmp_path, monkeypatch):
    """An engine registered by an entry point (a package's `bundlegen.engines` group) runs
    under its name: the printed command names it, and runs as printed."""
    import os

    site = tmp_path / "site"
    dist = site / "mykernels-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mykernels\nVersion: 0.1\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text("[bundlegen.engines]\nmy-math = mykernels:MyMath\n", encoding="utf-8")
    case, page, command = _report_of_a_failing_case(tmp_path, monkeypatch, "my-math")
    printed = f"bundlegen repro {case.id} --engine my-math --device cpu"
    assert printed in page
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(tmp_path)])}
    done = _run_as_printed(printed, command, tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"case {case.id}" in done.stdout and "verdict: pass" in done.stdout
