"""What the package declares: every third-party module it imports is a dependency or sits
behind an extra, every dependency is used, the extras match bundlegen/extras.py, and a
command that needs a missing extra says in one line which to install; `python -m
bundlegen` from a checkout that is not installed says how to install."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bundlegen.extras import EXTRAS, MissingExtra, require

REPO = Path(__file__).resolve().parent.parent
PACKAGE_FOLDERS = ("bundlegen", "plans", "generator", "harness", "claims", "mutants", "engines")
#: distribution name -> import name, where they differ
IMPORT_NAME = {"pyyaml": "yaml", "pytest-xdist": "xdist", "check-jsonschema": "check_jsonschema"}
#: imported by the package, provided by what imports it: the pytest plugin runs only in pytest
HOST_PROVIDED = {"pytest"}
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def dist_name(requirement: str) -> str:
    return re.split(r"[\s\[;<>=!~]", requirement, maxsplit=1)[0].lower()


def imported_top_levels(folders) -> set[str]:
    names = set()
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names.add(node.module.split(".")[0])
    return names


def third_party(names: set[str]) -> set[str]:
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("bundlegen", "__future__")}


def test_every_import_is_declared_and_every_dependency_imported():
    runtime = {IMPORT_NAME.get(dist_name(r), dist_name(r)) for r in PROJECT["dependencies"]}
    extras = {IMPORT_NAME.get(dist_name(r), dist_name(r))
              for name, reqs in PROJECT["optional-dependencies"].items() if name != "test" for r in reqs}
    used = third_party(imported_top_levels(PACKAGE_FOLDERS)) - HOST_PROVIDED
    assert used <= runtime | extras, f"imported but not declared: {sorted(used - runtime - extras)}"
    assert runtime <= used, f"declared but never imported: {sorted(runtime - used)}"
    assert runtime.isdisjoint(extras)


def test_the_test_extra_holds_the_other_extras_and_only_what_the_tests_use():
    test = PROJECT["optional-dependencies"]["test"]
    own = [r for r in test if dist_name(r) == "bundlegen"]
    assert own and set(re.search(r"\[(.*)\]", own[0]).group(1).split(",")) == \
        set(PROJECT["optional-dependencies"]) - {"test"}
    text = "\n".join(p.read_text(encoding="utf-8") for p in [*(REPO / "tests").glob("*.py"), *(REPO / "scripts").glob("*")]
                     if p.name != Path(__file__).name)
    for requirement in test:
        name = dist_name(requirement)
        if name != "bundlegen":
            assert name in text or IMPORT_NAME.get(name, name) in text, f"{name}: no test uses it"


def test_extras_py_names_the_extras_of_pyproject():
    optional = PROJECT["optional-dependencies"]
    for module, (extra, _) in EXTRAS.items():
        assert module in [dist_name(r) for r in optional[extra]], (module, extra)


def test_require_names_the_extra_and_does_not_mask_other_import_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtra, match=re.escape("pip install 'bundlegen[report]'")):
        require("matplotlib")
    from bundlegen.claims.report import _pyplot as pyplot   # noqa: PLC2701 (the test's own look)
    with pytest.raises(MissingExtra):
        pyplot()


def stub_folder(tmp_path: Path, module: str) -> Path:
    """A folder that, first on PYTHONPATH, makes `module` look not installed."""
    (tmp_path / "stubs" / module).mkdir(parents=True)
    (tmp_path / "stubs" / module / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named {module!r}\", name={module!r})\n")
    return tmp_path / "stubs"


def test_the_triton_engine_without_triton_says_which_extra_in_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(stub_folder(tmp_path, "triton"))}
    proc = subprocess.run([sys.executable, "-m", "bundlegen", "run", "--level", "quick", "--engine", "triton",
                           "--device", "cpu", "--quiet", "-k", "AX-DTYPE-BF16", "--out", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    message = (proc.stdout + proc.stderr).strip()
    assert len(message.splitlines()) == 1 and "pip install 'bundlegen[triton]'" in message, message


def test_python_m_bundlegen_from_a_checkout_that_is_not_installed_says_how_to_install():
    """-S: no site-packages, so the checkout's `bundlegen/` is all Python finds (as in a
    fresh clone with no install)."""
    proc = subprocess.run([sys.executable, "-S", "-m", "bundlegen", "--version"], cwd=REPO,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "not installed" in line and "pip install -e ." in line
    installed = subprocess.run([sys.executable, "-m", "bundlegen", "--version"], cwd=REPO,
                               capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0 and installed.stdout.startswith("bundlegen ")
