"""`bundlegen export hipdnn` round trip: the export read back by a small reader written from
hipDNN's documented rules (sweep discovery, placeholder resolution, per-uid values, required
metadata, canonical sidecars, name sanitizing and collisions), compared case by case with our
bundles; the TOML block's filters; junit harvested back; bad input. Expected counts are
computed from the bundles, never typed in."""
from __future__ import annotations

import fnmatch
import hashlib
import gzip
import json
import re
import tomllib
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest

from bundlegen import cli
from bundlegen.claims import hipdnn_format as fmt
from bundlegen.claims.harvest import HarvestRules, harvest
from bundlegen.claims.hipdnn_export import build_export, counts_table, load_cases, write_tree
from bundlegen.claims.hipdnn_gtest import MARGIN_PROPERTY, read_junit, records, run_json
from bundlegen.claims.hipdnn_toml import block_text
from bundlegen.claims.store import ClaimSet
from bundlegen.manifest import load_manifest
from bundlegen.tolerance_block import BEGIN, END, refresh
from bundlegen.workspace import builtin_bundle_root

ROOT = Path(__file__).resolve().parent.parent
PLACEHOLDER = re.compile(r"^\$\{case\.([A-Za-z0-9_.]+)\}$")
PER_TENSOR_ONLY = ("dims", "strides", "data_type")
PORT_OF_KEY = {"q_tensor_uid": "q", "k_tensor_uid": "k", "v_tensor_uid": "v", "o_tensor_uid": "o",
               "do_tensor_uid": "do", "stats_tensor_uid": "stats", "attn_mask_tensor_uid": "bias",
               "dq_tensor_uid": "dq", "dk_tensor_uid": "dk", "dv_tensor_uid": "dv", "dbias_tensor_uid": "dbias"}
OUR_DTYPE = {"bfloat16": "bf16", "half": "fp16", "float": "fp32"}


# ----------------------------------------------------------------- the independent reader
def resolve(node, values: dict, per_uid: dict, used: set, uid=None):
    """hipDNN's placeholder rules: whole values only; inside a tensor (an object with an
    integer uid) the uid's entry first, then the case-wide values; dims, strides and
    data_type only from the uid's entry; dotted paths; a missing value fails the case."""
    if isinstance(node, dict):
        own = node.get("uid") if isinstance(node.get("uid"), int) else uid
        return {k: resolve(v, values, per_uid, used, own) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, values, per_uid, used, uid) for v in node]
    m = PLACEHOLDER.match(node) if isinstance(node, str) else None
    if m is None:
        if isinstance(node, str):
            assert "${case." not in node, f"placeholder inside a longer string: {node}"
        return node
    path = m.group(1)
    if uid is not None and path.split(".")[0] in per_uid.get(uid, {}):
        used.add((uid, path))
        return _dotted(per_uid[uid], path)
    assert not (uid is not None and path in PER_TENSOR_ONLY), f"{path} of uid {uid} must come from its entry"
    assert path.split(".")[0] in values, f"no value for placeholder {path}"
    used.add((None, path.split(".")[0]))
    return _dotted(values, path)


def _dotted(obj: dict, path: str):
    for part in path.split("."):
        obj = obj[part]
    return obj


def read_export(root: Path) -> dict[str, dict]:
    """Full GTest name -> {graph, metadata, sweep, case_id}, checking the documented rules."""
    out: dict[str, dict] = {}
    for sweep_json in sorted(root.rglob("sweep.json")):
        folder = sweep_json.parent
        assert (folder / "graph.template.json").is_file(), folder
        template = json.loads((folder / "graph.template.json").read_text())
        sweep = json.loads(sweep_json.read_text())
        assert sweep["version"] == 1
        uids = {t["uid"] for t in template["tensors"]}
        rel = folder.relative_to(root).as_posix()
        suite = "_".join(re.sub(r"[^A-Za-z0-9_]", "_", s) for s in rel.split("/"))
        ids = [c["id"] for c in sweep["cases"]]
        assert len(ids) == len(set(ids)) and all(ids), f"{rel}: ids empty or repeated"
        for case in sweep["cases"]:
            meta = case["metadata"]
            assert meta["format_version"] == 1 and meta["generator"] and meta["reference_source"]
            values = dict(case.get("values", {}))
            per_uid = {t["uid"]: {k: v for k, v in t.items() if k != "uid"} for t in values.pop("tensors", [])}
            assert set(per_uid) <= uids and len(per_uid) == len(case["values"].get("tensors", []))
            used: set = set()
            graph = resolve(template, values, per_uid, used)
            unused = {k for k in values if (None, k) not in used}
            assert not unused, f"{rel}/{case['id']}: unused values {unused}"
            name = f"{suite}.{re.sub(r'[^A-Za-z0-9_]', '_', case['id'])}"
            assert name not in out, f"Bundle name collision: {name}"
            out[name] = {"graph": graph, "metadata": meta, "sweep": rel, "case_id": case["id"]}
        check_sidecar(folder / "support.json", set(ids))
    return out


def check_sidecar(path: Path, ids: set[str]) -> None:
    text = path.read_text()
    obj = json.loads(text)
    assert text == json.dumps(obj, indent=2, sort_keys=True) + "\n", f"{path}: not canonical"
    assert obj["version"] == 1
    for engine, groups in obj["claims"].items():
        named = [i for g in groups for i in g["cases"]]
        assert len(named) == len(set(named)) and set(named) <= ids, f"{path}: {engine}"
        assert groups == sorted(groups, key=lambda g: g["cases"][0])
        assert all(g["cases"] == sorted(g["cases"]) for g in groups)
        maps = [json.dumps(g["support"], sort_keys=True) for g in groups]
        assert len(maps) == len(set(maps)), "one group per identical support map"


def as_ours(graph: dict) -> dict:
    """The read graph in our bundle's JSON terms (tensors by port, the attributes)."""
    tensors = {t["uid"]: t for t in graph["tensors"]}
    node = graph["nodes"][0]
    assert node["type"] == "SdpaBackwardAttributes"
    ports = {}
    for side in ("inputs", "outputs"):
        for key, uid in node[side].items():
            if uid is not None:
                t = tensors[uid]
                ports[PORT_OF_KEY[key]] = {"dims": t["dims"], "strides": t["strides"], "offset": 0,
                                           "dtype": OUR_DTYPE[t["data_type"]]}
    a = node["attributes"]
    return {"tensors": ports, "attributes": {
        "attn_scale": a["attn_scale_value"], "diagonal_alignment": a["diagonal_alignment"],
        "left_bound": a["left_bound"], "right_bound": a["right_bound"],
        "dropout_probability": a["dropout_probability"]}}


# ----------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def plan_export():
    cases, plan, levels = load_cases(builtin_bundle_root(), None, None)
    return cases, build_export(cases, plan, levels, "test")


@pytest.fixture(scope="module")
def written(plan_export, tmp_path_factory):
    out = tmp_path_factory.mktemp("hipdnn") / "bundles"
    write_tree(out, plan_export[1].files)
    return out


# ----------------------------------------------------------------- round trip
def test_every_exported_graph_reads_back_equal_to_ours(plan_export, written):
    cases, export = plan_export
    read = read_export(written)
    by_id = {c.id: c for c in cases}
    assert set(read) == set(export.name_of())
    for name, got in read.items():
        case = by_id[got["metadata"]["bundlegen"]["case_id"]]
        assert as_ours(got["graph"]) == case.graph.to_json(), name
        assert got["metadata"]["seed"] == case.data.seed
        assert got["metadata"]["purpose"] == case.purpose
        assert got["metadata"]["bundlegen"]["tolerance_class"] == case.tolerance_class
        assert got["metadata"].get("expected_rejection", False) == (case.expected_rejection is not None)
        assert got["sweep"].split("/")[0] == fmt.TIERS[case.level]


def test_every_case_is_exported_or_counted_under_its_reason(plan_export):
    cases, export = plan_export
    exported = {e.case.id for e in export.exported}
    left = [i for ids in export.left_out.values() for i in ids]
    assert len(left) == len(set(left)) and not exported & set(left)
    assert exported | set(left) == {c.id for c in cases}
    for case in cases:
        why = fmt.left_out(case)
        assert (case.id in exported) == (why is None)
        if why is not None:
            assert case.id in export.left_out[why]
    drop = {c.id for c in cases if c.graph.attributes.dropout_probability or "dropout_mask" in c.graph.tensors}
    assert {i for ids in export.needs_field.values() for i in ids} == drop


def test_one_template_per_topology(written):
    for folder in {p.parent for p in written.rglob("sweep.json")}:
        template = json.loads((folder / "graph.template.json").read_text())
        wired = {k for side in ("inputs", "outputs") for k, v in template["nodes"][0][side].items() if v is not None}
        want = {"AttnMask": "attn_mask_tensor_uid", "DBias": "dbias_tensor_uid"}
        words = folder.name.removeprefix("Bundlegen_").split("_")
        assert {k for w, k in want.items() if w in words} == wired & set(want.values()), folder


def test_a_second_export_is_byte_identical(plan_export, written, tmp_path):
    cases, first = plan_export
    second = build_export(cases, first.plan, tuple(first.per_level), "test")
    write_tree(tmp_path / "again", second.files)
    a = {p.relative_to(written): p.read_bytes() for p in written.rglob("*") if p.is_file()}
    b = {p.relative_to(tmp_path / "again"): p.read_bytes() for p in (tmp_path / "again").rglob("*") if p.is_file()}
    assert a == b


def test_readme_and_adopting_give_the_exports_counts(plan_export):
    table = counts_table(plan_export[1])
    for doc in ("README.md", "docs/ADOPTING.md"):
        assert table in (ROOT / doc).read_text(encoding="utf-8"), \
            f"{doc}: its hipDNN export counts differ from the export's; replace its table with:\n{table}"


# ----------------------------------------------------------------- engine TOML block
def test_toml_block_filters_select_exactly_each_class(plan_export):
    cases, export = plan_export
    manifest = load_manifest(builtin_bundle_root())
    block = block_text(export, manifest.tolerance_classes, [], "test")
    rows = tomllib.loads(refresh("[meta]\nversion = 1\n", block).text)["tolerance_overrides"]
    names = export.name_of()
    by_name = {e.placement.gtest_name: e.case for e in export.exported}
    covered = set()
    for row in rows:
        picked = {n for n in names if any(fnmatch.fnmatchcase(n, f) for f in row["filters"])}
        classes = {by_name[n].tolerance_class for n in picked}
        assert len(classes) == 1, classes
        (name,) = classes
        assert picked == {n for n, c in by_name.items() if c.tolerance_class == name}
        tc = manifest.tolerance_classes[name]
        assert (row["atol"], row["rtol"]) == (tc.atol, tc.rtol)
        covered |= picked
    assert covered == {n for n, c in by_name.items() if c.tolerance_class is not None}


def test_tolerances_format_hipdnn_keeps_the_rest_byte_for_byte(tmp_path, capsys):
    """A stale block is replaced; the hand-written lines before and after it (CRLF line
    endings, a hand row that must keep winning) stay byte for byte."""
    path = tmp_path / "ENGINE.toml"
    before = "[meta]\r\nversion = 1\r\n\r\n"
    after = "\r\n[[tolerance_overrides]]\r\nfilters = [\"*x*\"]\r\natol = 1.0\r\nrtol = 0.5\r\n"
    stale = f"{BEGIN}\r\n[[tolerance_overrides]]\r\nfilters = [\"old\"]\r\natol = 9.0\r\nrtol = 9.0\r\n{END}"
    path.write_bytes((before + stale + after).encode())
    argv = ["tolerances", "--format", "hipdnn", "--engine-toml", str(path), "--bundles", str(builtin_bundle_root())]
    assert cli.main(argv) == 0
    text = path.read_bytes().decode()
    assert text.startswith(before) and text.endswith(f"{END}{after}") and '"old"' not in text
    assert "\n" not in text.replace("\r\n", "")
    assert cli.main(argv + ["--check"]) == 0


# ----------------------------------------------------------------- results back
def junit(rows: list[tuple[str, str, str, float | None]], seed: int | None = None) -> str:
    """A GTest junit: (full name, outcome pass|failure|skipped, message, margin)."""
    cases = []
    for name, outcome, message, margin in rows:
        suite, test = name.split(".", 1)
        inner = f'<properties><property name="{MARGIN_PROPERTY}" value="{margin}"/></properties>' if margin else ""
        if outcome == "failure":
            inner += f"<failure message={quoteattr(message)}/>"
        if outcome == "skipped":
            inner += f"<skipped message={quoteattr(message)}/>"
        cases.append(f'<testsuite name="{suite}"><testcase name="{test}" classname="{suite}" status="run" '
                     f'result="{"skipped" if outcome == "skipped" else "completed"}">{inner}</testcase></testsuite>')
    seed_attr = f' random_seed="{seed}"' if seed else ""
    return f'<?xml version="1.0"?><testsuites{seed_attr}>{"".join(cases)}</testsuites>'


def test_a_synthetic_junit_harvests_to_the_expected_claims(plan_export, tmp_path):
    cases, export = plan_export
    claimable = sorted((e for e in export.exported if e.case.purpose != "probe"), key=lambda e: e.case.id)[:4]
    probe = next(e for e in export.exported if e.case.expected_rejection is not None)
    passes, failing, declined, skipped = claimable
    rows = [(passes.placement.gtest_name, "pass", "", 9.0), (failing.placement.gtest_name, "failure", "mismatch", None),
            (declined.placement.gtest_name, "skipped", "Engine not applicable", None),
            (skipped.placement.gtest_name, "skipped", "[arch gfx942:sramecc+] T-1 - known", None),
            (probe.placement.gtest_name, "failure", "accepted expected-rejection bundle", None)]
    runs = []
    for seed in (1, 2):
        path = tmp_path / f"r{seed}.xml"
        path.write_text(junit(rows, seed))
        runs.append(records(read_junit(path)[0], export, "ASM_SDPA_ENGINE", "gfx942", path))
    store = fmt.store_engine("ASM_SDPA_ENGINE")
    updated, _ = harvest(runs, {store: ClaimSet(engine=store)}, HarvestRules(min_margin=1.5, min_runs=2, min_orders=1))
    got = updated[store]
    assert got.claims == {"gfx942": frozenset({passes.case.id})}
    assert got.declines["gfx942"] == {declined.case.id: "Engine not applicable"}
    assert set(got.unclaimed["gfx942"]) == {failing.case.id, skipped.case.id}
    verdicts = {r["case_id"]: r["verdict"] for r in runs[0]}
    assert verdicts[probe.case.id] == "rejection-accepted"


def our_torch_math_runs() -> list[tuple[list[dict], list[str]]]:
    """Our two shuffled torch-math runs of the whole plan: (records, the run's case order)."""
    runs = []
    for n in (1, 2):
        with gzip.open(ROOT / f"evidence/h200/torch-math-full-{n}.results.jsonl.gz", "rt") as fh:
            records_ = [json.loads(line) for line in fh if line.strip()]
        order = json.loads((ROOT / f"evidence/h200/torch-math-full-{n}.run.json").read_text())["order"]
        runs.append((records_, order))
    return runs


def test_junit_from_our_torch_math_results_reproduces_their_claims(plan_export, tmp_path):
    """Our own torch-math runs, written as the junit a hipDNN lane gives (a test per exported
    case it ran, in the run's shuffled order, its margin as a property), harvest back to the
    same claims of the exported cases as the runs themselves."""
    cases, export = plan_export
    by_id = {e.case.id: e.placement.gtest_name for e in export.exported}
    outcome = {"pass": "pass", "declined": "skipped", "skipped": "skipped", "rejected": "pass"}
    ours, our_orders, from_junit, junit_orders = [], [], [], []
    for index, (run, order) in enumerate(our_torch_math_runs()):
        rank = {case_id: i for i, case_id in enumerate(order)}
        mine = sorted((r for r in run if r.get("case_id") in by_id), key=lambda r: rank[r["case_id"]])
        ours.append(mine)
        our_orders.append(order)
        rows = [(by_id[r["case_id"]], outcome.get(r["verdict"], "failure"),
                 (f"[arch {r['arch']}] {r.get('detail', '')}" if r["verdict"] == "skipped" else r.get("reason") or ""),
                 r.get("margin") if r["verdict"] == "pass" else None) for r in mine]
        path = tmp_path / f"math{index}.xml"
        path.write_text(junit(rows, seed=index + 1))
        results, shuffled = read_junit(path)
        recs = records(results, export, "TORCH_MATH", mine[0]["arch"], path)
        from_junit.append(recs)
        junit_orders.append(run_json(path, recs, export, shuffled, builtin_bundle_root(), None)["order"])
    rules = HarvestRules(min_margin=load_manifest(builtin_bundle_root()).min_claim_margin)
    direct, _ = harvest(ours, {"torch-math": ClaimSet(engine="torch-math")}, rules, orders=our_orders)
    store = fmt.store_engine("TORCH_MATH")
    back, _ = harvest(from_junit, {store: ClaimSet(engine=store)}, rules, orders=junit_orders)
    claimed = direct["torch-math"].claims
    assert claimed and all(claimed.values()), "the runs themselves claim nothing: the comparison would be empty"
    assert back[store].claims == claimed
    assert back[store].declines == direct["torch-math"].declines


# ----------------------------------------------------------------- bad input
def _one_error_line(capsys) -> str:
    err = capsys.readouterr()
    lines = [l for l in (err.err + err.out).splitlines() if l.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_an_unknown_level_is_one_error_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "x"
    assert cli.main(["export", "hipdnn", "--out", str(out), "--level", "nope"]) == 2
    assert "unknown level 'nope'" in _one_error_line(capsys) and not out.exists()


def test_an_out_that_is_a_file_is_one_error_and_left_alone(tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("mine")
    assert cli.main(["export", "hipdnn", "--out", str(out), "--level", "quick"]) == 2
    assert "is a file" in _one_error_line(capsys) and out.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_junit_naming_unknown_tests_is_one_error_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "r.xml"
    path.write_text(junit([("quick_SdpaBackward_Bundlegen_Default.b1_h1_1_1_s1_1_d1_1_bf16_000000000000", "pass", "", 3.0)]))
    code = cli.main(["harvest", "--from-gtest", str(path), "--engine", "ASM_SDPA_ENGINE", "--arch", "gfx942",
                     "--claims-root", str(tmp_path / "claims")])
    assert code == 2
    assert "is no case of the current export" in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.xml"]


# ----------------------------------------------------------------- an engine's claims and defects
def _engine_folder(root: Path, valid, probe) -> Path:
    """A hipDNN engine's bundlegen folder: claims on two archs, one skip row over a valid
    case and a probe."""
    folder = root / fmt.store_engine("ASM_SDPA_ENGINE").replace("-", "_")
    folder.mkdir(parents=True)
    (folder / "engine.toml").write_text(
        '[meta]\nname = "hipdnn-asm-sdpa-engine"\n\n[[test_skips]]\nticket = "T-7"\nreason = "wrong dV"\n'
        f'archs = ["gfx942"]\nfilters = {{ id = ["{valid.case.id}", "{probe.case.id}"] }}\n')
    return folder


def test_engine_claims_skips_and_quarantine(plan_export, tmp_path, capsys):
    cases, export = plan_export
    probe = next(e for e in export.exported if e.case.expected_rejection is not None)
    sweep = probe.placement.sweep
    valid = sorted((e for e in export.exported if e.case.purpose == "claim" and e.placement.sweep == sweep),
                   key=lambda e: e.placement.case_id)
    a, b, c, d = valid[:4]     # one sweep: a on two archs, b and d on one (two groups, a's first)
    folder = _engine_folder(tmp_path / "engines", c, probe)
    claims = {"version": 1, "engine": "hipdnn-asm-sdpa-engine",
              "claims": {"gfx942": sorted([a.case.id, b.case.id, d.case.id]), "gfx950": [a.case.id]}}
    (folder / "claims.json").write_text(json.dumps(claims))
    out, yaml = tmp_path / "out", tmp_path / "quarantine.yaml"
    argv = ["export", "hipdnn", "--out", str(out), "--engine", "ASM_SDPA_ENGINE", "--tier-yaml", str(yaml),
            "--claims-root", str(tmp_path / "engines")]
    assert cli.main(argv) == 0
    read = read_export(out)    # the sidecars pass the reader's canonical-form checks
    sidecar = json.loads((out / sweep / "support.json").read_text())
    assert sidecar["claims"]["ASM_SDPA_ENGINE"] == [
        {"cases": [a.placement.case_id], "support": {"gfx942": ["linux"], "gfx950": ["linux"]}},
        {"cases": [b.placement.case_id, d.placement.case_id], "support": {"gfx942": ["linux"]}}]
    assert len(read) == len(export.exported)
    quarantine = yaml.read_text()
    assert f'"{probe.placement.gtest_name}"' in quarantine and c.placement.gtest_name not in quarantine
    assert "T-7" in quarantine
    toml = tmp_path / "ASM_SDPA_ENGINE.toml"
    toml.write_text("[meta]\nversion = 1\n")
    assert cli.main(["tolerances", "--format", "hipdnn", "--engine-toml", str(toml), "--engine", "ASM_SDPA_ENGINE",
                     "--config-root", str(tmp_path / "engines")]) == 0
    (skip,) = tomllib.loads(toml.read_text())["test_skips"]
    assert skip == {"archs": ["gfx942"], "filters": [c.placement.gtest_name], "reason": "T-7 - wrong dV"}


def test_harvest_from_gtest_writes_claims_citing_the_converted_run(plan_export, tmp_path, capsys):
    cases, export = plan_export
    claim = sorted((e for e in export.exported if e.case.purpose == "claim"), key=lambda e: e.case.id)[0]
    junit_path = tmp_path / "lane.xml"
    junit_path.write_text(junit([(claim.placement.gtest_name, "pass", "", 7.5)]))
    argv = ["harvest", "--from-gtest", str(junit_path), "--engine", "ASM_SDPA_ENGINE", "--arch", "gfx942",
            "--min-runs", "1", "--min-orders", "1", "--claims-root", str(tmp_path / "claims")]
    assert cli.main(argv) == 0
    converted = tmp_path / "lane.bundlegen"
    run = json.loads((converted / "run.json").read_text())
    assert run["source"]["junit"] == "lane.xml" and run["level"] == claim.case.level and not run["complete"]
    stored = json.loads((tmp_path / "claims" / "hipdnn_asm_sdpa_engine" / "claims.json").read_text())
    assert stored["claims"] == {"gfx942": [claim.case.id]}
    (cited,) = stored["evidence"]["gfx942"]["results"]
    assert cited["path"].endswith("lane.bundlegen/results.jsonl")
    assert cited["sha256"] == hashlib.sha256((converted / "results.jsonl").read_bytes()).hexdigest()


def test_claims_from_a_complete_gtest_run_pass_the_matrix_check(plan_export, tmp_path, monkeypatch):
    """A lane that ran every exported case of quick: its claims are backed (integrity's
    re-derivation from the cited converted file) and the level counts as covered."""
    from bundlegen.claims.cases import bundle_cases
    from bundlegen.claims.integrity import verify
    from bundlegen.claims.store import read_claim_set

    cases, export = plan_export
    quick = [e for e in export.exported if e.case.level == "quick"]
    rows = [(e.placement.gtest_name, "pass", "", 5.0) for e in quick]
    junit_path = tmp_path / "quick.xml"
    junit_path.write_text(junit(rows))
    monkeypatch.chdir(ROOT)
    assert cli.main(["harvest", "--from-gtest", str(junit_path), "--engine", "ASM_SDPA_ENGINE", "--arch", "gfx942",
                     "--min-runs", "1", "--min-orders", "1", "--claims-root", str(tmp_path / "claims")]) == 0
    store = fmt.store_engine("ASM_SDPA_ENGINE")
    claim_set = read_claim_set(tmp_path / "claims" / "hipdnn_asm_sdpa_engine" / "claims.json", store)
    assert claim_set.claims["gfx942"] == {e.case.id for e in quick if e.case.purpose != "probe"}
    manifest = load_manifest(builtin_bundle_root())
    known = bundle_cases(builtin_bundle_root(), manifest.plan, manifest.level_names)
    assert verify(claim_set, known, ROOT) == []
