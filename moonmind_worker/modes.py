"""Who may read what moonmind writes: only its user, unless MOONMIND_UMASK opens it to a group.

Why private by default: the store and the cached context packs hold the code that was indexed
and retrieved; whoever can read them reads that code. So directories moonmind
creates are 0700 and its files 0600. A shared deployment sets MOONMIND_UMASK (e.g. `027`:
directories 0750, files 0640, for a group that only reads); group and others never get write
(owner/trust.py refuses such directories: a writer could plant a socket or a link there).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

#: The umask when MOONMIND_UMASK is unset: nothing for group and others.
PRIVATE = 0o077


def umask(settings: Any = None) -> int:
    """MOONMIND_UMASK, or PRIVATE when it is unset (or the settings cannot be read: the safe side)."""
    if settings is None:
        from .errors import MoonmindError
        from .settings import get_settings

        try:
            settings = get_settings()
        except MoonmindError:
            return PRIVATE
    return int(getattr(settings, "umask", PRIVATE))


def file_mode(settings: Any = None) -> int:
    return 0o666 & ~umask(settings)


def dir_mode(settings: Any = None) -> int:
    return 0o777 & ~umask(settings)


def restrict_process(settings: Any = None) -> None:
    """Set this process's umask to MOONMIND_UMASK (see module doc).

    Why the process umask: the embedded engine creates its own files under `shard/`, with modes
    only the umask reaches; called by the process that owns the store, before it writes.
    """
    os.umask(umask(settings))


def makedirs(path: Path | str, settings: Any = None) -> None:
    """mkdir -p that gives every directory it creates dir_mode (os.makedirs gives the parents the default mode)."""
    mode = dir_mode(settings)
    missing = []
    p = os.path.normpath(os.fspath(path))
    while p and not os.path.lexists(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            pass  # created meanwhile by another process
