"""The package as a user gets it: build the wheel from a copy of this tree, install it into
a fresh venv (no network: the test venv's dependencies are lent through a .pth file), and
run from an empty folder. The wheel must add exactly one importable top-level name,
carry the built-in plan's bundles, and no command may write into site-packages."""
from __future__ import annotations

import json
import os
import pkgutil
import shutil
import subprocess
import sys
import sysconfig
from collections import Counter
from pathlib import Path

import pytest

from bundlegen.harness import verdicts as V
from bundlegen.harness.bundles import default_bundle_root, load_level

REPO = Path(__file__).resolve().parents[1]
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "out", "build", "dist", "*.egg-info",
                                    "__pycache__", "results")
#: what the test venv lends the new one: everything but bundlegen's own install and the
#: optional dependencies (the extras triton and report), so the wheel runs as
#: `pip install bundlegen` without extras leaves it
NOT_LENT = ("__editable__", "bundlegen", "_bundlegen", "__pycache__",
            "triton", "matplotlib", "mpl_toolkits", "pylab")
#: a few of quick's bf16 cases (one shard of 16 of some 200): enough for the runs below, which
#: show where a run writes and what an adopter's loop does; more cases would show nothing more
A_FEW_BF16 = ["-k", "AX-DTYPE-BF16", "--shard", "1/16"]


def _run(args, cwd, env=None, check=True):
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _site_packages(python: Path) -> Path:
    out = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd="/")
    return Path(out.stdout.strip())


def _lend_dependencies(venv_site: Path, farm: Path) -> None:
    farm.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        if entry.name.startswith(NOT_LENT) or entry.suffix == ".pth":
            continue
        (farm / entry.name).symlink_to(entry)
    (venv_site / "lent-test-dependencies.pth").write_text(f"{farm}\n")


def _snapshot(site: Path) -> dict[str, tuple[int, int]]:
    """Every file under site-packages but Python's own bytecode caches."""
    return {p.relative_to(site).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in site.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def _top_level_names(site: Path) -> set[str]:
    return {m.name for m in pkgutil.iter_modules([str(site)])}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=NOT_COPIED, symlinks=True)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-q", "-w", str(tmp / "dist"), str(src)], cwd=tmp)
    wheel = next((tmp / "dist").glob("bundlegen-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    python = venv / "bin" / "python"
    site = _site_packages(python)
    _lend_dependencies(site, tmp / "lent")
    names_before = _top_level_names(site)
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
          "-q", str(wheel)], cwd=tmp)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    empty = tmp / "empty"
    empty.mkdir()
    return {"site": site, "names_before": names_before, "env": env, "empty": empty,
            "bundlegen": str(venv / "bin" / "bundlegen"), "python": str(python)}


def test_the_wheel_adds_one_top_level_name(installed):
    assert _top_level_names(installed["site"]) - installed["names_before"] == {"bundlegen"}
    out = _run([installed["python"], "-c",
                "from importlib import metadata; "
                "print([ep.value for ep in metadata.entry_points(group='pytest11') if ep.name == 'bundlegen'])"],
               cwd=installed["empty"], env=installed["env"])
    assert out.stdout.strip() == "['bundlegen.harness.pytest_plugin']"


def test_quick_runs_from_an_empty_folder_and_writes_nothing_into_site_packages(installed):
    site, env, empty, bundlegen = installed["site"], installed["env"], installed["empty"], installed["bundlegen"]
    before = _snapshot(site)
    version = _run([bundlegen, "--version"], cwd=empty, env=env)
    assert version.stdout.startswith("bundlegen ")
    report = _run([bundlegen, "generate", "--dry-run", "--report"], cwd=empty, env=env)
    assert "all-pairs" in report.stdout
    for writer in (["generate"], ["matrix"]):
        refused = _run([bundlegen, *writer], cwd=empty, env=env, check=False)
        assert refused.returncode == 2, (writer, refused.stdout, refused.stderr)
        message = (refused.stdout + refused.stderr).strip()
        assert len(message.splitlines()) == 1 and "workspace" in message, message
    _run([bundlegen, "run", "--level", "quick", "--engine", "torch-math", "--device", "cpu", "--quiet",
          "--out", "out"], cwd=empty, env=env)
    records = [json.loads(line) for line in (empty / "out" / "results.jsonl").read_text().splitlines()]
    verdicts = Counter(r["verdict"] for r in records)
    # what the installed bundles say each case must get from torch-math: every claim and
    # regression passes but those asking the engine to draw its own dropout mask (torch-math
    # draws none: declined), device probes are contained, the other probes rejected
    loaded = load_level(default_bundle_root(), "quick")

    def wanted(c):
        if c.expected_rejection is not None:
            return V.CONTAINED if c.expected_rejection.by == "device" else V.REJECTED
        a = c.graph.attributes
        return V.DECLINED if a.dropout_probability and "dropout_mask" not in c.graph.tensors else V.PASS
    want = Counter(wanted(c) for c in loaded.cases)
    assert len(records) == len(loaded.cases) >= 100 and verdicts == want, verdicts
    assert sorted(p.name for p in empty.iterdir()) == ["out"]
    assert _snapshot(site) == before


def test_without_the_extras_the_triton_engine_and_the_plots_say_what_to_install(installed):
    env, empty, bundlegen = installed["env"], installed["empty"], installed["bundlegen"]
    for module in ("triton", "matplotlib"):   # not lent: the extras are not installed
        assert _run([installed["python"], "-c", f"import {module}"], cwd=empty, env=env, check=False).returncode
    refused = _run([bundlegen, "run", "--level", "quick", "--engine", "triton", "--device", "cpu", "--quiet",
                    "--out", str(empty.parent / "triton-out")], cwd=empty, env=env, check=False)
    assert refused.returncode == V.EXIT_USAGE
    message = (refused.stdout + refused.stderr).strip()
    assert len(message.splitlines()) == 1 and "pip install 'bundlegen[triton]'" in message, message
    out = empty.parent / "plots"
    ran = _run([bundlegen, "run", "--level", "quick", "--engine", "torch-math", "--device", "cpu", "--quiet",
                *A_FEW_BF16, "--out", str(out)], cwd=empty, env=env)
    refused = _run([bundlegen, "report", str(out), "--html", str(out / "report")], cwd=empty, env=env, check=False)
    assert ran.returncode == 0 and refused.returncode == V.EXIT_USAGE
    message = (refused.stdout + refused.stderr).strip()
    assert len(message.splitlines()) == 1 and "pip install 'bundlegen[report]'" in message, message


def test_every_writer_refuses_outside_a_workspace_with_the_package_read_only(installed, tmp_path):
    """The installed package made read-only, every writer run from an empty folder: each
    refuses in one line (exit 2) and site-packages is left as it was. `tolerances --engine`
    would otherwise rewrite the installed engine.toml; an explicit path into the package
    is refused the same way."""
    site, env, bundlegen = installed["site"], installed["env"], installed["bundlegen"]
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "results.jsonl").write_text("")
    package = site / "bundlegen"
    engine_toml = package / "engines" / "torch_math" / "engine.toml"
    before = _snapshot(site)
    modes = {p: p.stat().st_mode for p in [package, *package.rglob("*")]}
    for path in modes:
        path.chmod(modes[path] & ~0o222)
    try:
        for writer in (["generate"], ["matrix"], ["tolerances", "--engine", "torch-math"],
                       ["tolerances", "--engine-toml", str(engine_toml)],
                       ["harvest", str(tmp_path / "results")],
                       ["calibrate", str(tmp_path / "results"), "--write"]):
            refused = _run([bundlegen, *writer], cwd=empty, env=env, check=False)
            message = (refused.stdout + refused.stderr).strip()
            assert refused.returncode == 2, (writer, message)
            assert len(message.splitlines()) == 1 and "workspace" in message, (writer, message)
    finally:
        for path, mode in sorted(modes.items(), key=lambda kv: len(kv[0].parts)):
            path.chmod(mode)
    assert _snapshot(site) == before and list(empty.iterdir()) == []
def _written_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_outside_out_a_run_writes_only_what_adopting_says(installed, tmp_path):
    """ADOPTING's claim about where a run writes, checked: with a home of its own and
    PYTHONDONTWRITEBYTECODE set (as container images do), a quick run writes its results
    into out/ and, outside it, only bytecode under the cache folder ADOPTING names."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in installed["env"].items() if k not in ("XDG_CACHE_HOME", "BUNDLEGEN_PYCACHE",
                                                                   "PYTHONPYCACHEPREFIX")}
    env.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    _run([installed["bundlegen"], "run", "--level", "quick", "--engine", "torch-math", "--device", "cpu", "-q",
          *A_FEW_BF16, "--no-server"], cwd=work, env=env)
    assert sorted(p.name for p in work.iterdir()) == ["out"]
    written = _written_under(home)
    adopting = (REPO / "docs" / "ADOPTING.md").read_text(encoding="utf-8")
    places = {"~/.cache/bundlegen/pycache": ".cache/bundlegen/pycache/"}
    assert written, "the bytecode cache is the one place the run writes outside out/ here"
    for name in written:
        place = next((claim for claim, prefix in places.items() if name.startswith(prefix)), None)
        assert place is not None, f"the run wrote {name} under its home"
        assert f"`{place}`" in adopting, f"ADOPTING does not say a run writes under {place}"


ADOPTER_ENGINE_TOML = """\
[[tolerance_overrides]]
filters = { plan = "sdpa_bwd", item = "AX-DTYPE-BF16" }
rtol = 0.03125
atol = 0.03125

[[tolerance_overrides]]
filters = { item = "AX-NO-SUCH-ITEM" }
rtol = 0.25
atol = 0.25
"""


def test_an_adopter_loop_from_the_wheel(installed, tmp_path):
    """A kernel project on the installed wheel: a dead override row is reported by run, the
    harvest of a result under out/ is refused with the commands that keep it, and after
    the documented evidence step the claims, matrix and `matrix --check` agree."""
    env, bundlegen = installed["env"], installed["bundlegen"]
    ws = tmp_path / "kernelproj"
    (ws / "bundlegen-engines" / "torch_math").mkdir(parents=True)
    (ws / "bundlegen.toml").write_text('engines = ["bundlegen-engines"]\nmatrix = "SUPPORT_MATRIX.md"\n')
    (ws / "bundlegen-engines" / "torch_math" / "engine.toml").write_text(ADOPTER_ENGINE_TOML)
    ran = _run([bundlegen, "run", "--level", "quick", "--engine", "torch-math", "--device", "cpu", "-q",
                *A_FEW_BF16, "--out", "out/quick", "--no-server"], cwd=ws, env=env)
    warnings = [line for line in ran.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "tolerance_overrides[1]" in warnings[0] and "AX-NO-SUCH-ITEM" in warnings[0], \
        ran.stderr
    refused = _run([bundlegen, "harvest", "out/quick/results.jsonl", "--min-runs", "1"], cwd=ws, env=env,
                   check=False)
    assert refused.returncode == 2 and "keep it as evidence first: " in refused.stdout, refused.stdout
    keep, harvest = refused.stdout.split("keep it as evidence first: ")[1].strip().split(" and harvest ")
    subprocess.run(["bash", "-e", "-c", keep], cwd=ws, check=True, timeout=60)
    _run([bundlegen, "harvest", harvest, "--min-runs", "1"], cwd=ws, env=env)
    _run([bundlegen, "matrix"], cwd=ws, env=env)
    _run([bundlegen, "matrix", "--check"], cwd=ws, env=env)
    claims = json.loads((ws / "bundlegen-engines" / "torch_math" / "claims.json").read_text())
    passed = sorted(json.loads(line)["case_id"] for line in (ws / harvest).read_text().splitlines()
                    if json.loads(line)["verdict"] == V.PASS)
    assert claims["claims"]["cpu"] == passed and passed
