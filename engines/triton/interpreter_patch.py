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

`install()` also turns off the interpreter's integer-overflow sanitizer where its finding
is thrown away (skip_dead_overflow_checks): with `sanitize_overflow` on, every int32 add, sub
and mul of a kernel is done again in int64 and compared with int32's range, and the result
goes to `device_assert`, which does nothing unless `debug` is on; the interpreter's options
never turn it on. A compiled kernel drops those dead operations; the interpreter ran them
all (28 % of the engine's CPU seconds on eight of the quick level's slowest cases). The
kernels' own values are computed by the same operations either way.

Each patch also reads a scalar tensor's index from its one element (index_from_one_element):
the interpreter holds a kernel's scalars as one-element 1-D arrays, and a Triton that turns
them into a Python int with `int(array)` (3.6) fails under numpy 2.4, which converts only
0-d arrays; every `range()` over a computed bound then raised. Later Triton squeezes the
array first, which is what this does.
"""
from __future__ import annotations

import dataclasses

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


def _one_element_index(self) -> int:
    data = self.handle.data
    return int(data.reshape(()) if getattr(data, "size", 0) == 1 else data)


def index_from_one_element(scope) -> bool:
    """Set, through Triton's patch scope (so its restore undoes it), the tensor's `__index__`
    to read a one-element array's element (the module docstring); False where the scope is
    not the kind this expects."""
    import triton.language as tl

    if not callable(getattr(scope, "set_attr", None)):
        return False
    scope.set_attr(tl.core.tensor, "__index__", _one_element_index)
    return True


def skip_dead_overflow_checks(builder) -> bool:
    """The interpreter builder's options with `sanitize_overflow` off where `debug` is off
    (the module docstring); True when the builder now runs no overflow check, False where
    its options are not the dataclass this expects (left as they are)."""
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or not {"debug", "sanitize_overflow"} <= {
            f.name for f in dataclasses.fields(options)}:
        return False
    if options.debug:   # a checked overflow then asserts: keep it
        return not options.sanitize_overflow
    if options.sanitize_overflow:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def install() -> bool:
    """Wrap the interpreter's patching as the module docstring says; True once installed
    (again: nothing to do), False where this Triton lacks the internals it wraps."""
    try:
        from triton.runtime import interpreter as I
    except ImportError:
        return False
    builder = getattr(I, "interpreter_builder", None)
    if builder is not None:
        skip_dead_overflow_checks(builder)
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
        index_from_one_element(scope)
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
