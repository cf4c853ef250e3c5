"""A private copy of a held embedded store's data directory, for a process that searches it (edge.open_replica)."""

from __future__ import annotations

import os
from pathlib import Path

from ..process import alive


def copy_data_dir(source: Path, root: Path, collection: str) -> Path:
    """Copy `source` (a held collection's data directory) to `root/<pid>/collection`; `root/<pid>`, to remove on close.

    Why a copy: Qdrant Edge is a single-process engine. A shard with a write-ahead log locks
    it on load, so a second process cannot open it; one without opens twice, but nothing
    then keeps one process's writes and segment swaps from happening under the other's
    reads. While the source is held no writer can change it, so every
    copy answers exactly like the source. Copies left by processes that died are removed here.
    """
    import shutil

    from ..owner import trust

    trust.ensure_private_dirs(root)
    for old in root.iterdir():
        if old.name.isdigit() and not alive(int(old.name)):
            shutil.rmtree(old, ignore_errors=True)
    mine = root / str(os.getpid())
    shutil.rmtree(mine, ignore_errors=True)
    mine.mkdir(mode=0o700)
    if (source / "meta.json").exists():  # a missing collection stays missing: health says so
        # not the lock, nor the owner's socket (a copy is searched in this process only)
        shutil.copytree(source, mine / collection, ignore=shutil.ignore_patterns("owner.lock", "owner.sock", ".owner.sock.*"))
    return mine
