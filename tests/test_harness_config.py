"""engine.toml and claims.json as the harness reads them: override rows last match wins,
skips first match wins with archs, glob filters, and the manifest's class numbers; skip rows
one per defect (any of its filters selects a case) scoped by the library versions they were
seen with, and the checked-in rows against what the rows they replaced skipped."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bundlegen.harness.config import EngineConfigError, filters_match, load_engine_config, skip_row_schema
from tests import harness_support as S
from tests.graph_factory import packed_strides

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
    # a loosened or misspelt row is refused, not applied or ignored
    ("[[tolerance_overrides]]\nrtol = 1e6\natol = 1e-5\n", "tolerance_overrides[0].rtol: 1000000.0 is more than 1"),
    ("[[tolerance_overrides]]\nrtol = 0.03\natol = 5.0\n", "tolerance_overrides[0].atol: 5.0 is more than 1"),
    ("[[tolerance_overrides]]\nrtol = 0\natol = 1e-5\n", "tolerance_overrides[0].rtol: expected a finite number > 0"),
    ("[[tolerance_overrides]]\nrtl = 0.5\nrtol = 0.03\natol = 1e-5\n", "tolerance_overrides[0].rtl: unknown key"),
    ("[[tolerance_override]]\nrtol = 0.03\natol = 1e-5\n", "tolerance_override: unknown key"),
    ("[meta]\nnmae = 'demo'\n", "meta.nmae: unknown key"),
    ("[meta]\nname = '../x'\n", "meta.name: expected an engine name"),
    ("meta = 3\n", "meta: expected a table"),
])
def test_malformed_toml_names_file_and_row(tmp_path, text, where):
    (tmp_path / "engine.toml").write_text(text)
    with pytest.raises(EngineConfigError, match=r"engine\.toml") as info:
        load_engine_config(tmp_path)
    assert where in str(info.value)


@pytest.mark.parametrize("name", ["engine.toml", "claims.json"])
@pytest.mark.parametrize("kind", ["folder", "fifo", "dangling link"])
def test_an_engine_file_that_is_not_a_regular_file_is_refused_not_passed_by(tmp_path, name, kind):
    """Before, a folder, FIFO or dangling link named engine.toml was taken for an absent
    file: the engine's skips and overrides silently dropped."""
    import os
    import threading

    path = tmp_path / name
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(tmp_path / "nowhere")
    outcome = {}

    def load():
        try:
            load_engine_config(tmp_path)
            outcome["error"] = None
        except EngineConfigError as exc:
            outcome["error"] = str(exc)
    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "loading the engine config blocked"
    assert outcome["error"] is not None and outcome["error"].startswith(f"{path}: "), outcome


def test_claims_with_a_duplicate_key_are_refused(tmp_path):
    (tmp_path / "claims.json").write_text('{"claims": {"cpu": ["a"]}, "claims": {"cpu": ["a", "b"]}}')
    with pytest.raises(EngineConfigError, match="claims.json: duplicate key 'claims'"):
        load_engine_config(tmp_path)


# ----------------------------------------------------------------------------- skip rows
DEFECT = '''
[[test_skips]]
ticket = "BUG-7"
reason = "wrong dQ"
archs = ["sm90"]
seen_with = { torch = "2.11.*", cudnn = ">=9.10, <9.20" }
filters = [
  { item = "REG-A*" },
  { id = ["t1abc", "t2abc"], dtype = "bf16" },
  { feature = "do-strides-differ-from-o" },
]
'''
SEEN = {"torch": "2.11.0+cu130", "cudnn": "91900", "triton": "3.6.0", "driver": "580.159.04"}


@pytest.fixture
def defect(tmp_path):
    (tmp_path / "engine.toml").write_text(DEFECT)
    return load_engine_config(tmp_path, S.MANIFEST)


def do_transposed(**changes):
    """A case whose dO is stored [B, S, H, D] while O is [B, H, S, D]."""
    dims = (1, 2, 9, 8)
    return replace(S.case_of(out_strides={"do": packed_strides(dims, (0, 2, 1, 3))}), id="other",
                   items=("AX-1",), **changes)


def test_one_row_selects_by_any_of_its_filters(defect):
    row, = defect.skips
    assert row.detail == "BUG-7: wrong dQ"
    assert defect.skip_reason(case(), "sm90", SEEN) == "BUG-7: wrong dQ"             # an id of the list
    assert defect.skip_reason(case(id="t2abc"), "sm90", SEEN) == "BUG-7: wrong dQ"
    assert defect.skip_reason(case(id="t2abc", graph=S.case_of(dtype="fp16").graph),
                              "sm90", SEEN) is None                                  # every key of a filter
    assert defect.skip_reason(case(id="zz", items=("REG-A1",)), "sm90", SEEN) == "BUG-7: wrong dQ"
    assert defect.skip_reason(case(id="zz"), "sm90", SEEN) is None
    assert defect.skip_reason(do_transposed(), "sm90", SEEN) == "BUG-7: wrong dQ"     # the graph feature
    assert defect.skip_reason(replace(do_transposed(), graph=S.case_of().graph), "sm90", SEEN) is None


@pytest.mark.parametrize("changed, applies", [
    ({}, True),
    ({"torch": "2.11.3"}, True),                   # a patch release of the minor it was seen with
    ({"torch": "2.12.0"}, False),                  # torch moved on: the case runs again
    ({"torch": "2.11.0a0+git1234"}, True),         # a nightly of 2.11 counts as 2.11
    ({"cudnn": "92000"}, False),                   # cuDNN 9.20
    ({"cudnn": "91000"}, True),                    # cuDNN 9.10, inside >=9.10
    ({"cudnn": "90900"}, False),
    ({"cudnn": "8902"}, False),                    # cuDNN 8.9.2 (the older encoding)
    ({"cudnn": None}, False),                      # no cuDNN: a row scoped to it never applies
    ({"torch": "not a version"}, False),
    ({"driver": "999.1"}, True),                   # a library the row does not name
])
def test_a_row_applies_only_with_the_versions_it_was_seen_with(defect, changed, applies):
    versions = {k: v for k, v in {**SEEN, **changed}.items() if v is not None}
    assert (defect.skip_reason(case(), "sm90", versions) is not None) is applies
    assert defect.skip_reason(case(), "sm80", versions) is None                       # archs


def test_cudnn_and_the_driver_are_absent_off_an_nvidia_gpu(tmp_path):
    """A CPU run uses neither: even where the versions name them (run.json records torch's
    cuDNN on a CPU run too), a row scoped to either does not apply off an sm arch."""
    (tmp_path / "engine.toml").write_text(
        "[[test_skips]]\nreason = 'T-1: x'\nseen_with = { cudnn = '9.*' }\nfilters = { id = 't1*' }\n"
        "[[test_skips]]\nreason = 'T-2: y'\nseen_with = { driver = '580.*' }\nfilters = { id = 't1*' }\n"
        "[[test_skips]]\nreason = 'T-3: z'\nseen_with = { torch = '2.*' }\nfilters = { id = 't1*' }\n")
    config = load_engine_config(tmp_path)
    assert config.skip_reason(case(), "sm90", SEEN) == "T-1: x"
    assert config.skip_reason(case(), "cpu", SEEN) == "T-3: z"
    assert config.skip_reason(case(), "gfx942", SEEN) == "T-3: z"


def test_the_running_versions_are_read_only_for_a_case_a_scoped_row_selects(defect, monkeypatch):
    from bundlegen.harness import config as C

    asked = []
    monkeypatch.setattr(C, "running_version", lambda library, arch: asked.append(library) or SEEN.get(library))
    assert defect.skip_reason(case(id="zz"), "sm90") is None and asked == []      # no filter selects it
    assert defect.skip_reason(case(), "cpu") is None and asked == []              # not its arch
    assert defect.skip_reason(case(), "sm90") == "BUG-7: wrong dQ"
    assert sorted(asked) == ["cudnn", "torch"]


def test_running_versions_on_this_machine():
    import torch

    from bundlegen.harness.library_versions import running_version

    assert running_version("torch", "cpu") == str(torch.__version__)
    assert running_version("cudnn", "cpu") is None and running_version("driver", "cpu") is None


def test_loading_the_rows_imports_no_torch():
    """The run command loads engine.toml before its workers start; torch is theirs to import."""
    import subprocess
    import sys

    from bundlegen.workspace import package_root

    code = ("import sys; from bundlegen.harness.config import load_engine_config; "
            f"c = load_engine_config({str(package_root() / 'engines' / 'torch_cudnn')!r}); "
            "assert c.skips and c.skips[0].seen_with, c; print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("text, where", [
    ("cudnn = '9.19.*'", None),
    ("torch = '==2.11.*, !=2.11.2'", None),
    ("torch = '>=2.10,<2.12'", None),
    ("torch = '2.11.x'", "seen_with.torch: '2.11.x'"),
    ("torch = '>=2.*'", "seen_with.torch: '>=2.*': a wildcard"),
    ("torch = ''", "seen_with.torch"),
    ("torch = 2.11", "seen_with.torch"),
    ("cuda = '13.0'", "seen_with.cuda: unknown library"),
])
def test_version_specifiers_are_checked_at_load(tmp_path, text, where):
    (tmp_path / "engine.toml").write_text(
        f"[[test_skips]]\nreason = 'T-1: x'\nseen_with = {{ {text} }}\nfilters = {{ id = 'a' }}\n")
    if where is None:
        load_engine_config(tmp_path)
        return
    with pytest.raises(EngineConfigError) as info:
        load_engine_config(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'engine.toml'}: test_skips[0].{where}"), info.value


@pytest.mark.parametrize("body, where", [
    ("reason = 'x'\narch = ['sm90']\nfilters = { id = 'a' }", "test_skips[0].arch: unknown key"),
    ("reason = 'x'\nticket = 7\nfilters = { id = 'a' }", "test_skips[0].ticket: expected a non-empty string"),
    ("reason = 'x'\nticket = ''\nfilters = { id = 'a' }", "test_skips[0].ticket"),
    ("reason = 'x'\narchs = []\nfilters = { id = 'a' }", "test_skips[0].archs: expected a non-empty list"),
    ("reason = 'x'\nseen_with = {}\nfilters = { id = 'a' }", "test_skips[0].seen_with: expected a table"),
    ("reason = 'x'\nseen_with = '2.11'\nfilters = { id = 'a' }", "test_skips[0].seen_with: expected a table"),
    ("reason = 'x'\nfilters = []", "test_skips[0].filters: a skip must name"),
    ("reason = 'x'\nfilters = [{ id = 'a' }, {}]", "test_skips[0].filters[1]: a skip must name"),
    ("reason = 'x'\nfilters = [{ id = 'a' }, 'b']", "test_skips[0].filters: expected a table or an array"),
    ("reason = 'x'\nfilters = 'a'", "test_skips[0].filters: expected a table or an array"),
    ("reason = 'x'\nfilters = [{ id = ['a', '*'] }]", "test_skips[0].filters[0].id: '*' matches every case"),
    ("reason = 'x'\nfilters = { id = [] }", "test_skips[0].filters.id: expected a string or a non-empty list"),
    ("reason = 'x'\nfilters = { id = ['a', 3] }", "test_skips[0].filters.id: expected a string"),
    ("reason = 'x'\nfilters = { feature = 'dO-transposed' }", "test_skips[0].filters.feature: unknown graph feature"),
    ("reason = 'x'\nfilters = [{ id = 'a' }, { colour = 'b' }]", "test_skips[0].filters[1].colour: unknown filter key"),
])
def test_malformed_skip_rows_name_file_and_key(tmp_path, body, where):
    (tmp_path / "engine.toml").write_text(f"[[test_skips]]\n{body}\n")
    with pytest.raises(EngineConfigError) as info:
        load_engine_config(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'engine.toml'}: {where}"), info.value


def test_a_lane_skip_takes_the_same_rows_and_names_the_lane(tmp_path):
    from bundlegen.harness.lanes import LanesError, load_lanes

    lane = ("lanes: {a: {engine: torch-math, device: cpu, level: quick, skips: [{ticket: X-1, "
            "reason: flaky, seen_with: {torch: '%s'}, filters: [{item: 'AX-2'}, {id: [b, c]}]}]}}")
    path = tmp_path / "lanes.yaml"
    path.write_text(lane % "2.*")
    row, = load_lanes(path).lane("a").skips
    assert row.detail == "X-1: flaky" and len(row.filters) == 2
    path.write_text(lane % "two")
    with pytest.raises(LanesError, match=r"lanes\.a\.skips\[0\]\.seen_with\.torch: 'two'"):
        load_lanes(path)


# ----------------------------------------------------------------------------- the checked-in rows
RECORDED = Path(__file__).parent / "data" / "skipped_cases_sm90.json"


@pytest.fixture(scope="module")
def every_case():
    from tests.record_skipped_cases import every_case
    return every_case()


# Rows widened since the recording: folder -> (ticket, the filter its row now selects by).
# F2's defect hangs on the case run before, so its row covers its whole graph feature.
WIDENED = {"torch_cudnn": ("BUNDLEGEN-F2", {"feature": "do-strides-differ-from-o"})}
# Cases seen failing since the recording (new plan cases): folder -> {case id: the ticket of
# the row that now skips it}.
FOUND_SINCE = {"torch_cudnn": {"45bb11dc8b7b": "BUNDLEGEN-F1"},
               "torch_efficient": {"13c37b39466f": "BUNDLEGEN-F4"}}


def _found_since(folder: str, config, recorded: dict) -> dict:
    details = {row.ticket: row.detail for row in config.skips}
    found = {case_id: details[ticket] for case_id, ticket in FOUND_SINCE.get(folder, {}).items()}
    assert not set(found) & set(recorded), f"{folder}: a FOUND_SINCE case is in the recording"
    return found


def test_the_checked_in_rows_skip_what_the_rows_they_replaced_skipped(every_case):
    """tests/data/skipped_cases_sm90.json holds what the rows before the one-row-per-defect
    format skipped, in the environment the claims were harvested in (sm90, torch 2.11,
    cuDNN 9.19); recorded by `python -m tests.record_skipped_cases a6bd9c9 >
    tests/data/skipped_cases_sm90.json` (a6bd9c9: the last revision with the old rows).
    The rows skip exactly that, except a WIDENED row, which skips a superset: every case
    its filter selects (with its row's detail) besides the recorded ones."""
    from tests.record_skipped_cases import ENGINES, skipped

    recorded = json.loads(RECORDED.read_text())
    cases, manifest = every_case
    assert recorded["skipped"]["torch_cudnn"], "the recording skips nothing: it proves nothing"
    for folder, want in recorded["skipped"].items():
        config = load_engine_config(ENGINES / folder, manifest)
        if folder in WIDENED:
            ticket, wide = WIDENED[folder]
            row, = (r for r in config.skips if r.ticket == ticket)
            grown = {c.id: row.detail for c in cases if filters_match(wide, c, manifest.plan)}
            assert set(grown) - set(want), f"{folder}: {wide} adds no case to the recording"
            want = {**grown, **want}
        want = {**want, **_found_since(folder, config, recorded["skipped"][folder])}
        assert skipped(config, cases, recorded["arch"], recorded["versions"]) == want, folder


@pytest.mark.parametrize("changed", [{"torch": "2.12.0"}, {"cudnn": "92000"}])
def test_the_checked_in_rows_lapse_with_a_newer_library(every_case, changed):
    from tests.record_skipped_cases import ENGINES, skipped

    recorded = json.loads(RECORDED.read_text())
    cases, manifest = every_case
    versions = {**recorded["versions"], **changed}
    for folder in recorded["skipped"]:
        config = load_engine_config(ENGINES / folder, manifest)
        names = {library for row in config.skips for library in row.seen_with}
        still = skipped(config, cases, recorded["arch"], versions)
        kept = {**recorded["skipped"][folder], **_found_since(folder, config, recorded["skipped"][folder])}
        assert still == ({} if names & set(changed) else kept), folder


def test_the_checked_in_rows_are_one_per_defect_and_none_is_stale(every_case):
    """Each row names its ticket once, in its own key; no two rows share one; each is scoped
    to the versions its defect was seen with; each filter (each value of a list) still
    selects a case of the checked-in bundles."""
    from tests.record_skipped_cases import ENGINES

    cases, manifest = every_case
    for path in sorted(ENGINES.glob("*/engine.toml")):
        config = load_engine_config(path.parent, manifest)
        tickets = [row.ticket for row in config.skips]
        assert None not in tickets and len(set(tickets)) == len(tickets), path
        for row in config.skips:
            assert row.seen_with and row.ticket not in row.reason, (path, row.ticket)
            for f in row.filters:
                for key, value in f.items():
                    for one in ((value,) if isinstance(value, str) else value):
                        single = {**f, key: one}
                        assert any(filters_match(single, c, manifest.plan) for c in cases), (path, single)


@pytest.mark.parametrize("library, version, release", [
    ("cudnn", "91900", (9, 19, 0)), ("cudnn", "90100", (9, 1, 0)), ("cudnn", "8902", (8, 9, 2)),
    ("cudnn", "9.19.1", (9, 19, 1)), ("torch", "2.11.0+cu130", (2, 11, 0)),
    ("torch", "2.13.0.dev20260101+cu130", (2, 13, 0)), ("driver", "580.159.04", (580, 159, 4)),
    ("triton", None, None), ("driver", "N/A", None),
])
def test_versions_are_read_as_run_json_spells_them(library, version, release):
    from bundlegen.harness.library_versions import release_of

    assert release_of(library, version) == release


SPECIFIERS = ["2.11.*", "9.19.0", "==2.11.*, !=2.11.2", ">=9.10,<9.20", " < 3 ", "!=2.*",
              "2.11.x", ">=2.*", "", "2.11,", "==", "2..11", "v2.11", "2.11 2.12", "~=2.11"]


@pytest.mark.parametrize("text", SPECIFIERS)
def test_the_schema_pattern_and_the_loader_agree_on_specifiers(text):
    import re

    from bundlegen.harness.library_versions import BadSpecifier, parse_specifier

    try:
        parse_specifier(text)
        loads = True
    except BadSpecifier:
        loads = False
    pattern = skip_row_schema()["properties"]["seen_with"]["properties"]["torch"]["pattern"]
    assert (re.fullmatch(pattern, text) is not None) is loads


def test_the_schema_names_what_the_loader_takes():
    from bundlegen.harness import config as C
    from bundlegen.harness.library_versions import LIBRARIES

    schema = json.loads(json.dumps(skip_row_schema()))            # plain JSON
    assert list(schema["properties"]) == list(C.SKIP_KEYS)
    assert list(schema["$defs"]["filter"]["properties"]) == list(C.FILTER_KEYS)
    assert schema["$defs"]["filter"]["properties"]["feature"]["oneOf"][0]["enum"] == list(C.GRAPH_FEATURES)
    assert list(schema["properties"]["seen_with"]["properties"]) == list(LIBRARIES)


def test_the_stride_feature_holds_for_every_case_of_its_plan_axis(every_case):
    """The plan's layout axis value AX-LAYOUT-DO-STRIDES-DIFFER stores dO unlike O; each of
    its cases has the feature a skip of that defect would select by."""
    cases, manifest = every_case
    axis = [c for c in cases if "AX-LAYOUT-DO-STRIDES-DIFFER" in c.items]
    assert axis and all(filters_match({"feature": "do-strides-differ-from-o"}, c, manifest.plan) for c in axis)
    plain = [c for c in cases if "AX-LAYOUT-BHSD" in c.items]
    assert plain and not any(filters_match({"feature": "do-strides-differ-from-o"}, c, manifest.plan) for c in plain)
