"""`bundlegen shrink --into MODULE`: write a Regression's declaration into a workspace plan
module, at the end of the tuple its module-level `REGRESSIONS` assignment holds (where an
Extension's regressions, or a plan's, are kept). The edit is checked by importing the module
again: when it no longer imports, or its PLAN does not take the new item, the file is put
back as it was and the reason is raised."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

from bundlegen import safe_read, safe_write
from bundlegen.generator.errors import PlanError

TUPLE_NAME = "REGRESSIONS"
INDENT = "    "


class EditError(PlanError):
    """The regression could not be written into the module (one line)."""


def _tuple_node(tree: ast.Module, path: Path) -> ast.Tuple:
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        if isinstance(target, ast.Name) and target.id == TUPLE_NAME:
            if not isinstance(node.value, ast.Tuple):
                raise EditError(f"{path}: {TUPLE_NAME} is not a tuple literal (...), so there is no place "
                                "to write the regression")
            return node.value
    raise EditError(f"{path}: has no module-level {TUPLE_NAME} = (...) to write the regression into: "
                    f"add `{TUPLE_NAME} = ()` and pass it as Extension(regressions={TUPLE_NAME})")


def inserted(source: str, declaration: str, path: Path) -> str:
    """`source` with `declaration` (one element, ending in ',') appended to REGRESSIONS's tuple."""
    node = _tuple_node(ast.parse(source), path)
    lines = source.splitlines(keepends=True)
    if node.end_col_offset is None or node.end_lineno is None:
        raise EditError(f"{path}: cannot place {TUPLE_NAME}'s end")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    close = offsets[node.end_lineno - 1] + node.end_col_offset - 1     # the closing parenthesis
    if source[close] != ")":
        raise EditError(f"{path}: {TUPLE_NAME} is not a parenthesized tuple")
    head = source[:close].rstrip()
    if node.elts and not head.endswith(","):
        head += ","
    block = "".join(f"{INDENT}{line}\n" if line else "\n" for line in declaration.splitlines())
    return f"{head}\n{block}{source[close:]}"


def _write(path: Path, text: str) -> None:
    """`text` into the plan file, atomically (bundlegen.safe_write); EditError (one line)
    for a file that may not be written (read-only, not a regular file)."""
    try:
        safe_write.write_text(path, text)
    except safe_write.UnsafeWrite as exc:
        raise EditError(str(exc)) from None


def write_regression(module_name: str, path: Path, declaration: str, item: str, check) -> None:
    """Append `declaration` to REGRESSIONS in the module's file `path`; re-import the module
    and call `check(module)` (a PlanError for a module that does not take it), putting the
    file back when the import or the check fails."""
    try:
        before = safe_read.read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise EditError(f"cannot read: {exc}") from None
    after = inserted(before, declaration, path)
    _write(path, after)
    try:
        importlib.invalidate_caches()
        module = importlib.reload(importlib.import_module(module_name))
        check(module)
        taken = {r.item for r in getattr(module.PLAN, "regressions", ())} | {
            r.item for space in (getattr(module.PLAN, "padded", None), getattr(module.PLAN, "ragged", None))
            if space is not None for r in space.regressions}
        if item not in taken:
            raise EditError(f"{path}: written into {TUPLE_NAME}, but PLAN does not take {item}")
    except Exception as exc:
        _write(path, before)
        importlib.reload(importlib.import_module(module_name))
        if isinstance(exc, PlanError):
            raise
        raise EditError(f"{path}: the module does not import with the regression ({type(exc).__name__}: {exc}); "
                        "left as it was") from None
