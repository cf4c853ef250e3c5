"""Every operation an entry point asks of this box, one typed function each.

The CLI, the MCP tools, the Celery tasks, the gateway's direct path and the job hook call these; none
names an operation by string or builds its arguments by hand. Each runs on the box's owner when one
serves the store, else in this process (`owner.dispatch.execute`); either way `owner.ops` validates the
request into its contract once, where it runs, and answers the contract's JSON.

Why the JSON shapes (`wire.py`) and not the pydantic models here: this module is on the thin client's
path, and importing pydantic would triple a served `rag search`. The shapes are held to the models by
`tests/test_wire_contracts.py`.
"""

from __future__ import annotations

from .owner.dispatch import execute

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any

    from .owner.client import Progress
    from .wire import (
        ContextPackJSON,
        IndexReportJSON,
        IndexRequestJSON,
        OverlayCleanResultJSON,
        OverlayReportJSON,
        OverlayRowJSON,
        OverlayUpsertRequestJSON,
        QueryFields,
        ReposJSON,
        StatsJSON,
        SymbolsResultJSON,
        SyncEmbeddingJSON,
    )

#: Extra wait past a latency budget, so the owner's own latency_budget_exceeded (with its measurement) arrives.
GRACE_S = 0.5


def _with_caller_defaults(settings: Any, query: QueryFields, keys: tuple[str, ...]) -> QueryFields:
    """The caller's own RAG_SIMILARITY_TOP_K / RAG_SCORE_THRESHOLD where the request leaves them open.

    Why here, once: a job's environment decides its searches' defaults whichever process runs them,
    and the owner runs them with its own settings.
    """
    fields_set = settings.model_fields_set
    out = dict(query)
    for key in keys:
        if out.get(key) is None and key in fields_set:
            out[key] = getattr(settings, key)
    return out  # type: ignore[return-value]  # the same keys, filled in


def search(settings: Any, query: QueryFields, *, record: bool = True, timeout_s: float | None = None) -> ContextPackJSON:
    """RetrievalQuery → ContextPack. `record=False`: not context an agent used (evaluation queries)."""
    query = _with_caller_defaults(settings, query, ("top_k", "score_threshold"))
    budgets = query.get("budgets") or {}
    if timeout_s is None and budgets.get("latency_ms"):
        timeout_s = budgets["latency_ms"] / 1000 + GRACE_S
    args: dict[str, Any] = {"query": query}
    if not record:
        args["record"] = False
    return execute(settings, "search", args, timeout_s=timeout_s)


def related(settings: Any, query: QueryFields) -> ContextPackJSON:
    """A location (`query` = PATH#Lx-Ly or a chunk id) → the ContextPack of the chunks most like it."""
    return execute(settings, "related", {"query": _with_caller_defaults(settings, query, ("top_k",))})


def symbols(settings: Any, query: QueryFields) -> SymbolsResultJSON:
    """A name (`query` = NAME) → SymbolsResult: where it is defined, then where it is mentioned."""
    return execute(settings, "symbols", {"query": _with_caller_defaults(settings, query, ("top_k",))})


def index(settings: Any, request: IndexRequestJSON, *, progress: Progress | None = None) -> IndexReportJSON:
    """IndexRequest → IndexReport (the owner's watcher re-indexes changed paths itself: owner/freshness.py)."""
    return execute(settings, "index", dict(request), progress=progress)


def overlay_upsert(settings: Any, request: OverlayUpsertRequestJSON) -> OverlayReportJSON:
    """OverlayUpsertRequest → OverlayReport (with its printed `line`)."""
    return execute(settings, "overlay_upsert", dict(request))


def overlay_clean(settings: Any, *, run_id: str | None, expired: bool = False) -> OverlayCleanResultJSON:
    """One run's overlay removed, or (`expired`) every expired overlay point: the TTL sweep."""
    return execute(settings, "overlay_clean", {"run_id": run_id, "expired": expired})


def overlay_list(settings: Any, *, run_id: str | None) -> list[OverlayRowJSON]:
    """What is overlaid (one run's, or every run's), with expiry."""
    return execute(settings, "overlay_list", {"run_id": run_id})


def stats(settings: Any, *, repo: str, tenant: str | None, root: str | None = None) -> StatsJSON:
    """What the index holds for a repository; `root` (absolute): also what changed on disk since."""
    return execute(settings, "stats", {"repo": repo, "tenant": tenant, "root": root})


def repos(settings: Any, *, tenant: str | None) -> ReposJSON:
    """Every indexed repository, in one tenant or all."""
    return execute(settings, "repos", {"tenant": tenant})


def chunk_count(settings: Any, *, repo: str, tenant: str | None) -> int:
    """How many canonical chunks a repository holds (after the collection's guardrail checks)."""
    return int(execute(settings, "chunks", {"repo": repo, "tenant": tenant})["chunks"])


def sync_embedding(settings: Any, *, collection: str | None, dry_run: bool,
                   progress: Progress | None = None) -> SyncEmbeddingJSON:
    """Re-embed a collection with the configured model (or, `dry_run`, only plan it)."""
    return execute(settings, "sync_embedding", {"collection": collection, "dry_run": dry_run},
                   collection=collection, progress=progress)


def enqueue(settings: Any, task: str, kwargs: dict[str, Any], *, queue: str, timeout_s: float | None,
            wait: bool = True, progress: Progress | None = None) -> Any:
    """Send a Celery task with this caller's broker settings; its result (or, `wait=False`, its id).

    Why through the owner: a warm owner keeps Celery loaded and its broker connections open. It
    never starts one: sending a task does not need the store.
    """
    args = {"task": task, "kwargs": kwargs, "queue": queue, "timeout_s": timeout_s, "wait": wait,
            "progress": progress is not None}
    return execute(settings, "enqueue", args, timeout_s=None if timeout_s is None else timeout_s + 5.0,
                   start_owner=False, progress=progress)
