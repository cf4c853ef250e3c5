"""Canonical indexing: walk a tree, chunk, embed, upsert — incrementally.

Unchanged files (same content hash as stored) cost one hash and nothing else;
changed files have their chunks replaced (upsert first, then drop the stale
ids, so a search never sees the file missing); deleted files lose their chunks.
Point ids are deterministic, so re-running after a crash never duplicates.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections import deque
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Iterator

from .. import observe
from ..contracts import PAYLOAD_SCHEMA_VERSION
from ..embedding import Embedder
from ..heap import collect_rarely, keep_large_blocks_out_of_the_heap
from ..settings import Settings
from ..store import FileTable, PointIn, Store
from ..store.guardrails import check_collection
from ..store.lexstats import RunTable
from ..store.scopes import canonical_repo
from ..text.files import Skipped, TreeReader, WalkRules, listed, walk
from ..text.secrets import RULES_VERSION
from . import batching, source, workers
from .payloads import build_points as build_points  # where overlays and tests import them from
from .payloads import payload_template as payload_template
from .points import Docs

_NOTHING = workers.done(None)  # the "job" of a file that was not read: nothing to wait for
#: the skip reason of a readable file the chunker finds no chunk in (shared with the dry run)
NO_TEXT = "no text to index"


def count_seen(files: list, skipped: list[Skipped]) -> int:
    """Every file the walk met that is not ignored: each ends indexed, unchanged or skipped (with its reason)."""
    return len(files) + sum(1 for s in skipped if s.kind == "file")


@dataclass
class IndexSummary:
    repo: str
    tenant: str
    files_seen: int = 0
    files_indexed: int = 0
    files_unchanged: int = 0
    files_deleted: int = 0
    chunks_written: int = 0
    chunks_deleted: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0
    rechunked: bool = False
    resumed: bool = False
    worker_died: bool = False

    def skipped_by_reason(self) -> dict[str, int]:
        """The files seen and not indexed, counted by reason, most frequent first (directories and ignore rules apart)."""
        counts: dict[str, int] = {}
        for s in self.skipped:
            if s.kind == "file":
                counts[s.reason] = counts.get(s.reason, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def dirs_skipped(self) -> int:
        return sum(1 for s in self.skipped if s.kind == "directory")

    def report(self):
        """The wire form (contracts.IndexReport) every entry point prints from."""
        from ..contracts import IndexReport, SkippedFile

        data = {k: v for k, v in self.__dict__.items() if k != "skipped"}
        skipped = [SkippedFile(path=s.path, reason=s.reason, kind=s.kind) for s in self.skipped]
        by_reason = self.skipped_by_reason()
        return IndexReport(**data, skipped=skipped, files_skipped=sum(by_reason.values()), skipped_by_reason=by_reason,
                           dirs_skipped=self.dirs_skipped, line=self.line())

    def line(self) -> str:
        """One line whose figures add up: files seen = indexed + unchanged + skipped (the main reasons named)."""
        rate = self.chunks_written / self.seconds if self.seconds > 0 else 0.0
        by_reason = self.skipped_by_reason()
        reasons = [f"{n} {reason}" for reason, n in by_reason.items()]
        if len(reasons) > 4:  # the three most frequent, and the rest together (--json lists them all)
            reasons[3:] = [f"{sum(list(by_reason.values())[3:])} for other reasons"]
        dirs = self.dirs_skipped
        return (
            f"indexed repo={self.repo} tenant={self.tenant}: {self.files_seen} files seen = {self.files_indexed} indexed + "
            f"{self.files_unchanged} unchanged + {sum(by_reason.values())} skipped"
            + (f" ({', '.join(reasons)})" if reasons else "")
            + f"; {self.files_deleted} deleted"
            + (f"; {dirs} {'directory' if dirs == 1 else 'directories'} not read" if dirs else "")
            + f"; {self.chunks_written} chunks written ({rate:.0f}/s), {self.seconds:.2f}s"
            + ("; every file re-chunked (chunking changed since the last run)" if self.rechunked else "")
            + ("; resumed a run that was cut short (the files it finished were kept)" if self.resumed else "")
            + ("; an index worker died (out of memory, killed, or could not start) and the run went on in this process"
               if self.worker_died else "")
        )


#: Bumped whenever chunk boundaries, or what is embedded and BM25-indexed per chunk, change:
#: the next index run then re-chunks files it would otherwise skip as unchanged (what each bump
#: changed is in git log).
CHUNK_RECIPE_VERSION = 6
#: The collection metadata key of what each (tenant, repo)'s canonical index was built from (indexing.source).
SOURCES = "repo_sources"


#: Points per store write. Why not one embedding batch (256): each write is durable as it returns,
#: which on the embedded store is a flush with a fixed cost whatever it holds; four batches a write
#: make that cost a quarter, and a run cut short loses at most this many points it had embedded and
#: not yet stored (the next run does those files again).
WRITE_POINTS = 1024


def chunk_recipe(settings: Settings) -> str:
    """What decides a file's chunks besides its content: the chunker, its size settings and the secret rules."""
    secrets = f"redact{RULES_VERSION}" if settings.redact_secrets == "on" else "raw"
    return f"v{CHUNK_RECIPE_VERSION}:{settings.chunk_chars}:{settings.chunk_overlap_lines}:{secrets}"


def content_hash(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _self_and_parents(rel: str) -> Iterator[str]:
    """`a/b/c.py`, `a/b`, `a`."""
    while rel:
        yield rel
        rel = rel.rpartition("/")[0]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


#: A file changed less than this before it was read is not known by its stat: a second change within
#: the same tick of the file system's clock would leave size and times as they were ("racily clean" in
#: git), so such a file is read and hashed again by the next run.
SETTLED_NS = 2_000_000_000


def stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def settled_stat(st: os.stat_result, now_ns: int) -> tuple[int, int, int, int] | None:
    """What the file table records of a file read now: its stat, if it had settled (see SETTLED_NS)."""
    if not stat.S_ISREG(st.st_mode) or max(st.st_mtime_ns, st.st_ctime_ns) > now_ns - SETTLED_NS:
        return None
    return stat_key(st)


def named_file_table(store: Store, key: str, version: str | None, *, repo: str, tenant: str) -> FileTable | None:
    """The repository's file table of the version its metadata names (`version`), if every chunk it
    lists is still stored (their count); else None."""
    table = store.read_file_table(key, version) if version else None
    if table is None or sum(len(entry[1]) for entry in table.files.values()) != store.count(canonical_repo(repo, tenant)):
        return None
    return table


@dataclass
class StoredFile:
    """What the store holds of one file: its chunks' ids, content hashes, sequence numbers and totals."""

    ids: set[str] = field(default_factory=set)
    hashes: set[str] = field(default_factory=set)
    seqs: set[int] = field(default_factory=set)
    totals: set[int] = field(default_factory=set)
    stat: tuple[int, int, int, int] | None = None  # the file's when it was read (`settled_stat`), from the file table

    def add(self, point_id: str, payload: dict) -> None:
        self.ids.add(point_id)
        self.hashes.add(payload.get("content_hash", ""))
        self.seqs.add(payload.get("chunk_sequence", -1))
        self.totals.add(payload.get("total_chunks", -1))

    def complete(self, content_hash: str) -> bool:
        """Every chunk of exactly this version is stored, and nothing else.

        Why not trust one chunk's hash: a run stopped between a batch's upsert and its
        stale-chunk delete (a crash, a kill -9) leaves two versions of a file side by side;
        the next run must see that and write the file again, not call it unchanged.
        """
        if self.hashes != {content_hash} or len(self.totals) != 1:
            return False
        total = next(iter(self.totals))
        return len(self.ids) == total and self.seqs == set(range(total))


@dataclass(slots=True)
class PendingFile:
    """A file in the run's line, in walk order, until its chunks (or its skip reason) are handed on."""

    rel: str
    content_hash: str
    old: StoredFile | None  # what the store held of it: those ids go once its new chunks are in
    slot: int  # its place in its chunking job's result
    job: Future | None  # that job (None until its group is sent; a done one for a file not read)
    reason: str | None  # why it is skipped (it was not read), else None
    chars: int  # its text: counted against the line's bound until it is handed on


@observe.index
def index_repository(
    root: Path,
    *,
    repo: str,
    tenant: str,
    settings: Settings,
    embedder: Embedder,
    store: Store,
    progress: Callable[..., None] | None = None,  # (files done, files, chunks so far)
    paths: Collection[str] | None = None,
) -> IndexSummary:
    """Walk → read and hash → chunk → embed + BM25 + payloads → write, streamed in bounded batches.

    `paths` (repo-relative files, or directories that are gone): look at these alone, as the walk
    would, and leave the rest of the tree as it is stored (what the owner's watcher saw change).

    Chunking and embedding run on the other cores (`workers`) when the run is big enough to pay for
    starting them; this process reads, decides what changed, and writes, in file order. Batches are
    cut exactly where a single process cuts them (the static model's vectors depend on the batch
    a text is embedded with, in the last bits), and written in order, so the stored points are the
    same bit for bit whichever way a run goes, and an interrupted run leaves whole files behind.
    """
    run = IndexRun(root, repo=repo, tenant=tenant, settings=settings, embedder=embedder, store=store,
                   progress=progress, paths=paths)
    return run.run()


class IndexRun:
    """One `index_repository` run: its state, and the steps that stream the tree's files through
    chunking, embedding and the store's writes, in file order.

    Why a class: the steps share the line of files, the batch being built and the points not yet
    stored; where each of them is cut is `batching`'s, which is tested without a store.
    """

    stored: dict[str, StoredFile]  # what the store holds, per path; what is left at the end is gone
    recipes: dict[str, str]
    recipe: str
    rechunk: bool
    unfinished: dict[str, float]
    terms: RunTable
    files: list[tuple[str, Path]]
    batch_chunks: int
    pool: workers.Pool
    reader: TreeReader

    def __init__(self, root: Path, *, repo: str, tenant: str, settings: Settings, embedder: Embedder, store: Store,
                 progress: Callable[..., None] | None = None, paths: Collection[str] | None = None) -> None:
        self.root, self.repo, self.tenant = root, repo, tenant
        self.settings, self.embedder, self.store, self.progress = settings, embedder, store, progress
        # only these files may change or go; a directory selects the files under it
        self.paths = None if paths is None else {p.rstrip("/") for p in paths}
        self.scope_key = f"{tenant}/{repo}"
        self.summary = IndexSummary(repo=repo, tenant=tenant)
        self.line: deque[PendingFile] = deque()  # files in order, waiting for their chunks
        self.line_chars = 0  # their text, in characters: what the line holds (texts in jobs, then their chunks)
        self.group: list[tuple[str, str]] = []  # changed files not yet handed to a chunking job: (rel, text)
        self.unsent: list[PendingFile] = []  # their places in the line
        self.group_chars = 0
        self.writing: deque[tuple[Future, list[str]]] = deque()  # batches being embedded: (points job, stale ids)
        self.pending: Docs = []  # chunks handed on, not yet in a batch
        self.pending_chunks = 0
        self.stale: list[str] = []  # the ids their files had before
        self.taken = 0  # files handed on
        self.held: list[PointIn] = []  # embedded points not yet stored (fewer than WRITE_POINTS), in order
        self.held_stale: list[str] = []  # the ids their files had before
        # what the file table this run writes at its end lists: files it left out (`paths`), found unchanged, wrote
        self.outside: dict[str, StoredFile] = {}
        self.kept: dict[str, StoredFile] = {}
        self.written: dict[str, StoredFile] = {}
        self.stats: dict[str, tuple[int, int, int, int] | None] = {}  # of the files read (see `settled_stat`)
        self.table_read = False  # what was stored came from the file table (not read back from the chunks)

    def run(self) -> IndexSummary:
        started = time.perf_counter()
        keep_large_blocks_out_of_the_heap()  # this process writes the store and holds its growing segment
        with collect_rarely():
            self._begin()
            self._start()
            try:
                self._stream()
            finally:
                self.reader.close()
                self.pool.close()
                self.summary.worker_died = self.pool.lost_a_worker
            self._finish()
        self.summary.seconds = time.perf_counter() - started
        return self.summary

    def _begin(self) -> None:
        """Read what is stored and the chunk recipe, and mark the run unfinished before its first write."""
        store, summary, scope_key = self.store, self.summary, self.scope_key
        info = check_collection(store, self.embedder, must_exist=False)
        if info is None:
            store.create(self.embedder.dimensions, self.embedder.name, PAYLOAD_SCHEMA_VERSION)
        # per repo: a file unchanged since it was chunked another way is chunked again
        self.recipes = dict((info.extra.get("chunk_recipes") if info else None) or {})
        self.recipe = chunk_recipe(self.settings)
        self.rechunk = self.recipes.get(scope_key) != self.recipe
        # the repository's BM25 statistics, marked stale (begin) until the run ends; its version names the file table too
        self.terms = RunTable(store, info, self.tenant, self.repo)
        self.stored = self._stored_files()
        if scope_key not in self.recipes and not self.stored:
            # nothing is stored in this scope, so nothing can have been chunked another way: record the
            # recipe now, and a first index that is interrupted resumes (finished files are skipped by
            # hash) instead of re-chunking everything under a false "chunking changed"
            self.recipes[scope_key] = self.recipe
            self.rechunk = False
        if self.paths is not None:
            selected = {p for p in self.stored if any(a in self.paths for a in _self_and_parents(p))}
            self.outside = {p: f for p, f in self.stored.items() if p not in selected}
            self.stored = {p: self.stored[p] for p in selected}
        self.source = source.describe(self.root)  # before any file is read: the commit the files are read at
        self.sources = dict((info.extra.get(SOURCES) if info else None) or {})  # every repo's, as the recipes
        # marked before the first write, cleared by the last: the next run knows this one was cut short
        self.unfinished = dict((info.extra.get("unfinished_index_runs") if info else None) or {})
        summary.resumed = scope_key in self.unfinished
        self.unfinished[scope_key] = time.time()
        store.set_metadata(chunk_recipes=self.recipes, unfinished_index_runs=self.unfinished, **self.terms.begin())

    def _stored_files(self) -> dict[str, StoredFile]:
        """What is stored now, per path: every chunk's version and place, so that a file is only
        "unchanged" when all of its chunks are of this version and none is missing.

        From the repository's file table when the metadata names one (the last run that finished
        wrote it, and no chunk changed since); else read back from the chunks' payloads.
        """
        table = self._named_file_table()
        if table is not None:
            self.table_read = True
            return {path: StoredFile(set(ids), {h}, set(range(len(ids))), {len(ids)}, known)
                    for path, (h, ids, known) in table.files.items()}
        stored: dict[str, StoredFile] = {}
        fields = ["path", "content_hash", "chunk_sequence", "total_chunks"]
        for hit in self.store.scroll(canonical_repo(self.repo, self.tenant), fields):
            stored.setdefault(hit.payload["path"], StoredFile()).add(hit.id, hit.payload)
        return stored

    def _named_file_table(self) -> FileTable | None:
        return named_file_table(self.store, self.terms.key, self.terms.old_version, repo=self.repo, tenant=self.tenant)

    def _write_file_table(self) -> None:
        """The files this run leaves stored, under the version its metadata is about to name (see `FileTable`).

        Written before the metadata names it, as the term table is; none when a file is not one whole
        version (the next run reads the chunks instead).
        """
        version = self.terms.version
        if version is None:
            return  # a store that keeps no term table
        if version == self.terms.old_version and self.table_read and not any(
                self.stats.get(path) not in (None, f.stat) for path, f in self.kept.items()):
            return  # the table that was read is still the one named, and says all this run learnt
        files: dict[str, tuple[str, list[str], tuple[int, int, int, int] | None]] = {}
        for path, f in {**self.outside, **self.kept, **self.written}.items():
            if len(f.hashes) != 1 or not f.complete(next(iter(f.hashes))):
                return
            files[path] = (next(iter(f.hashes)), sorted(f.ids), self.stats.get(path, f.stat))
        self.store.write_file_table(self.terms.key, FileTable(version, files))

    def _start(self) -> None:
        """List the files, and start the pool that chunks and embeds them."""
        root, summary = self.root, self.summary
        rules = WalkRules.of(self.settings)
        self.files = list(walk(root, summary.skipped, rules=rules) if self.paths is None
                          else listed(root, self.paths, summary.skipped, rules=rules))
        summary.files_seen = count_seen(self.files, summary.skipped)
        self.batch_chunks = batching.batch_chunks(self.settings.embedding_batch_size)
        self.pool = workers.Pool(self.embedder, self.settings)
        # new files: a cold run's whole tree; a file over the size limit is skipped unread, so it counts nothing
        limit = self.settings.max_file_bytes
        self.pool.expect(sum(n for rel, path in self.files if rel not in self.stored and (n := _size(path)) <= limit))
        self.reader = TreeReader(root.resolve())  # reads what the walk listed, never through a link swapped in since

    def _stream(self) -> None:
        """Every file read, chunked, embedded and stored, in order; the last writes once the workers are gone."""
        for rel, _path in self.files:
            self._read(rel)
        self._send_group()
        self._take(block=True)
        self._flush()
        while any(not job.done() for job, _ in self.writing):  # write what is in while the rest is embedded
            futures.wait([self.writing[0][0]])
            self._write(block=False)
        self.pool.close()  # every point is built: the workers exit before the store's largest moment, the last writes
        self._write(block=True)

    def _read(self, rel: str) -> None:
        """One file of the walk: skipped, unchanged, or into the line (and a chunking group)."""
        old = self.stored.get(rel)
        if old is not None and old.stat is not None and not self.rechunk:
            st = self.reader.stat(rel)
            # as git does: a file whose size, times and inode are those it had when last read is that file
            if st is not None and stat_key(st) == old.stat and st.st_size <= self.settings.max_file_bytes:
                del self.stored[rel]
                self.summary.files_unchanged += 1
                self.kept[rel] = old
                return
        text, reason, st = self.reader.read(rel, self.settings.max_file_bytes)
        if st is not None:
            self.stats[rel] = settled_stat(st, time.time_ns())
        if text is None:
            self.line.append(PendingFile(rel, "", None, 0, _NOTHING, reason or "unreadable", 0))
            return
        fhash = content_hash(text)
        old = self.stored.pop(rel, None)
        if old is not None and old.complete(fhash):
            if not self.rechunk:
                self.summary.files_unchanged += 1
                self.kept[rel] = old
                return
            self.summary.rechunked = True
        entry = PendingFile(rel, fhash, old, 0, None, None, len(text))
        self.line.append(entry)
        self.line_chars += len(text)
        self.unsent.append(entry)
        self.group.append((rel, text))
        self.group_chars += len(text)
        if batching.group_full(self.group_chars, len(self.group), self.pool):
            self._send_group()
            self._take(block=False)

    def _send_group(self) -> None:
        """Hand the changed files read since the last group to one chunking job."""
        if self.group:
            job = self.pool.chunk(self.group, self.settings.chunk_chars, self.settings.chunk_overlap_lines,
                                  self.settings.redact_secrets == "on")
            for slot, entry in enumerate(self.unsent):
                entry.slot, entry.job = slot, job
            # new lists, not cleared ones: a worker pool may not have sent the job's yet
            self.group, self.unsent, self.group_chars = [], [], 0

    def _take(self, block: bool) -> None:
        """Hand the chunks of files at the head of the line on to batches, in file order."""
        while self.line and batching.may_take(self.line[0].job, block=block, files=len(self.line),
                                              chars=self.line_chars, limits=self.pool):
            self._hand_on(self.line.popleft())

    def _hand_on(self, entry: PendingFile) -> None:
        """One file off the head of the line: skipped, or its chunks into the batch being built."""
        summary = self.summary
        self.line_chars -= entry.chars
        self.taken += 1
        if self.progress:  # files before this one are done; 100% is reported once the last write is in
            self.progress(self.taken - 1, len(self.files), summary.chunks_written + len(self.held) + self.pending_chunks)
        if entry.reason is not None:
            summary.skipped.append(Skipped(entry.rel, entry.reason))
            return
        assert entry.job is not None  # batching.may_take hands on sent files only
        chunks = self.pool.result(entry.job)[entry.slot]
        if not chunks and entry.old is None:
            summary.skipped.append(Skipped(entry.rel, NO_TEXT))
            return
        summary.files_indexed += 1
        if entry.old is not None:
            self.stale.extend(entry.old.ids)
        self.pending.append((entry.rel, entry.content_hash, chunks))
        self.pending_chunks += len(chunks)
        if batching.batch_full(self.pending_chunks, self.batch_chunks):
            self._flush()

    def _flush(self) -> None:
        """The batch built so far to an embedding job (an empty one too: it carries its stale ids)."""
        job = self.pool.points(self.pending, repo=self.repo, tenant=self.tenant) if self.pending else workers.done([])
        self.writing.append((job, self.stale))
        self.pending, self.pending_chunks, self.stale = [], 0, []
        self._write(block=False)

    def _write(self, block: bool) -> None:
        """Store the embedded batches at the head of the line, in order, WRITE_POINTS at a time (all
        of them when `block`)."""
        while self.writing and batching.may_store(self.writing[0][0], block=block, batches=len(self.writing),
                                                  limits=self.pool):
            job, stale_ids = self.writing.popleft()
            self.held.extend(self.pool.result(job))
            self.held_stale.extend(stale_ids)
            due = batching.store_due(len(self.held), self.store.room(), WRITE_POINTS)
            if due == batching.BUILD:
                self.pool.rest()  # this write builds a segment: the workers' memory is not held beside the build's
            if due is not None:
                self._store_held()
        if block and self.held:
            self._store_held()

    def _store_held(self) -> None:
        """Write the held points, then drop the ids their files had that they did not overwrite."""
        built, stale_ids = self.held, self.held_stale
        self.held, self.held_stale = [], []
        self.terms.replacing(stale_ids)  # read before the upsert overwrites them
        self.terms.adding(built)
        self.store.upsert(built)
        for p in built:
            self.written.setdefault(p.payload["path"], StoredFile()).add(p.id, p.payload)
        self.summary.chunks_written += len(built)
        new_ids = {p.id for p in built}
        drop = [i for i in stale_ids if i not in new_ids]
        self.store.delete_ids(drop)
        self.summary.chunks_deleted += len(drop)

    def _finish(self) -> None:
        """Drop the chunks of files that are gone, record the recipe, and clear the unfinished mark."""
        store, summary, scope_key = self.store, self.summary, self.scope_key
        if self.progress:
            self.progress(len(self.files), len(self.files), summary.chunks_written)
        # files that are gone (or now ignored/skipped) lose their chunks
        gone = [i for f in self.stored.values() for i in f.ids]
        summary.files_deleted = len(self.stored)
        self.terms.replacing(gone)
        store.delete_ids(gone)
        summary.chunks_deleted += len(gone)
        if self.paths is None or not self.rechunk:  # files left out of this run are still chunked the old way
            self.recipes[scope_key] = self.recipe
        self.unfinished.pop(scope_key, None)
        named = self.terms.finish()  # the table is stored before the metadata names it
        self._write_file_table()  # and so is this one
        self.sources[scope_key] = self.source
        store.set_metadata(last_indexed_at=time.time(), chunk_recipes=self.recipes, unfinished_index_runs=self.unfinished,
                           **{SOURCES: self.sources}, **named)
        store.optimize()  # see EdgeStore.optimize: searches after an index run use the built index
        store.flush()
