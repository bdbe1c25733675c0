"""Fault injection at the run level (issue 13): an engine that cannot be rebuilt after a
crash, a hung engine with a helper process, a warm-up past --timeout, resume keyed to
what was run, Ctrl-C, and bad command lines. Each case is recorded and charged to the
engine, or the command refuses with one line; nothing is lost, nothing hangs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from bundlegen.cli import main
from bundlegen.harness import verdicts as V
from bundlegen.harness.results import RESULTS_NAME, read_results, read_run_times
from bundlegen.harness.executor import CaseExecutor
from bundlegen.harness.level import run_level
from bundlegen.harness.workers.worker import WorkerStartError
from tests import harness_support as S

REPO = Path(__file__).resolve().parents[1]
#: set in the worker's environment by the tests that need it
MARK_DIR = "BUNDLEGEN_TEST_MARK_DIR"


class BuildsOnce(S.TorchMathEngine):
    """Builds once per test (a marker file), then can no longer be built; S_q 4 exits."""
    name = "builds-once"

    def warm_up(self):
        pass

    def __init__(self, device):
        marker = Path(os.environ[MARK_DIR]) / "built"
        if marker.exists():
            raise RuntimeError("the driver is gone")
        marker.touch()
        super().__init__(device)

    def run(self, graph, tensors):
        if graph.S_q == 4:
            os._exit(3)
        super().run(graph, tensors)


class HangsWithAHelper(S.TorchMathEngine):
    """Starts a helper process that shares our stdout, then hangs."""
    name = "hangs-with-a-helper"

    def warm_up(self):
        pass

    def run(self, graph, tensors):
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        (Path(os.environ[MARK_DIR]) / "helper.pid").write_text(str(helper.pid))
        time.sleep(300)


class SlowWarmUp(S.TorchMathEngine):
    name = "slow-warm-up"

    def warm_up(self):
        time.sleep(300)


class Slow(S.TorchMathEngine):
    name = "slow"

    def run(self, graph, tensors):
        time.sleep(0.5)
        super().run(graph, tensors)


@pytest.fixture
def marks(tmp_path, monkeypatch):
    folder = tmp_path / "marks"
    folder.mkdir()
    monkeypatch.setenv(MARK_DIR, str(folder))
    return folder


def _run(tmp_path, engine, **kwargs):
    return run_level("quick", S.engine_ref(engine), device="cpu", bundles=tmp_path / "bundles",
                     out=tmp_path / "out", config=S.LOOSE, repeat=1, **kwargs)


def test_an_engine_that_cannot_be_rebuilt_after_a_crash_costs_each_case_not_the_run(tmp_path, marks):
    cases = [S.case_of(1), S.case_of(4, S_q=4)] + [S.case_of(10 + n) for n in range(6)]
    S.write_bundle(tmp_path / "bundles", "quick", "a", cases)
    summary = _run(tmp_path, BuildsOnce, timeout_s=60)
    records = read_results(summary.results_path)
    assert [r["case_id"] for r in records] == [c.id for c in cases]
    assert records[0]["verdict"] == V.PASS
    assert records[1]["verdict"] == V.CRASHED and "could not be rebuilt" in records[1]["detail"]
    assert all(r["verdict"] == V.CRASHED and "the driver is gone" in r["detail"] for r in records[2:])
    assert summary.exit_code == V.EXIT_FAILED


def test_a_timeout_ends_the_engines_helper_processes_too(tmp_path, marks):
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(1)])
    summary = _run(tmp_path, HangsWithAHelper, timeout_s=4)   # the case only waits it out
    (record,) = read_results(summary.results_path)
    assert record["verdict"] == V.CRASHED and "timed out after 4 s" in record["detail"]
    pid = int((marks / "helper.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the engine's helper outlived the timeout"


def _alive(pid: int) -> bool:
    if not S.pid_exists(pid):
        return False
    with open(f"/proc/{pid}/stat") as fh:   # a zombie has exited; its parent just did not reap it
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_timeout_covers_the_warm_up():
    start = time.monotonic()
    with pytest.raises(WorkerStartError, match="did not finish its warm-up within 5 s"):
        CaseExecutor(S.engine_ref(SlowWarmUp), "cpu", config=S.LOOSE, timeout_s=5)
    assert time.monotonic() - start < 60


def test_resume_refuses_results_of_another_run(tmp_path):
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(1), S.case_of(2)])
    _run(tmp_path, S.TorchMathEngine, isolation=False)
    for changed in (dict(engine=S.AcceptsEverything), dict(pattern="no-such-case")):
        kwargs = {"engine": S.TorchMathEngine, **changed}
        with pytest.raises(ValueError, match=r"--resume: .* holds another run \(its (engine spec|selection)"):
            _run(tmp_path, kwargs.pop("engine"), isolation=False, resume=True, **kwargs)
    bundle = tmp_path / "bundles" / "quick" / "sdpa_bwd" / "a.json"
    bundle.write_text(bundle.read_text().replace('"seed": 2', '"seed": 3'))
    with pytest.raises(ValueError, match="its bundles differ from this run's"):
        _run(tmp_path, S.TorchMathEngine, isolation=False, resume=True)


def test_resume_refuses_a_changed_engine_config_or_tolerance_file(tmp_path):
    """What decides verdicts besides the bundles joins the resume key (issue 45): a resume
    under a loosened engine config or tolerance file would mix cases judged two ways."""
    import json as json_
    from dataclasses import replace

    from bundlegen.harness.config import OverrideRow
    from bundlegen.tolerances import text_digest

    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(1), S.case_of(2)])
    _run(tmp_path, S.TorchMathEngine, isolation=False, pattern=S.case_of(1).id)
    loose = replace(S.LOOSE, overrides=(OverrideRow(filters={}, rtol=0.3, atol=0.3, index=0),))
    with pytest.raises(ValueError, match=r"holds another run \(its engine config \(engine.toml and "
                                         r"claims.json\) differs from this run's") as refused:
        run_level("quick", S.engine_ref(S.TorchMathEngine), device="cpu", bundles=tmp_path / "bundles",
                  out=tmp_path / "out", config=loose, repeat=1, isolation=False, resume=True,
                  pattern=S.case_of(1).id)
    assert "\n" not in str(refused.value)
    manifest = next((tmp_path / "bundles").glob("*.manifest.json"))
    raw = json_.loads(manifest.read_text())
    toml = manifest.parent / raw["tolerances"]["file"]
    text = toml.read_text().replace("rtol = 0.", "rtol = 0.0", 1)   # one class ten times tighter
    assert text != toml.read_text()
    toml.write_text(text)
    raw["tolerances"]["digest"] = text_digest(text)
    manifest.write_text(json_.dumps(raw))
    # the built-in plan's numbers are recomputed first (bundlegen/tolerance_check.py): the
    # edited file is refused before the resume could mix cases judged by two of them
    with pytest.raises(ValueError, match=r"class bf16-r256: rtol is 0.003125, the plan derives 0.03125"):
        _run(tmp_path, S.TorchMathEngine, isolation=False, resume=True, pattern=S.case_of(1).id)


def test_resume_keeps_a_whole_last_record_that_lost_its_newline(tmp_path):
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(1), S.case_of(2)])
    first = _run(tmp_path, S.TorchMathEngine, isolation=False)
    results = first.results_path
    lines = results.read_text().splitlines()
    results.write_text(lines[0] + "\n" + lines[1])   # whole, but no newline
    again = _run(tmp_path, S.TorchMathEngine, isolation=False, resume=True)
    assert (again.ran, again.resumed) == (0, 2)
    assert len(read_results(results)) == 2 and results.read_text().endswith("\n")


def test_ctrl_c_ends_cleanly_with_results_junit_run_json_and_the_resume_command(tmp_path):
    # 15 cases of half a second each: the interrupt after the second lands with several
    # seconds of cases left, and the resume (in this process) waits out fewer of them
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(n) for n in range(1, 16)])
    out = tmp_path / "out"
    args = ["run", "--level", "quick", "--engine", S.engine_ref(Slow), "--device", "cpu",
            "--bundles", str(tmp_path / "bundles"), "--out", str(out), "--quiet"]
    proc = S.start_cli(args, cwd=REPO)
    deadline = time.monotonic() + 120
    while len(read_results(out / RESULTS_NAME)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == V.EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr and "--resume" in stderr and "interrupted after" in stderr
    ET.parse(out / "junit.xml")
    times = read_run_times(out)
    recorded = read_results(out / RESULTS_NAME)
    assert times is not None and not times.complete and times.cases == len(recorded) >= 2
    assert main([*args, "--no-isolation", "--resume"]) == V.EXIT_OK
    assert len(read_results(out / RESULTS_NAME)) == 15


@pytest.mark.parametrize("extra, message", [
    (["--device", "gpu"], "--device gpu: expected cpu, cuda or cuda:N"),
    (["--out", "FILE"], "is a file, not a folder"),
])
def test_bad_command_lines_are_one_line_usage_errors(tmp_path, capsys, extra, message):
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(1)])
    (tmp_path / "FILE").write_text("")
    extra = [str(tmp_path / "FILE") if e == "FILE" else e for e in extra]
    code = main(["run", "--level", "quick", "--engine", "torch-math", "--device", "cpu",
                 "--bundles", str(tmp_path / "bundles"), "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == V.EXIT_USAGE and len(err) == 1 and message in err[0], err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_one_line_error(tmp_path, capsys):
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(1)])
    code = main(["run", "--level", "quick", "--engine", "torch-math", "--device", "cuda",
                 "--bundles", str(tmp_path / "bundles"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == V.EXIT_USAGE and len(err) == 1 and "no GPU is visible" in err[0], err


def test_the_driver_version_is_asked_in_the_background(tmp_path, monkeypatch):
    """worker.ask_driver starts nvidia-smi and returns at once (a worker asks before it
    imports torch); software_versions reads the answer; None where it fails or is missing."""
    from types import SimpleNamespace

    from bundlegen.harness.workers import worker

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nsleep 1\necho 550.54.15\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    start = time.perf_counter()
    query = worker.ask_driver()
    assert time.perf_counter() - start < 0.5
    assert worker.software_versions(SimpleNamespace(type="cuda"), query)["driver"] == "550.54.15"
    fake.write_text("#!/bin/sh\nexit 9\n")
    assert worker.driver_version(worker.ask_driver()) is None
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert worker.ask_driver() is None and "driver" not in worker.software_versions("cpu")


def test_run_json_records_the_key_and_the_software_versions(tmp_path):
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(1)])
    _run(tmp_path, S.TorchMathEngine, isolation=False, pattern=["a", "not b"], shard=(1, 1))
    times = read_run_times(tmp_path / "out")
    assert times.complete and times.versions["torch"] == torch.__version__
    assert times.selection == "-k 'a' -k 'not b' --shard 1/1" and len(times.bundles_digest) == 16


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_terminated_or_killed_run_leaves_no_traceback(tmp_path, how):
    """SIGTERM ends a run as Ctrl-C does (one line, the resume command); after SIGKILL of the
    run its workers, finding no one to send to, exit quietly: the stderr they share with the
    run holds no BrokenPipeError traceback."""
    S.write_bundle(tmp_path / "bundles", "quick", "a", [S.case_of(n) for n in range(1, 40)])
    out = tmp_path / "out"
    args = ["run", "--level", "quick", "--engine", S.engine_ref(Slow), "--device", "cpu",
            "--bundles", str(tmp_path / "bundles"), "--out", str(out), "--quiet", "--no-server"]
    proc = S.start_cli(args, cwd=REPO)
    deadline = time.monotonic() + 120
    while len(read_results(out / RESULTS_NAME)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(getattr(signal, how))
    stdout, stderr = proc.communicate(timeout=60)    # EOF: the workers have closed it too
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    if how == "SIGTERM":
        assert proc.returncode == V.EXIT_INTERRUPTED, stderr
        assert "interrupted after" in stderr and "--resume" in stderr
