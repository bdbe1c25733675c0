"""Imports point one way (DESIGN section 9): core <- plans <- generator; core <- harness <-
claims, mutants; engines <- core. Inside the harness, its floors point one way too (front
ends > level > executor > workers > case > judging); the core CLI imports no speed module;
and no private (underscore) name crosses a module line. Every module of each part is parsed,
and every import in it (inside functions too) is checked."""
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


# ----------------------------------------------------------------------------- the harness's floors
#: the harness's floors, top first (DESIGN section 9): a module imports modules of its own
#: floor or of a floor below it, never above. Speed and process machinery (workers/) sits
#: above the one-case path, which must run, and judge, without it.
HARNESS_FLOORS = (
    ("front end", ("command", "lanes_command", "repro_command", "serve_command", "pytest_plugin",
                   "schema_files", "tolerance_power_command")),
    ("level", ("level", "lanes", "lanes_install", "workflow", "repro", "repro_dump", "progress")),
    ("executor", ("executor",)),
    ("workers", ("workers",)),
    ("case", ("case",)),
    ("judging", ("materialize", "drawn_dropout", "oracle", "oracle_ragged", "io_reference", "checks", "statistical", "diagnose", "config", "verdicts",
                 "results", "bundles", "selection", "stale_skips", "dead_rows", "distributions", "library_versions", "selfcheck",
                 "job_summary", "tolerance_power", "portable_traceback", "__init__")),
)
HARNESS = ROOT / "harness"


def harness_floor(module: str) -> int | None:
    """The floor (0 = top) of a `bundlegen.harness...` module or of a name inside one; None
    for anything outside the harness, and for the package itself."""
    names = module.split(".")
    if names[:2] != ["bundlegen", "harness"] or len(names) < 3:
        return None
    for floor, (_, members) in enumerate(HARNESS_FLOORS):
        if names[2] in members:
            return floor
    raise AssertionError(f"{module}: no floor of HARNESS_FLOORS holds harness.{names[2]}")


def floor_violations(path: Path, module_floor: int, root: Path = ROOT) -> list[str]:
    """The imports of the harness file at `path` (under `root`, the repository's root) that
    reach a floor above `module_floor`."""
    package = "bundlegen." + ".".join(path.parent.relative_to(root).parts)
    bad = []
    for line, module in imported_modules(path, package):
        target = harness_floor(module)
        if target is not None and target < module_floor:
            bad.append(f"{path.relative_to(root).as_posix()}:{line}: the {HARNESS_FLOORS[module_floor][0]} "
                       f"floor imports {module} ({HARNESS_FLOORS[target][0]} floor)")
    return bad


def harness_files() -> list[tuple[Path, int]]:
    out = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS).with_suffix("").parts
        out.append((path, harness_floor(".".join(("bundlegen", "harness", *rel)))))
    return out


def test_every_harness_module_has_a_floor():
    files = harness_files()
    assert len(files) > 20 and all(floor is not None for _, floor in files)
    floors = {floor for _, floor in files}
    assert floors == set(range(len(HARNESS_FLOORS))), "a floor with no module: drop it or fill it"


def test_harness_imports_go_down_the_floors_never_up():
    found = [v for path, floor in harness_files() for v in floor_violations(path, floor)]
    assert not found, "harness imports against its floors (front end > level > executor > " \
                      "workers > case > judging):\n" + "\n".join(found)


def test_the_floor_checker_sees_a_judging_module_reaching_up(tmp_path):
    probe = tmp_path / "harness" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("def f():\n    from bundlegen.harness.workers import pycache\n"
                     "from bundlegen.harness.executor import CaseExecutor\n"
                     "from bundlegen.harness import level, checks\n"
                     "from . import command, case\n")
    found = sorted(line.split(": ", 1)[1]
                   for line in floor_violations(probe, len(HARNESS_FLOORS) - 1, root=tmp_path))
    assert found == [
        "the judging floor imports bundlegen.harness.case (case floor)",
        "the judging floor imports bundlegen.harness.command (front end floor)",
        "the judging floor imports bundlegen.harness.executor (executor floor)",
        "the judging floor imports bundlegen.harness.executor.CaseExecutor (executor floor)",
        "the judging floor imports bundlegen.harness.level (level floor)",
        "the judging floor imports bundlegen.harness.workers (workers floor)",
        "the judging floor imports bundlegen.harness.workers.pycache (workers floor)"], found


# ----------------------------------------------------------------------------- the core CLI
SPEED_MODULES = "bundlegen.harness.workers"


def test_the_core_cli_imports_no_speed_module():
    found = [f"{ROUTER}:{line}: {module}" for line, module in imported_modules(ROOT / ROUTER, "bundlegen")
             if module == SPEED_MODULES or module.startswith(SPEED_MODULES + ".")]
    assert not found, "the router imports process or speed machinery (a front end's job):\n" + "\n".join(found)


# ----------------------------------------------------------------------------- private names
#: the parts whose modules may not reach into another module's private (underscore) names
PRIVATE_CHECKED = ("harness", "mutants", "claims")


def private_crossings(path: Path, package: str) -> list[str]:
    """`from X import _name` of another bundlegen module, and `module._name` on a bundlegen
    module imported here (dunder names are public)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    private = lambda name: name.startswith("_") and not name.startswith("__")  # noqa: E731
    modules_bound: set[str] = set()
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if part_of(base) is None:
                continue
            for alias in node.names:
                if private(alias.name):
                    bad.append(f"{rel}:{node.lineno}: imports {base}.{alias.name}")
                if _is_module(f"{base}.{alias.name}"):
                    modules_bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if part_of(alias.name) is not None and alias.asname:
                    modules_bound.add(alias.asname)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules_bound and private(node.attr)):
            bad.append(f"{rel}:{node.lineno}: uses {node.value.id}.{node.attr}")
    return bad


def _is_module(name: str) -> bool:
    """Whether a `bundlegen...` name is a module or package of this repository."""
    part = part_of(name)
    names = name.split(".")
    folder = ROOT / (FOLDERS[part] if part in FOLDERS else "bundlegen")
    rest = names[2:] if part != "core" else names[1:]
    target = folder.joinpath(*rest) if rest else folder
    return target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()


@pytest.mark.parametrize("part", PRIVATE_CHECKED)
def test_no_private_name_crosses_a_module_line(part):
    found = [v for path, package in modules(part) for v in private_crossings(path, package)]
    assert not found, "private (underscore) names used across module lines:\n" + "\n".join(found)


def test_the_private_name_checker_sees_imports_and_attributes(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from bundlegen.harness.workers.worker import _kill_group, WorkerSpec\n"
                     "from bundlegen.harness.workers import zygote\n"
                     "from bundlegen.harness import verdicts as V\n"
                     "import os\n"
                     "zygote._SHARED, V.__name__, os._exit\n"
                     "def f():\n    from .config import _private\n")
    found = sorted(line.split(": ", 1)[1] for line in private_crossings(probe, "bundlegen.harness"))
    assert found == ["imports bundlegen.harness.config._private",
                     "imports bundlegen.harness.workers.worker._kill_group",
                     "uses zygote._SHARED"], found
