"""The traceback of the exception being handled, its files named as a reader of the record
can place them: a run's records (run.json, results) travel with the evidence to other
machines, where one machine's folders name nothing."""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

#: the folder bundlegen's subpackages sit in: the repository root of a checkout (harness/,
#: engines/, ...), site-packages/bundlegen of an installed wheel
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def portable_path(filename: str) -> str:
    """`filename` relative to PACKAGE_ROOT when under it (engines/triton/warm.py), else to
    the longest sys.path entry holding it (a library: torch/...), else its last part."""
    path = os.path.abspath(filename)
    if path.startswith(str(PACKAGE_ROOT) + os.sep):
        return os.path.relpath(path, PACKAGE_ROOT).replace(os.sep, "/")
    roots = sorted((os.path.abspath(p) for p in sys.path if p), key=len, reverse=True)
    for root in roots:
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root).replace(os.sep, "/")
    return os.path.basename(path)


def portable_traceback(limit_chars: int = 2000) -> str:
    """traceback.format_exc(), each frame's file as portable_path names it, its last
    `limit_chars` characters."""
    exc = traceback.TracebackException(*sys.exc_info())
    for frame in exc.stack:
        frame.line                                   # read the source line while the path holds
        frame.filename = portable_path(frame.filename)
    return "".join(exc.format())[-limit_chars:]
