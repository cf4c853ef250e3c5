"""Each repository's BM25 term table (lexstats.py) as a file in the embedded store's data directory: its codec, read and write."""

from __future__ import annotations

import os
from pathlib import Path

from .base import TermTable
from .edge_disk import no_room, room

#: The folder beside meta.json holding each repository's term table (`write`).
TERM_TABLES = "term_tables"


def read(folder: Path, key: str, version: str) -> TermTable | None:
    """The table of `key` at `version` in `folder`, or None when there is none (or only part of one)."""
    raw = read_whole(folder, table_name(key, version))
    return None if raw is None else _table_from_bytes(version, raw)


def write(folder: Path, key: str, table: TermTable, where: Path) -> None:
    """One file per key and version, written whole and renamed into place, then the key's other versions removed.

    `folder` is TERM_TABLES in the data directory of the store at `where` (the room checked is its disk's).
    """
    write_whole(folder, table_name(key, table.version), _table_bytes(table), where,
                "writing the repository's term statistics")


def read_whole(folder: Path, name: str) -> bytes | None:
    """What `write_whole` stored as `folder/name`, or None when there is none."""
    try:
        return (folder / name).read_bytes()
    except FileNotFoundError:
        return None


def write_whole(folder: Path, name: str, data: bytes, where: Path, doing: str) -> None:
    """`data` as `folder/name`, durably (written aside, renamed into place, the folder synced), then the
    other versions of the same key (`<key hash>.*`) removed."""
    folder.mkdir(mode=0o700, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    room(where, len(data), doing, lambda: folder.parent / "shard")
    with no_room(where, doing):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(folder / name)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a power cut before the metadata names this version
        finally:
            os.close(fd)
    prefix = name.split(".", 1)[0] + "."
    for old in folder.iterdir():
        if old.name.startswith(prefix) and old.name != name:
            old.unlink(missing_ok=True)


def table_name(key: str, version: str) -> str:
    """`<hash of the key>.<version>`: a name safe for any tenant and repository name."""
    import hashlib

    return f"{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}.{version}"


def _table_bytes(table: TermTable) -> bytes:
    """docs, the number of terms, the sorted term ids, their counts: native int64 words."""
    from array import array

    words = array("q", [table.docs, len(table.ids)])
    words.extend(table.ids)
    words.extend(table.counts)
    return words.tobytes()


def _table_from_bytes(version: str, raw: bytes) -> TermTable | None:
    from array import array

    words = array("q")
    words.frombytes(raw[: len(raw) - len(raw) % 8])
    if len(words) < 2 or len(words) != 2 + 2 * words[1]:
        return None  # not a whole table: the caller counts it again from the points
    n = words[1]
    return TermTable(version=version, docs=words[0], ids=words[2:2 + n], counts=words[2 + n:])
