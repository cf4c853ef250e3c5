"""Canonical indexing: walk a tree, chunk, embed, upsert — incrementally.

Unchanged files (same content hash as stored) cost one hash and nothing else;
changed files have their chunks replaced (upsert first, then drop the stale
ids, so a search never sees the file missing); deleted files lose their chunks.
Point ids are deterministic, so re-running after a crash never duplicates.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterator

from .. import observe
from ..contracts import CANONICAL, PAYLOAD_SCHEMA_VERSION, ChunkPayload, TrustClass
from ..embedding import Embedder
from ..heap import keep_large_blocks_out_of_the_heap
from ..ids import utc_timestamp
from ..settings import Settings
from ..store import PointIn, Store
from ..store.guardrails import check_collection
from ..store.lexstats import RunTable
from ..store.scopes import canonical_repo
from ..text.chunking import Chunk, language_of
from ..text.files import Skipped, TreeReader, listed, walk
from . import points, workers
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


#: Points per store write. Why not one embedding batch (256): each write is durable as it returns,
#: which on the embedded store is a flush with a fixed cost whatever it holds; four batches a write
#: make that cost a quarter, and a run cut short loses at most this many points it had embedded and
#: not yet stored (the next run does those files again).
WRITE_POINTS = 1024


def chunk_recipe(settings: Settings) -> str:
    """What decides a file's chunks besides its content: the chunker and its size settings."""
    return f"v{CHUNK_RECIPE_VERSION}:{settings.chunk_chars}:{settings.chunk_overlap_lines}"


def content_hash(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def payload_template(
    docs: Docs,
    *,
    repo: str,
    tenant: str,
    model_version: str,
    trust_class: TrustClass = CANONICAL,
    run_id: str = "",
    expires_at: float | None = None,
) -> dict[str, Any]:
    """A batch's payload as the contract dumps it, from its first chunk: what `points.build` copies per chunk.

    Why one per batch: the contract's keys, order, defaults and batch-wide values, validated once,
    without pydantic's per-chunk cost (and without pydantic where the points are built).
    """
    path, fhash, chunks = next((d for d in docs if d[2]), docs[0])
    c = chunks[0]
    return ChunkPayload(
        **points.chunk_fields(path, fhash, c, language_of(path)),
        repo=repo,
        tenant=tenant,
        model_version=model_version,
        indexed_at=utc_timestamp(),
        trust_class=trust_class,
        run_id=run_id,
        expires_at=expires_at,
    ).model_dump()


def build_points(
    embedder: Embedder,
    docs: Docs,
    *,
    repo: str,
    tenant: str,
    trust_class: TrustClass = CANONICAL,
    run_id: str = "",
    expires_at: float | None = None,
) -> list[PointIn]:
    """Embed chunks of several files in one batch and wrap them as points (shared with overlays)."""
    if not any(chunks for _, _, chunks in docs):
        return []
    template = payload_template(docs, repo=repo, tenant=tenant, model_version=embedder.name,
                                trust_class=trust_class, run_id=run_id, expires_at=expires_at)
    return points.build(embedder, docs, template)


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


@dataclass
class StoredFile:
    """What the store holds of one file: its chunks' ids, content hashes, sequence numbers and totals."""

    ids: set[str] = field(default_factory=set)
    hashes: set[str] = field(default_factory=set)
    seqs: set[int] = field(default_factory=set)
    totals: set[int] = field(default_factory=set)

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
    started = time.perf_counter()
    keep_large_blocks_out_of_the_heap()  # this process writes the store and holds its growing segment
    summary = IndexSummary(repo=repo, tenant=tenant)
    info = check_collection(store, embedder, must_exist=False)
    if info is None:
        store.create(embedder.dimensions, embedder.name, PAYLOAD_SCHEMA_VERSION)
    # per repo: a file unchanged since it was chunked another way is chunked again
    recipes = dict((info.extra.get("chunk_recipes") if info else None) or {})
    recipe, scope_key = chunk_recipe(settings), f"{tenant}/{repo}"
    rechunk = recipes.get(scope_key) != recipe

    # what is stored now, per path: every chunk's version and place, so that a file is only
    # "unchanged" when all of its chunks are of this version and none is missing
    stored: dict[str, StoredFile] = {}
    for hit in store.scroll(canonical_repo(repo, tenant), ["path", "content_hash", "chunk_sequence", "total_chunks"]):
        stored.setdefault(hit.payload["path"], StoredFile()).add(hit.id, hit.payload)
    if scope_key not in recipes and not stored:
        # nothing is stored in this scope, so nothing can have been chunked another way: record the
        # recipe now, and a first index that is interrupted resumes (finished files are skipped by
        # hash) instead of re-chunking everything under a false "chunking changed"
        recipes[scope_key] = recipe
        rechunk = False
    if paths is not None:  # only these files may change or go; a directory selects the files under it
        paths = {p.rstrip("/") for p in paths}
        stored = {p: f for p, f in stored.items() if any(a in paths for a in _self_and_parents(p))}
    # marked before the first write, cleared by the last: the next run knows this one was cut short
    unfinished = dict((info.extra.get("unfinished_index_runs") if info else None) or {})
    summary.resumed = scope_key in unfinished
    unfinished[scope_key] = time.time()
    terms = RunTable(store, info, tenant, repo)  # the repository's BM25 statistics, marked stale until the run ends
    store.set_metadata(chunk_recipes=recipes, unfinished_index_runs=unfinished, **terms.begin())

    files = list(walk(root, summary.skipped) if paths is None else listed(root, paths, summary.skipped))
    summary.files_seen = count_seen(files, summary.skipped)
    batch_chunks = max(settings.embedding_batch_size * 4, 256)
    pool = workers.Pool(embedder, settings)
    pool.expect(sum(_size(path) for rel, path in files if rel not in stored))  # new files: a cold run's whole tree
    # files in order, waiting for their chunks:
    # [rel, hash, what was stored, slot in its job, chunking job, skip reason, characters]
    line: deque[list] = deque()
    line_chars = 0  # their text, in characters: what the line holds (texts in jobs, then their chunks)
    group: list[tuple[str, str]] = []  # changed files not yet handed to a chunking job: (rel, text)
    unsent: list[list] = []  # their places in `line`
    group_chars = 0
    writing: deque[tuple[Future, list[str]]] = deque()  # batches being embedded: (points job, stale ids)
    pending: list[tuple[str, str, list[Chunk]]] = []
    pending_chunks = 0
    stale: list[str] = []
    taken = 0
    reader = TreeReader(root.resolve())  # reads what the walk listed, never through a link swapped in since

    def send_group() -> None:
        nonlocal group, unsent, group_chars
        if group:
            job = pool.chunk(group, settings.chunk_chars, settings.chunk_overlap_lines)
            for slot, entry in enumerate(unsent):
                entry[3], entry[4] = slot, job
            group, unsent, group_chars = [], [], 0

    held: list[PointIn] = []  # embedded points not yet stored (fewer than WRITE_POINTS), in order
    held_stale: list[str] = []  # the ids their files had before

    def write(block: bool) -> None:
        """Store the embedded batches at the head of the line, in order, WRITE_POINTS at a time (all
        of them when `block`)."""
        while writing and (block or writing[0][0].done() or len(writing) > pool.batches_in_flight):
            job, stale_ids = writing.popleft()
            held.extend(pool.result(job))
            held_stale.extend(stale_ids)
            room = store.room()
            if room is not None and len(held) >= room:
                pool.rest()  # this write builds a segment: the workers' memory is not held beside the build's
                store_held()
            elif len(held) >= WRITE_POINTS:
                store_held()
        if block and held:
            store_held()

    def store_held() -> None:
        built, stale_ids = held[:], held_stale[:]
        held.clear()
        held_stale.clear()
        terms.replacing(stale_ids)  # read before the upsert overwrites them
        terms.adding(built)
        store.upsert(built)
        summary.chunks_written += len(built)
        new_ids = {p.id for p in built}
        drop = [i for i in stale_ids if i not in new_ids]
        store.delete_ids(drop)
        summary.chunks_deleted += len(drop)

    def flush() -> None:
        nonlocal pending, pending_chunks, stale
        writing.append((pool.points(pending, repo=repo, tenant=tenant) if pending else workers.done([]), stale))
        pending, pending_chunks, stale = [], 0, []
        write(block=False)

    def take(block: bool) -> None:
        """Hand the chunks of files at the head of the line on to batches, in file order."""
        nonlocal pending_chunks, taken, line_chars
        while line and line[0][4] is not None and (
            block or line[0][4].done() or len(line) > pool.files_in_flight or line_chars > pool.chars_in_flight
        ):
            rel, fhash, old, slot, job, reason, chars = line.popleft()
            line_chars -= chars
            taken += 1
            if progress:  # files before this one are done; 100% is reported once the last write is in
                progress(taken - 1, len(files), summary.chunks_written + len(held) + pending_chunks)
            if reason is not None:
                summary.skipped.append(Skipped(rel, reason))
                continue
            chunks = pool.result(job)[slot]
            if not chunks and old is None:
                summary.skipped.append(Skipped(rel, NO_TEXT))
                continue
            summary.files_indexed += 1
            if old is not None:
                stale.extend(old.ids)
            pending.append((rel, fhash, chunks))
            pending_chunks += len(chunks)
            if pending_chunks >= batch_chunks:
                flush()

    try:
        for rel, path in files:
            text, reason = reader.read_text(rel, settings.max_file_bytes)
            if text is None:
                line.append([rel, "", None, 0, _NOTHING, reason or "unreadable", 0])
                continue
            fhash = content_hash(text)
            old = stored.pop(rel, None)
            if old is not None and old.complete(fhash):
                if not rechunk:
                    summary.files_unchanged += 1
                    continue
                summary.rechunked = True
            entry = [rel, fhash, old, 0, None, None, len(text)]
            line.append(entry)
            line_chars += len(text)
            unsent.append(entry)
            group.append((rel, text))
            group_chars += len(text)
            if group_chars >= pool.group_chars or len(group) >= pool.group_files:
                send_group()
                take(block=False)
        send_group()
        take(block=True)
        flush()
        while any(not job.done() for job, _ in writing):  # write what is in while the rest is embedded
            futures.wait([writing[0][0]])
            write(block=False)
        pool.close()  # every point is built: the workers exit before the store's largest moment, the last writes
        write(block=True)
    finally:
        reader.close()
        pool.close()
        summary.worker_died = pool.lost_a_worker
    if progress:
        progress(len(files), len(files), summary.chunks_written)
    # files that are gone (or now ignored/skipped) lose their chunks
    gone = [i for f in stored.values() for i in f.ids]
    summary.files_deleted = len(stored)
    terms.replacing(gone)
    store.delete_ids(gone)
    summary.chunks_deleted += len(gone)
    if paths is None or not rechunk:  # files left out of this run are still chunked the old way
        recipes[scope_key] = recipe
    unfinished.pop(scope_key, None)
    named = terms.finish()  # the table is stored before the metadata names it
    store.set_metadata(last_indexed_at=time.time(), chunk_recipes=recipes, unfinished_index_runs=unfinished, **named)
    store.optimize()  # see EdgeStore.optimize: searches after an index run use the built index
    store.flush()
    summary.seconds = time.perf_counter() - started
    return summary
