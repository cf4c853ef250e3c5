"""The operations a command needs from the store, one function each, whichever process runs them.

The owner runs them for its clients (`server`); a one-shot command runs the same
function in-process when no owner is alive (`dispatch.execute` → `run`). Arguments
and results are JSON (a command prints the result the same way in both cases); the
arguments carry absolute paths, because the owner's working directory is not the client's.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from ..errors import MoonmindError
from ..job_scope import confine

Progress = Callable[..., None] | None  # (done, total[, chunks])

#: Writes run one at a time in an owner (several clients may ask at once); reads never wait for them.
_WRITES = threading.Lock()


def _resources(settings, collection: str | None = None):
    from .. import runtime

    return runtime.get_embedder(settings), runtime.get_store(settings, collection)


def search(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    """RetrievalQuery fields → ContextPack JSON (validated here, once, by the contract function)."""
    from .. import observe
    from ..contracts import json_dump, parse_query
    from ..retrieval.pipeline import retrieve_context_pack

    transport = args.get("transport", "direct")
    if transport not in ("direct", "gateway"):
        raise MoonmindError("invalid_argument", f"Unknown transport {transport!r}.",
                            "Use the same moonmind-worker version for the CLI and the owner.")
    query = parse_query(args["query"]).model_copy(update={"transport": transport})
    scope = _scope(args.get("scope"))
    embedder, store = _resources(settings)
    from .freshness import annotate

    with observe.no_artifacts():  # recorded below, as the caller gets it: with its freshness
        pack = annotate(retrieve_context_pack(query, settings=settings, embedder=embedder, store=store, scope=scope),
                        settings)
    if args.get("record", True):  # evaluation queries (and a gateway's) are not context this box's agent used
        observe.record_pack(pack, settings)
    return json_dump(pack)


def _navigation_query(args: dict[str, Any]):
    """A related/symbols request's RetrievalQuery and allow-list, validated as a search's are."""
    from ..contracts import parse_query

    transport = args.get("transport", "direct")
    if transport not in ("direct", "gateway"):
        raise MoonmindError("invalid_argument", f"Unknown transport {transport!r}.",
                            "Use the same moonmind-worker version for the CLI and the owner.")
    return parse_query(args["query"]).model_copy(update={"transport": transport}), _scope(args.get("scope"))


def related(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    """A location (RetrievalQuery fields, `query` = PATH#Lx-Ly or a chunk id) → the ContextPack of similar chunks."""
    from ..contracts import json_dump
    from ..retrieval.related import related_pack

    query, scope = _navigation_query(args)
    embedder, store = _resources(settings)
    return json_dump(related_pack(query, settings=settings, embedder=embedder, store=store, scope=scope))


def symbols(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    """A name (RetrievalQuery fields, `query` = NAME) → SymbolsResult JSON: where it is defined, then mentioned."""
    from .. import runtime
    from ..retrieval.symbols import find_symbols

    query, scope = _navigation_query(args)
    # no embedder: a payload lookup and a BM25 search, so a one-shot call never loads the model
    return find_symbols(query, settings=settings, store=runtime.get_store(settings), scope=scope)


def _scope(raw: Any):
    """A gateway token's allow-list sent with a search it forwards (it only narrows what is searched)."""
    if raw is None:
        return None
    from ..store.scopes import Scope

    if not isinstance(raw, dict) or not all(
        isinstance(raw.get(k), list) and all(isinstance(v, str) for v in raw[k]) for k in ("repos", "tenants")
    ):
        raise MoonmindError("invalid_argument", "The owner received a scope it does not understand.",
                            "Use the same moonmind-worker version for the gateway and the owner.")
    return Scope(repos=tuple(raw["repos"]), tenants=tuple(raw["tenants"]))


def index(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    """IndexRequest fields → IndexReport JSON."""
    from ..indexing.indexer import index_repository

    root = Path(args["path"])
    if not root.is_dir():
        raise MoonmindError("invalid_argument", f"{args['path']} is not a directory.", "Pass the root of the repository to index.")
    paths = args.get("paths")  # the owner's watcher re-indexes the files it saw change (freshness.py)
    if paths is not None and not (isinstance(paths, list) and all(isinstance(p, str) for p in paths)):
        raise MoonmindError("invalid_argument", "The owner received index paths it does not understand.",
                            "Use the same moonmind-worker version for the CLI and the owner.")
    embedder, store = _resources(settings)
    started = time.time()
    summary = index_repository(
        root, repo=args["repo"], tenant=args["tenant"], settings=settings, embedder=embedder, store=store, progress=progress,
        paths=paths,
    )
    from . import freshness

    # the owner watches what was indexed from here, and a search checks its hits against it
    freshness.indexed(settings, root, args["repo"], args["tenant"], started)
    return summary.report().model_dump(mode="json")


def overlay_upsert(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    """OverlayUpsertRequest fields → OverlayReport JSON (`line` included)."""
    from ..indexing.overlay import parse_duration, upsert_overlay

    embedder, store = _resources(settings)
    summary = upsert_overlay(
        args["paths"], root=Path(args["root"]), run_id=args.get("run_id") or "", ttl_s=parse_duration(args["ttl"]),
        repo=args.get("repo") or "", tenant=args.get("tenant") or "", settings=settings, embedder=embedder, store=store,
    )
    return {**summary.as_dict(), "line": summary.line()}


def overlay_clean(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    """A run's overlay, or every expired overlay point, removed → OverlayCleanResult JSON."""
    from .. import runtime
    from ..indexing.overlay import clean_overlay

    run_id, expired = args.get("run_id"), bool(args.get("expired"))
    removed = clean_overlay(run_id=run_id, expired=expired, settings=settings, store=runtime.get_store(settings))
    return {"removed": removed, "run_id": run_id, "expired": expired}


def overlay_list(settings, args: dict[str, Any], progress: Progress = None) -> list[dict[str, Any]]:
    from .. import runtime
    from ..indexing.overlay import list_overlay

    return list_overlay(run_id=args.get("run_id"), settings=settings, store=runtime.get_store(settings))


def stats(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    """What the index holds for a repository: the statistics and their printed form."""
    from ..indexing.stats import collect_stats, format_stats

    embedder, store = _resources(settings)
    root = Path(args["root"]) if args.get("root") else None
    result = collect_stats(repo=args["repo"], tenant=args.get("tenant"), root=root, settings=settings, embedder=embedder, store=store)
    if not result.files:  # a mistyped or never indexed repository: say so, with the ones there are
        from ..indexing.stats import indexed_repos, unknown_repo
        from ..job_scope import bound

        raise unknown_repo(args["repo"], args.get("tenant"), indexed_repos(store, bound(settings, "tenant")))
    return {"stats": result.to_dict(), "text": format_stats(result)}


def repos(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    """Every indexed repository (canonical chunks), in one tenant or all: `rag repos`. A read: no collection is none."""
    from .. import runtime
    from ..indexing.stats import indexed_repos

    store = runtime.get_store(settings)
    held = indexed_repos(store, args.get("tenant") or None) if store.info() is not None else []
    return {"collection": store.collection, "repos": held}


def chunks(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    """How many canonical chunks a repository holds (in one tenant, or all): what `job start` checks."""
    from ..store.guardrails import check_collection
    from ..store.scopes import canonical_repo

    embedder, store = _resources(settings)
    check_collection(store, embedder)
    return {"chunks": store.count(canonical_repo(str(args["repo"]), args.get("tenant") or None))}


def checks(settings, args: dict[str, Any], progress: Progress = None) -> list[dict[str, Any]]:
    """The doctor's direct checks (embedding, store, collection, model, a real query) run by this process."""
    from ..jobs.doctor import direct_checks

    return [asdict(c) for c in direct_checks(settings)]


def sync_embedding(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    from .. import runtime
    from ..indexing.sync import sync_embedding as sync

    collection = args.get("collection")
    result = sync(
        runtime.get_store(settings, collection), runtime.get_embedder(settings),
        batch_size=settings.embedding_batch_size, dry_run=bool(args.get("dry_run")), progress=progress,
    )
    return {"result": result.to_dict(), "line": result.plan.line() if args.get("dry_run") else result.line()}


def watch_state(settings, args: dict[str, Any], progress: Progress = None) -> dict[str, Any]:
    """What this process watches and how many re-index passes it ran (owner/freshness.py)."""
    from .freshness import state

    return state(settings, args)


def enqueue(settings, args: dict[str, Any], progress: Progress = None) -> Any:
    """Send a Celery task with the client's broker settings and wait for its result (or return its id).

    Why here: the warm owner keeps Celery loaded and its broker connections open, so a queued
    command costs the thin client nothing but the socket round trip.
    """
    from ..transports.queue_client import run_task

    timeout = args.get("timeout_s")
    return run_task(
        str(args["task"]), dict(args["kwargs"]), queue=str(args["queue"]), broker_url=settings.celery_broker_url,
        backend_url=settings.result_backend, timeout_s=None if timeout is None else float(timeout),
        wait=bool(args.get("wait", True)), progress=progress if args.get("progress") else None,
    )


OPS: dict[str, Callable[..., Any]] = {
    "search": search,
    "related": related,
    "symbols": symbols,
    "index": index,
    "overlay_upsert": overlay_upsert,
    "overlay_clean": overlay_clean,
    "overlay_list": overlay_list,
    "stats": stats,
    "repos": repos,
    "checks": checks,
    "chunks": chunks,
    "sync_embedding": sync_embedding,
    "enqueue": enqueue,
    "freshness": watch_state,
}
WRITES = frozenset({"index", "overlay_upsert", "overlay_clean", "sync_embedding"})


def run(op: str, args: dict[str, Any], settings, *, progress: Progress = None) -> Any:
    """Run one operation in this process: for the owner's clients, or a one-shot command's own (writes one at a time)."""
    fn = OPS.get(op)
    if fn is None:
        raise MoonmindError("invalid_argument", f"Unknown operation {op!r}.",
                            "Use the same moonmind-worker version for the CLI and the owner.")
    # here, where every transport's operation runs (one-shot, owner, worker): a job's scope is a ceiling
    args = confine(op, args, settings)
    if op in WRITES:
        with _WRITES:
            return fn(settings, args, progress)
    return fn(settings, args, progress)
