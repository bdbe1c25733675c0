"""The support matrix from explicit fixtures: the four states (supported, partial with why,
declined with the feature's own reason, not run), probes excluded, every level's bundles
read, the plan's feature rows, never-run archs listed apart, lines within 120 columns,
deterministic rendering."""
import pytest

from bundlegen.graph import Bundle, Rejection, canonical_json
from bundlegen.claims.cases import BundleCases
from bundlegen.claims.matrix import (DECLINED, IN_NO_RUN, NOT_RUN, NO_CASES, PARTIAL, SUPPORTED, WIDTH, Column,
                                     Feature, FeatureGroup, Gate, build_matrix, cell_for, display_width,
                                     feature_cases, feature_groups, feature_reason, render)
from bundlegen.claims.store import ClaimSet
from tests.graph_factory import make_case, make_graph

SM90 = Column("torch-flash", "sm90")
FLASH = ClaimSet("torch-flash", claims={"sm90": frozenset({"a", "b", "c"})},
                 declines={"sm90": {"d": "hv-not-hk: H_k=4, H_v=2", "e": "hv-not-hk", "f": "mask-not-served",
                                    "g": "mask-not-served", "h": "alignment-not-served"}},
                 unclaimed={"sm90": {"s": "skipped: T-1: NaN", "t": "skipped: T-1: NaN",
                                     "u": "failed: fail:numeric in run 2", "v": "too few runs: passed in 1 of 2",
                                     "w": "margin: 1.2 < 1.5 in run 1"}})


@pytest.mark.parametrize("cases,status,text", [
    ({"a", "b"}, SUPPORTED, "✅ 2"),
    ({"a", "b", "d", "f"}, SUPPORTED, "✅ 2"),           # declines for other features do not count
    ({"a", "x"}, PARTIAL, "🟡 1/2"),                     # x: in no run
    ({"d", "e", "f", "x"}, DECLINED, "❌ hv-not-hk"),    # declined wherever seen: x (in no run) says nothing
    ({"d", "e", "f", "u"}, PARTIAL, "🟡 0/1"),           # accepted (failed), never claimed
    ({"d", "e", "f"}, DECLINED, "❌ hv-not-hk"),         # no case's other items served: most common
    ({"f", "g", "d", "e"}, DECLINED, "❌ hv-not-hk"),    # tie: alphabetical first
    (set(), NO_CASES, "n/a"),
])
def test_cells(cases, status, text):
    cell = cell_for(frozenset(cases), SM90, FLASH)
    assert (cell.status, cell.text) == (status, text)


def test_partial_cells_say_why():
    cell = cell_for(frozenset({"a", "s", "t", "u", "v", "w", "x"}), SM90, FLASH)
    assert (cell.status, cell.claimed, cell.accepted) == (PARTIAL, 1, 7)
    assert {(c.kind, c.detail, c.count) for c in cell.causes} == {
        ("skipped", "T-1: NaN", 2), ("failed", "", 1), ("too few runs", "", 1), ("margin", "", 1),
        (IN_NO_RUN, "", 1)}


def test_a_declined_feature_shows_its_own_reason():
    """Strict-causal cases declined mostly because of GQA (checked first by the engine) show the
    mask reason: the only case whose other items the engine serves was declined for the mask."""
    items = {"m": frozenset({"MHA", "NONE"}), "g1": frozenset({"GQA", "SC"}), "g2": frozenset({"GQA", "SC"}),
             "s1": frozenset({"MHA", "SC"})}
    declined = {"g1": "gqa-not-served", "g2": "gqa-not-served", "s1": "mask-not-served: strict"}
    engine = ClaimSet("e", claims={"sm90": frozenset({"m"})}, declines={"sm90": declined})
    cell = cell_for(frozenset({"g1", "g2", "s1"}), Column("e", "sm90"), engine, items, "SC")
    assert cell.text == "❌ mask-not-served"
    assert feature_reason("GQA", {"g1": "gqa-not-served", "g2": "gqa-not-served"}, items,
                          frozenset({"MHA", "NONE"})) == "gqa-not-served"


def test_arch_not_run():
    cell = cell_for(frozenset({"a"}), Column("torch-flash", "sm120"), FLASH)
    assert (cell.status, cell.text) == (NOT_RUN, "—")
    declines_only = ClaimSet("x", declines={"sm120": {"a": "dtype-not-served"}})
    assert cell_for(frozenset({"a"}), Column("x", "sm120"), declines_only).text == "❌ dtype-not-served"


def _matrix():
    groups = [FeatureGroup("io dtype", (Feature("AX-DTYPE-BF16", "bf16"), Feature("AX-DTYPE-FP16", "fp16")), True),
              FeatureGroup("regressions", (Feature("REG-X", "a | pipe in the title"),))]
    items = {"AX-DTYPE-BF16": frozenset({"a", "b"}), "AX-DTYPE-FP16": frozenset({"c", "s"}),
             "REG-X": frozenset({"f"})}
    case_items = {c: frozenset(i for i, ids in items.items() if c in ids) for c in "abcsf"}
    cases = BundleCases(items=items, case_items=case_items, levels=(("quick", frozenset("abcsf")),))
    columns = [SM90, Column("torch-flash", "sm120"), Column("triton", "sm90")]
    triton = ClaimSet("triton", claims={"sm90": frozenset({"a", "b", "c", "s", "f"})})
    return build_matrix(groups, cases, columns, {"torch-flash": FLASH, "triton": triton},
                        gated=[Gate("GATE-FP32", "fp32 io dtype", "waiting on fp32", 20)],
                        engine_tomls={"torch-flash": "engines/torch_flash/engine.toml"})


def test_render_from_fixtures():
    text = render(_matrix())
    lines = text.splitlines()
    assert "| value | torch-flash | triton |" in lines           # one arch: the header names the engine
    assert "| bf16 | ✅ 2 | ✅ 2 |" in lines
    assert "| fp16 | 🟡 1/2 [^1] | ✅ 2 |" in lines
    assert "| `REG-X` | ❌ mask-not-served | ✅ 1 |" in lines
    assert "- `REG-X`: a | pipe in the title" in lines               # the catalog is a list: no escape
    assert lines[lines.index("| `REG-X` | ❌ mask-not-served | ✅ 1 |") + 2].startswith(
        "[^1]: skipped by a skip row the engine's [engine.toml](engines/torch_flash/engine.toml) does not hold")
    assert "Every column below is on **sm90**." in lines
    assert "Configured, never run: torch-flash sm120." in lines and "sm120 |" not in text
    assert "| torch-flash | sm90 | all | 3 | 5 | 5 | 0 | — |" in lines
    assert "Levels covered: every level (quick)." in lines
    assert "- io dtype: ✅ bf16; 🟡 fp16" in lines
    assert "- `GATE-FP32` fp32 io dtype: waiting on fp32" in lines
    assert text.endswith("\n") and not text.endswith("\n\n\n")
    assert render(_matrix()) == text


def test_the_checked_in_matrix_fits_in_120_columns():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "SUPPORT_MATRIX.md").read_text(encoding="utf-8")
    wide = [line for line in text.splitlines() if display_width(line) > WIDTH]
    assert not wide, wide[:3]
    assert "## Where the claims come from" in text and "| engine | arch | torch | triton | cudnn | driver |" in text


def _write_bundle(root, level, group, cases):
    path = root / level / "sdpa_bwd" / f"{group}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(canonical_json(Bundle(level=level, group=group, cases=tuple(cases)).to_json()), encoding="utf-8")
    return path


def test_feature_cases_all_levels_probes_excluded(tmp_path):
    import dataclasses

    claim = dataclasses.replace(make_case(make_graph(S_q=16)), items=("AX-A", "AX-B"))
    regression = dataclasses.replace(make_case(make_graph(S_q=17), purpose="regression"), items=("REG-Y",))
    probe = dataclasses.replace(make_case(make_graph(S_q=18), purpose="probe",
                                          rejection=Rejection("engine", "zero-stride-output")), items=("AX-A",))
    _write_bundle(tmp_path, "quick", "axes", [claim, probe])
    _write_bundle(tmp_path, "nightly", "regressions", [regression])
    bad = tmp_path / "pr" / "sdpa_bwd" / "broken.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json", encoding="utf-8")
    cases, errors = feature_cases(tmp_path, "sdpa_bwd")
    assert cases == {"AX-A": frozenset({claim.id}), "AX-B": frozenset({claim.id}),
                     "REG-Y": frozenset({regression.id})}
    assert len(errors) == 1 and "broken.json" in errors[0]


def test_feature_groups_from_the_manifest():
    from bundlegen.manifest import load_manifest
    from bundlegen.plans import sdpa_bwd
    from bundlegen.workspace import builtin_bundle_root

    groups, gated = feature_groups(load_manifest(builtin_bundle_root()))
    ids = [f.id for grp in groups for f in grp.features]
    assert "AX-DTYPE-BF16" in ids and "AX-MASK-CAUSAL-BR" in ids and "AX-HEADS-HK4-HV2" in ids
    assert "REG-HV-LT-HK" in ids and "SHP-S1" in ids
    assert not any(i.startswith("PRB-") for i in ids)
    assert len(ids) == len(set(ids))
    assert [g.item for g in gated] == [g.item for g in sdpa_bwd.GATED]


def test_ranges_group_declined_values_by_reason():
    from bundlegen.claims.matrix import Range, range_text

    r = Range("mask", ("none",), ("causal",), (("mask-not-served", ("band", "window")), ("gqa-not-served", ("x",))))
    assert range_text(r) == "- mask: ✅ none; 🟡 causal; ❌ mask-not-served: band, window; ❌ gqa-not-served: x"


def test_an_arch_compiled_and_resource_checked_is_a_state_of_its_own(tmp_path):
    """A configured arch never run is 'compiled and resource-checked, not run' when the
    engine's compile report lists its variants and none has a problem; one problem, or no
    report, leaves it 'never run'."""
    import json as _json

    from bundlegen.claims.matrix import COMPILE_REPORT_NAME, compile_reports

    folder = tmp_path / "triton"
    folder.mkdir()
    report = {"archs": {"sm120": {"variants": {"a": {"problems": []}, "b": {"problems": []}}},
                        "gfx942": {"variants": {"a": {"problems": ["spills (16 bytes)"]}}},
                        "sm100": {"variants": {}}}}
    (folder / COMPILE_REPORT_NAME).write_text(_json.dumps(report), encoding="utf-8")
    assert compile_reports({"triton": folder, "other": tmp_path / "none"}) == {"triton": {"sm120": 2}}


def test_the_checked_in_matrix_shows_the_compiled_archs():
    import json as _json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    variants = len(_json.loads((root / "engines" / "triton" / "resources.json").read_text())
                   ["archs"]["sm120"]["variants"])
    text = (root / "SUPPORT_MATRIX.md").read_text(encoding="utf-8")
    compiled = text.split("Compiled and resource-checked, not run", 1)[1].split("\n\n", 1)[0]
    never = text.split("Configured, never run:", 1)[1].split("\n\n", 1)[0]
    assert f"triton sm120 ({variants}" in compiled.replace("\n", " ") and "triton sm120" not in never


# ----------------------------------------------------------------------------- part of the levels, skip sources
def _levels_fixture(evidence_level="pr"):
    from bundlegen.claims.store import ArchEvidence, RunSource

    levels = (("quick", frozenset({"q1", "q2", "q3"})), ("pr", frozenset({"p1"})),
              ("nightly", frozenset({"n1", "n2", "n3", "n4"})))
    items = {"GQA": frozenset({"q1", "p1", "n1", "n2"}), "MHA": frozenset({"q2", "n3"}),
             "WIN": frozenset({"n4"}), "FP16": frozenset({"q3"})}
    case_items = {c: frozenset(i for i, ids in items.items() if c in ids) for _, ids in levels for c in ids}
    cases = BundleCases(items=items, case_items=case_items, levels=levels)
    sources = (RunSource("r1.jsonl", "0" * 64, level=evidence_level, complete=True, selection="all"),)
    engine = ClaimSet("e", claims={"sm90": frozenset({"q2"})},
                      declines={"sm90": {"q1": "gqa-not-served", "p1": "gqa-not-served: H_k=2"}},
                      unclaimed={"sm90": {"q3": "skipped: too large for cpu"}},
                      evidence={"sm90": ArchEvidence(min_runs=1, min_margin=1.5, results=sources)})
    groups = [FeatureGroup("heads", (Feature("GQA", "gqa"), Feature("MHA", "mha")), True),
              FeatureGroup("mask", (Feature("WIN", "window"),), True),
              FeatureGroup("dtype", (Feature("FP16", "fp16"),), True)]
    return build_matrix(groups, cases, [Column("e", "sm90")], {"e": engine})


def test_a_matrix_of_part_of_the_levels_counts_only_those_levels():
    """Harvested from quick and pr: GQA, declined in every case those levels hold, is ❌ (not
    🟡 0/n for the nightly cases no run gave the engine); a nightly-only feature is n/a; the
    header says which levels the counts cover."""
    matrix = _levels_fixture("pr")
    cells = {row.feature.id: row.cells[0] for section in matrix.sections for row in section.rows}
    assert cells["GQA"].text == "❌ gqa-not-served"
    assert cells["MHA"].text == "✅ 1"                 # n3 (nightly) is not counted
    assert cells["WIN"].status == NO_CASES
    lines = render(matrix).splitlines()
    assert "Levels covered: quick, pr of quick, pr, nightly; the cases of the other levels are not counted." in lines
    assert "| e | sm90 | quick, pr | 1 | 2 | 1 | 1 | 1 |" in lines
    full = _levels_fixture("nightly")
    cells = {row.feature.id: row.cells[0] for section in full.sections for row in section.rows}
    assert cells["MHA"].text == "🟡 1/2 [^1]" and cells["WIN"].text == "🟡 0/1 [^1]"   # in no run
    assert cells["FP16"].text == "🟡 0/1 [^2]"
    assert "Levels covered: every level (quick, pr, nightly)." in render(full).splitlines()


def test_covered_levels_without_a_recorded_level():
    from bundlegen.claims.matrix import covered_levels

    cases = BundleCases(items={}, case_items={}, levels=(("quick", frozenset({"a"})), ("pr", frozenset({"b"})),
                                                         ("nightly", frozenset({"c"}))))
    assert covered_levels(ClaimSet("e", claims={"x": frozenset({"b"})}), "x", cases) == ("quick", "pr")
    assert covered_levels(ClaimSet("e", claims={"x": frozenset()}), "x", cases) == ("quick", "pr", "nightly")


def test_a_row_too_wide_for_its_reason_codes_gives_them_as_footnotes():
    """Seven engines declining with long codes: the row moves each code to a footnote (one per
    code, shared across rows) and fits WIDTH; a row that fits keeps its codes inline."""
    long_code = "modifier-combination-not-served"
    engines = [f"engine-{i}" for i in range(7)]
    sets = {e: ClaimSet(e, claims={"sm90": frozenset({"a"})}, declines={"sm90": {"w": long_code, "n": "gqa-not-served"}})
            for e in engines}
    for e in engines[:4]:
        sets[e] = ClaimSet(e, claims={"sm90": frozenset({"a", "n"})}, declines={"sm90": {"w": long_code}})
    items = {"WIDE": frozenset({"w"}), "NARROW": frozenset({"n"}), "PLAIN": frozenset({"a"})}
    case_items = {c: frozenset(i for i, ids in items.items() if c in ids) for c in "wna"}
    cases = BundleCases(items=items, case_items=case_items, levels=(("quick", frozenset("wna")),))
    group = FeatureGroup("g", (Feature("WIDE", "wide"), Feature("NARROW", "n"), Feature("PLAIN", "p")), True)
    matrix = build_matrix([group], cases, [Column(e, "sm90") for e in engines], sets)
    wide, narrow, _ = matrix.sections[0].rows
    assert [c.text for c in wide.cells] == ["❌ [^1]"] * 7
    assert [n.causes for n in matrix.notes] == [(f"declined: `{long_code}`",)]
    assert [c.text for c in narrow.cells] == ["✅ 1"] * 4 + ["❌ gqa-not-served"] * 3   # fits: inline
    lines = render(matrix).splitlines()
    assert "| wide | " + " | ".join(["❌ [^1]"] * 7) + " |" in lines
    assert f"[^1]: declined: `{long_code}`" in lines
    assert all(display_width(line) <= WIDTH for line in lines)


def test_skips_are_attributed_to_their_source():
    """The CPU size limit and a level's byte ceiling are not blamed on an engine.toml; a row of
    the engine's engine.toml is named with its arch and version scope; a skip no row of it holds
    says so."""
    from bundlegen.claims.skips import skip_note
    from bundlegen.harness.config import skip_row

    row = skip_row("engine.toml", "test_skips[0]", {"ticket": "T-7", "reason": "NaN", "archs": ["sm90"],
                                                   "seen_with": {"torch": "2.11.*"}, "filters": {"id": "abc*"}})
    engine = ClaimSet("e", claims={"sm90": frozenset({"a"})},
                      unclaimed={"sm90": {"c1": "skipped: too large for cpu",
                                          "m1": "skipped: too large: needs 3 GiB at its peak, the pr level allows 2 GiB",
                                          "m2": "skipped: too large: needs 5 GiB at its peak, the pr level allows 2 GiB",
                                          "t1": "skipped: T-7: NaN", "l1": "skipped: T-8: lane skip"}})
    ids = frozenset({"a", "c1", "m1", "m2", "t1", "l1"})
    cases = BundleCases(items={"F": ids}, case_items={c: frozenset({"F"}) for c in ids},
                        levels=(("quick", ids),))
    matrix = build_matrix([FeatureGroup("f", (Feature("F", "f"),), True)], cases, [Column("e", "sm90")],
                          {"e": engine}, engine_tomls={"e": "engines/e/engine.toml"}, skip_rows={"e": (row,)})
    assert len(matrix.notes) == 1 and matrix.sections[0].rows[0].cells[0].text == "🟡 1/6 [^1]"   # one marker
    notes = matrix.notes[0].causes
    assert len(notes) == 4                              # the two byte-ceiling skips share one cause
    cpu = next(n for n in notes if "CPU" in n)
    assert "engine.toml" not in cpu and "size limit of the device" in cpu
    memory = next(n for n in notes if "byte ceiling" in n)
    assert "engine.toml" not in memory
    assert ("skipped by a `[[test_skips]]` row of the engine's [engine.toml](engines/e/engine.toml) (on sm90; "
            "seen with torch 2.11.*: the row applies only at those versions): T-7: NaN") in notes
    assert any(n.startswith("skipped by a skip row the engine's [engine.toml](engines/e/engine.toml) does not hold")
               and n.endswith("T-8: lane skip") for n in notes)
    assert "in no engine.toml of the engine" in skip_note("T-8: lane skip")
    lines = render(matrix).splitlines()                 # the one footnote lists each cause as an item
    start = lines.index("[^1]: the accepted cases not claimed have 4 causes:")
    items = [line for line in lines[start + 1:] if line.startswith("    - ")][:4]
    assert len(items) == 4 and all(n.startswith(item[len("    - "):]) for n, item in zip(notes, items))


# ----------------------------------------------------------------------------- combinations
def test_combinations_answer_which_values_an_engine_serves_together():
    from bundlegen.claims.combinations import CombinationError, combinations, combinations_text, parse_picks
    from bundlegen.manifest import AxisItems

    axes = [AxisItems("heads", "heads", True, "mha", ("mha", "gqa2", "gqa4"), ("H-MHA", "H-GQA2", "H-GQA4")),
            AxisItems("mask", "mask", True, "none", ("none", "window-tl"), ("M-NONE", "M-WIN")),
            AxisItems("dtype", "dtype", True, "bf16", ("bf16", "fp16"), ("D-BF16", "D-FP16"))]
    case_items = {"a": {"H-MHA", "M-NONE", "D-BF16"}, "b": {"H-GQA2", "M-WIN", "D-BF16"},
                  "c": {"H-GQA2", "M-WIN", "D-FP16"}, "d": {"H-GQA4", "M-WIN", "D-BF16"},
                  "e": {"H-GQA2", "M-NONE", "D-BF16"}}
    items: dict = {}
    for case, held in case_items.items():
        for item in held:
            items.setdefault(item, set()).add(case)
    cases = BundleCases(items={i: frozenset(ids) for i, ids in items.items()},
                        case_items={c: frozenset(i) for c, i in case_items.items()},
                        levels=(("quick", frozenset(case_items)),))
    engines = {"k": ClaimSet("k", claims={"sm90": frozenset({"a", "b", "e"})},
                             declines={"sm90": {"c": "dtype-not-served", "d": "gqa-not-served"}})}
    picks = parse_picks("heads=gqa*,mask=window*,dtype", axes)
    view = combinations(picks, cases, [Column("k", "sm90"), Column("k", "sm120")], engines)
    assert view.axes == ("heads", "mask", "dtype") and view.columns == (Column("k", "sm90"),)
    assert [(row.values, row.cells[0].text) for row in view.rows] == [
        (("gqa2", "window-tl", "bf16"), "✅ 1"),
        (("gqa2", "window-tl", "fp16"), "❌ dtype-not-served"),
        (("gqa4", "window-tl", "bf16"), "❌ gqa-not-served")]        # gqa4 x fp16: no case holds it
    lines = combinations_text(view).splitlines()
    assert lines[0] == "| heads | mask | dtype | k sm90 |" and "| gqa2 | window-tl | fp16 | ❌ dtype-not-served |" in lines
    for bad in ("hedas", "heads=xqa*"):
        with pytest.raises(CombinationError):
            parse_picks(bad, axes)


def test_a_tolerance_override_is_recorded_in_the_matrix(tmp_path, monkeypatch, capsys):
    """An engine judged with numbers other than its classes' says so in the matrix (the
    generated rows, which carry the plan's own numbers, are not listed)."""
    from bundlegen.cli import main
    from bundlegen.claims.overrides import TITLE
    (tmp_path / "bundlegen.toml").write_text('bundles = "ws-bundles"\n', encoding="utf-8")
    folder = tmp_path / "engines" / "torch_math"
    folder.mkdir(parents=True)
    (folder / "engine.toml").write_text('[meta]\nname = "torch-math"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["tolerances", "--engine-toml", str(folder / "engine.toml")]) == 0
    assert main(["matrix"]) == 0
    assert TITLE not in (tmp_path / "SUPPORT_MATRIX.md").read_text(encoding="utf-8")
    with open(folder / "engine.toml", "a", encoding="utf-8") as fh:
        fh.write('\n[[tolerance_overrides]]\nfilters = { dtype = "bf16", item = "REG-*" }\nrtol = 0.05\natol = 1e-5\n')
    assert main(["matrix"]) == 0
    text = (tmp_path / "SUPPORT_MATRIX.md").read_text(encoding="utf-8")
    assert TITLE in text
    assert "| torch-math | `engines/torch_math/engine.toml` tolerance_overrides[15] | dtype=bf16, item=REG-* " \
           "| 0.05 | 1e-05 |" in text
    capsys.readouterr()
