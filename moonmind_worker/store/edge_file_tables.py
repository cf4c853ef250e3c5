"""Each repository's file table (base.FileTable) as a file in the embedded store's data directory: its codec, read and write.

Why a file beside the shard: a no-change index run otherwise reads back every chunk's path and
content hash from the engine's payload storage, which is on disk and cold in a new process; this
file is one read and one JSON parse. Figures: BENCHMARKS.md ("Index speed against the peer").
"""

from __future__ import annotations

import json
from pathlib import Path

from .base import FileTable
from .edge_term_tables import read_whole, table_name, write_whole

#: The folder beside meta.json holding each repository's file table (`write`).
FILE_TABLES = "file_tables"


def read(folder: Path, key: str, version: str) -> FileTable | None:
    """The table of `key` at `version` in `folder`, or None when there is none (or it does not parse)."""
    raw = read_whole(folder, table_name(key, version))
    if raw is None:
        return None
    try:
        files = json.loads(raw)
    except ValueError:
        return None  # not a whole table: the caller reads the chunks instead
    if not isinstance(files, dict):
        return None
    return FileTable(version=version, files={
        path: (entry[0], entry[1], tuple(entry[2]) if len(entry) > 2 and entry[2] else None)
        for path, entry in files.items()})


def write(folder: Path, key: str, table: FileTable, where: Path) -> None:
    """One file per key and version, written whole and renamed into place, then the key's other versions removed."""
    # ensure_ascii: a path that is not valid UTF-8 (surrogate escapes) round-trips as \\udcxx
    data = json.dumps({path: list(entry) for path, entry in table.files.items()}, separators=(",", ":")).encode()
    write_whole(folder, table_name(key, table.version), data, where, "writing the repository's file table")
