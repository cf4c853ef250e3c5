"""The hand-over marker: a process taking the store over says so before it asks the owner to step down.

Why a file beside the lock: between the moment the former owner stops accepting and the moment
the newcomer listens, the socket is missing. Without a word, a client would take that for "no
owner" and start one of its own (or run one-shot and hold the lock), racing the newcomer. The
marker ``owner.next`` names the newcomer's PID: clients wait for its socket instead, and an
auto owner does not start while it names a live process. Standard library only (the thin client
reads it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..process import alive

MARKER = "owner.next"
#: How long a newcomer waits for the former owner to finish its requests and let go of the store,
#: and how long a client waits for the newcomer's socket.
HANDOVER_S = 60.0
_POLL_S = 0.02
#: A marker this much older than HANDOVER_S names no hand-over in progress.
_SLACK_S = 5.0


def _marker(store_dir: Path) -> Path:
    return Path(store_dir) / MARKER


def announce(store_dir: Path, role: str) -> Path:
    """Write the marker naming this process (atomically: a reader sees the whole line or none)."""
    path = _marker(store_dir)
    tmp = path.with_name(f".{MARKER}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        # the start time as its own key: a role may hold spaces ("celery worker")
        os.write(fd, f"{os.getpid()} {role} started={started(os.getpid()) or ''}".encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def withdraw(store_dir: Path) -> None:
    """Remove the marker if it still names this process (another newcomer may have written its own since)."""
    path = _marker(store_dir)
    if pending(store_dir, exclude=None) == os.getpid():
        try:
            path.unlink()
        except OSError:
            pass


def pending(store_dir: Path, exclude: int | None = None) -> int | None:
    """The PID of a live process taking the store over (other than `exclude`), or None.

    A marker is stale, and ignored, when it is older than a hand-over may take or when the process it
    names is not the one that wrote it (its PID reused since: the start time it wrote differs). Why:
    a marker left behind by a newcomer that died made every command wait out HANDOVER_S (61 s).
    """
    try:
        fd = os.open(_marker(store_dir), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        written = os.fstat(fd).st_mtime
        text = os.read(fd, 128).decode(errors="replace")
    finally:
        os.close(fd)
    fields = text.split()
    try:
        pid = int(fields[0])
    except (ValueError, IndexError):
        return None
    if pid == exclude or not alive(pid) or time.time() - written > HANDOVER_S + _SLACK_S:
        return None
    wrote = next((f[len("started="):] for f in fields[1:] if f.startswith("started=")), "")
    if wrote and started(pid) not in (None, wrote):
        return None
    return pid


def started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat's 22nd field), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None


def wait_while_pending(store_dir: Path, until: float, attempt) -> object | None:
    """Call `attempt()` every few ms while a hand-over is pending, until it returns something or `until`."""
    while pending(store_dir) is not None and time.monotonic() < until:
        got = attempt()
        if got is not None:
            return got
        time.sleep(_POLL_S)
    return attempt()
