"""Finding engines by name: the built-in table, the `bundlegen.engines` entry point
group, or an explicit `package.module:Class` (a module in the current folder or the
current workspace imports without PYTHONPATH)."""
from __future__ import annotations

import importlib
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from bundlegen.extras import MissingExtra
from bundlegen.workspace import WorkspaceError, check_engine_name, find_workspace, is_engine_name

if TYPE_CHECKING:   # bundlegen.engines.base imports torch: a lookup by name should not
    from bundlegen.engines.base import Engine

BUILTIN = {
    "torch-math": "bundlegen.engines.torch_math.engine:TorchMathEngine",
    "triton": "bundlegen.engines.triton.engine:TritonEngine",
    "torch-flash": "bundlegen.engines.torch_flash.engine:TorchFlashEngine",
    "torch-efficient": "bundlegen.engines.torch_efficient.engine:TorchEfficientEngine",
    "torch-cudnn": "bundlegen.engines.torch_cudnn.engine:TorchCudnnEngine",
}
ENTRY_POINT_GROUP = "bundlegen.engines"


class EngineNotFound(LookupError):
    pass


def _importable_from_here() -> None:
    """Put the current folder and the current workspace's root on sys.path (a worker
    process inherits the parent's sys.path), as `python -m` would for the folder."""
    workspace = find_workspace()
    for folder in (Path.cwd(), workspace.root if workspace else None):
        if folder is not None and str(folder) not in sys.path and str(folder.resolve()) not in sys.path:
            sys.path.append(str(folder))


def _load(target: str) -> "type[Engine]":
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise EngineNotFound(f"{target!r}: expected 'package.module:Class'")
    _importable_from_here()
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except MissingExtra as exc:
        raise EngineNotFound(str(exc)) from None
    except (ImportError, AttributeError) as exc:
        raise EngineNotFound(f"cannot load engine {target!r}: {exc}") from exc
    from bundlegen.engines.base import Engine
    if not (isinstance(obj, type) and issubclass(obj, Engine)):
        raise EngineNotFound(f"{target!r} is not an Engine subclass")
    try:
        check_engine_name(obj.name)
    except WorkspaceError as exc:
        raise EngineNotFound(f"{target!r}: {exc}") from None
    return obj


def known_names() -> list[str]:
    names = set(BUILTIN)
    names.update(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)
                 if is_engine_name(ep.name))
    return sorted(names)


def registered_name(name: str) -> str:
    """The engine's registry name (what names its config folder), failing like
    engine_class for an unknown one; a built-in name is answered without importing its
    engine (or torch)."""
    if name in BUILTIN:
        return name
    return engine_class(name).name


def engine_class(name: str) -> "type[Engine]":
    if ":" in name:
        return _load(name)
    if name in BUILTIN:
        return _load(BUILTIN[name])
    try:
        check_engine_name(name)
    except WorkspaceError as exc:
        raise EngineNotFound(str(exc)) from None
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return _load(ep.value)
    raise EngineNotFound(f"unknown engine {name!r} (known: {', '.join(known_names())}; "
                         "or give package.module:Class)")
