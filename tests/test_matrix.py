"""The support matrix from explicit fixtures: cells (✅ n/n, 🟡 k/n, ❌ reason, —), probes
excluded, every level's bundles read, the plan's feature rows, deterministic rendering."""
import pytest

from bundlegen.graph import Bundle, Rejection, canonical_json
from bundlegen.claims.matrix import (CLAIMED, DECLINED, NOT_RUN, NO_CASES, PARTIAL, Column, Feature, FeatureGroup,
                           GatedFeature, build_matrix, cell_for, feature_cases, feature_groups, render)
from bundlegen.claims.store import ClaimSet
from tests.graph_factory import make_case, make_graph

SM90 = Column("torch-flash", "sm90")
FLASH = ClaimSet("torch-flash", claims={"sm90": frozenset({"a", "b", "c"})},
                 declines={"sm90": {"d": "hv-not-hk: H_k=4, H_v=2", "e": "hv-not-hk", "f": "mask-not-served",
                                    "g": "mask-not-served", "h": "alignment-not-served"}})


@pytest.mark.parametrize("cases,status,text", [
    ({"a", "b"}, CLAIMED, "✅ 2/2"),
    ({"a", "d", "x"}, PARTIAL, "🟡 1/3"),
    ({"d", "e", "f", "x"}, DECLINED, "❌ hv-not-hk"),        # most common code
    ({"f", "g", "d", "e"}, DECLINED, "❌ hv-not-hk"),        # tie: alphabetical first
    ({"x", "y"}, PARTIAL, "🟡 0/2"),                         # ran, nothing claimed or declined
    (set(), NO_CASES, "n/a"),
])
def test_cells(cases, status, text):
    cell = cell_for(frozenset(cases), SM90, FLASH)
    assert (cell.status, cell.text) == (status, text)


def test_arch_not_run():
    cell = cell_for(frozenset({"a"}), Column("torch-flash", "sm120"), FLASH)
    assert (cell.status, cell.text) == (NOT_RUN, "—")
    declines_only = ClaimSet("x", declines={"sm120": {"a": "dtype-not-served"}})
    assert cell_for(frozenset({"a"}), Column("x", "sm120"), declines_only).text == "❌ dtype-not-served"


def _matrix():
    groups = [FeatureGroup("io dtype", (Feature("AX-DTYPE-BF16", "bf16"), Feature("AX-DTYPE-FP16", "fp16"))),
              FeatureGroup("regressions", (Feature("REG-X", "a | pipe in the title"),))]
    cases = {"AX-DTYPE-BF16": frozenset({"a", "b"}), "AX-DTYPE-FP16": frozenset({"c", "d"}),
             "REG-X": frozenset({"f"})}
    columns = [SM90, Column("torch-flash", "sm120"), Column("triton", "sm90")]
    triton = ClaimSet("triton", claims={"sm90": frozenset({"a", "b", "c", "d", "f"})})
    return build_matrix(groups, cases, columns, {"torch-flash": FLASH, "triton": triton},
                        gated=[GatedFeature("GATE-FP32", "fp32 io dtype", "waiting on fp32")])


def test_render_from_fixtures():
    text = render(_matrix())
    lines = text.splitlines()
    assert "| bf16 | `AX-DTYPE-BF16` | ✅ 2/2 | — | ✅ 2/2 |" in lines
    assert "| fp16 | `AX-DTYPE-FP16` | 🟡 1/2 | — | ✅ 2/2 |" in lines
    assert "| a \\| pipe in the title | `REG-X` | ❌ mask-not-served | — | ✅ 1/1 |" in lines
    assert "| feature | item | torch-flash sm90 | torch-flash sm120 | triton sm90 |" in lines
    assert "| torch-flash | sm90 | 3 | 5 |" in lines
    assert "| torch-flash | sm120 | — | — |" in lines
    assert "| `GATE-FP32` | fp32 io dtype | waiting on fp32 |" in lines
    assert text.endswith("\n") and not text.endswith("\n\n\n")
    assert render(_matrix()) == text


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
    assert [g.id for g in gated] == [g.item for g in sdpa_bwd.GATED]
