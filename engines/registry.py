"""Finding engines by name: the built-in table, the `bundlegen.engines` entry point
group, or an explicit `package.module:Class`."""
from __future__ import annotations

import importlib
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

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
ENGINES_ROOT = Path(__file__).resolve().parent


class EngineNotFound(LookupError):
    pass


def _load(target: str) -> "type[Engine]":
    module_name, _, attr = target.partition(":")
    if not attr:
        raise EngineNotFound(f"{target!r}: expected 'package.module:Class'")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise EngineNotFound(f"cannot load engine {target!r}: {exc}") from exc
    from bundlegen.engines.base import Engine
    if not (isinstance(obj, type) and issubclass(obj, Engine)):
        raise EngineNotFound(f"{target!r} is not an Engine subclass")
    return obj


def config_dir(name: str) -> Path:
    """engines/<dir>/ holding engine.toml and claims.json: the name with '-' as '_'."""
    return ENGINES_ROOT / name.replace("-", "_")


def known_names() -> list[str]:
    names = set(BUILTIN)
    names.update(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def registered_name(name: str) -> str:
    """The engine's registry name (what config_dir takes), failing like engine_class for
    an unknown one; a built-in name is answered without importing its engine (or torch)."""
    if name in BUILTIN:
        return name
    return engine_class(name).name


def engine_class(name: str) -> "type[Engine]":
    if ":" in name:
        return _load(name)
    if name in BUILTIN:
        return _load(BUILTIN[name])
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return _load(ep.value)
    raise EngineNotFound(f"unknown engine {name!r} (known: {', '.join(known_names())}; "
                         "or give package.module:Class)")
