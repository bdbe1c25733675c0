"""Workers keep bytecode under a cache prefix where the environment writes none
(harness/pycache.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from bundlegen.harness.workers import pycache
from bundlegen.harness.config import EngineConfig
from bundlegen.harness.workers.worker import WorkerSpec, worker_environment


def test_no_bytecode_becomes_a_cache_prefix(tmp_path):
    env = pycache.with_bytecode({"PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path),
                                 "PATH": "/bin"})
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PATH"] == "/bin"
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "bundlegen" / "pycache")


def test_an_environment_that_writes_bytecode_or_chose_a_prefix_or_opted_out_is_kept():
    for env in ({}, {"PYTHONDONTWRITEBYTECODE": ""},
                {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/elsewhere"},
                {"PYTHONDONTWRITEBYTECODE": "1", pycache.OPT_OUT: "0"}):
        assert pycache.with_bytecode(env) == env


def test_a_worker_started_without_bytecode_keeps_it_under_the_prefix(tmp_path, monkeypatch):
    """The environment a worker gets makes a real interpreter write the bytecode of what it
    imports under the prefix, and none beside the source."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv(pycache.OPT_OUT, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = worker_environment(WorkerSpec("torch-math", "cpu", EngineConfig()))
    source = tmp_path / "src" / "probe_module.py"
    source.parent.mkdir()
    source.write_text("VALUE = 1\n")
    subprocess.run([sys.executable, "-c", "import probe_module"], cwd=source.parent, env=env,
                   check=True)
    prefix = tmp_path / "cache" / "bundlegen" / "pycache"
    written = [p for p in prefix.rglob("probe_module*.pyc")]
    assert len(written) == 1 and str(source.parent).lstrip(os.sep) in str(written[0])
    assert not (source.parent / "__pycache__").exists()


def _cli_bytecode(tmp_path, extra_env: dict) -> list:
    """The bytecode a `bundlegen run` process without bytecode writes under the prefix (a run
    that stops at once: its level does not exist, after the harness is imported)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", pycache.OPT_OUT)}
    env.update(PYTHONDONTWRITEBYTECODE="1", XDG_CACHE_HOME=str(tmp_path / "cache"), **extra_env)
    done = subprocess.run([sys.executable, "-m", "bundlegen", "run", "--level", "no-such-level",
                           "--engine", "torch-math", "--device", "cpu"], env=env, capture_output=True)
    assert done.returncode == 2, done.stderr
    return list((tmp_path / "cache" / "bundlegen" / "pycache").rglob("*.pyc"))


def test_the_run_command_keeps_the_bytecode_of_its_imports_under_the_prefix(tmp_path):
    import bundlegen.harness.level as level

    written = _cli_bytecode(tmp_path, {})
    mirrored = os.path.dirname(level.__file__).lstrip(os.sep)
    assert any(p.name.startswith("level.") and mirrored in str(p) for p in written), written
    assert _cli_bytecode(tmp_path / "off", {pycache.OPT_OUT: "0"}) == []


def test_this_process_is_left_alone_where_bytecode_is_written(monkeypatch):
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    assert not pycache.keep_bytecode_in_this_process() and sys.pycache_prefix is None
