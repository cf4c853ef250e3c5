"""Wrappers for every embed, search, index and overlay action: metrics, events, artifacts, in one place."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, TypeVar

from ..errors import EXIT_BUDGET, EXIT_USAGE, MoonmindError
from . import metrics
from .artifacts import record_pack, recording
from .sinks import publish, scope_fields

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("moonmind_worker.breadcrumbs")

def _mark(err: BaseException) -> bool:
    """True the first time an error is seen, so one failure yields one abort event."""
    if getattr(err, "_moonmind_observed", False):
        return False
    try:
        err._moonmind_observed = True  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass
    return True


# --- search ---------------------------------------------------------------


def search(fn: F) -> F:
    """Wrap the retrieval pipeline: metrics, events, breadcrumb and cached pack for every search."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        started = time.perf_counter()
        query = args[0] if args else kwargs.get("query")
        settings = kwargs.get("settings")
        try:
            pack = fn(*args, **kwargs)
        except MoonmindError as err:
            search_failed(query, err, (time.perf_counter() - started) * 1000)
            raise
        except Exception as exc:
            metrics.incr("rag.search.errors")
            if _mark(exc):
                publish("embedding_aborted", reason="internal_error", stage="search", attempts=1, **_query_scope(query))
            raise
        search_completed(query, pack, (time.perf_counter() - started) * 1000, settings)
        return pack

    return wrapper  # type: ignore[return-value]


def _query_scope(query: Any) -> dict[str, Any]:
    try:
        return scope_fields(query.filters.scope())
    except Exception:  # noqa: BLE001
        return {}


def search_completed(query: Any, pack: Any, elapsed_ms: float, settings: Any = None) -> None:
    """Report one finished search (also called by transports that receive a pack from elsewhere)."""
    try:
        hits = len(pack.items)
        overlay_hits = sum(1 for i in pack.items if i.trust_class == "overlay")
        metrics.timing("rag.search.latency_ms", elapsed_ms)
        metrics.incr("rag.search.hits", hits)
        scope = scope_fields(pack.filters)
        publish(
            "qdrant_query_completed",
            telemetry_id=pack.telemetry_id,
            hits=hits,
            overlay_hits=overlay_hits,
            latency_ms=round(elapsed_ms, 2),
            transport=pack.transport,
            top_k=pack.top_k,
            best_score=pack.best_score,
            tokens=pack.usage.tokens,
            **scope,
        )
        if pack.truncated and pack.budgets is not None and pack.budgets.tokens:
            budget_exceeded("tokens", pack.budgets.tokens, pack.usage.tokens, outcome="truncated", scope=scope)
        if recording():
            record_pack(pack, settings)
    except Exception:  # noqa: BLE001 - reporting never fails a search
        pass


def search_failed(query: Any, err: MoonmindError, elapsed_ms: float) -> None:
    """Report a failed search before the error reaches the caller."""
    try:
        metrics.incr("rag.search.errors")
        scope = _query_scope(query)
        if err.exit_code == EXIT_BUDGET:
            kind = "latency_ms" if err.code == "latency_budget_exceeded" else "tokens"
            limit = getattr(getattr(query, "budgets", None), kind, None)
            spent = err.details.get(kind, round(elapsed_ms, 2) if kind == "latency_ms" else None)
            budget_exceeded(kind, limit, spent, outcome="aborted", scope=scope)
        elif err.exit_code != EXIT_USAGE and _mark(err):
            publish(
                "embedding_aborted",
                reason=err.code,
                stage="search",
                attempts=err.details.get("attempts", 1),
                latency_ms=round(elapsed_ms, 2),
                **scope,
            )
    except Exception:  # noqa: BLE001
        pass


def budget_exceeded(budget_type: str, limit: Any, spent: Any, *, outcome: str, scope: dict | None = None) -> None:
    """A token or latency budget was hit (`outcome`: aborted, or truncated to fit)."""
    metrics.incr(f"rag.budget.exceeded.{metrics.name_part(budget_type)}")
    publish(
        "budget_exceeded",
        budget_type=budget_type,
        budget_limit=limit,
        budget_spent=spent,
        outcome=outcome,
        **(scope or {}),
    )


# --- embedding ------------------------------------------------------------


def embed(fn: F) -> F:
    """Wrap an embedder's batch call (`self, texts`): latency, text count, and the abort event on failure."""

    @functools.wraps(fn)
    def wrapper(self: Any, texts: list[str], *args: Any, **kwargs: Any):
        started = time.perf_counter()
        try:
            out = fn(self, texts, *args, **kwargs)
        except Exception as err:
            metrics.incr("rag.embed.errors")
            if _mark(err):
                mm = err if isinstance(err, MoonmindError) else None
                publish(
                    "embedding_aborted",
                    reason=mm.code if mm else "internal_error",
                    stage="embed",
                    attempts=mm.details.get("attempts", 1) if mm else 1,
                    provider=getattr(self, "provider", "static"),
                    model=getattr(self, "name", ""),
                    texts=len(texts),
                    latency_ms=round((time.perf_counter() - started) * 1000, 2),
                )
            raise
        metrics.timing("rag.embed.latency_ms", (time.perf_counter() - started) * 1000)
        metrics.incr("rag.embed.count", len(texts))
        return out

    return wrapper  # type: ignore[return-value]


# --- indexing -------------------------------------------------------------


def index(fn: F) -> F:
    """Wrap `index_repository`: chunks written and duration, plus a `repository_indexed` event."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        summary = fn(*args, **kwargs)
        try:
            metrics.incr("rag.index.chunks", summary.chunks_written)
            metrics.timing("rag.index.latency_ms", summary.seconds * 1000)
            publish(
                "repository_indexed",
                repo=summary.repo,
                tenant=summary.tenant,
                files_seen=summary.files_seen,
                files_indexed=summary.files_indexed,
                files_deleted=summary.files_deleted,
                chunks_written=summary.chunks_written,
                chunks_deleted=summary.chunks_deleted,
                latency_ms=round(summary.seconds * 1000, 2),
            )
        except Exception:  # noqa: BLE001
            pass
        return summary

    return wrapper  # type: ignore[return-value]


# --- workspace overlay ----------------------------------------------------


def overlay_upsert(fn: F) -> F:
    """Wrap `upsert_overlay`: latency, chunks written, and an `overlay_upserted` event."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        started = time.perf_counter()
        try:
            summary = fn(*args, **kwargs)
        except Exception:
            metrics.incr("rag.overlay.errors")
            raise
        try:
            elapsed = (time.perf_counter() - started) * 1000
            metrics.timing("rag.overlay.upsert.latency_ms", elapsed)
            metrics.incr("rag.overlay.chunks", summary.chunks_written)
            publish(
                "overlay_upserted",
                run_id=summary.run_id,
                repo=summary.repo,
                tenant=summary.tenant,
                files=len(summary.files),
                tombstones=len(summary.tombstones),
                skipped=len(summary.skipped),
                chunks_written=summary.chunks_written,
                chunks_replaced=summary.chunks_replaced,
                expires_at=summary.expires_at,
                latency_ms=round(elapsed, 2),
            )
        except Exception:  # noqa: BLE001
            pass
        return summary

    return wrapper  # type: ignore[return-value]


def overlay_clean(fn: F) -> F:
    """Wrap `clean_overlay`: a TTL sweep reports `overlay_swept`, a run clean `overlay_cleaned` (points removed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        started = time.perf_counter()
        try:
            removed = fn(*args, **kwargs)
        except Exception:
            metrics.incr("rag.overlay.errors")
            raise
        try:
            run_id = (kwargs.get("run_id") or "").strip() or None
            sweep = bool(kwargs.get("expired")) and run_id is None
            metrics.incr("rag.overlay.swept" if sweep else "rag.overlay.cleaned", removed)
            fields: dict[str, Any] = {
                "removed": removed,
                "expired_only": bool(kwargs.get("expired")),
                "latency_ms": round((time.perf_counter() - started) * 1000, 2),
            }
            if run_id is not None:
                fields["run_id"] = run_id
            publish("overlay_swept" if sweep else "overlay_cleaned", **fields)
        except Exception:  # noqa: BLE001
            pass
        return removed

    return wrapper  # type: ignore[return-value]
