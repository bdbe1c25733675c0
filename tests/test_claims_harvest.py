"""bundlegen harvest: the claim rule (min runs, margin, every run passes, claimable purposes),
claims only grow unless pruned, the declines kept for the matrix, canonical claims.json."""
import argparse
import json

import pytest

from bundlegen.graph import canonical_json
from bundlegen.claims import harvest_command
from bundlegen.claims.harvest import HarvestRules, harvest
from bundlegen.claims.store import ClaimsError, ClaimSet, claims_path, read_claim_set, write_claim_set

RULES = HarvestRules(min_runs=2, min_margin=1.5, min_orders=1)   # runs here record no order


def rec(case, verdict="pass", margin=10.0, purpose="claim", engine="triton", arch="sm90", reason=None):
    return {"case_id": case, "verdict": verdict, "margin": margin, "purpose": purpose,
            "engine": engine, "arch": arch, "reason": reason, "items": ["AX-X"]}


def claims_of(runs, existing=None, prune=False, rules=RULES, engine="triton", arch="sm90"):
    updated, _ = harvest(runs, {engine: existing} if existing else {}, rules, prune)
    return set(updated[engine].claimed(arch))


def test_needs_min_runs():
    assert claims_of([[rec("a")]]) == set()
    assert claims_of([[rec("a")]], rules=HarvestRules(min_runs=1, min_margin=1.5, min_orders=1)) == {"a"}
    assert claims_of([[rec("a")], [rec("a")]]) == {"a"}
    # a case absent from one run still qualifies on the runs it appears in
    assert claims_of([[rec("a")], [rec("b")], [rec("a")]]) == {"a"}


@pytest.mark.parametrize("margin,claimed", [(1.49, False), (1.5, True), (None, False), (1e9, True)])
def test_margin_threshold_in_every_run(margin, claimed):
    runs = [[rec("a", margin=5.0)], [rec("a", margin=margin)]]
    assert claims_of(runs) == ({"a"} if claimed else set())


@pytest.mark.parametrize("verdict", ["fail:numeric", "fail:nan", "claim-broken", "crashed",
                                     "declined", "fail:nondeterministic"])
def test_one_failing_run_excludes(verdict):
    runs = [[rec("a")], [rec("a")], [rec("a", verdict=verdict, margin=None)]]
    assert claims_of(runs) == set()


def test_probes_never_claimed_regressions_are():
    runs = [[rec("p", purpose="probe"), rec("r", purpose="regression"), rec("c")]] * 2
    assert claims_of(runs) == {"r", "c"}
    rejected = [[rec("p", verdict="rejected", purpose="probe", margin=None, reason="zero-stride-output")]] * 2
    updated, _ = harvest(rejected, {}, RULES)
    assert updated["triton"].claims == {"sm90": frozenset()}
    assert not updated["triton"].declines


def test_last_line_of_a_run_wins():
    runs = [[rec("a", verdict="crashed", margin=None), rec("a")], [rec("a")]]
    assert claims_of(runs) == {"a"}


def test_engines_and_archs_kept_apart():
    runs = [[rec("a"), rec("b", arch="sm120"), rec("c", engine="torch-flash")]] * 2
    updated, changes = harvest(runs, {}, RULES)
    assert set(updated["triton"].claimed("sm90")) == {"a"}
    assert set(updated["triton"].claimed("sm120")) == {"b"}
    assert set(updated["torch-flash"].claimed("sm90")) == {"c"}
    assert {(c.engine, c.arch, c.added) for c in changes} == {
        ("triton", "sm90", 1), ("triton", "sm120", 1), ("torch-flash", "sm90", 1)}


def test_claims_only_grow_unless_pruned():
    existing = ClaimSet("triton", claims={"sm90": frozenset({"old", "broken"}),
                                          "sm120": frozenset({"other-arch"})})
    runs = [[rec("new"), rec("broken", verdict="fail:numeric", margin=0.5)]] * 2
    assert claims_of(runs, existing) == {"old", "broken", "new"}
    updated, changes = harvest(runs, {"triton": existing}, RULES, prune=True)
    assert set(updated["triton"].claimed("sm90")) == {"new"}
    assert set(updated["triton"].claimed("sm120")) == {"other-arch"}   # not covered: untouched
    assert [(c.added, c.dropped, c.total) for c in changes] == [(1, 2, 1)]


def test_declines_recorded_and_cleared():
    runs = [[rec("d", verdict="declined", margin=None, reason="gqa-not-served: H_q=4"),
             rec("cb", verdict="claim-broken", margin=None, reason="mask-not-served"),
             rec("f", verdict="fail:numeric", margin=0.3)]] * 2
    updated, _ = harvest(runs, {}, RULES)
    assert updated["triton"].declined("sm90") == {"d": "gqa-not-served: H_q=4", "cb": "mask-not-served"}
    # a later harvest where d ran (and passed twice) claims it and drops the decline
    later, _ = harvest([[rec("d")], [rec("d")]], updated, RULES)
    assert set(later["triton"].claimed("sm90")) == {"d"}
    assert later["triton"].declined("sm90") == {"cb": "mask-not-served"}
    pruned, _ = harvest([[rec("d")], [rec("d")]], updated, RULES, prune=True)
    assert pruned["triton"].declined("sm90") == {}


def test_skips_are_neither_run_nor_declined():
    runs = [[rec("s", verdict="skipped", margin=None)]] * 2
    updated, _ = harvest(runs, {}, RULES)
    assert updated["triton"].claims == {"sm90": frozenset()} and not updated["triton"].declines


def test_unusable_records_ignored():
    runs = [[{"case_id": "a", "verdict": "pass"}, rec("b")], [rec("b"), {"garbage": 1}]]
    assert claims_of(runs) == {"b"}


def test_default_min_margin_is_the_manifests(tmp_path, capsys):
    """No --min-margin: the manifest's min_claim_margin (1.5) decides; 1.4 is not enough."""
    from bundlegen.plans.sdpa_bwd import MIN_CLAIM_MARGIN

    assert MIN_CLAIM_MARGIN == 1.5
    runs = [_write_run(tmp_path / f"r{i}.jsonl", [rec("ok", margin=1.5, engine="torch-flash"),
                                                   rec("thin", margin=1.4, engine="torch-flash")])
            for i in range(2)]
    root = tmp_path / "engines"
    assert harvest_command.main(_args(runs, root)) == 0
    assert json.loads((root / "torch_flash" / "claims.json").read_text())["claims"] == {"sm90": ["ok"]}
    assert "min margin 1.5" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the file
def test_claims_json_canonical(tmp_path):
    cs = ClaimSet("torch-flash", claims={"sm90": frozenset({"b", "a", "c"}), "sm120": frozenset()},
                  declines={"sm90": {"z": "hv-not-hk", "y": "mask-not-served"}, "sm120": {}})
    path = tmp_path / "claims.json"
    assert write_claim_set(path, cs) is True
    text = path.read_text(encoding="utf-8")
    assert text == canonical_json(json.loads(text)) and text.endswith("}\n")
    raw = json.loads(text)
    assert raw == {"version": 1, "engine": "torch-flash",
                   "claims": {"sm120": [], "sm90": ["a", "b", "c"]},
                   "declines": {"sm90": {"y": "mask-not-served", "z": "hv-not-hk"}}}
    assert write_claim_set(path, cs) is False
    back = read_claim_set(path, "torch-flash")
    assert back.claims == cs.claims and back.declined("sm90") == cs.declined("sm90")


def test_harness_reads_our_claims(tmp_path):
    from bundlegen.harness import config

    write_claim_set(claims_path("triton", tmp_path), ClaimSet("triton", claims={"sm90": frozenset({"a"})},
                                                               declines={"sm90": {"b": "x"}}))
    loaded = config.load_engine_config(tmp_path / "triton")
    assert loaded.is_claimed("a", "sm90") and not loaded.is_claimed("b", "sm90")


# ----------------------------------------------------------------------------- the command
def _write_run(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def _args(results, root, **kw):
    base = dict(results=results, min_runs=2, min_orders=1, min_margin=None, plan=None, prune=False,
                claims_root=root, dry_run=False)
    base.update(kw)
    return argparse.Namespace(**base)


def test_command_writes_claims(tmp_path, capsys):
    runs = [_write_run(tmp_path / f"r{i}.jsonl", [rec("a", engine="torch-flash"),
                                                   rec("p", purpose="probe", engine="torch-flash"),
                                                   rec("x", engine="mod.path:Engine")])
            for i in range(2)]
    root = tmp_path / "engines"
    assert harvest_command.main(_args(runs, root, dry_run=True)) == 0
    assert not (root / "torch_flash" / "claims.json").exists()
    assert harvest_command.main(_args(runs, root)) == 0
    raw = json.loads((root / "torch_flash" / "claims.json").read_text())
    assert raw["claims"] == {"sm90": ["a"]}
    assert "not a registered engine name" in capsys.readouterr().out
    run_dir = tmp_path / "run3"
    run_dir.mkdir()
    _write_run(run_dir / "results.jsonl", [rec("a", engine="torch-flash")])
    assert harvest_command.main(_args([*runs, str(run_dir)], root)) == 0


def test_command_missing_file(tmp_path):
    assert harvest_command.main(_args([str(tmp_path / "nope.jsonl")], tmp_path)) == 2


def test_command_writes_into_the_workspace_engine_folder(tmp_path, monkeypatch, capsys):
    runs = [_write_run(tmp_path / f"r{i}.jsonl", [rec("a", engine="torch-flash")]) for i in range(2)]
    ws = tmp_path / "ws"
    (ws / "kernels" / "torch_flash").mkdir(parents=True)
    (ws / "bundlegen.toml").write_text('engines = ["configs", "kernels"]\n')
    monkeypatch.chdir(ws)
    assert harvest_command.main(_args(runs, None)) == 0
    assert json.loads((ws / "kernels/torch_flash/claims.json").read_text())["claims"] == {"sm90": ["a"]}
    assert harvest_command.main(_args([_write_run(tmp_path / "t.jsonl", [rec("b")])], None, min_runs=1)) == 0
    assert (ws / "configs/triton/claims.json").is_file()        # a new engine: the first folder


def test_command_outside_a_workspace_refuses(tmp_path, monkeypatch, capsys):
    runs = [_write_run(tmp_path / "r.jsonl", [rec("a", engine="torch-flash")])]
    monkeypatch.chdir(tmp_path)
    assert harvest_command.main(_args(runs, None, min_runs=1)) == 2
    assert "harvest writes into a workspace" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


# ----------------------------------------------------------------------------- why not claimed, evidence
def test_unclaimed_cases_say_why():
    runs = [[rec("skip", verdict="skipped", margin=None) | {"detail": "T-9: NaN"}, rec("fail"), rec("thin", margin=1.2),
             rec("once"), rec("dec", verdict="declined", margin=None, reason="mask-not-served")],
            [rec("fail", verdict="fail:nan", margin=0.0) | {"detail": "NaN in dq"}, rec("thin"), rec("skip"),
             rec("dec", verdict="declined", margin=None, reason="mask-not-served")]]
    updated, _ = harvest(runs, {}, RULES)
    assert updated["triton"].not_claimed("sm90") == {
        "skip": "skipped: T-9: NaN",
        "fail": "failed: fail:nan (NaN in dq) in run 2",
        "thin": "margin: 1.2 < 1.5 in run 1",
        "once": "too few runs: passed in 1 of the 2 runs needed"}
    assert updated["triton"].declined("sm90") == {"dec": "mask-not-served"}
    # a later harvest where they pass clears them
    later, _ = harvest([[rec("skip"), rec("fail"), rec("thin"), rec("once")]] * 2, updated, RULES)
    assert later["triton"].not_claimed("sm90") == {}
    assert later["triton"].claimed("sm90") == {"skip", "fail", "thin", "once"}


def test_harvest_records_its_evidence(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    (ws / "engines").mkdir(parents=True)
    (ws / "bundlegen.toml").write_text('engines = ["engines"]\n')
    run_dir = ws / "evidence" / "run1"
    run_dir.mkdir(parents=True)
    _write_run(run_dir / "results.jsonl", [rec("a", engine="torch-flash")])
    (run_dir / "run.json").write_text(json.dumps({
        "level": "pr", "complete": True, "selection": "all",
        "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0", "cudnn": "91000", "driver": "580.1"}}))
    other = _write_run(ws / "evidence" / "old.results.jsonl", [rec("a", engine="torch-flash")])
    monkeypatch.chdir(ws)
    assert harvest_command.main(_args([str(run_dir), other], None)) == 0
    held = read_claim_set(ws / "engines/torch_flash/claims.json", "torch-flash")
    evidence = held.evidence["sm90"]
    assert (evidence.min_runs, evidence.min_margin) == (2, 1.5)
    by_path = {s.path: s for s in evidence.results}
    assert sorted(by_path) == ["evidence/old.results.jsonl", "evidence/run1/results.jsonl"]
    fresh = by_path["evidence/run1/results.jsonl"]
    assert (fresh.level, fresh.complete, fresh.selection) == ("pr", True, "all")
    assert fresh.versions == {"torch": "2.11.0+cu130", "triton": "3.6.0", "cudnn": "91000", "driver": "580.1"}
    import hashlib
    assert fresh.sha256 == hashlib.sha256((run_dir / "results.jsonl").read_bytes()).hexdigest()
    old = by_path["evidence/old.results.jsonl"]
    assert (old.level, old.complete, set(old.versions.values())) == ("", False, {"unknown"})
    raw = json.loads((ws / "engines/torch_flash/claims.json").read_text())
    assert raw["evidence"]["sm90"]["results"][1]["versions"]["cudnn"] == "91000"


def test_run_json_beside_a_results_file():
    from pathlib import Path

    from bundlegen.claims.harvest import run_json_of

    assert run_json_of("x/triton-full.results.jsonl.gz") == Path("x/triton-full.run.json")
    assert run_json_of("x/results.jsonl.gz") == Path("x/run.json")
    assert run_json_of("x/r0.jsonl") == Path("x/r0.run.json")


def test_command_reads_gzipped_results(tmp_path):
    import gzip

    root = tmp_path / "engines"
    paths = []
    for i in range(2):
        path = tmp_path / f"r{i}.results.jsonl.gz"
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(json.dumps(rec("a", engine="torch-flash")) + "\n")
        paths.append(str(path))
    assert harvest_command.main(_args(paths, root)) == 0
    assert json.loads((root / "torch_flash" / "claims.json").read_text())["claims"] == {"sm90": ["a"]}


# ----------------------------------------------------------------------------- bundles of another run
def test_command_refuses_results_run_against_other_bundles(tmp_path, capsys):
    from bundlegen.claims.provenance import workspace_digest
    from bundlegen.workspace import default_bundle_root

    from bundlegen.harness.bundles import load_level
    from bundlegen.harness.results import bundles_digest
    from bundlegen.manifest import manifest_path

    ours = workspace_digest(default_bundle_root(), "quick")
    loaded = load_level(default_bundle_root(), "quick")          # what a run of quick records
    assert ours == bundles_digest([*loaded.files, manifest_path(default_bundle_root())], default_bundle_root())
    same, other, bare = (tmp_path / name for name in ("same", "other", "bare"))
    for folder, digest in ((same, ours), (other, "0123456789abcdef"), (bare, None)):
        folder.mkdir()
        _write_run(folder / "results.jsonl", [rec("a", engine="torch-flash")])
        if digest is not None:
            (folder / "run.json").write_text(json.dumps({"level": "quick", "bundles_digest": digest}))
    root = tmp_path / "engines"
    assert harvest_command.main(_args([str(same), str(bare)], root)) == 0
    capsys.readouterr()
    assert harvest_command.main(_args([str(same), str(other)], root, prune=True)) == 2
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "0123456789abcdef" in out[0] and ours in out[0] and str(other) in out[0]
    # nothing was written: the claims are still the first harvest's
    held = read_claim_set(root / "torch_flash" / "claims.json", "torch-flash")
    assert held.claimed("sm90") == {"a"} and len(held.evidence["sm90"].results) == 2


# ----------------------------------------------------------------------------- case orders
ORDERED = HarvestRules(min_runs=2, min_margin=1.5)        # the default rule: two orders


def test_two_orders_are_the_default_rule(tmp_path, capsys):
    """Two orders unless --min-runs asks for one run only (then one order: a single run has one)."""
    assert ORDERED.min_orders == 2
    parser = argparse.ArgumentParser()
    harvest_command.add_arguments(parser)
    run = _write_run(tmp_path / "r.jsonl", [rec("a", engine="torch-flash")])
    root = tmp_path / "engines"
    for argv, min_orders, claimed in ((["--min-runs", "1"], 1, ["a"]), ([], 2, [])):
        args = parser.parse_args([run, run, *argv, "--claims-root", str(root), "--prune"])
        assert harvest_command.main(args) == 0
        assert f"min orders {min_orders}," in capsys.readouterr().out
        assert json.loads((root / "torch_flash" / "claims.json").read_text())["claims"] == {"sm90": claimed}


def test_claim_needs_passes_in_two_different_orders():
    runs = [[rec("a"), rec("b")], [rec("b"), rec("a")]]
    a_first, b_first = ("a", "b"), ("b", "a")
    assert claims_of(runs) == {"a", "b"}                                 # orders not asked for
    updated, _ = harvest(runs, {}, ORDERED)                              # no order recorded: natural, once
    assert updated["triton"].claimed("sm90") == set()
    assert updated["triton"].not_claimed("sm90")["a"] == "too few orders: passed in 1 of the 2 case orders needed"
    updated, _ = harvest(runs, {}, ORDERED, orders=[a_first, a_first])   # the same order twice counts once
    assert updated["triton"].claimed("sm90") == set()
    updated, _ = harvest(runs, {}, ORDERED, orders=[a_first, b_first])
    assert updated["triton"].claimed("sm90") == {"a", "b"}
    updated, _ = harvest(runs, {}, ORDERED, orders=[None, b_first])      # natural and a shuffled one
    assert updated["triton"].claimed("sm90") == {"a", "b"}
    # three runs, two of them in one order: still two orders
    updated, _ = harvest(runs + [[rec("a"), rec("b")]], {}, HarvestRules(min_runs=3, min_margin=1.5),
                         orders=[a_first, b_first, a_first])
    assert updated["triton"].claimed("sm90") == {"a", "b"}


def test_command_reads_each_runs_order_and_records_the_rule(tmp_path, capsys):
    runs = []
    for i, order in enumerate((["a", "b"], ["b", "a"])):
        run_dir = tmp_path / f"run{i}"
        run_dir.mkdir()
        _write_run(run_dir / "results.jsonl", [rec(c, engine="torch-flash") for c in order])
        (run_dir / "run.json").write_text(json.dumps({"level": "quick", "shuffle_seed": i, "order": order}))
        runs.append(str(run_dir))
    root = tmp_path / "engines"
    assert harvest_command.main(_args(runs[:1] * 2, root, min_orders=2)) == 0    # one order, twice
    assert json.loads((root / "torch_flash" / "claims.json").read_text())["claims"] == {"sm90": []}
    assert harvest_command.main(_args(runs, root, min_orders=2)) == 0
    raw = json.loads((root / "torch_flash" / "claims.json").read_text())
    assert raw["claims"] == {"sm90": ["a", "b"]} and raw["evidence"]["sm90"]["min_orders"] == 2
    assert read_claim_set(root / "torch_flash" / "claims.json", "torch-flash").evidence["sm90"].min_orders == 2
    assert "2 run(s) in 2 case order(s)" in capsys.readouterr().out


def test_evidence_without_min_orders_reads_as_one_order(tmp_path):
    """Evidence harvested before runs recorded their order has no min_orders: it was harvested
    with one order, is checked with one, and rewrites unchanged."""
    from bundlegen.claims.store import LEGACY_MIN_ORDERS, ArchEvidence, RunSource

    assert LEGACY_MIN_ORDERS == 1
    path = tmp_path / "claims.json"
    old = ClaimSet("triton", claims={"sm90": frozenset({"a"})},
                   evidence={"sm90": ArchEvidence(min_runs=2, min_margin=1.5, results=(RunSource("r", "0" * 64),))})
    write_claim_set(path, old)
    assert "min_orders" not in path.read_text()
    back = read_claim_set(path, "triton")
    assert back.evidence["sm90"].min_orders == 1 and back == old
    raw = json.loads(path.read_text())
    raw["evidence"]["sm90"]["min_orders"] = 0
    path.write_text(json.dumps(raw))
    with pytest.raises(ClaimsError, match=r"evidence: sm90: malformed \(min_orders 0 is below 1\)"):
        read_claim_set(path, "triton")


def test_order_dependent_verdicts_named_with_their_neighbours():
    from bundlegen.claims.harvest import order_dependent

    runs = [[rec("x"), rec("a"), rec("c")],
            [rec("c"), rec("y"), rec("a", verdict="fail:numeric", margin=0.2), rec("x")],
            [rec("s", verdict="skipped", margin=None), rec("c")]]
    # run 1 records no order (its records' order), run 2 its shuffled order, run 3 none
    found = order_dependent(runs, [None, ("c", "y", "a", "x")])
    assert [d.case_id for d in found] == ["a"]
    (a,) = found
    assert (a.first.run, a.first.verdict, a.first.neighbour) == (0, "pass", "x")
    assert (a.other.run, a.other.verdict, a.other.neighbour) == (1, "fail:numeric", "y")
    assert a.line() == "order-dependent: triton sm90 a: pass in run 1 (after x), fail:numeric in run 2 (after y)"
    # the recorded order decides the neighbour, not where the record sits in the file
    (moved,) = order_dependent(runs, [("a", "x", "c"), ("c", "y", "a", "x")])
    assert moved.first.neighbour is None and "pass in run 1 (run first)" in moved.line()


def test_command_reports_order_dependent_cases_one_line_each(tmp_path, capsys):
    runs = [_write_run(tmp_path / "r0.jsonl", [rec("n1", engine="torch-flash"), rec("a", engine="torch-flash"),
                                               rec("b", engine="torch-flash")]),
            _write_run(tmp_path / "r1.jsonl", [rec("n2", engine="torch-flash"),
                                               rec("b", verdict="crashed", margin=None, engine="torch-flash"),
                                               rec("a", verdict="fail:nan", margin=0.0, engine="torch-flash")])]
    root = tmp_path / "engines"
    for dry_run in (True, False):
        assert harvest_command.main(_args(runs, root, dry_run=dry_run)) == 0
        lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if "order-dependent" in ln]
        assert lines == ["order-dependent: torch-flash sm90 a: pass in run 1 (after n1), fail:nan in run 2 (after b)",
                         "order-dependent: torch-flash sm90 b: pass in run 1 (after a), crashed in run 2 (after n2)"]


def test_matrix_check_reapplies_each_archs_order_rule(tmp_path):
    """integrity.verify reads each cited run's order from its run.json and applies the
    arch's recorded min_orders: one order backs legacy (min_orders 1) evidence only."""
    from bundlegen.claims.cases import BundleCases
    from bundlegen.claims.harvest import run_source
    from bundlegen.claims.integrity import verify
    from bundlegen.claims.store import ArchEvidence

    cases = BundleCases(items={"AX-X": frozenset({"a", "b"})},
                        case_items={"a": frozenset({"AX-X"}), "b": frozenset({"AX-X"})},
                        levels=(("quick", frozenset({"a", "b"})),))
    paths = []
    for i, order in enumerate((["a", "b"], ["b", "a"])):
        path = tmp_path / f"r{i}.results.jsonl"
        _write_run(path, [rec(c) for c in order])
        (tmp_path / f"r{i}.run.json").write_text(json.dumps({"level": "quick", "complete": True, "order": order}))
        paths.append(path)
    sources = tuple(run_source(p, tmp_path) for p in paths)

    def problems(min_orders, cited):
        claim_set = ClaimSet("triton", claims={"sm90": frozenset({"a", "b"})},
                             evidence={"sm90": ArchEvidence(min_runs=2, min_margin=1.5, min_orders=min_orders,
                                                            results=cited)})
        return [str(p) for p in verify(claim_set, cases, tmp_path)]

    assert problems(2, sources) == []
    assert problems(1, sources) == []
    (tmp_path / "r1.run.json").write_text(json.dumps({"level": "quick", "complete": True, "order": ["a", "b"]}))
    assert problems(1, sources) == []                     # legacy rule: one order is enough
    (unbacked,) = problems(2, sources)
    assert "2 claims not backed" in unbacked and "min orders 2" in unbacked


def test_no_checked_in_claim_is_a_case_its_rows_skip():
    """A run skips what an engine's [[test_skips]] rows select, so no run can back a claim
    on such a case: with the versions each arch's evidence was run with, none is claimed."""
    from bundlegen.harness.config import load_engine_config
    from tests.record_skipped_cases import ENGINES, every_case, skipped

    cases, manifest = every_case()
    checked = 0
    for path in sorted(ENGINES.glob("*/claims.json")):
        held = read_claim_set(path, path.parent.name)
        config = load_engine_config(path.parent, manifest)
        for arch, evidence in held.evidence.items():
            claimed = [c for c in cases if c.id in held.claimed(arch)]
            for versions in {tuple(sorted(s.versions.items())) for s in evidence.results}:
                found = skipped(config, claimed, arch, dict(versions))
                assert not found, f"{path.parent.name} {arch}: claims skipped cases {sorted(found)}"
                checked += len(claimed)
    assert checked, "no claim was checked"


def test_a_recorded_order_missing_cases_gives_way_to_the_files_order():
    """A resumed run's run.json records only its last invocation's order: where it misses a
    case of the file, the file's own record order places the neighbours."""
    from bundlegen.claims.harvest import run_sequence

    records = [rec("x"), rec("y"), rec("a")]
    assert run_sequence(records, ("a", "y", "x")) == {("triton", "sm90"): ["a", "y", "x"]}
    assert run_sequence(records, ("a", "y")) == {("triton", "sm90"): ["x", "y", "a"]}
    assert run_sequence(records + [rec("x")], None) == {("triton", "sm90"): ["y", "a", "x"]}   # its last record


# ----------------------------------------------------------------------------- the command's defaults
def _parsed(argv):
    parser = argparse.ArgumentParser()
    harvest_command.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_command_drops_what_its_runs_no_longer_back_unless_told_to_keep_it(tmp_path, capsys):
    """A harvest whose runs no longer back a claim drops it by default (then `matrix --check`
    agrees with the claims); --keep-unbacked keeps it."""
    root = tmp_path / "engines"
    both = _write_run(tmp_path / "both.jsonl", [rec("a", engine="torch-flash"), rec("b", engine="torch-flash")])
    only_a = _write_run(tmp_path / "only_a.jsonl", [rec("a", engine="torch-flash"),
                                                    rec("b", engine="torch-flash", verdict="fail:numeric")])
    claims = lambda: json.loads((root / "torch_flash" / "claims.json").read_text())["claims"]  # noqa: E731
    common = ["--min-runs", "1", "--claims-root", str(root)]
    assert harvest_command.main(_parsed([both, *common])) == 0 and claims() == {"sm90": ["a", "b"]}
    assert harvest_command.main(_parsed([only_a, *common, "--keep-unbacked"])) == 0
    assert claims() == {"sm90": ["a", "b"]}
    capsys.readouterr()
    assert harvest_command.main(_parsed([only_a, *common])) == 0
    assert claims() == {"sm90": ["a"]} and "(+0 -1)" in capsys.readouterr().out


def test_the_command_refuses_results_under_the_default_out_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "torch-flash-quick").mkdir(parents=True)
    run = _write_run(tmp_path / "out" / "torch-flash-quick" / "results.jsonl", [rec("a", engine="torch-flash")])
    assert harvest_command.main(_parsed([run, "--min-runs", "1", "--claims-root", str(tmp_path / "e")])) == 2
    said = capsys.readouterr().out
    assert len(said.strip().splitlines()) == 1 and "the next `bundlegen run` overwrites" in said
    assert ("mkdir -p evidence/torch-flash-quick && cp out/torch-flash-quick/results.jsonl "
            "out/torch-flash-quick/run.json evidence/torch-flash-quick/") in said
    assert not (tmp_path / "e").exists()
