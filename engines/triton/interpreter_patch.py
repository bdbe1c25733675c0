"""The Triton interpreter's language patching, done once per launch (CPU only).

The interpreter runs a kernel by swapping triton.language's builtins for numpy ones
(`triton.runtime.interpreter._patch_lang`) around the launch, and restores them after it.
It also calls `_patch_lang` again on every call of a nested @triton.jit function (our
tile_ops helpers, called per program and per loop trip), where each call walks every
member of triton.language, its tensor class and its math module with inspect.getmembers
to patch what is already patched. On the quick level's grid-size case (65 programs of a
few helpers each) that walk was 40 % of the interpreted time.

`install()` keeps Triton's own first patch of each launch (and its restore) and skips the
nested calls whose triton.language modules that launch has already patched: the nested
calls would set the same attributes to equivalent functions. Anywhere else (a nested
function called outside a launch, a module the launch did not patch) Triton's patching
runs as before. Only the interpreter's module is touched, so compiled GPU launches are
unchanged; a Triton without these internals keeps its own behaviour (install does nothing).
"""
from __future__ import annotations

#: per running launch (innermost last): the language modules its patch covers
_launches: list[set[int]] = []


class _NoScope:
    """What a skipped nested patch returns (Triton ignores the nested call's scope)."""

    def restore(self) -> None:
        return None


#: id of a function's globals -> the language modules among them (a module's globals hold
#: the same modules for the life of the process; scanning them was 2 % of interpreted time)
_seen: dict[int, frozenset[int]] = {}


def _languages(fn) -> frozenset[int]:
    import triton.language as tl

    space = getattr(fn, "__globals__", {})
    found = _seen.get(id(space))
    if found is None:
        wanted = {id(tl), id(tl.core)}
        found = _seen[id(space)] = frozenset(id(v) for v in space.values() if id(v) in wanted)
    return found


def install() -> bool:
    """Wrap the interpreter's patching as the module docstring says; True once installed
    (again: nothing to do), False where this Triton lacks the internals it wraps."""
    try:
        from triton.runtime import interpreter as I
    except ImportError:
        return False
    patch, executor = getattr(I, "_patch_lang", None), getattr(I, "GridExecutor", None)
    if patch is None or executor is None or not callable(getattr(executor, "__call__", None)):
        return False
    if getattr(patch, "bundlegen_once", False):
        return True
    launch = executor.__call__

    def patch_once(fn):
        langs = _languages(fn)
        if _launches and langs and langs <= _launches[-1]:
            return _NoScope()
        scope = patch(fn)
        if _launches:
            _launches[-1].update(langs)
        return scope

    def launch_once(self, *args, **kwargs):
        _launches.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            _launches.pop()

    patch_once.bundlegen_once = True
    I._patch_lang = patch_once
    executor.__call__ = launch_once
    return True
