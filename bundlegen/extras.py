"""The optional dependencies, each behind an extra of the package: a command that needs one
that is not installed stops with one line naming the extra to install, instead of a
ModuleNotFoundError deep in a worker or a plot."""
from __future__ import annotations

import importlib
from types import ModuleType

#: import name -> (extra, what needs it); pyproject.toml's [project.optional-dependencies]
#: holds the same extras (tests/test_install_extras.py checks that they agree)
EXTRAS = {
    "triton": ("triton", "the triton engine"),
    "matplotlib": ("report", "the report's plots"),
}


class MissingExtra(ModuleNotFoundError):
    """An optional dependency is not installed; the message is the one line to show."""


def install_hint(module: str) -> str:
    extra, needed_by = EXTRAS[module]
    return f"{needed_by} needs {module}, which is not installed: pip install 'bundlegen[{extra}]'"


def require(module: str) -> ModuleType:
    """`module` imported, or MissingExtra naming the extra that installs it (a failed import
    inside the module itself is not masked)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise MissingExtra(install_hint(module), name=module) from None
