"""Reading a file that something outside bundlegen put on disk (a bundle, a manifest, a
tolerance TOML, an engine config, a workspace file): only a regular file is read.

A FIFO named where a file is expected would block `open` forever, and a folder or a
dangling link would raise an error no caller expects. The file is opened without blocking
(O_NONBLOCK: opening a FIFO returns at once), and what was opened is checked with fstat
before a byte is read, so nothing can swap it between a check and the read. Every refusal
is a NotRegularFile (an OSError) whose message says what the path is instead."""
from __future__ import annotations

import os
import stat
from pathlib import Path

#: a file larger than this is refused unread (the biggest generated bundle is ~1 MB)
MAX_FILE_BYTES = 64 * 2 ** 20


class NotRegularFile(OSError):
    """The path is missing, a dangling link, a folder, a FIFO, a device or too large."""


def kind_of(mode: int) -> str:
    """What a path of stat mode `mode` is, in words, when it is no regular file."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: Path | str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at `path` (a link to one is followed); NotRegularFile
    for anything else, for a missing file or a dangling link, and past `max_bytes`."""
    if os.path.islink(path) and not os.path.exists(path):
        raise NotRegularFile(f"{path}: a dangling link (its target {os.readlink(path)!r} does not exist)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise NotRegularFile(f"{path}: no such file") from None
    except IsADirectoryError:
        raise NotRegularFile(f"{path}: a folder, not a file") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(f"{path}: {kind_of(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise NotRegularFile(f"{path}: {info.st_size} bytes, more than the {max_bytes} it may have")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > max_bytes:     # grew while being read
                raise NotRegularFile(f"{path}: more than the {max_bytes} bytes it may have")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: Path | str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of the regular file at `path` (read_bytes; UnicodeDecodeError for
    bytes that are not UTF-8)."""
    return read_bytes(path, max_bytes).decode("utf-8")


def digest_bytes(path: Path | str) -> bytes:
    """What a digest over files takes for `path`: its bytes, or, for a path that is not a
    regular file, a marker naming why (the loader reports that file as an error on its own;
    a digest must neither block on it nor stop the run)."""
    try:
        return read_bytes(path)
    except OSError as exc:
        return f"\0unreadable: {exc}\0".encode("utf-8", "replace")
