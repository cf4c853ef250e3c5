"""A private store: what the owner socket and lock may be trusted with (standard library only).

Like ssh-agent's and gpg-agent's runtime directories: before a client connects, before an
owner binds its socket and before anyone opens ``owner.lock``, MOONMIND_HOME and the
directories below it down to the collection's must be real directories (no symlink), owned by
this process's effective uid, and writable by nobody else; otherwise another user could plant
a socket that reads our queries, or a link that makes our lock file truncate one of ours.
A client also checks, before it sends a byte, that the process listening on the socket runs as
its own uid (SO_PEERCRED). Directories the CLI creates itself are created mode 0700.
Directories above MOONMIND_HOME (/tmp, say) are the system's and not checked.
"""

from __future__ import annotations

import _socket  # the C module, as in client.py: no `socket` wrapper on the thin client's path
import errno
import os
import stat
import sys

from ..errors import MoonmindError

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from pathlib import Path

#: The data directory's name under MOONMIND_HOME (settings.data_dir).
DATA_DIR_NAME = "qdrant-edge"
_PRIVATE = "set MOONMIND_HOME to a private directory of your own"


def _euid() -> int:
    return os.geteuid()


def _refuse(path: Path | str, what: str, action: str) -> MoonmindError:
    return MoonmindError("forbidden", f"moonmind refuses to use {path}: {what}.", action, path=str(path))


def check_private_dir(path: Path | str) -> bool:
    """True when `path` is a private directory of ours, False when it does not exist; raises when it is not private."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "it is a symbolic link, which could lead the store somewhere another user chose",
                      f"Replace the link with a real directory (mkdir -m 700 {path}), or {_PRIVATE}.")
    if not stat.S_ISDIR(st.st_mode):
        raise MoonmindError("invalid_setting", f"{path} is not a directory; moonmind keeps its store there.",
                            f"Remove or move {path}, or {_PRIVATE}.", path=str(path))
    if st.st_uid != _euid():
        raise _refuse(path, f"it is owned by uid {st.st_uid}, not by you (uid {_euid()}), so that user controls what is in it",
                      f"Remove {path} (or chown it to uid {_euid()} if it is yours), or {_PRIVATE}.")
    if st.st_mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "group"), (0o002, "others")) if st.st_mode & bit)
        raise _refuse(path, f"its mode {stat.S_IMODE(st.st_mode):04o} lets {who} write to it, so they could plant a socket or link there",
                      f"Run `chmod 700 {path}`, or {_PRIVATE}.")
    return True


def ensure_private_dirs(home: Path | str, *names: str) -> str:
    """Create (mode 0700) and check `home` and each directory `names` leads down to; the deepest one's path."""
    path = os.fspath(home)
    _make_private(path)
    check_private_dir(path)
    for name in names:
        path = os.path.join(path, name)
        _make_private(path)
        check_private_dir(path)
    return path


def check_private_dirs(home: Path | str, *names: str) -> bool:
    """Check `home` and the directories `names` leads down to, without creating any; False at the first missing one."""
    path = os.fspath(home)
    if not check_private_dir(path):
        return False
    for name in names:
        path = os.path.join(path, name)
        if not check_private_dir(path):
            return False
    return True


def store_dirs(data_dir: Path | str, collection: str) -> tuple[str, ...]:
    """The directories a collection's trust rests on: from MOONMIND_HOME (data_dir's parent) down to the collection's.

    A store rooted elsewhere (a gateway worker's replica, a test's directory) starts at its root.
    """
    data = os.fspath(data_dir)
    if os.path.basename(os.path.normpath(data)) == DATA_DIR_NAME:
        return (os.path.dirname(os.path.normpath(data)) or ".", DATA_DIR_NAME, collection)
    return (data, collection)


def _make_private(path: str) -> None:
    """mkdir -p with mode 0700 for every directory it creates (os.makedirs gives the parents the default mode)."""
    if os.path.lexists(path):
        return
    parent = os.path.dirname(os.path.normpath(path))
    if parent and parent != path:
        _make_private(parent)
    from .. import modes

    try:
        os.mkdir(path, modes.dir_mode())  # 0700 unless MOONMIND_UMASK opens it to a group
    except FileExistsError:
        pass  # created meanwhile by another process: checked like any other


def check_own_entry(path: Path | str) -> os.stat_result | None:
    """The lstat of a socket or lock file of ours; None when it does not exist; raises on a link or another user's file."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "it is a symbolic link, never followed there",
                      f"Remove the link (rm {path}); if another user can create it, {_PRIVATE}.")
    if st.st_uid != _euid():
        raise _refuse(path, f"it is owned by uid {st.st_uid}, not by you (uid {_euid()})",
                      f"Remove {path}; if another user can create it, {_PRIVATE}.")
    return st


def open_private_file(path: Path | str, flags: int, mode: int = 0o600) -> int:
    """os.open that never follows a link at `path` (O_NOFOLLOW, O_CLOEXEC) and refuses another user's file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "it is a symbolic link, never followed there (it could point at a file of yours)",
                          f"Remove the link (rm {path}); if another user can create it, {_PRIVATE}.") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != _euid() or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "it is not a regular file" if not stat.S_ISREG(st.st_mode) else f"it is owned by uid {st.st_uid}, not by you (uid {_euid()})"
        raise _refuse(path, what, f"Remove {path}; if another user can create it, {_PRIVATE}.")
    return fd


def peer_uid(sock: _socket.socket) -> int | None:
    """The effective uid of the process at the other end of a connected Unix socket; None where the OS has no SO_PEERCRED."""
    opt = getattr(_socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    raw = sock.getsockopt(_socket.SOL_SOCKET, opt, 12)  # struct ucred: pid, uid, gid (native ints)
    return int.from_bytes(raw[4:8], sys.byteorder)  # no `struct` import on the thin client's path


def check_peer(sock: _socket.socket, path: Path | str) -> None:
    """Raise (the caller closes `sock`) unless the process listening at `path` runs as our own effective uid."""
    uid = peer_uid(sock)
    if uid is not None and uid != _euid():
        directory = os.path.dirname(os.fspath(path))
        raise MoonmindError(
            "forbidden",
            f"The process listening on {path} runs as uid {uid}, not as you (uid {_euid()}); "
            "moonmind sent it nothing.",
            f"Another user controls {directory}: remove it, or {_PRIVATE}.",
            path=str(path), uid=uid,
        )
