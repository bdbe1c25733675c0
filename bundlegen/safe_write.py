"""Writing a file bundlegen owns (a tolerance block, claims, the support matrix, a plan
module `shrink --into` edits, generated bundles, calibrated coefficients, a report): the one
writer every command uses, so that each refuses the same things the same way.

- Only a regular file is replaced, or a new one created: a FIFO would block the writer
  forever, a folder or device is no file to write.
- A path that leads (through a symlink, its own or a parent folder's) outside the folder it
  must stay in (`inside`: the workspace, the bundle root) is refused: a link must not let a
  writer rewrite a file elsewhere.
- The text goes to a temporary file beside the target, which then replaces it (os.replace),
  so a reader sees the old file or the new one, never half of one, and an interrupted write
  leaves the old file as it was. An existing file keeps its permission bits.
- A file the user may not write (read-only, or in a read-only folder) is refused too: the
  rename would replace it, where `open(..., "w")` would not.

Every refusal is an UnsafeWrite (an OSError) with a one-line message naming the path;
commands print it and exit 2."""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from bundlegen.safe_read import kind_of


class UnsafeWrite(OSError):
    """The target is no regular file, lies outside where it must, or may not be written."""

    def __str__(self) -> str:       # OSError's own str() shows errno tuples
        return self.args[0] if self.args else "cannot write"


def check_target(path: Path | str, inside: Path | str | None = None) -> Path:
    """The resolved path a write to `path` would replace; UnsafeWrite when it is not a
    regular file (or absent), resolves outside `inside`, or may not be written."""
    path = Path(path)
    resolved = Path(os.path.realpath(path))
    if inside is not None:
        root = Path(os.path.realpath(inside))
        if not resolved.is_relative_to(root):
            via = "" if resolved == Path(os.path.abspath(path)) else f" (through a symlink, to {resolved})"
            raise UnsafeWrite(f"{path}: refusing to write outside {root}{via}")
    try:
        info = os.stat(resolved)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise UnsafeWrite(f"{path}: cannot write: {exc.strerror or exc}") from None
    if info is not None:
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeWrite(f"{path}: {kind_of(info.st_mode)}, not a regular file: refusing to write it")
        if not os.access(resolved, os.W_OK):
            raise UnsafeWrite(f"{path}: permission denied: the file is read-only")
    return resolved


def write_text(path: Path | str, text: str, *, inside: Path | str | None = None,
               make_parents: bool = True) -> Path:
    """Write `text` as UTF-8, its line ends as they are, to `path` atomically; see the
    module's doc. Returns the resolved path written."""
    return write_bytes(path, text.encode("utf-8"), inside=inside, make_parents=make_parents)


def write_bytes(path: Path | str, data: bytes, *, inside: Path | str | None = None,
                make_parents: bool = True) -> Path:
    """Write `data` to `path` atomically; see the module's doc."""
    target = check_target(path, inside)
    try:
        if make_parents:
            target.parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(os.stat(target).st_mode) if target.exists() else None
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise UnsafeWrite(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        os.replace(tmp, target)
    except OSError as exc:
        _remove(tmp)
        raise UnsafeWrite(f"{path}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        _remove(tmp)
        raise
    return target


def unlink(path: Path | str, *, inside: Path | str | None = None) -> None:
    """Remove the file at `path` (a stale generated file), under the same checks."""
    target = check_target(path, inside)
    try:
        target.unlink()
    except OSError as exc:
        raise UnsafeWrite(f"{path}: cannot remove: {exc.strerror or exc}") from None


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
