"""engine.toml and claims.json as the harness reads them: override rows last match wins,
skips first match wins with archs, glob filters, and the manifest's class numbers."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bundlegen.harness.config import EngineConfigError, load_engine_config
from tests import harness_support as S

TOML = '''
[meta]
name = "demo"

[[tolerance_overrides]]
filters = { plan = "sdpa_bwd", tolerance_class = "bf16-r256" }
rtol = 0.02
atol = 1e-05

[[tolerance_overrides]]
filters = { plan = "sdpa_bwd", tolerance_class = "bf16-r256", group = "layouts" }
rtol = 0.03
atol = 2e-05

[[tolerance_overrides]]
filters = { item = "REG-*" }
rtol = 0.04
atol = 0

[[test_skips]]
filters = { id = "t1*", dtype = "bf16" }
reason = "TICKET-1: first"
archs = ["sm90"]

[[test_skips]]
filters = { group = "layouts" }
reason = "TICKET-2: second"

[[test_skips]]
filters = { group = "layouts", level = "quick" }
reason = "TICKET-3: never reached"
'''


@pytest.fixture
def config(tmp_path):
    (tmp_path / "engine.toml").write_text(TOML)
    (tmp_path / "claims.json").write_text(json.dumps(
        {"version": 1, "engine": "demo", "claims": {"sm90": ["aaa", "bbb"]}}))
    return load_engine_config(tmp_path, S.MANIFEST)


def case(**changes):
    base = replace(S.case_of(), id="t1abc", tolerance_class="bf16-r256", level="quick",
                   group="axes", items=("AX-1",))
    return replace(base, **changes)


def test_last_matching_override_wins(config, tmp_path):
    assert (config.tolerance_for(case()).rtol, config.tolerance_for(case()).atol) == (0.02, 1e-5)
    layouts = config.tolerance_for(case(group="layouts"))
    assert (layouts.rtol, layouts.atol) == (0.03, 2e-5)
    assert layouts.source == f"{tmp_path / 'engine.toml'} tolerance_overrides[1]"
    assert config.tolerance_for(case(group="layouts", items=("AX-1", "REG-HV"))).rtol == 0.04


def test_no_matching_row_takes_the_manifest_class(config):
    from bundlegen.plans.sdpa_bwd import TOLERANCE_CLASSES

    tol = config.tolerance_for(case(tolerance_class="fp16-r1k"))
    assert (tol.rtol, tol.atol) == (TOLERANCE_CLASSES["fp16-r1k"].rtol, TOLERANCE_CLASSES["fp16-r1k"].atol)
    assert tol.source == "manifest class fp16-r1k"
    with pytest.raises(KeyError, match="unknown tolerance class 'no-such-class'"):
        config.tolerance_for(case(tolerance_class="no-such-class"))
    with pytest.raises(KeyError, match="missing"):
        config.tolerance_for(case(tolerance_class=None))


def test_without_a_manifest_only_override_rows_give_numbers(tmp_path):
    (tmp_path / "engine.toml").write_text(TOML)
    bare = load_engine_config(tmp_path)
    with pytest.raises(KeyError, match="no bundle manifest"):
        bare.tolerance_for(case(tolerance_class="fp16-r1k"))
    # a `plan` filter matches only when the run's plan is known
    assert bare.tolerance_for(case(items=("REG-HV",))).rtol == 0.04
    with pytest.raises(KeyError):
        bare.tolerance_for(case())


def test_the_checked_in_engine_tomls_hold_no_tolerance_rows():
    """Tolerances live in the plan (and so the manifest); an engine.toml row is a hand-written
    engine-specific override, and none is needed today."""
    from bundlegen.workspace import package_root

    for path in sorted((package_root() / "engines").glob("*/engine.toml")):
        assert load_engine_config(path.parent).overrides == (), path


def test_first_matching_skip_wins_and_archs_limit_it(config):
    assert config.skip_reason(case(), "sm90") == "TICKET-1: first"
    assert config.skip_reason(case(), "cpu") is None                 # archs = ["sm90"] only
    assert config.skip_reason(case(group="layouts"), "cpu") == "TICKET-2: second"
    assert config.skip_reason(case(id="x1abc", group="layouts"), "sm90") == "TICKET-2: second"


def test_claims_by_arch(config):
    assert config.is_claimed("aaa", "sm90") and not config.is_claimed("aaa", "cpu")


def test_missing_files_give_an_empty_config(tmp_path):
    config = load_engine_config(tmp_path / "nowhere")
    assert config.overrides == () and config.skips == () and not config.is_claimed("x", "cpu")


@pytest.mark.parametrize("text, where", [
    ("[[tolerance_overrides]]\nfilters = { colour = 'red' }\nrtol = 1\natol = 1\n", "filters.colour"),
    ("[[tolerance_overrides]]\nfilters = { id = 3 }\nrtol = 1\natol = 1\n", "filters.id"),
    ("[[tolerance_overrides]]\nrtol = 'x'\natol = 1\n", "tolerance_overrides[0].rtol"),
    ("[[test_skips]]\nfilters = {}\n", "test_skips[0].reason"),
    ("[[test_skips]]\nreason = 'T-1'\narchs = 'sm90'\nfilters = { id = 'a' }\n", "test_skips[0].archs"),
    ("[[test_skips]]\nreason = 'T-1'\n", "test_skips[0].filters: a skip must name"),
    ("[[test_skips]]\nreason = 'T-1'\nfilters = {}\n", "test_skips[0].filters: a skip must name"),
    ("[[test_skips]]\nreason = 'T-1'\nfilters = { id = '*' }\n", "test_skips[0].filters.id: '*' matches every"),
    ("[[test_skips]]\nreason = 'T-1'\nfilters = { item = '**?' }\n", "filters.item: '**?' matches every"),
    ("[[tolerance_overrides]]\nrtol = nan\natol = 1\n", "tolerance_overrides[0].rtol: expected a finite"),
    ("[[tolerance_overrides]]\nrtol = 1\natol = inf\n", "tolerance_overrides[0].atol: expected a finite"),
    ("[[test_skips]\n", "engine.toml"),
])
def test_malformed_toml_names_file_and_row(tmp_path, text, where):
    (tmp_path / "engine.toml").write_text(text)
    with pytest.raises(EngineConfigError, match=r"engine\.toml") as info:
        load_engine_config(tmp_path)
    assert where in str(info.value)
