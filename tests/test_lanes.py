"""lanes.yaml (issue 16): loading with one-line errors, `bundlegen lanes --check`, the
GitHub Actions workflow parsed back, and `bundlegen run --lane`."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from bundlegen.cli import main
from bundlegen.harness import verdicts as V
from bundlegen.harness.bundles import load_level
from bundlegen.harness.lanes import LanesError, check_lanes, load_lanes, names_ticket
from bundlegen.harness.workflow import github_actions
from bundlegen.harness.results import read_results, read_run_times
from bundlegen.workspace import builtin_bundle_root
from tests import harness_support as S

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "lanes.yaml"
    path.write_text(textwrap.dedent(text))
    return path


LANE = """\
    lanes:
      a:
        engine: torch-math
        device: cpu
        level: quick
    """


def test_the_repositorys_lanes_load_and_pass_the_check():
    lanes = load_lanes(REPO / "lanes.yaml")
    assert {"cpu-quick", "cpu-triton-quick", "h200-full"} <= set(lanes.lanes)
    quick, main_job, full = (lanes.lane(n) for n in ("cpu-quick", "cpu-triton-quick", "h200-full"))
    assert (quick.engine, quick.device, quick.level) == ("torch-math", "cpu", "quick")
    assert (main_job.engine, main_job.device, main_job.level) == ("triton", "cpu", "quick")
    assert (full.engine, full.device, full.level) == ("triton", "cuda", "full") and full.shards > 1
    assert {lanes.lane(n).engine for n in lanes.lanes} >= {"torch-flash", "torch-efficient", "torch-cudnn"}
    assert check_lanes(lanes, builtin_bundle_root()) == []
    assert "bundlegen run --lane cpu-quick" in (REPO / ".ci" / "run").read_text()


def test_a_lane_takes_defaults():
    lane = load_lanes(REPO / "lanes.yaml").lane("cpu-quick")
    assert lane.kept() == ("run.json", "results.jsonl", "junit.xml")
    assert lane.out_dir() == Path("out/lanes/cpu-quick")
    assert lane.out_dir((2, 3)) == Path("out/lanes/cpu-quick/shard-2-of-3")


@pytest.mark.parametrize("body, where", [
    ("lanes: []", "lanes: expected a mapping"),
    ("lanes: {a: {engine: torch-math, device: cpu}}", "lanes.a.level: missing"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, colour: red}}", "lanes.a.colour: unknown key"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, shards: 0}}", "lanes.a.shards: expected a whole number"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, shards: true}}", "lanes.a.shards:"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, timeout: -1}}", "lanes.a.timeout: expected seconds"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, keep: [logs]}}", "lanes.a.keep: expected a list"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, keep: [{x: 1}]}}", "lanes.a.keep: expected a list"),
    ("lanes: {a: {engine: 7, device: cpu, level: quick}}", "lanes.a.engine: expected a non-empty string"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, runner: []}}", "lanes.a.runner:"),
    ("lanes: {A_b: {engine: torch-math, device: cpu, level: quick}}", "lanes.A_b: a lane name"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, skips: [{reason: X-1}]}}",
     "lanes.a.skips[0].filters: a skip must name the cases"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, skips: [{filters: {colour: x}, reason: X-1}]}}",
     "lanes.a.skips[0].filters.colour: unknown filter key"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, skips: [{filters: {id: '*'}, reason: X-1}]}}",
     "lanes.a.skips[0].filters.id: '*' matches every case"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, skips: [{filters: {id: x}}]}}",
     "lanes.a.skips[0].reason: a skip needs a reason"),
    ("lanes: {a: {engine: torch-math, device: gpu, level: quick}}", "lanes.a.device: 'gpu': expected cpu"),
    ("lanes: {a: {engine: torch-math, device: cuda, devices: 'cuda:0,gpu', level: quick}}",
     "lanes.a.devices: cuda:0,gpu: expected all"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, workers_per_device: 0}}",
     "lanes.a.workers_per_device: expected a whole number >= 1"),
    ("lanes: {a: {engine: torch-math, device: cuda, level: quick, mps: 'yes'}}",
     "lanes.a.mps: expected true or false"),
    ("lanes: {a: {engine: torch-math, device: cpu, level: quick, mps: true}}",
     "lanes.a.mps: MPS shares a GPU between processes; cpu is not a GPU"),
    ("lanes: {a: {engine: torch-math, device: cuda, devices: 'cpu,cpu', level: quick, mps: true}}",
     "lanes.a.mps: MPS shares a GPU"),
    ("lanes: {a: [", "not valid YAML"),
    ("lanes: !!python/object:os.system {}", "not valid YAML"),   # the safe loader refuses tags
])
def test_malformed_lanes_are_one_line_errors_naming_file_lane_and_key(tmp_path, body, where):
    path = write(tmp_path, body)
    with pytest.raises(LanesError) as info:
        load_lanes(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and where in message and "\n" not in message, message


def test_a_gpu_lane_may_ask_for_mps(tmp_path):
    path = write(tmp_path, "lanes: {a: {engine: triton, device: cuda, level: quick, mps: true},"
                           " b: {engine: triton, device: cuda, devices: all, level: quick, mps: true},"
                           " c: {engine: triton, device: cuda, level: quick}}")
    lanes = load_lanes(path)
    assert (lanes.lane("a").mps, lanes.lane("b").mps, lanes.lane("c").mps) == (True, True, False)


def test_an_unknown_lane_is_named():
    with pytest.raises(LanesError, match=r"lanes\.nope: no such lane \(known: cpu-quick, "):
        load_lanes(REPO / "lanes.yaml").lane("nope")


@pytest.mark.parametrize("text, ticket", [
    ("PROJ-12: flaky", True), ("see owner/repo#345", True), ("https://example.com/issues/9", True),
    ("TICKET-7: flaky", True), ("flaky on the interpreter", False), ("proj-12 lower case", False),
    ("#12 alone", False)])
def test_what_a_ticket_looks_like(text, ticket):
    assert names_ticket(text) is ticket


def test_check_finds_unknown_engines_levels_and_stale_or_ticketless_skips(tmp_path):
    case = load_level(builtin_bundle_root(), "quick").cases[0]
    path = write(tmp_path, f"""\
        install: ["pip install wheels/bundlegen-1.0-py3-none-any.whl"]
        lanes:
          good:
            engine: torch-math
            device: cpu
            level: quick
            skips:
              - {{filters: {{id: "{case.id}"}}, reason: "PROJ-1: known"}}
          bad:
            engine: no-such-engine
            device: cpu
            level: weekly
          stale:
            engine: torch-math
            device: cpu
            level: quick
            skips:
              - {{filters: {{id: "0000gone0000"}}, reason: "PROJ-2: fixed long ago"}}
              - {{filters: {{id: "{case.id}"}}, reason: "flaky"}}
        """)
    problems = check_lanes(load_lanes(path), builtin_bundle_root())
    assert len(problems) == 4, problems
    assert all(p.startswith(f"{path}: lanes.") for p in problems)
    text = "\n".join(problems)
    assert "lanes.bad.engine: unknown engine" in text
    assert "lanes.bad.level: 'weekly' is not a level" in text
    assert "lanes.stale.skips[0].filters: match no case of level quick" in text
    assert "lanes.stale.skips[1].reason: names no ticket" in text
    assert not any("lanes.good" in p for p in problems)


def test_lanes_check_exit_codes(tmp_path, capsys):
    assert main(["lanes", "--check", "--lanes-file", str(REPO / "lanes.yaml")]) == 0
    assert "lanes ok" in capsys.readouterr().out
    bad = write(tmp_path, LANE.replace("torch-math", "no-such-engine"))
    assert main(["lanes", "--check", "--lanes-file", str(bad)]) == 1
    assert "lanes.a.engine" in capsys.readouterr().out
    assert main(["lanes", "--check", "--lanes-file", str(tmp_path / "none.yaml")]) == V.EXIT_USAGE
    assert "cannot read" in capsys.readouterr().err


def test_the_workflow_parses_back_with_a_job_per_lane_and_a_matrix_over_shards(tmp_path, capsys):
    out = tmp_path / "wf" / "bundlegen.yml"
    assert main(["lanes", "--emit", "github-actions", "--output", str(out),
                 "--lanes-file", str(REPO / "lanes.yaml")]) == 0
    doc = yaml.safe_load(out.read_text())
    lanes = load_lanes(REPO / "lanes.yaml")
    assert doc == github_actions(lanes)
    assert set(doc["on"]) == {"push", "pull_request", "schedule", "workflow_dispatch"}
    assert set(doc["jobs"]) == {"check"} | {f"lane-{name}" for name in lanes.lanes}
    for name, lane in lanes.lanes.items():
        job = doc["jobs"][f"lane-{name}"]
        include = job["strategy"]["matrix"]["include"]
        assert job["strategy"]["fail-fast"] is False
        assert [e["shard"] for e in include] == list(range(1, lane.shards + 1))
        assert job["runs-on"] == (list(lane.runner) if isinstance(lane.runner, tuple) else lane.runner)
        # the matrix's out folder is where `run --lane L --shard I/N` writes
        assert [e["out"] for e in include] == [lane.out_dir((i, lane.shards)).as_posix()
                                               for i in range(1, lane.shards + 1)]
        assert f"bundlegen run --lane {name} --shard ${{{{ matrix.shard }}}}/{lane.shards}" in [
            s.get("run") for s in job["steps"]]
    quick, full = doc["jobs"]["lane-cpu-quick"], doc["jobs"]["lane-h200-full"]
    assert quick["strategy"]["matrix"]["include"][0]["artifacts"].split("\n") == [
        "out/lanes/cpu-quick/shard-1-of-1/run.json", "out/lanes/cpu-quick/shard-1-of-1/results.jsonl",
        "out/lanes/cpu-quick/shard-1-of-1/junit.xml"]
    assert full["strategy"]["matrix"]["include"][1]["artifacts"].split("\n")[-1] == "out/lanes/h200-full/shard-2-of-4/report"
    runs = lambda job: [s.get("run", "") for s in job["steps"]]   # noqa: E731
    assert any("--index-url https://download.pytorch.org/whl/cpu" in r for r in runs(quick))
    assert not any("--index-url" in r for r in runs(full))
    assert any("bundlegen report" in r for r in runs(full)) and not any("bundlegen report" in r for r in runs(quick))
    steps = full["steps"]
    uses = [s.get("uses", "") for s in steps]
    assert uses[0].startswith("actions/checkout@") and uses[1].startswith("actions/setup-python@")
    torch = next(i for i, r in enumerate(runs(full)) if "pip install torch" in r)
    install = next(i for i, r in enumerate(runs(full)) if "pip install -e" in r)
    assert torch < install and runs(full)[install].splitlines() == list(lanes.install)   # this repository's own
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["path"] == "${{ matrix.artifacts }}" and "always()" in upload["if"]


# ----------------------------------------------------------------------------- run --lane
@pytest.fixture
def lane_bundles(tmp_path, monkeypatch):
    from dataclasses import replace

    cases = [replace(S.case_of(n), items=(f"AX-{n}",)) for n in range(1, 5)]
    S.write_bundle(tmp_path / "bundles", "quick", "a", cases)
    S.write_bundle(tmp_path / "bundles", "pr", "a", [S.case_of(9)])
    write(tmp_path, """\
        lanes:
          mine:
            engine: torch-math
            device: cpu
            level: quick
            shards: 2
            timeout: 120
            skips:
              - {filters: {item: "AX-2"}, reason: "PROJ-9: skipped by the lane"}
          pair:
            engine: torch-math
            device: cpu
            devices: cpu,cpu
            level: quick
          shared:
            engine: torch-math
            device: cpu
            workers_per_device: 3
            level: quick
        """)
    monkeypatch.chdir(tmp_path)
    return cases


def run_lane(tmp_path, *extra):
    return main(["run", "--lane", "mine", "--lanes-file", str(tmp_path / "lanes.yaml"),
                 "--bundles", str(tmp_path / "bundles"), "--no-isolation", "--quiet", *extra])


def test_run_lane_takes_the_lane_and_its_skips(tmp_path, lane_bundles):
    assert run_lane(tmp_path) == V.EXIT_OK
    out = tmp_path / "out" / "lanes" / "mine"
    got = {r["case_id"]: r for r in read_results(out)}
    assert set(got) == {c.id for c in lane_bundles}   # the whole lane: every shard at once
    skipped = got[lane_bundles[1].id]
    assert skipped["verdict"] == V.SKIPPED and skipped["detail"] == "PROJ-9: skipped by the lane"
    times = read_run_times(out)
    assert (times.lane, times.level, times.engine, times.device) == ("mine", "quick", "torch-math", "cpu")


def test_run_lane_shards_and_flags_override(tmp_path, lane_bundles):
    seen = []
    for index in (1, 2):
        run_lane(tmp_path, "--shard", f"{index}/2", "--allow-empty")
        seen += [r["case_id"] for r in read_results(tmp_path / "out" / "lanes" / "mine" / f"shard-{index}-of-2")]
    assert sorted(seen) == sorted(c.id for c in lane_bundles)
    assert run_lane(tmp_path, "--level", "pr", "--out", str(tmp_path / "o")) == V.EXIT_OK
    assert S.case_of(9).id in {r["case_id"] for r in read_results(tmp_path / "o")}


def test_a_lane_with_devices_runs_one_worker_per_device(tmp_path, lane_bundles):
    assert main(["run", "--lane", "pair", "--lanes-file", str(tmp_path / "lanes.yaml"),
                 "--bundles", str(tmp_path / "bundles"), "--quiet"]) == V.EXIT_OK
    out = tmp_path / "out" / "lanes" / "pair"
    times = read_run_times(out)
    assert times.device == "cpu,cpu" and [d["device"] for d in times.per_device] == ["cpu", "cpu"]
    assert sum(d["cases"] for d in times.per_device) == len(read_results(out)) == len(lane_bundles)


def test_a_lane_with_workers_per_device_shares_its_device(tmp_path, lane_bundles):
    assert main(["run", "--lane", "shared", "--lanes-file", str(tmp_path / "lanes.yaml"),
                 "--bundles", str(tmp_path / "bundles"), "--quiet"]) == V.EXIT_OK
    times = read_run_times(tmp_path / "out" / "lanes" / "shared")
    assert times.device == "cpu" and times.workers_per_device == 3
    assert [(d["device"], d["worker"]) for d in times.per_device] == [("cpu", 0), ("cpu", 1), ("cpu", 2)]


def test_run_lane_errors_are_usage_errors(tmp_path, lane_bundles, capsys):
    assert main(["run", "--lane", "other", "--lanes-file", str(tmp_path / "lanes.yaml")]) == V.EXIT_USAGE
    assert "lanes.other: no such lane" in capsys.readouterr().err
    assert main(["run", "--engine", "torch-math"]) == V.EXIT_USAGE
    assert "--level and --engine are required (or --lane NAME)" in capsys.readouterr().err


def test_the_readme_says_what_ci_runs():
    """Each command .ci/run runs (the test script, the lanes check, the CPU lane) is named in
    the README's account of CI."""
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip().startswith(("bash scripts/", "bundlegen "))]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "CI runs `.ci/run`" in readme and len(ci) >= 3
    for command in ci:
        assert command in readme, f"README does not say CI runs {command!r}"
