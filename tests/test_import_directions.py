"""Imports point one way (DESIGN section 9): core <- plans <- generator; core <- harness <-
claims, mutants; engines <- core. Every module of each part is parsed, and every import
in it (inside functions too) is checked."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: part -> its folder in the repository (the package-dir map of pyproject.toml)
FOLDERS = {"core": "bundlegen", "plans": "plans", "generator": "generator", "harness": "harness",
           "claims": "claims", "mutants": "mutants", "engines": "engines"}
SUBPACKAGES = ("plans", "generator", "harness", "claims", "mutants", "engines", "bundles")
#: part -> the parts it may import (besides itself); harness may also use the engine
#: registry and the engine interface
ALLOWED = {
    "core": {"core"},
    "plans": {"core"},
    "generator": {"core", "plans"},
    "harness": {"core", "harness"},
    "claims": {"core", "harness", "claims", "engines"},
    "mutants": {"core", "harness", "mutants", "engines"},
    "engines": {"core", "engines"},
}
HARNESS_ENGINE_MODULES = ("bundlegen.engines.registry", "bundlegen.engines.base")
#: generator may run cases through the harness's in-process runner and name its verdicts:
#: `bundlegen shrink` needs the plan (Specs, legality, the Regression syntax) and an engine
#: run per candidate. The edge keeps the direction (the harness never imports plans or
#: generator, so bundles stay the harness's only contract) and is this narrow on purpose.
GENERATOR_HARNESS_MODULES = ("bundlegen.harness.repro", "bundlegen.harness.verdicts")
ROUTER = "bundlegen/cli.py"     # routes to every subcommand


def part_of(module: str) -> str | None:
    """The part a `bundlegen...` module belongs to; None for anything outside bundlegen."""
    names = module.split(".")
    if names[0] != "bundlegen":
        return None
    if len(names) > 1 and names[1] in SUBPACKAGES:
        return names[1]
    return "core"


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved
    against `package`; `from X import name` gives X.name as well, as name may be a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


def violations(part: str, path: Path, package: str) -> list[str]:
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    if rel == ROUTER:
        return []
    bad = []
    for line, module in imported_modules(path, package):
        target = part_of(module)
        if target is None or target in ("bundles", part) or target in ALLOWED[part]:
            continue
        if part == "harness" and target == "engines" and module.startswith(HARNESS_ENGINE_MODULES):
            continue
        if part == "generator" and target == "harness" and _within(module, GENERATOR_HARNESS_MODULES):
            continue
        if target == "engines" and module == "bundlegen.engines":   # `from bundlegen.engines import registry`
            continue
        bad.append(f"{rel}:{line}: {part} imports {module} ({target})")
    return bad


def _within(module: str, allowed: tuple[str, ...]) -> bool:
    """`module` is one of `allowed` or a name inside one of them."""
    return module in allowed or module.startswith(tuple(f"{m}." for m in allowed))


def modules(part: str) -> list[tuple[Path, str]]:
    folder = ROOT / FOLDERS[part]
    prefix = "bundlegen" if part == "core" else f"bundlegen.{part}"
    files = sorted(folder.glob("*.py")) if part == "core" else sorted(folder.rglob("*.py"))
    out = []
    for path in files:
        sub = path.parent.relative_to(folder).parts
        out.append((path, ".".join((prefix, *sub))))
    return out


@pytest.mark.parametrize("part", sorted(FOLDERS))
def test_imports_point_one_way(part):
    found = [v for path, package in modules(part) for v in violations(part, path, package)]
    assert modules(part), f"no modules found for {part}"
    assert not found, "imports against the direction core <- plans <- generator; core <- harness <- " \
                      "claims, mutants; engines <- core:\n" + "\n".join(found)


def _found_in(tmp_path: Path, part: str, source: str) -> list[str]:
    """The sorted violations of a module of `part` holding `source`, without their line."""
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    return sorted(line.split(": ", 1)[1] for line in violations(part, probe, f"bundlegen.{part}"))


def test_the_checker_sees_imports_inside_functions_and_relative_ones(tmp_path):
    found = _found_in(tmp_path, "harness", "def f():\n    from bundlegen.plans.sdpa_bwd import PLAN\n"
                                           "from ..generator import build\n"
                                           "import bundlegen.engines.triton.engine\n"
                                           "from bundlegen.engines import registry\n"
                                           "from bundlegen.engines.base import Engine\n"
                                           "from bundlegen.graph import Graph\n")
    assert found == [
        "harness imports bundlegen.engines.triton.engine (engines)",
        "harness imports bundlegen.generator (generator)",
        "harness imports bundlegen.generator.build (generator)",
        "harness imports bundlegen.plans.sdpa_bwd (plans)",
        "harness imports bundlegen.plans.sdpa_bwd.PLAN (plans)"], found


def test_generator_may_use_only_the_harness_runner_and_verdicts(tmp_path):
    found = _found_in(tmp_path, "generator", "from bundlegen.harness.repro import CaseRunner\n"
                                             "import bundlegen.harness.verdicts as V\n"
                                             "from bundlegen.harness.repro_command import main\n"
                                             "from bundlegen.harness import run\n")
    assert found == [
        "generator imports bundlegen.harness (harness)",
        "generator imports bundlegen.harness.repro_command (harness)",
        "generator imports bundlegen.harness.repro_command.main (harness)",
        "generator imports bundlegen.harness.run (harness)"], found
