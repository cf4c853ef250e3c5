"""The embedded store's directory around its shard (edge.py): the lock that makes one process its owner, meta.json, the alias."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import MoonmindError
from .base import CollectionInfo
from .edge_disk import no_room
from .edge_file_tables import FILE_TABLES
from .edge_term_tables import TERM_TABLES


class EdgeDirectory:
    """`root/collection`: who holds it (owner.lock), its metadata and the physical collection its name points at."""

    def __init__(self, root: Path, collection: str, wait_s: float, queue_s: float) -> None:
        self.collection = collection
        self.dir = Path(root) / collection
        self.wait_s = wait_s  # how long to wait for another process's hold to end (see acquire)
        self.queue_s = queue_s  # how long, when that process serves no socket (a one-shot command)
        self.lock_fd: int | None = None
        # meta.json and the alias, remembered while this process owns the store: no other
        # process can change them then, and every search checks them (guardrails)
        self._meta: dict[str, Any] | None = None
        self._alias: tuple[str | None] | None = None

    # -- the lock ---------------------------------------------------------
    def acquire(self, wait_s: float | None = None) -> None:
        import fcntl

        if self.lock_fd is not None:
            return
        from .. import modes
        from ..owner import trust

        modes.restrict_process()  # before this process, or the engine in it, creates a file of the store
        # a link planted at owner.lock would make ftruncate below empty the file it points at
        trust.ensure_private_dirs(*trust.store_dirs(self.dir.parent, self.collection))
        fd = trust.open_private_file(self.dir / "owner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        # Why wait: an agent's parallel one-shot `rag search` calls each hold the store for a fraction
        # of a second, so the next simply queues behind them (up to edge.ONE_SHOT_QUEUE_S while the holder
        # serves no socket: it is such a command). An owner holds it for good: then the wait ends
        # after `wait_s` in the clear error below.
        wait_s = self.wait_s if wait_s is None else wait_s
        started = time.monotonic()
        deadline = started + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                now = time.monotonic()
                if now < deadline or (now - started < self.queue_s and not (self.dir / "owner.sock").exists()):
                    time.sleep(0.02)
                    continue
                pid = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                waited = f" (waited {wait_s:g} s)" if wait_s else ""
                raise MoonmindError(
                    "store_busy",
                    f"The embedded store {self.dir} is in use by PID {pid}{waited}.",
                    "That process owns the store. If it serves this box (a Celery worker, the gateway, `moonmind "
                    "serve`), moonmind commands use it by themselves unless MOONMIND_OWNER=off; otherwise stop it, "
                    "or point QDRANT_URL at a Qdrant server for many processes.",
                ) from None
        mine = str(os.getpid()).encode()
        try:
            # over the old PID, then cut: a file emptied first needs a new block, which a full disk lacks
            os.pwrite(fd, mine, 0)
            os.ftruncate(fd, len(mine))
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                os.close(fd)
                raise
            # the PID only names the holder in store_busy's message; the lock is held without it
        self.lock_fd = fd

    def unlock(self) -> None:
        """Let other processes take the store (a no-op when this process does not hold it)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    @property
    def holding(self) -> bool:
        return self.lock_fd is not None

    # -- metadata ---------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        """Where the shard and its metadata live: this directory, or the one its alias points at (sync.py)."""
        target = self.alias_target()
        return self.dir.parent / target if target else self.dir

    @property
    def meta_path(self) -> Path:
        return self.data_dir / "meta.json"

    def read_meta(self) -> dict[str, Any] | None:
        if self._meta is not None:
            return dict(self._meta)
        try:
            meta = json.loads(self.meta_path.read_text())
        except FileNotFoundError:
            return None
        if self.lock_fd is not None:
            self._meta = meta
        return dict(meta)

    def info(self, points: Callable[[], int]) -> CollectionInfo | None:
        """What meta.json says of the collection, with its count of `points` (asked only then); None when it has none."""
        meta = self.read_meta()
        if meta is None:
            return None
        return CollectionInfo(name=self.collection, dimensions=int(meta["dimensions"]), model=meta.get("model"),
                              schema_version=meta.get("schema_version"), points=points(), extra=meta)

    def write_meta(self, meta: dict[str, Any]) -> None:
        """meta.json written whole, then renamed into place (call `forget` first: the alias may have changed)."""
        tmp = self.meta_path.with_suffix(".tmp")
        with no_room(self.dir, "writing the store's metadata"):
            tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
        tmp.replace(self.meta_path)

    def clear_data(self) -> None:
        """Remove the shard and the term tables from the data directory: a new shard replaces them."""
        import shutil

        if (self.data_dir / "shard").exists():
            shutil.rmtree(self.data_dir / "shard")
        shutil.rmtree(self.data_dir / TERM_TABLES, ignore_errors=True)  # the counts of the points just dropped
        shutil.rmtree(self.data_dir / FILE_TABLES, ignore_errors=True)  # and their files

    def forget(self) -> None:
        """Drop the metadata and alias remembered: they may change now."""
        self._meta = None
        self._alias = None

    # -- the alias (sync-embedding) ---------------------------------------
    def alias_target(self) -> str | None:
        """The physical collection this name points at, or None when it holds its data itself."""
        if self._alias is not None:
            return self._alias[0]
        try:
            target = json.loads((self.dir / "meta.json").read_text()).get("alias")
        except (FileNotFoundError, ValueError):
            return None
        if self.lock_fd is not None:
            self._alias = (target,)
        return target

    def write_alias(self, target: str) -> str | None:
        """Point this name at `target` with one atomic rename of meta.json; the old physical name, or None."""
        old = self.alias_target()
        tmp = self.dir / "meta.json.tmp"
        tmp.write_text(json.dumps({"alias": target}))
        tmp.replace(self.dir / "meta.json")
        self.forget()
        return old

    def drop_physical(self, name: str | None) -> None:
        """Delete data no name points at any more: a former target, or (None) this directory's own shard."""
        import shutil

        if name is None:
            shutil.rmtree(self.dir / "shard", ignore_errors=True)
            shutil.rmtree(self.dir / TERM_TABLES, ignore_errors=True)
            shutil.rmtree(self.dir / FILE_TABLES, ignore_errors=True)
        elif name != self.alias_target() and name != self.collection:
            shutil.rmtree(self.dir.parent / name, ignore_errors=True)

    def has_physical(self, name: str | None) -> bool:
        """Whether data that `drop_physical(name)` would delete is on disk; never what this name serves."""
        if name is None:
            return self.alias_target() is not None and (self.dir / "shard").exists()
        return name not in (self.alias_target(), self.collection) and (self.dir.parent / name).exists()
