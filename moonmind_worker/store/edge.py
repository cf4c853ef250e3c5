"""Qdrant Edge: the Qdrant engine in-process, persistent under MOONMIND_HOME.

One owning process at a time (a file lock); collection metadata (embedding model,
dimension, payload schema version) lives in `meta.json` beside the shard.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:
    import numpy as np

from ..errors import MoonmindError, disk_full, disk_full_from, free_bytes
from ..process import alive
from .base import (
    DENSE,
    LEXICAL_FORMAT,
    LEXICAL_FORMAT_KEY,
    PAYLOAD_CACHE_POINTS,
    PAYLOAD_INDEXES,
    SPARSE,
    CollectionInfo,
    Hit,
    Match,
    MatchAny,
    PointIn,
    Range,
    SearchSpec,
    SparseVec,
    TermTable,
    Where,
    _fields,
    _missing,
    _refuse_if_expired,
    _rescorings,
)

# ------------------------------------------------------------ Qdrant Edge ---


#: Points written since the shard was loaded above which `optimize` loads it again first (memory).
RELOAD_BEFORE_OPTIMIZE = 10_000

#: The largest segment the engine builds, in KB of dense vectors (1 KB = one 256-d float32 vector):
#: optimizing a segment holds old and new copies of it at once, so its size sets the memory and
#: time of every optimize. Uncapped (the engine's default is 256 MB per core), a large run's
#: optimize grew with the run, and a later run that crossed the indexing threshold rebuilt the
#: whole store. The cap also bounds what the segment being written holds in the writing process
#: (its in-memory indexes and written pages), so with it the run's peak, at a small cost to open
#: each further segment.
#: Figures: BENCHMARKS.md ("capped segments", "flat in repository size").
SEGMENT_KB = 16_000
#: The engine's default, written out: a segment below it is searched whole and gets no HNSW graph.
INDEXING_KB = 10_000

#: Whether a new shard logs its writes ahead (the engine's default; it fixes the choice at creation).
#: Why not: every open, a one-shot search's too, maps and checks the log's retained files (a closed
#: 32 MiB file and the open one), which then stay resident in every process holding the store, and
#: they take a large share of its disk on a large repository. What the log guaranteed, that a write which returned
#: survives its process (a crash, SIGKILL), is kept by flushing before each write returns
#: (`_durable`), which also makes it survive a power cut. Figures: BENCHMARKS.md ("no write-ahead
#: log"). A store created with a log keeps it and works as before.
WAL_ON_CREATE = False
#: How long a command queues behind one-shot commands holding the store (they hold it for a moment each).
ONE_SHOT_QUEUE_S = 60.0

# Disk space. Why checked here: the engine writes through memory maps, and a page it cannot back is
# a SIGBUS that kills the process with no message, where a write call would have returned an error.
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


class EdgeStore:
    """The Qdrant engine in-process, persistent under MOONMIND_HOME; one owning process at a time."""

    def __init__(
        self, root: Path, collection: str, wait_s: float = 0.0, scratch: Path | None = None, queue_s: float = 0.0,
    ) -> None:
        import qdrant_edge  # noqa: F401 - fail here, not mid-query, when the engine is missing

        self.collection = collection
        self.wait_s = wait_s  # how long to wait for another process's hold to end (see _acquire)
        self.queue_s = queue_s  # how long, when that process serves no socket (a one-shot command)
        self.dir = Path(root) / collection
        self._scratch = scratch  # a replica's private directory, removed by close() (open_replica)
        self._shard: Any = None  # a qdrant_edge.EdgeShard once opened
        self._lock_fd: int | None = None
        self._dirty = False  # a search-only session has nothing to flush (a flush costs fsyncs)
        self._wal = True  # whether the open shard logs its writes ahead (see WAL_ON_CREATE)
        self._written = 0  # points upserted since the shard was loaded (see optimize)
        self._unindexed = 0  # points upserted since the last optimize (see upsert)
        # meta.json and the alias, remembered while this process owns the store: no other
        # process can change them then, and every search checks them (guardrails)
        self._meta: dict[str, Any] | None = None
        self._alias: tuple[str | None] | None = None
        self._cache: dict[tuple[str, ...] | None, OrderedDict] = {}  # see _payloads
        self._cache_lock = threading.Lock()
        self._generation = 0
        self._pinned = False  # held for good by an owner serving the box (see hold, release)
        # one engine call at a time per process: a sync's alias switch closes the shard that a
        # search on another thread of the owner would otherwise still be reading; the binding
        # holds the GIL during a call anyway, so this costs no parallelism
        self._engine = threading.RLock()
        self._optimizing = 0  # optimize() calls running outside the engine lock
        self._optimized = threading.Condition(self._engine)

    # -- ownership --------------------------------------------------------
    def _acquire(self, wait_s: float | None = None) -> None:
        import fcntl

        if self._lock_fd is not None:
            return
        from .. import modes
        from ..owner import trust

        modes.restrict_process()  # before this process, or the engine in it, creates a file of the store
        # a link planted at owner.lock would make ftruncate below empty the file it points at
        trust.ensure_private_dirs(*trust.store_dirs(self.dir.parent, self.collection))
        fd = trust.open_private_file(self.dir / "owner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        # Why wait: an agent's parallel one-shot `rag search` calls each hold the store for a fraction
        # of a second, so the next simply queues behind them (up to ONE_SHOT_QUEUE_S while the holder
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
        self._lock_fd = fd

    def hold(self, wait_s: float | None = None) -> Path:
        """Own the store for good without loading it (other processes wait, then get store_busy); its data directory.

        What an owner does (`owner.server.serve_store`), and `gateway serve --workers N` while its
        workers search replicas of that directory. `release()` then keeps the hold. `wait_s`: how
        long to wait for another process to let go (default MOONMIND_STORE_WAIT_S).
        """
        self._acquire(wait_s)
        self._pinned = True
        return self.data_dir

    @property
    def holding(self) -> bool:
        """True while this process holds the store's lock."""
        return self._lock_fd is not None

    @property
    def data_dir(self) -> Path:
        """Where the shard and its metadata live: this directory, or the one its alias points at (sync.py)."""
        target = self.alias_target()
        return self.dir.parent / target if target else self.dir

    @property
    def _meta_path(self) -> Path:
        return self.data_dir / "meta.json"

    def _read_meta(self) -> dict[str, Any] | None:
        if self._meta is not None:
            return dict(self._meta)
        try:
            meta = json.loads(self._meta_path.read_text())
        except FileNotFoundError:
            return None
        if self._lock_fd is not None:
            self._meta = meta
        return dict(meta)

    def _forget_cached(self) -> None:
        """Drop what this process remembers of the store (metadata, alias, payloads): it may change now."""
        self._meta = None
        self._alias = None
        with self._cache_lock:
            self._cache.clear()
            self._generation += 1

    def _open(self):
        if self._shard is None:
            with self._engine:
                if self._shard is None:
                    self._acquire()
                    if self._read_meta() is None or not (self.data_dir / "shard").exists():
                        raise _missing(self.collection)
                    self._load()
        return self._shard

    # -- collection -------------------------------------------------------
    def info(self) -> CollectionInfo | None:
        meta = self._read_meta()
        if meta is None:
            return None
        return CollectionInfo(
            name=self.collection,
            dimensions=int(meta["dimensions"]),
            model=meta.get("model"),
            schema_version=meta.get("schema_version"),
            points=self._points(),
            extra=meta,
        )

    def _points(self) -> int:
        with self._engine:  # a reload on the writer's thread closes the shard object this call would use
            return self._open().info().points_count

    def create(self, dimensions: int, model: str, schema_version: int) -> None:
        from qdrant_edge import (
            EdgeConfig,
            EdgeShard,
            EdgeSparseVectorParams,
            HnswIndexConfig,
            Memory,
            UpdateOperation,
        )

        self._acquire()
        import shutil

        if (self.data_dir / "shard").exists():
            shutil.rmtree(self.data_dir / "shard")
        shutil.rmtree(self.data_dir / TERM_TABLES, ignore_errors=True)  # the counts of the points just dropped
        self._room(CREATE_BYTES, "creating the store")
        # Why Cached for the graph, the sparse index and the payload indexes (the engine's defaults pin
        # them in RAM): pinned, every open copies them onto the heap (the sparse index, and a map per
        # payload field), a cost that grows with the index and that a one-shot search pays whole;
        # cached, they are memory-mapped from the same files and searched the same way (the same
        # results), warmed into the page cache instead of copied. Not Cold: that evicts the files
        # from the page cache on every open, and the first query then reads them from disk.
        cached = Memory.Cached
        config = EdgeConfig(
            vectors={DENSE: _dense(dimensions)},
            # no IDF modifier: the engine's would count every repository in the shard (see lexstats)
            sparse_vectors={SPARSE: EdgeSparseVectorParams(memory=cached)},
            hnsw_config=HnswIndexConfig(m=16, ef_construct=100, full_scan_threshold=10_000, memory=cached),  # the defaults, but memory
            optimizers=_optimizers(),
            wal_enabled=None if WAL_ON_CREATE else False,
        )
        with self._no_room("creating the store"):
            shard = EdgeShard.create(str(self.data_dir / "shard"), config)
            for name, kind in PAYLOAD_INDEXES:
                shard.update(UpdateOperation.create_field_index(name, _index_params(kind)))
            shard.flush()
        self._shard = shard
        self._wal = WAL_ON_CREATE
        self._write_meta(
            {"dimensions": dimensions, "model": model, "schema_version": schema_version, "created_at": time.time(),
             LEXICAL_FORMAT_KEY: LEXICAL_FORMAT}
        )

    def _write_meta(self, meta: dict[str, Any]) -> None:
        self._forget_cached()
        tmp = self._meta_path.with_suffix(".tmp")
        with self._no_room("writing the store's metadata"):
            tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
        tmp.replace(self._meta_path)

    def set_metadata(self, **meta: Any) -> None:
        current = self._read_meta() or {}
        current.update(meta)
        self._write_meta(current)

    # -- data -------------------------------------------------------------
    def upsert(self, points: Sequence[PointIn]) -> None:
        from qdrant_edge import Point, SparseVector, UpdateOperation

        if not points:
            return
        self._open()
        doing = f"writing {len(points)} chunks"
        self._room(BATCH_FACTOR * _batch_bytes(points), doing)
        op = UpdateOperation.upsert_points(
            [
                Point(
                    id=p.id,
                    vector={
                        DENSE: p.dense.tolist(),
                        SPARSE: SparseVector(indices=p.sparse.indices, values=p.sparse.values),
                    },
                    payload=p.payload,
                )
                for p in points
            ]
        )
        self._dirty = True
        self._written += len(points)
        self._unindexed += len(points)
        self._invalidate([p.id for p in points])
        with self._engine, self._no_room(doing):
            self._open().update(op)
            self._durable()
        if self._unindexed >= self._segment_points():
            # Why here: every write lands in the one appendable segment, which only an optimize
            # closes (indexed) and replaces; so a run that writes more than a segment's worth
            # optimizes as it goes, and each optimize handles one capped segment, not the run
            self.optimize()
            # and loads it again after: the next segment's writes start without the build's leftovers
            self._reload()

    def room(self) -> int | None:
        return max(self._segment_points() - self._unindexed, 0)

    def _dimensions(self) -> int:
        return int((self._read_meta() or {})["dimensions"])

    def _segment_points(self) -> int:
        """How many points fill a segment of SEGMENT_KB (dense vectors are what the engine counts)."""
        return SEGMENT_KB * 1024 // (4 * self._dimensions())

    def delete(self, where: Where) -> None:
        from qdrant_edge import UpdateOperation

        self._invalidate()  # deleted points are never returned again; a re-upsert drops its entry
        self._open()
        self._room(0, "deleting chunks")  # a delete marks flags in mapped files too
        with self._engine, self._no_room("deleting chunks"):
            self._open().update(UpdateOperation.delete_points_by_filter(_edge_filter(where)))
            self._dirty = True
            self._durable()

    def delete_ids(self, ids: Sequence[str]) -> None:
        from qdrant_edge import UpdateOperation

        if ids:
            self._invalidate(ids)
            self._open()
            self._room(0, "deleting chunks")
            with self._engine, self._no_room("deleting chunks"):
                self._open().update(UpdateOperation.delete_points(list(ids)))
                self._dirty = True
                self._durable()

    def _durable(self) -> None:
        """A shard without a write-ahead log keeps a write only once flushed: flush before it returns.

        So a write that returned survives the process (a crash, SIGKILL) on either kind of shard,
        and an interrupted index run keeps every batch it wrote (the next run skips those files).
        """
        if not self._wal:
            self._shard.flush()
            self._dirty = False

    def search(self, specs: Sequence[SearchSpec], deadline: float | None = None) -> list[list[Hit]]:
        """In-process: a search cannot be interrupted, so a spent budget refuses to start one.

        Why two engine calls: the branches run as one batch that returns ids and scores only,
        then the payloads of the distinct hits are read once by id. Reading payload inside the
        query costs more per point (and twice for a point both branches find).
        """
        from qdrant_edge import Prefetch, QueryBatchRequest, QueryRequest

        _refuse_if_expired(deadline)
        self._open()  # a missing collection fails here, before the requests are built
        requests: list[Any] = []
        plan: list[tuple[int, dict[str, int]]] = []
        for s in specs:
            flt = _edge_filter(s.where)
            q = _edge_query(s.dense, s.sparse)
            main, extra = len(requests), dict[str, int]()
            requests.append(QueryRequest(limit=s.limit, query=q, filter=flt, with_payload=False, with_vector=False))
            for score_field, dense, sparse in _rescorings(s):  # the same candidates, rescored by the other query
                extra[score_field] = len(requests)
                requests.append(QueryRequest(
                    limit=s.limit, prefetches=[Prefetch(limit=s.limit, query=q, filter=flt)],
                    query=_edge_query(dense, sparse), with_payload=False, with_vector=False,
                ))
            plan.append((main, extra))
        # (key, score) pairs keyed by the id's integer: the binding builds a new UUID object on every
        # `.id` access, and UUIDs hash and compare in Python (~1,000 such calls per search)
        points_of: dict[Any, Any] = {}
        results = []
        with self._engine:
            batch = self._open().query_batch(QueryBatchRequest(requests))
        for points in batch:
            row = []
            for p in points:
                pid = p.id
                k = _point_key(pid)
                points_of[k] = pid
                row.append((k, p.score))
            results.append(row)
        payloads = self._payloads(results, specs, points_of)
        out = []
        for s, (main, extra) in zip(specs, plan):
            cos, bm25 = (dict(results[extra[f]]) if f in extra else None for f in ("cosine", "bm25"))
            hits = []
            for pid, score in results[main]:
                if pid not in payloads:
                    continue  # deleted between the query and the read
                sid, payload = payloads[pid]
                if s.fields is not None and len(payload) > len(s.fields):
                    payload = {k: payload[k] for k in s.fields if k in payload}
                hits.append(Hit(id=sid, score=score, payload=payload,
                                cosine=None if cos is None else cos.get(pid, 0.0),
                                bm25=None if bm25 is None else bm25.get(pid, 0.0)))
            out.append(hits)
        return out

    def _payloads(self, results, specs: Sequence[SearchSpec], points_of: dict[Any, Any]) -> dict[Any, tuple[str, dict[str, Any]]]:
        """(string id, payload) of every distinct hit, with the union of the fields the branches asked.

        Why a cache: a warm process (Celery worker, gateway) sees the same candidates again and
        again, and reading a point's payload is costly in the engine (it decodes the whole
        payload, chunk text included) — the largest part of a search. Entries are the engine's
        own data, dropped when this process writes those points (it is the only writer: see
        `_acquire`); a read that raced a write is not kept (`_generation`).
        """
        ids = list({pid: None for points in results for pid, _ in points})
        if not ids:
            return {}
        key = None if any(s.fields is None for s in specs) else tuple(sorted({f for s in specs for f in s.fields or ()}))
        out: dict[Any, tuple[str, dict[str, Any]]] = {}
        misses = []
        with self._cache_lock:
            cache = self._cache.setdefault(key, OrderedDict())
            generation = self._generation
            for pid in ids:
                got = cache.get(pid)
                if got is None:
                    misses.append(pid)
                else:
                    cache.move_to_end(pid)
                    out[pid] = got
        if misses:
            fresh = {}
            with self._engine:
                records = self._open().retrieve(
                    [points_of[k] for k in misses], with_payload=True if key is None else list(key), with_vector=False
                )
            for r in records:
                rid = r.id  # a new UUID object per access
                fresh[_point_key(rid)] = (str(rid), r.payload or {})
            out.update(fresh)
            with self._cache_lock:
                if generation == self._generation:
                    cache.update(fresh)
                    while len(cache) > PAYLOAD_CACHE_POINTS:
                        cache.popitem(last=False)
        return out

    def _invalidate(self, ids: Sequence[str] = ()) -> None:
        """Forget cached payloads of points this process is about to write (all of them when unsure)."""
        with self._cache_lock:
            self._generation += 1
            if not ids:
                return
            keys = [_point_key(uuid.UUID(i)) if isinstance(i, str) else _point_key(i) for i in ids]
            for cache in self._cache.values():
                for k in keys:
                    cache.pop(k, None)

    def retrieve(self, ids: Sequence[str], fields: Sequence[str] | bool = True) -> list[Hit]:
        """Points by id with the payload fields asked for, in the order asked; missing ids are skipped."""
        if not ids:
            return []
        with self._engine:
            records = self._open().retrieve(list(ids), with_payload=_fields(fields), with_vector=False)
        by_id = {str(r.id): r for r in records}
        return [Hit(id=i, score=0.0, payload=dict(by_id[i].payload or {})) for i in ids if i in by_id]

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        if not ids:
            return {}
        with self._engine:
            records = self._open().retrieve(list(ids), with_payload=False, with_vector=[DENSE])
        return {str(r.id): list(_dense_of(r.vector)) for r in records}

    def scroll(self, where: Where | None, fields: Sequence[str] | bool, batch: int = 1024) -> Iterator[Hit]:
        from qdrant_edge import ScrollRequest

        self._open()  # a missing collection fails here, not at the first batch
        offset = None
        flt = _edge_filter(where) if where else None
        with_payload = list(fields) if not isinstance(fields, bool) else fields
        while True:
            with self._engine:
                records, offset = self._open().scroll(
                    ScrollRequest(offset=offset, limit=batch, filter=flt, with_payload=with_payload, with_vector=False)
                )
            for r in records:
                yield Hit(id=str(r.id), score=0.0, payload=dict(r.payload or {}))
            if offset is None:
                break

    def sparse_terms(self, where: Where | None = None, ids: Sequence[str] | None = None) -> Iterator[list[int]]:
        from qdrant_edge import ScrollRequest

        if ids is not None:
            for start in range(0, len(ids), 1024):
                with self._engine:
                    records = self._open().retrieve(list(ids[start:start + 1024]), with_payload=False, with_vector=[SPARSE])
                for r in records:
                    yield _indices(r.vector)
            return
        self._open()
        offset = None
        flt = _edge_filter(where) if where else None
        while True:
            with self._engine:
                records, offset = self._open().scroll(
                    ScrollRequest(offset=offset, limit=1024, filter=flt, with_payload=False, with_vector=[SPARSE])
                )
            for r in records:
                yield _indices(r.vector)
            if offset is None:
                break

    def read_term_table(self, key: str, version: str) -> TermTable | None:
        try:
            raw = (self.data_dir / TERM_TABLES / _table_name(key, version)).read_bytes()
        except FileNotFoundError:
            return None
        return _table_from_bytes(version, raw)

    def write_term_table(self, key: str, table: TermTable) -> None:
        """One file per key and version, written whole and renamed into place, then the key's other versions removed."""
        folder = self.data_dir / TERM_TABLES
        folder.mkdir(mode=0o700, exist_ok=True)
        name = _table_name(key, table.version)
        tmp = folder / f".{name}.tmp"
        data = _table_bytes(table)
        self._room(len(data), "writing the repository's term statistics")
        with self._no_room("writing the repository's term statistics"):
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

    def count(self, where: Where | None = None) -> int:
        from qdrant_edge import CountRequest

        with self._engine:
            return self._open().count(CountRequest(exact=True, filter=_edge_filter(where) if where else None))

    def optimize(self) -> None:
        """Merge segments and build the HNSW index, in this process, before the shard is searched.

        Why after every index run: a freshly written shard is one appendable segment that each
        query scans whole; once built, the query branches take a fraction of that time and the
        shard opens faster (BENCHMARKS.md, "The HNSW graph"). Small shards (below the engine's
        indexing threshold) are only merged, which is quick. Asking
        again costs nothing when there is nothing to do, so a store written by an older version
        is optimized by its next index run even when no file changed.
        """
        if self._written >= RELOAD_BEFORE_OPTIMIZE:
            # Why: a shard that took many writes in this process holds their working memory (its
            # appendable segment's growth) until it is closed, and the build adds its own on top;
            # loading it again from disk first is quick and cuts the peak
            self._reload()
        self._unindexed = 0
        self._add_missing_indexes()
        with self._engine:
            shard = self._open()
            self._optimizing += 1
        try:
            # outside the engine lock, so searches run beside a build that takes seconds; the shard
            # cannot be closed under it: every close waits for `_optimizing` (see _shard_idle)
            # the engine checks its own room first (it copies the segments it merges): its refusal is disk_full
            with self._no_room("optimizing the store (building its search index)"):
                if shard.optimize():  # False (and quick) when already optimal
                    self._dirty = True
        finally:
            with self._engine:
                self._optimizing -= 1
                self._optimized.notify_all()

    def _add_missing_indexes(self) -> None:
        """Create the payload indexes this version declares that an older store lacks (`symbols`), on its next index run."""
        from qdrant_edge import UpdateOperation

        with self._engine:
            shard = self._open()
            have = shard.info().payload_schema
            missing = [(name, kind) for name, kind in PAYLOAD_INDEXES if name not in have]
            if not missing:
                return
            with self._no_room("adding payload indexes"):
                for name, kind in missing:
                    shard.update(UpdateOperation.create_field_index(name, _index_params(kind)))
                self._dirty = True
                self._durable()

    def _shard_idle(self) -> None:
        """Wait (holding the engine lock) until no optimize uses the open shard: it is about to be closed."""
        while self._optimizing:
            self._optimized.wait()

    def _reload(self) -> None:
        """Close the shard and load it again from disk: what it held in memory for this process's writes is gone."""
        from qdrant_edge import EdgeConfig

        from ..heap import give_back_heap

        # the segment cap and the dense vectors' placement given again: a store created before
        # them takes them here (the engine records them), before the optimize they bound; the
        # shard's other settings stay its own
        config = EdgeConfig(vectors={DENSE: _dense(self._dimensions())}, optimizers=_optimizers())
        with self._engine:  # one hold: a search on another thread never opens the shard in between
            self._shard_idle()
            self._shard.flush()
            self._shard.close()
            self._shard = None
            self._written = 0
            give_back_heap()  # what the closed shard freed, and the run before it, before the build needs more
            self._load(config)

    def _load(self, config: Any = None) -> None:
        """Load the shard from disk, noting whether it logs its writes ahead (see WAL_ON_CREATE)."""
        from qdrant_edge import EdgeShard

        shard = self.data_dir / "shard"
        self._room_to_open(shard)
        with self._no_room("opening the store"):
            self._shard = EdgeShard.load(str(shard), config)
        self._wal = (shard / "wal").is_dir()

    def _room(self, need: int, doing: str) -> None:
        """Refuse (`disk_full`) a write that may take more than the store's filesystem has free: one statvfs."""
        free = free_bytes(self.dir)
        if free < CAREFUL_BELOW and _fills_holes_on_read(self.dir):
            # on tmpfs the next open fills the holes of the payload indexes (see _room_to_open): a
            # write leaves room for that, so the store can still be opened and searched after it
            need += _holes(self.data_dir / "shard", "payload_index")
        if free < need + SPACE_MARGIN:
            raise disk_full(self.dir, free, need + SPACE_MARGIN, doing)

    def _room_to_open(self, shard: Path) -> None:
        """Refuse (`disk_full`) an open that would fill the disk: on tmpfs, opening reads the payload
        indexes whole (Memory.Cached), and each hole it reads there takes a page of the filesystem.

        Elsewhere a read takes no room, so a store opens on a full disk (its few writes on open, if
        any, fail as the engine's own disk_full). Above CAREFUL_BELOW free, this is one statvfs.
        """
        free = free_bytes(self.dir)
        if free >= CAREFUL_BELOW or not _fills_holes_on_read(shard):
            return
        need = _holes(shard, "payload_index")
        if need and free < need + SPACE_MARGIN:
            raise disk_full(self.dir, free, need + SPACE_MARGIN, "opening the store (tmpfs backs the pages it reads)")

    @contextmanager
    def _no_room(self, doing: str) -> Iterator[None]:
        """The engine's (or the OS's) "no space left" as `disk_full`, naming the store and what ran out."""
        try:
            yield
        except Exception as exc:
            full = disk_full_from(exc, self.dir, doing)
            if full is None:
                raise
            raise full from None

    # -- aliases (sync-embedding) -------------------------------------------
    def alias_target(self) -> str | None:
        """The physical collection this name points at, or None when it holds its data itself."""
        if self._alias is not None:
            return self._alias[0]
        try:
            target = json.loads((self.dir / "meta.json").read_text()).get("alias")
        except (FileNotFoundError, ValueError):
            return None
        if self._lock_fd is not None:
            self._alias = (target,)
        return target

    def sibling(self, name: str) -> "EdgeStore":
        """Another collection beside this one (a sync target): its own directory and lock."""
        return EdgeStore(self.dir.parent, name, wait_s=self.wait_s, queue_s=self.queue_s)

    def release(self) -> None:
        """Let other processes use the store (searches keep working while a sync embeds).

        An owner keeps its hold: it serves those searches itself.
        """
        if not self._pinned:
            self.close()

    def switch_alias(self, target: str, wait_s: float = 30.0) -> str | None:
        """Point this name at `target` with one atomic rename of meta.json; the old physical name, or None."""
        self._acquire(wait_s)
        with self._engine:
            self._shard_idle()
            if self._shard is not None:
                self._shard.flush()
                self._shard.close()
                self._shard = None
            old = self.alias_target()
            tmp = self.dir / "meta.json.tmp"
            tmp.write_text(json.dumps({"alias": target}))
            tmp.replace(self.dir / "meta.json")
            self._forget_cached()
        return old

    def drop_physical(self, name: str | None) -> None:
        """Delete data no name points at any more: a former target, or (None) this directory's own shard."""
        import shutil

        if name is None:
            shutil.rmtree(self.dir / "shard", ignore_errors=True)
            shutil.rmtree(self.dir / TERM_TABLES, ignore_errors=True)
        elif name != self.alias_target() and name != self.collection:
            shutil.rmtree(self.dir.parent / name, ignore_errors=True)

    def has_physical(self, name: str | None) -> bool:
        """Whether data that `drop_physical(name)` would delete is on disk; never what this name serves."""
        if name is None:
            return self.alias_target() is not None and (self.dir / "shard").exists()
        return name not in (self.alias_target(), self.collection) and (self.dir.parent / name).exists()

    def flush(self) -> None:
        """Make every write durable; a shard with a write-ahead log (WAL_ON_CREATE) then ends it with an empty entry.

        Why the empty entry (an empty delete): the engine acknowledges the WAL up to its last
        entry on flush, and every later open decodes that acknowledged entry again before
        skipping it. After an index run that is the last upsert batch (a batch of vectors and
        chunk text, CBOR-decoded on every one-shot search); an empty entry costs nothing to
        decode. The log still holds every write, so durability is unchanged.
        """
        from qdrant_edge import UpdateOperation

        with self._engine:
            if self._shard is not None and self._dirty:
                with self._no_room("flushing the store"):
                    if self._wal:
                        self._shard.update(UpdateOperation.delete_points([]))
                    self._shard.flush()
                self._dirty = False

    def close(self) -> None:
        with self._engine:
            self._shard_idle()
            if self._shard is not None:
                self.flush()
                self._shard.close()
                self._shard = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            self._pinned = False
            self._forget_cached()
        if self._scratch is not None:
            import shutil

            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def open_replica(source: Path, root: Path, collection: str) -> EdgeStore:
    """A private copy of a held collection's data directory (`EdgeStore.hold`), searched in this process.

    Why a copy: Qdrant Edge is a single-process engine. A shard with a write-ahead log locks
    it on load, so a second process cannot open it; one without opens twice, but nothing
    then keeps one process's writes and segment swaps from happening under the other's
    reads. While the source is held no writer can change it, so every
    copy answers exactly like the source. The copy lives under `root/<pid>` and is removed
    by `close()`; copies left by processes that died are removed here.
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
    return EdgeStore(mine, collection, scratch=mine)


#: The folder beside meta.json holding each repository's term table (`write_term_table`).
TERM_TABLES = "term_tables"


def _table_name(key: str, version: str) -> str:
    """`<hash of the key>.<version>`: a name safe for any tenant and repository name."""
    import hashlib

    return f"{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}.{version}"


def _indices(vector: Any) -> list[int]:
    """A record's sparse term ids (none when the point has no sparse vector: a text with no term)."""
    sparse = (vector or {}).get(SPARSE)
    return list(sparse.indices) if sparse is not None else []


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


def _index_params(kind: str) -> Any:
    """A payload index's parameters by kind (base.PAYLOAD_INDEXES), memory-mapped like the graph (see `create`)."""
    from qdrant_edge import FloatIndexParams, KeywordIndexParams, Memory

    cached = Memory.Cached
    return {
        "tenant": KeywordIndexParams(is_tenant=True, memory=cached),
        "keyword": KeywordIndexParams(memory=cached),
        "float": FloatIndexParams(memory=cached),
    }[kind]


def _dense(dimensions: int):
    """The dense vectors' parameters this version gives every shard.

    Why Cold (memory-mapped, not warmed on open), where the graph and the indexes are Cached: the
    engine's default copies every segment's vectors into memory as it opens it, and the segment
    being written keeps its whole preallocated chunk resident; a one-shot search then pays for
    all the vectors to read the few hundred its graph walk touches, and an optimize holds the
    old and the new segment's vectors at once. Mapped, they are read where the search goes, from
    the page cache the write has just filled. Same vectors, same graph, same results; figures:
    BENCHMARKS.md ("The run's peak memory under 500 MiB").
    """
    from qdrant_edge import Distance, EdgeVectorParams, Memory

    return EdgeVectorParams(size=dimensions, distance=Distance.Cosine, memory=Memory.Cold)


def _optimizers():
    """The optimizer settings this version gives every shard (see SEGMENT_KB)."""
    from qdrant_edge import EdgeOptimizersConfig

    return EdgeOptimizersConfig(max_segment_size=SEGMENT_KB, indexing_threshold=INDEXING_KB)


def _batch_bytes(points: Sequence[PointIn]) -> int:
    """A batch's own bytes: dense and sparse vectors, payload text, and a little per point for the rest."""
    n = 0
    for p in points:
        n += 4 * len(p.dense) + 8 * len(p.sparse.indices) + 256
        n += sum(len(v) for v in p.payload.values() if isinstance(v, str))
    return n


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


def _point_key(pid: Any) -> Any:
    """A point id as a cheap dict key: a UUID's integer (ids are UUIDs here), anything else as is."""
    return pid.int if pid.__class__ is uuid.UUID else pid


def _dense_of(vector: Any) -> Any:
    """The dense vector of a retrieved record (named vectors come back as a dict)."""
    return vector[DENSE] if isinstance(vector, dict) else vector


def _edge_filter(where: Where | None):
    from qdrant_edge import FieldCondition, Filter, MatchValue, RangeFloat
    from qdrant_edge import MatchAny as EMatchAny

    if where is None:
        return None

    def cond(c):
        if isinstance(c, Where):
            return _edge_filter(c)
        if isinstance(c, Match):
            return FieldCondition(key=c.key, match=MatchValue(c.value))
        if isinstance(c, MatchAny):
            return FieldCondition(key=c.key, match=EMatchAny(list(c.values)))
        if isinstance(c, Range):
            return FieldCondition(key=c.key, range=RangeFloat(gt=c.gt, gte=c.gte, lt=c.lt, lte=c.lte))
        raise TypeError(c)

    return Filter(
        must=[cond(c) for c in where.must] or None,
        must_not=[cond(c) for c in where.must_not] or None,
        should=[cond(c) for c in where.should] or None,
    )


def _edge_query(dense: np.ndarray | None, sparse: SparseVec | None):
    from qdrant_edge import Query, SparseVector

    if dense is not None:
        return Query.Nearest(dense.tolist(), using=DENSE)
    if sparse is None:
        raise ValueError("a search branch needs a dense or a sparse query")
    return Query.Nearest(SparseVector(indices=sparse.indices, values=sparse.values), using=SPARSE)
