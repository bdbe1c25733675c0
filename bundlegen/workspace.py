"""Workspaces (DESIGN section 9): where bundlegen reads plans, bundles and engine
configuration, and the only places its writers (`generate`, `harvest`, `matrix`,
`calibrate --write`) may write.

A workspace is a folder holding `bundlegen.toml`, or a `pyproject.toml` with a
`[tool.bundlegen]` table; the nearest one at or above the current folder is used. Keys
(all optional; paths are relative to the workspace folder):

    plans   = ["bundlegen.plans.sdpa_bwd"]   # plan modules (each defines PLAN: a Plan, or an
                                              # Extension of the built-in one)
    bundles = "bundles"                       # bundle root: manifests and bundles
    engines = ["engines"]                     # engine config folders: <folder>/<engine dir>/
    lanes   = "lanes.yaml"                    # CI lanes
    matrix  = "SUPPORT_MATRIX.md"             # the rendered support matrix

Outside a workspace bundlegen reads its built-in plan's bundles and its built-in engines'
configuration from the installed package, and writes nothing there.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundlegen import safe_read

CONFIG_NAME = "bundlegen.toml"
PYPROJECT_NAME = "pyproject.toml"
KEYS = ("plans", "bundles", "engines", "lanes", "matrix")
DEFAULTS: dict[str, Any] = {"plans": ["bundlegen.plans.sdpa_bwd"], "bundles": "bundles",
                            "engines": ["engines"], "lanes": "lanes.yaml",
                            "matrix": "SUPPORT_MATRIX.md"}
#: what an engine may be called: it names a folder, so no path characters
ENGINE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
#: what a plan entry may be: an importable dotted module name
MODULE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


LOG = logging.getLogger(__name__)


class WorkspaceError(ValueError):
    """A malformed workspace file, a writer run outside a workspace, or a bad engine name;
    the message is one line naming the file and key where there is one."""


@dataclass(frozen=True)
class Workspace:
    root: Path
    source: Path                    # the file that declared it
    plans: tuple[str, ...]
    bundles: Path
    engine_dirs: tuple[Path, ...]
    lanes: Path
    matrix: Path

    def engine_config_dir(self, name: str) -> Path:
        """Where engine `name` keeps engine.toml and claims.json in this workspace: the
        first engine folder that has it, else the first folder (where harvest creates it)."""
        sub = engine_dir_name(name)
        for folder in self.engine_dirs:
            if (folder / sub).is_dir():
                return folder / sub
        return self.engine_dirs[0] / sub


def package_root() -> Path:
    """The folder the package's built-in data hangs from: `plans/`, `bundles/` and
    `engines/` are its children, in a checkout and in an installed wheel alike. Found, not
    imported: core imports no subpackage."""
    spec = importlib.util.find_spec("bundlegen.plans")
    return Path(spec.origin).resolve().parent.parent


def builtin_bundle_root() -> Path:
    return package_root() / "bundles"


def builtin_engine_dir(name: str) -> Path:
    return package_root() / "engines" / engine_dir_name(name)


def is_engine_name(name: object) -> bool:
    return isinstance(name, str) and ENGINE_NAME_RE.match(name) is not None


def check_engine_name(name: str) -> str:
    if not is_engine_name(name):
        raise WorkspaceError(f"engine name {name!r}: expected lower-case letters, digits and '-' "
                             "(starting with a letter or digit)")
    return name


def engine_dir_name(name: str) -> str:
    """The config folder of engine `name`: the name with '-' as '_'."""
    return check_engine_name(name).replace("-", "_")


def find_workspace(start: Path | str | None = None) -> Workspace | None:
    """The nearest workspace at or above `start` (default: the current folder)."""
    here = Path.cwd() if start is None else Path(start)
    for folder in (here.resolve(), *here.resolve().parents):
        config = folder / CONFIG_NAME
        if os.path.lexists(config):     # a folder, FIFO or dangling link there is refused, not passed by
            LOG.debug("workspace: %s", config)
            return _workspace(folder, config, _read_toml(config))
        pyproject = folder / PYPROJECT_NAME
        if pyproject.is_file():
            tool = _read_toml(pyproject).get("tool", {})
            table = tool.get("bundlegen") if isinstance(tool, dict) else None
            if table is not None:
                LOG.debug("workspace: %s [tool.bundlegen]", pyproject)
                return _workspace(folder, pyproject, table, prefix="tool.bundlegen.")
    return None


def require_workspace(command: str, start: Path | str | None = None) -> Workspace:
    """The current workspace, or a one-line refusal for a writer run outside one."""
    workspace = find_workspace(start)
    if workspace is None:
        raise WorkspaceError(f"{command} writes into a workspace, and {Path.cwd() if start is None else start} "
                             f"is not inside one: create {CONFIG_NAME} there (see the README)")
    return workspace


def default_bundle_root(start: Path | str | None = None) -> Path:
    """The current workspace's bundle root when it has generated one, else the built-in."""
    workspace = find_workspace(start)
    if workspace is not None and workspace.bundles.is_dir():
        return workspace.bundles
    return builtin_bundle_root()


def engine_config_dir(name: str, explicit: Path | str | None = None,
                      start: Path | str | None = None) -> Path | None:
    """Where engine `name`'s engine.toml and claims.json are read from: `explicit`
    (--engine-config), else the current workspace's folder for it when it exists, else
    the built-in engine's folder in the package; None when there is none."""
    if explicit is not None:
        return Path(explicit)
    workspace = find_workspace(start)
    if workspace is not None:
        directory = workspace.engine_config_dir(name)
        if directory.is_dir():
            return directory
    builtin = builtin_engine_dir(name)
    return builtin if builtin.is_dir() else None


# ----------------------------------------------------------------------------- reading
def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(safe_read.read_text(path))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise WorkspaceError(f"{path}: {exc}") from None


def _workspace(root: Path, source: Path, table: Any, prefix: str = "") -> Workspace:
    if not isinstance(table, dict):
        raise WorkspaceError(f"{source}: {prefix.rstrip('.') or 'top level'}: expected a table")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise WorkspaceError(f"{source}: {prefix}{unknown[0]}: unknown key (known: {', '.join(KEYS)})")
    raw = {**DEFAULTS, **table}
    for key in ("bundles", "lanes", "matrix"):
        if not isinstance(raw[key], str) or not raw[key]:
            raise WorkspaceError(f"{source}: {prefix}{key}: expected a path string")
    for key in ("plans", "engines"):
        if not isinstance(raw[key], list) or not all(isinstance(v, str) and v for v in raw[key]):
            raise WorkspaceError(f"{source}: {prefix}{key}: expected a list of strings")
    for plan in raw["plans"]:
        if not MODULE_NAME_RE.match(plan):
            raise WorkspaceError(f"{source}: {prefix}plans: {plan!r} is not a module name (dotted.name)")
    if not raw["engines"]:
        raise WorkspaceError(f"{source}: {prefix}engines: name at least one folder")
    return Workspace(root=root, source=source, plans=tuple(raw["plans"]),
                     bundles=root / raw["bundles"],
                     engine_dirs=tuple(root / d for d in raw["engines"]),
                     lanes=root / raw["lanes"], matrix=root / raw["matrix"])


def workspace_schema() -> dict:
    """A JSON Schema (draft 2020-12) of bundlegen.toml (and of pyproject.toml's
    [tool.bundlegen] table), built from the keys and defaults _workspace checks by;
    published as bundlegen/schemas/bundlegen-toml.schema.json."""
    path = {"type": "string", "minLength": 1}
    names = {"type": "array", "items": {"type": "string", "minLength": 1}}
    properties = {
        "plans": {**names, "items": {"type": "string", "pattern": MODULE_NAME_RE.pattern},
                  "description": "plan modules (dotted names) whose bundles the workspace keeps"},
        "bundles": {**path, "description": "the bundle root, relative to the workspace"},
        "engines": {**names, "minItems": 1,
                    "description": "folders of engine configuration: <folder>/<engine>/engine.toml, claims.json"},
        "lanes": {**path, "description": "the CI lanes file"},
        "matrix": {**path, "description": "the support matrix markdown"},
    }
    for key, value in DEFAULTS.items():
        properties[key]["default"] = value
    assert tuple(properties) == KEYS
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "bundlegen.toml (or pyproject.toml [tool.bundlegen]) - a bundlegen workspace",
            "type": "object", "additionalProperties": False, "properties": properties}
