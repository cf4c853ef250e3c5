"""`moonmind rag sync-embedding`: move a collection to the configured embedding model without downtime.

Why not re-index: the stored chunks already are the source of truth (text,
offsets, hashes); re-embedding them needs no checkout and keeps every point id.
The new vectors go into a separate physical collection; searches keep using
the old one until a single atomic switch (a Qdrant alias update on a server,
one rename of `meta.json` on the embedded store); only then is the old data
dropped. Point ids are kept, so re-running after an interruption skips what is
already in the target (same id, same chunk_hash) and can never duplicate.

A crash between the switch and the drop leaves the old data on disk with nothing pointing at
it; the new collection names it (`REPLACES` in its metadata, written before the switch), so
the next run finds it, drops it and says so.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from typing import Callable

from ..contracts import CANONICAL, PAYLOAD_SCHEMA_VERSION, READABLE_SCHEMA_VERSIONS
from ..embedding import Embedder
from ..errors import MoonmindError
from ..store import PointIn, SparseVec, lexstats
from ..text import lexical
from .points import titled_text

#: Rounds of catch-up with writes that landed in the old collection while the sync embedded.
CATCH_UP_ROUNDS = 3
#: Metadata key of a synced collection: the physical collection it replaced at the switch
#: (the collection's own name when that held its data itself).
REPLACES = "replaces"


@dataclass
class SyncPlan:
    collection: str
    source_model: str | None
    source_dimensions: int
    target_model: str
    target_dimensions: int
    target: str  # the physical collection the name will point at
    points: int  # chunks in the collection now
    already_done: int  # chunks already in the target (an interrupted sync)
    to_embed: int
    up_to_date: bool  # the collection is already on the configured model: nothing to do
    leftover: str | None = None  # old data a sync that crashed before its drop left behind (see REPLACES)

    def line(self) -> str:
        note = f"; would drop {self.leftover}, old data an interrupted sync left behind" if self.leftover else ""
        if self.up_to_date:
            return (f"{self.collection} is already embedded with {self.target_model} "
                    f"(dim={self.target_dimensions}); nothing to sync{note}")
        return (f"{self.collection}: re-embed {self.to_embed} of {self.points} chunks "
                f"({self.already_done} already done) from {self.source_model} (dim={self.source_dimensions}) "
                f"to {self.target_model} (dim={self.target_dimensions}) into {self.target}, then switch{note}")


@dataclass
class SyncResult:
    plan: SyncPlan
    embedded: int = 0
    switched: bool = False
    dropped: str | None = None  # what was dropped after the switch
    dropped_leftover: str | None = None  # old data of an earlier, interrupted sync, dropped by this run
    seconds: float = 0.0

    def line(self) -> str:
        note = (f"; dropped {self.dropped_leftover}, old data an interrupted sync left behind"
                if self.dropped_leftover else "")
        if self.plan.up_to_date:
            return (f"{self.plan.collection} is already embedded with {self.plan.target_model} "
                    f"(dim={self.plan.target_dimensions}); nothing to sync{note}")
        return (f"synced {self.plan.collection}: {self.embedded} chunks re-embedded with {self.plan.target_model} "
                f"(dim={self.plan.target_dimensions}), {self.plan.points} in total; now served from "
                f"{self.plan.target}; old data ({self.plan.source_model}) dropped{note}; {self.seconds:.2f}s")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["plan"] = asdict(self.plan)
        return out


def target_name(collection: str, model: str, dimensions: int, current: str | None) -> str:
    """Deterministic per (model, dims), so a re-run resumes the same target; two slots so a re-sync never
    writes into the collection being served."""
    h = hashlib.sha256(f"{model}\0{dimensions}".encode()).hexdigest()[:10]
    a, b = f"{collection}__{h}_a", f"{collection}__{h}_b"
    return b if current == a else a


def _read_source(store) -> dict[str, dict]:
    return {hit.id: hit.payload for hit in store.scroll(None, True)}


def _read_done(target) -> dict[str, str]:
    if target.info() is None:
        return {}
    return {hit.id: hit.payload.get("chunk_hash", "") for hit in target.scroll(None, ["chunk_hash"])}


def _todo(source: dict[str, dict], done: dict[str, str]) -> list[str]:
    return sorted(i for i, p in source.items() if done.get(i) != p.get("chunk_hash"))


def _leftover(store, info, target: str) -> str | None:
    """The physical collection the last switch replaced, when it is still there: a crash kept it from being dropped.

    Never the collection being served, nor the target this run would resume (an unfinished sync's work).
    """
    name = info.extra.get(REPLACES)
    if not isinstance(name, str) or name == target:
        return None
    return name if store.has_physical(None if name == info.name else name) else None


def _waiting_for_lock(fn, wait_s: float = 30.0):
    """Run fn, waiting while another process briefly holds the embedded store (a search)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return fn()
        except MoonmindError as err:
            if err.code != "store_busy" or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def plan_sync(store, embedder: Embedder):
    """What a sync would do (also the first step of a real one); reads, never writes.

    Returns (plan, source payloads by id, target chunk_hash by id, the target store).
    """
    info = store.info()
    if info is None:
        raise MoonmindError(
            "collection_missing",
            f"Collection {store.collection} does not exist yet.",
            "Run `moonmind rag index PATH --repo NAME` to create and fill it; there is nothing to sync.",
        )
    if info.schema_version not in READABLE_SCHEMA_VERSIONS:
        raise MoonmindError(
            "schema_unsupported",
            f"Collection {info.name} uses payload schema v{info.schema_version}; this version reads "
            f"{sorted(READABLE_SCHEMA_VERSIONS)}, so its chunks cannot be re-embedded.",
            "Re-index into a fresh collection (`moonmind rag index PATH --repo NAME`) or upgrade moonmind-worker.",
        )
    dims = embedder.dimensions
    target = target_name(info.name, embedder.name, dims, store.alias_target())
    # a collection with the engine's collection-wide IDF is rebuilt too: the new one keeps BM25 statistics per repository
    up_to_date = info.model == embedder.name and info.dimensions == dims and lexstats.scoped(info)
    source: dict[str, dict] = {}
    done: dict[str, str] = {}
    target_store = store.sibling(target)
    if not up_to_date:
        source = _read_source(store)
        done = _read_done(target_store)
    todo = _todo(source, done)
    plan = SyncPlan(
        collection=info.name, source_model=info.model, source_dimensions=info.dimensions,
        target_model=embedder.name, target_dimensions=dims, target=target,
        points=len(source) if not up_to_date else info.points,
        already_done=len(source) - len(todo), to_embed=len(todo), up_to_date=up_to_date,
        leftover=_leftover(store, info, target),
    )
    return plan, source, done, target_store


def _points(embedder: Embedder, ids: list[str], source: dict[str, dict]) -> list[PointIn]:
    """Re-embed stored chunks exactly as the indexer embedded them (same text, same sparse vector)."""
    texts = []
    for i in ids:
        p = source[i]
        texts.append(titled_text(p["path"], p.get("section_title", ""), p["text"]))
    vectors = embedder.embed_documents(texts)
    out = []
    for i, text, vec in zip(ids, texts, vectors):
        idx, values = lexical.document_vector(text)
        payload = dict(source[i])
        payload["model_version"] = embedder.name
        out.append(PointIn(id=i, dense=vec, sparse=SparseVec(idx, values), payload=payload))
    return out


def sync_embedding(
    store,
    embedder: Embedder,
    *,
    batch_size: int = 64,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SyncResult:
    """Re-embed every chunk into the target, catch up with concurrent writes, switch, drop the old data."""
    started = time.perf_counter()
    plan, source, done, target = plan_sync(store, embedder)
    result = SyncResult(plan)
    if plan.leftover and not dry_run:
        store.drop_physical(None if plan.leftover == plan.collection else plan.leftover)
        result.dropped_leftover = plan.leftover
    if dry_run or plan.up_to_date:
        target.close()
        return result
    tinfo = target.info()
    if tinfo is None or tinfo.dimensions != plan.target_dimensions or tinfo.model != plan.target_model:
        target.create(plan.target_dimensions, plan.target_model, PAYLOAD_SCHEMA_VERSION)
        done = {}
    store.release()  # on the embedded store, other processes may search the old data while we embed

    for _ in range(CATCH_UP_ROUNDS + 1):
        todo = _todo(source, done)
        total = len(todo)
        for start in range(0, total, batch_size):
            ids = todo[start : start + batch_size]
            target.upsert(_points(embedder, ids, source))
            target.flush()  # each batch is durable: an interruption loses at most one batch
            result.embedded += len(ids)
            for i in ids:
                done[i] = source[i].get("chunk_hash", "")
            if progress:
                progress(start + len(ids), total)
        stale = sorted(set(done) - set(source))
        target.delete_ids(stale)
        for i in stale:
            done.pop(i)
        # Writes may have landed in the old collection meanwhile: re-read it (this re-takes the embedded
        # store's lock, held from here through the switch) and go round again until nothing is left.
        source = _waiting_for_lock(lambda: _read_source(store))
        if not _todo(source, done) and set(done) == set(source):
            break
    else:
        raise MoonmindError(
            "store_busy",
            f"Collection {plan.collection} kept changing during the sync; nothing was switched.",
            "Re-run `moonmind rag sync-embedding` when indexing is idle; finished chunks are kept.",
        )

    old_info = store.info()
    meta = {k: v for k, v in (old_info.extra if old_info else {}).items()
            if k not in ("dimensions", "model", "schema_version", "alias")}
    # a dict, not keywords: a collection synced before carries these keys already
    meta.update(synced_from=plan.source_model, synced_at=time.time())
    # named before the switch: a crash between the switch and the drop leaves the next run this name
    meta[REPLACES] = store.alias_target() or plan.collection
    # each repository's term table, counted from the new collection's points before its metadata names them
    meta.update(lexstats.rebuild_all(target, {(str(p.get("tenant")), str(p.get("repo"))) for p in source.values()
                                              if p.get("trust_class") == CANONICAL}))
    target.set_metadata(**meta)
    target.optimize()
    target.flush()
    target.close()  # the embedded target's own lock: readers reach it through the alias from now on
    old = store.switch_alias(plan.target)
    result.switched = True
    store.drop_physical(old)
    result.dropped = old or f"{plan.collection} (its own data)"
    result.seconds = time.perf_counter() - started
    return result
