"""Qdrant Edge: the Qdrant engine in-process, persistent under MOONMIND_HOME.

One owning process at a time (a file lock); collection metadata (embedding model,
dimension, payload schema version) lives in `meta.json` beside the shard. EdgeStore holds the
shard and its locks; beside it: edge_directory.py (the lock, meta.json, the alias), edge_shard.py
(creating, loading, flushing a shard), edge_reads.py, edge_query.py (filters and queries),
edge_disk.py (disk room), edge_term_tables.py, edge_replica.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any, ContextManager, Iterator, Sequence

from . import edge_disk, edge_file_tables, edge_payloads, edge_reads, edge_replica, edge_shard, edge_term_tables
from .base import (
    DENSE,
    LEXICAL_FORMAT,
    LEXICAL_FORMAT_KEY,
    PAYLOAD_CACHE_POINTS,
    PAYLOAD_INDEXES,
    SPARSE,
    CollectionInfo,
    FileTable,
    Hit,
    PointIn,
    SearchSpec,
    TermTable,
    Where,
    _missing,
    _refuse_if_expired,
    _rescorings,
)
from .edge_census import Census
from .edge_directory import EdgeDirectory
from .edge_disk import BATCH_FACTOR, CREATE_BYTES, batch_bytes
from .edge_file_tables import FILE_TABLES
from .edge_query import _edge_filter, _point_key, branch_request, rescoring_request, rows
from .edge_term_tables import TERM_TABLES

#: Points written since the shard was loaded above which `optimize` reloads a store made before this version's settings.
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
#: Whether a new shard holds its keyword filter fields as one indexed list of entries (edge_payloads.KEYS):
#: one payload index where there were seven, each a pass over every payload in every segment build
#: (BENCHMARKS.md, "One index for the keyword fields"). A store made before keeps its layout (tests make one).
KEYED_ON_CREATE = True
#: How long a command queues behind one-shot commands holding the store (they hold it for a moment each).
ONE_SHOT_QUEUE_S = 60.0


class EdgeStore:
    """The Qdrant engine in-process, persistent under MOONMIND_HOME; one owning process at a time."""

    def __init__(
        self, root: Path, collection: str, wait_s: float = 0.0, scratch: Path | None = None, queue_s: float = 0.0,
    ) -> None:
        import qdrant_edge  # noqa: F401 - fail here, not mid-query, when the engine is missing

        self.collection = collection
        self.wait_s = wait_s  # how long to wait for another process's hold to end (see EdgeDirectory.acquire)
        self.queue_s = queue_s  # how long, when that process serves no socket (a one-shot command)
        self.dir = Path(root) / collection
        self._files = EdgeDirectory(Path(root), collection, wait_s, queue_s)  # its lock, meta.json and alias
        self._scratch = scratch  # a replica's private directory, removed by close() (open_replica)
        self._shard: Any = None  # a qdrant_edge.EdgeShard once opened
        self._dirty = False  # a search-only session has nothing to flush (a flush costs fsyncs)
        self._wal = True  # whether the open shard logs its writes ahead (see WAL_ON_CREATE)
        self._written = 0  # points upserted since the shard was loaded (see optimize)
        self._unindexed = 0  # points upserted since the last optimize (see upsert)
        self._cache: dict[tuple[str, ...] | None, OrderedDict] = {}  # see _payloads
        self._cache_lock = threading.Lock()
        self._generation = 0
        self._census = Census()  # filter conditions every point holds (edge_census.py); cleared by writes, loads
        self._pinned = False  # held for good by an owner serving the box (see hold, release)
        # one engine call at a time per process: a sync's alias switch closes the shard that a
        # search on another thread of the owner would otherwise still be reading; the binding
        # holds the GIL during a call anyway, so this costs no parallelism
        self._engine = threading.RLock()
        self._optimizing = 0  # optimize() calls running outside the engine lock
        self._optimized = threading.Condition(self._engine)

    # -- ownership (edge_directory.py) ------------------------------------
    def _acquire(self, wait_s: float | None = None) -> None:
        self._files.acquire(wait_s)

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
        return self._files.holding

    @property
    def data_dir(self) -> Path:
        """Where the shard and its metadata live: this directory, or the one its alias points at (sync.py)."""
        return self._files.data_dir

    def _forget_cached(self) -> None:
        """Drop what this process remembers of the store (metadata, alias, payloads): it may change now."""
        self._files.forget()
        self._census.clear()
        with self._cache_lock:
            self._cache.clear()
            self._generation += 1

    def _open(self):
        if self._shard is None:
            with self._engine:
                if self._shard is None:
                    self._acquire()
                    if self._files.read_meta() is None or not (self.data_dir / "shard").exists():
                        raise _missing(self.collection)
                    self._load()
        return self._shard

    # -- collection -------------------------------------------------------
    def info(self) -> CollectionInfo | None:
        return self._files.info(self._points)

    def _points(self) -> int:
        with self._engine:  # a reload on the writer's thread closes the shard object this call would use
            return self._open().info().points_count

    def create(self, dimensions: int, model: str, schema_version: int) -> None:
        self._acquire()
        self._files.clear_data()
        self._room(CREATE_BYTES, "creating the store")
        # Cached indexes and graph, Cold dense vectors: edge_shard.create and _dense say why
        keyed = KEYED_ON_CREATE
        indexes = [(name, _index_params(kind)) for name, kind in _indexes(keyed)]
        with self._no_room("creating the store"):
            self._shard = edge_shard.create(self.data_dir / "shard", _dense(dimensions), _optimizers(), WAL_ON_CREATE, indexes)
        self._wal = WAL_ON_CREATE
        self._write_meta(
            {"dimensions": dimensions, "model": model, "schema_version": schema_version, "created_at": time.time(),
             LEXICAL_FORMAT_KEY: LEXICAL_FORMAT, edge_shard.DENSE_KEY: edge_shard.EXACT,
             **({edge_payloads.LAYOUT_KEY: edge_payloads.KEYED_LAYOUT} if keyed else {})}
        )

    def _keyed(self) -> bool:
        """Whether this store holds its keyword filter fields as entries (KEYED_ON_CREATE); one made before does not."""
        return (self._files.read_meta() or {}).get(edge_payloads.LAYOUT_KEY) == edge_payloads.KEYED_LAYOUT

    def _stored(self, where: Where | None) -> Where | None:
        """`where` as this store's payload layout matches it."""
        return edge_payloads.keyed_where(where) if where is not None and self._keyed() else where

    def _write_meta(self, meta: dict[str, Any]) -> None:
        self._forget_cached()
        self._files.write_meta(meta)

    def set_metadata(self, **meta: Any) -> None:
        current = self._files.read_meta() or {}
        current.update(meta)
        self._write_meta(current)

    # -- data -------------------------------------------------------------
    def upsert(self, points: Sequence[PointIn]) -> None:
        from qdrant_edge import Point, SparseVector, UpdateOperation

        if not points:
            return
        self._open()
        doing = f"writing {len(points)} chunks"
        self._room(BATCH_FACTOR * batch_bytes(points), doing)
        keyed = self._keyed()
        op = UpdateOperation.upsert_points(
            [
                Point(
                    id=p.id,
                    vector={
                        DENSE: p.dense.tolist(),
                        SPARSE: SparseVector(indices=p.sparse.indices, values=p.sparse.values),
                    },
                    payload=edge_payloads.pack(p.payload, keyed),
                )
                for p in points
            ]
        )
        self._written += len(points)
        self._unindexed += len(points)
        self._invalidate([p.id for p in points])
        self._apply(op, doing)
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
        return int((self._files.read_meta() or {})["dimensions"])

    def _segment_points(self) -> int:
        """How many points fill a segment of SEGMENT_KB (dense vectors are what the engine counts)."""
        return SEGMENT_KB * 1024 // (4 * self._dimensions())

    def delete(self, where: Where) -> None:
        from qdrant_edge import UpdateOperation

        self._invalidate()  # deleted points are never returned again; a re-upsert drops its entry
        self._open()
        self._room(0, "deleting chunks")  # a delete marks flags in mapped files too
        self._apply(UpdateOperation.delete_points_by_filter(_edge_filter(self._stored(where))), "deleting chunks")

    def delete_ids(self, ids: Sequence[str]) -> None:
        from qdrant_edge import UpdateOperation

        if ids:
            self._invalidate(ids)
            self._open()
            self._room(0, "deleting chunks")
            self._apply(UpdateOperation.delete_points(list(ids)), "deleting chunks")

    def _apply(self, op: Any, doing: str) -> None:
        """One write, durable before it returns; what the census knew of the points is forgotten in the same hold."""
        with self._engine, self._no_room(doing):
            self._dirty = True
            self._open().update(op)
            self._census.clear()
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

        Why three engine calls: the branches run as one batch that returns ids and scores only;
        a branch's candidates are then rescored by the other query by id (one batch), not found
        again (a second walk of the graph: ~0.3-0.6 ms a search); and the payloads of the distinct
        hits are read once by id. Reading payload inside the query costs more per point (and twice
        for a point both branches find).
        """
        from qdrant_edge import QueryBatchRequest

        _refuse_if_expired(deadline)
        self._open()  # a missing collection fails here, before the requests are built
        stored = [edge_payloads.keyed_where(s.where) for s in specs] if self._keyed() else [s.where for s in specs]
        points_of: dict[Any, Any] = {}  # id key -> the engine's id (see edge_query.rows)
        rescoring: list[tuple[int, str]] = []  # (spec, Hit field) of each rescoring request, in order
        again: list[Any] = []
        with self._engine:  # one hold: no write lands between the census, a branch and its rescoring
            shard = self._open()
            requests = [branch_request(replace(s, where=self._census.trimmed(shard, w))) for s, w in zip(specs, stored)]
            results = rows(shard.query_batch(QueryBatchRequest(requests)), points_of)
            for i, s in enumerate(specs):
                found = {points_of[k] for k, _ in results[i]}
                for score_field, dense, sparse in _rescorings(s) if found else ():  # the same candidates, by id
                    rescoring.append((i, score_field))
                    again.append(rescoring_request(found, dense, sparse))
            rescored = rows(self._open().query_batch(QueryBatchRequest(again)), points_of) if again else []
        # each asked score per spec, empty where the branch found nothing (every candidate then scores 0)
        scored: list[dict[str, dict[Any, float]]] = [{f: {} for f, _, _ in _rescorings(s)} for s in specs]
        for (i, score_field), row in zip(rescoring, rescored):
            scored[i][score_field] = dict(row)
        payloads = self._payloads(results, specs, points_of)
        out = []
        for i, s in enumerate(specs):
            cos, bm25 = (scored[i].get(f) for f in ("cosine", "bm25"))
            hits = []
            for pid, score in results[i]:
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
            fields = True if key is None else key
            with self._engine:
                records = self._open().retrieve(
                    [points_of[k] for k in misses], with_payload=edge_payloads.selector(fields), with_vector=False
                )
            for r in records:
                rid = r.id  # a new UUID object per access
                fresh[_point_key(rid)] = (str(rid), edge_payloads.unpack(r.payload, fields))
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

    # -- reads (edge_reads.py) --------------------------------------------
    def retrieve(self, ids: Sequence[str], fields: Sequence[str] | bool = True) -> list[Hit]:
        """Points by id with the payload fields asked for, in the order asked; missing ids are skipped."""
        return edge_reads.retrieve(self._open, self._engine, ids, fields)

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        records = edge_reads.by_id(self._open, self._engine, ids, with_payload=False, with_vector=[DENSE])
        return {str(r.id): list(_dense_of(r.vector)) for r in records}

    def scroll(self, where: Where | None, fields: Sequence[str] | bool, batch: int = 1024) -> Iterator[Hit]:
        return edge_reads.scroll(self._open, self._engine, self._stored(where), fields, batch)

    def sparse_terms(self, where: Where | None = None, ids: Sequence[str] | None = None) -> Iterator[list[int]]:
        return edge_reads.sparse_terms(self._open, self._engine, self._stored(where), ids)

    def count(self, where: Where | None = None) -> int:
        return edge_reads.count(self._open, self._engine, self._stored(where))

    def read_term_table(self, key: str, version: str) -> TermTable | None:
        return edge_term_tables.read(self.data_dir / TERM_TABLES, key, version)

    def write_term_table(self, key: str, table: TermTable) -> None:
        """One file per key and version, written whole and renamed into place, then the key's other versions removed."""
        edge_term_tables.write(self.data_dir / TERM_TABLES, key, table, self.dir)

    def read_file_table(self, key: str, version: str) -> FileTable | None:
        return edge_file_tables.read(self.data_dir / FILE_TABLES, key, version)

    def write_file_table(self, key: str, table: FileTable) -> None:
        """One file per key and version, written whole and renamed into place, then the key's other versions removed."""
        edge_file_tables.write(self.data_dir / FILE_TABLES, key, table, self.dir)

    def optimize(self) -> None:
        """Build the written segments (their indexes; the graph once due: edge_shard.graph_due), in this process, before a search.

        Why after every index run: a built segment opens and is searched faster than the appendable one
        (BENCHMARKS.md, "The HNSW graph"). Asking again costs nothing when there is nothing to do, so a
        store written by an older version is optimized by its next index run even when no file changed.
        """
        meta = self._files.read_meta()
        graph = edge_shard.graph_due(meta, self._points, self._segment_points())
        if graph or (self._written >= RELOAD_BEFORE_OPTIMIZE and edge_shard.DENSE_KEY not in (meta or {})):
            # a store made before this version's settings (no `dense_search` in its meta) is loaded with them, the
            # segment cap among them, before the build they bound; one made since has them, and for it the reload
            # cut no memory a run needs, only time (BENCHMARKS.md, "Index speed against the peer")
            self._reload(graph)
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
        with self._engine:
            shard = self._open()
            have = shard.info().payload_schema
            missing = [(name, _index_params(kind)) for name, kind in _indexes(self._keyed()) if name not in have]
            if not missing:
                return
            with self._no_room("adding payload indexes"):
                edge_shard.add_indexes(shard, missing)
                self._dirty = True
                self._durable()

    def _shard_idle(self) -> None:
        """Wait (holding the engine lock) until no optimize uses the open shard: it is about to be closed."""
        while self._optimizing:
            self._optimized.wait()

    def _reload(self, graph: bool = False) -> None:
        """Close the shard and load it again from disk: what it held in memory for this process's writes is gone.

        `graph`: with the graph from now on (recorded by the engine, then in meta.json; the next optimize builds it).
        """
        from ..heap import give_back_heap

        config = edge_shard.given_again(_dense(self._dimensions()), _optimizers(), graph)
        with self._engine:  # one hold: a search on another thread never opens the shard in between
            self._shard_idle()
            self._shard.flush()
            self._shard.close()
            self._shard = None
            self._written = 0
            give_back_heap()  # what the closed shard freed, and the run before it, before the build needs more
            self._load(config)
        if graph:
            self.set_metadata(**{edge_shard.DENSE_KEY: edge_shard.GRAPH})

    def _load(self, config: Any = None) -> None:
        """Load the shard from disk, noting whether it logs its writes ahead (see WAL_ON_CREATE)."""
        self._shard, self._wal = edge_shard.load(self.data_dir / "shard", self.dir, config)
        self._census.clear()

    def _room(self, need: int, doing: str) -> None:
        """Refuse (`disk_full`) a write that may take more than the store's filesystem has free (edge_disk.py)."""
        edge_disk.room(self.dir, need, doing, lambda: self.data_dir / "shard")

    def _no_room(self, doing: str) -> ContextManager[None]:
        """The engine's (or the OS's) "no space left" as `disk_full`, naming the store and what ran out."""
        return edge_disk.no_room(self.dir, doing)

    # -- aliases (sync-embedding; edge_directory.py) ----------------------
    def alias_target(self) -> str | None:
        """The physical collection this name points at, or None when it holds its data itself."""
        return self._files.alias_target()

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
            old = self._files.write_alias(target)
            self._forget_cached()
        return old

    def drop_physical(self, name: str | None) -> None:
        """Delete data no name points at any more: a former target, or (None) this directory's own shard."""
        self._files.drop_physical(name)

    def has_physical(self, name: str | None) -> bool:
        """Whether data that `drop_physical(name)` would delete is on disk; never what this name serves."""
        return self._files.has_physical(name)

    def flush(self) -> None:
        """Make every write durable; a shard with a write-ahead log (WAL_ON_CREATE) then ends it with an empty entry (edge_shard.flush)."""
        with self._engine:
            if self._shard is not None and self._dirty:
                edge_shard.flush(self._shard, self._wal, self.dir)
                self._dirty = False

    def close(self) -> None:
        with self._engine:
            self._shard_idle()
            if self._shard is not None:
                self.flush()
                self._shard.close()
                self._shard = None
            self._files.unlock()
            self._pinned = False
            self._forget_cached()
        if self._scratch is not None:
            import shutil

            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def open_replica(source: Path, root: Path, collection: str) -> EdgeStore:
    """A private copy of a held collection's data directory (`EdgeStore.hold`), searched in this process.

    The copy (edge_replica.py says why one) lives under `root/<pid>` and is removed by `close()`.
    """
    mine = edge_replica.copy_data_dir(source, root, collection)
    return EdgeStore(mine, collection, scratch=mine)


def _indexes(keyed: bool) -> tuple[tuple[str, str], ...]:
    """The payload indexes (name, kind) of a store of this layout."""
    return edge_payloads.KEYED_INDEXES if keyed else PAYLOAD_INDEXES


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


def _dense_of(vector: Any) -> Any:
    """The dense vector of a retrieved record (named vectors come back as a dict)."""
    return vector[DENSE] if isinstance(vector, dict) else vector
