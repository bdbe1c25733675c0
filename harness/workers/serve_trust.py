"""Whether a `bundlegen serve` socket may be used: a server's results become a run's verdicts,
so a socket another user could have put in place is never spoken to.

The folders bundlegen makes for its sockets (workers.serve_key.serve_dir, and the per-user
folder above it under the system's temporary folder) are made with mode 0700 and must stay
this user's, private to it; no part of the socket's path may be a symbolic link (the folder
above the workspace is resolved once, so a link there is followed before the check, never
after); the socket must be a socket of this user's; and the process answering on it must
run as this user (SO_PEERCRED, where the system has it). A server checks the same of each
run that connects."""
from __future__ import annotations

import os
import socket
import stat
import struct
from pathlib import Path

#: mode bits a private folder may not have: any access by the group or by others
SHARED_BITS = 0o077


def private_folders(socket_file: Path) -> tuple[Path, ...]:
    """The folders of `socket_file` that bundlegen made, which must be this user's alone:
    its own, and the per-user folder above it when it lies under the temporary folder."""
    folder = socket_file.parent
    if folder.parent.name == f"bundlegen-{os.getuid()}":
        return folder.parent, folder
    return (folder,)


def make_private_folder(socket_file: Path) -> str | None:
    """Make the folders of `socket_file` (mode 0700; one of this user's made with a wider
    mode is narrowed, never one of another user's or a link); why they cannot be trusted,
    or None."""
    for folder in private_folders(socket_file):
        if os.path.islink(folder):     # refused below: nothing is made through it
            break
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            st = os.lstat(folder)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & SHARED_BITS:
                os.chmod(folder, 0o700, follow_symlinks=False)
    return untrusted_folder(socket_file)


def untrusted_folder(socket_file: Path) -> str | None:
    """Why the path to `socket_file` cannot be trusted (a symbolic link in it; a private
    folder another user owns, or that others may read or write), or None."""
    path = Path(os.path.abspath(socket_file))
    for part in (*reversed(path.parents), path):
        try:
            if stat.S_ISLNK(os.lstat(part).st_mode):
                return f"{part} is a symbolic link"
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{part}: {exc}"
    for folder in private_folders(path):
        try:
            st = os.lstat(folder)
        except OSError as exc:
            return f"{folder}: {exc}"
        if st.st_uid != os.geteuid():
            return f"{folder} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
        if st.st_mode & SHARED_BITS:
            return f"{folder} has mode {stat.S_IMODE(st.st_mode):04o}; only its owner may use it (0700)"
    return None


def untrusted_socket(socket_file: Path) -> str | None:
    """Why `socket_file` may not be connected to, or None: its path (untrusted_folder), or
    the file is no socket or is another user's."""
    why = untrusted_folder(socket_file)
    if why:
        return why
    try:
        st = os.lstat(socket_file)
    except OSError as exc:
        return f"{socket_file}: {exc}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{socket_file} is not a socket"
    if st.st_uid != os.geteuid():
        return f"{socket_file} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    return None


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a connected Unix socket; None where the
    system does not say (then the socket file's checks stand alone)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return uid


def untrusted_peer(sock: socket.socket) -> str | None:
    """Why the process at the other end of `sock` is not trusted (another user's), or None."""
    uid = peer_uid(sock)
    if uid is not None and uid != os.geteuid():
        return f"the process answering runs as uid {uid}, not as this user (uid {os.geteuid()})"
    return None
