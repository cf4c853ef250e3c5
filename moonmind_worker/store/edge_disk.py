"""Disk room for the embedded store (edge.py): a write or an open it cannot back is refused as `disk_full` first.

Why checked here: the engine writes through memory maps, and a page it cannot back is a SIGBUS
that kills the process with no message, where a write call would have returned an error.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ..errors import disk_full, disk_full_from, free_bytes
from .base import PointIn

#: Room every write leaves free beyond its own estimate: the engine grows files by whole pages and
#: rewrites small ones (its config, segment versions) as it goes.
SPACE_MARGIN = 8 << 20
#: How many times a batch's own bytes (vectors, payload text) it may take on disk: each point also
#: lands in the id tracker, the sparse index and every payload index.
BATCH_FACTOR = 2
#: What a new shard takes before its first point (the payload indexes' bitmaps are written whole).
CREATE_BYTES = 16 << 20
#: Below this much free space an open first adds up what it may fill (a walk of the shard's files).
CAREFUL_BELOW = 256 << 20
#: statfs(2)'s f_type of tmpfs: a page read there through a mapping, even a hole's, takes the filesystem's memory.
TMPFS_MAGIC = 0x01021994
#: The smallest file the engine maps, preallocated (see _holes).
MAPPED_MIN = 1 << 20
#: What an open of a shard without a write-ahead log may take beyond the holes it reads: it writes
#: nothing through its maps (no log to replay), so a page or so per file it rewrites is all.
OPEN_SLACK = 64 << 10


def room(where: Path, need: int, doing: str, shard: Callable[[], Path]) -> None:
    """Refuse (`disk_full`) a write to the store at `where` that may take more than its filesystem has free: one statvfs.

    `shard` gives the shard's directory, only looked up when the disk is nearly full.
    """
    free = free_bytes(where)
    if free < CAREFUL_BELOW and _fills_holes_on_read(where):
        # on tmpfs the next open fills the holes of the payload indexes (see room_to_open): a
        # write leaves room for that, so the store can still be opened and searched after it
        need += _holes(shard(), "payload_index")
    if free < need + SPACE_MARGIN:
        raise disk_full(where, free, need + SPACE_MARGIN, doing)


def room_to_open(where: Path, shard: Path) -> None:
    """Refuse (`disk_full`) an open that would fill the disk: on tmpfs, opening reads the payload
    indexes whole (Memory.Cached), and each hole it reads there takes a page of the filesystem.

    Elsewhere a read takes no room, so a store opens on a full disk (its few writes on open, if
    any, fail as the engine's own disk_full). Above CAREFUL_BELOW free, this is one statvfs.
    A shard with a write-ahead log replays it on open, through its maps: that open keeps a write's margin.
    """
    free = free_bytes(where)
    if free >= CAREFUL_BELOW or not _fills_holes_on_read(shard):
        return
    need = _holes(shard, "payload_index")
    margin = SPACE_MARGIN if (shard / "wal").is_dir() else OPEN_SLACK
    if need and free < need + margin:
        raise disk_full(where, free, need + margin, "opening the store (tmpfs backs the pages it reads)")


@contextmanager
def no_room(where: Path, doing: str) -> Iterator[None]:
    """The engine's (or the OS's) "no space left" as `disk_full`, naming the store and what ran out."""
    try:
        yield
    except Exception as exc:
        full = disk_full_from(exc, where, doing)
        if full is None:
            raise
        raise full from None


def _fills_holes_on_read(path: Path) -> bool:
    """Whether `path` is on tmpfs (statfs's f_type), where reading a hole through a mapping allocates it."""
    import ctypes

    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type (a long) comes first on Linux
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.statfs(os.fsencode(path), buf) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return ctypes.c_long.from_buffer(buf).value == TMPFS_MAGIC


def _holes(root: Path, under: str) -> int:
    """Bytes not yet on disk (holes) of the mapped files below directories named `under` in `root`.

    Only files of MAPPED_MIN or more count: the engine preallocates the files it maps, and reads
    its small ones with read(2), which takes no room for a hole.
    """
    total = 0
    for d, _, files in os.walk(root):
        if under not in Path(d).parts:
            continue
        for f in files:
            try:
                st = os.stat(os.path.join(d, f))
            except OSError:
                continue
            if st.st_size >= MAPPED_MIN:
                total += max(st.st_size - st.st_blocks * 512, 0)
    return total


def batch_bytes(points: Sequence[PointIn]) -> int:
    """A batch's own bytes: dense and sparse vectors, payload text, and a little per point for the rest."""
    n = 0
    for p in points:
        n += 4 * len(p.dense) + 8 * len(p.sparse.indices) + 256
        n += sum(len(v) for v in p.payload.values() if isinstance(v, str))
    return n
