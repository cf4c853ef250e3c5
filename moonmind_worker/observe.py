"""Observability for every embed, search, index and overlay action, in one place.

Each action is wrapped once, at its shared function (`pipeline.retrieve_context_pack`,
the embedders, `indexer.index_repository`, the overlay helpers), so every entry
point — CLI, Celery task, gateway — reports the same way without code of its own:

* StatsD timers/counters (`metrics.py`; names and units in docs/operations.md "Metrics"),
* queue events (`events.publish`; each carries job_id, run_id, repo, tenant),
* for a finished search: a breadcrumb line with the `context_pack_id` and sources,
  and the pack JSON cached under the run's artifacts directory ("Context used").

Nothing here may fail or slow an action: every sink swallows its own errors, and
a failure's event is sent before the error propagates (so a command that exits
non-zero has already reported why).
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from . import metrics
from .errors import EXIT_BUDGET, EXIT_USAGE, MoonmindError

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("moonmind_worker.breadcrumbs")

#: Run directory used when a search has no run id (ad-hoc use outside a job).
ADHOC_RUN = "adhoc"
PACKS_DIR = "context-packs"
BREADCRUMBS_FILE = "breadcrumbs.jsonl"

_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")
_made_dirs: set[Path] = set()  # directories already created by this process (one mkdir each, not per search)
_record_packs: contextvars.ContextVar[bool] = contextvars.ContextVar("moonmind_record_packs", default=True)


@contextmanager
def no_artifacts() -> Iterator[None]:
    """Searches inside this block are not cached as "Context used" (probes, evaluations); metrics and events still go out."""
    token = _record_packs.set(False)
    try:
        yield
    finally:
        _record_packs.reset(token)


# --- sinks ----------------------------------------------------------------


def publish(event: str, **fields: Any) -> None:
    """Send a queue event; never raises (events.publish is itself bounded and no-op without a broker)."""
    from . import events

    try:
        events.publish(event, **{k: v for k, v in fields.items() if v is not None})
    except Exception:  # noqa: BLE001 - an event must never break the action it reports
        pass


def _scope(filters: dict | None) -> dict[str, Any]:
    """The repo/tenant/run a search was scoped to, so its events carry the searched scope."""
    f = filters or {}
    return {k: f[k] for k in ("repo", "tenant", "run_id") if f.get(k)}


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
        return _scope(query.filters.scope())
    except Exception:  # noqa: BLE001
        return {}


def search_completed(query: Any, pack: Any, elapsed_ms: float, settings: Any = None) -> None:
    """Report one finished search (also called by transports that receive a pack from elsewhere)."""
    try:
        hits = len(pack.items)
        overlay_hits = sum(1 for i in pack.items if i.trust_class == "overlay")
        metrics.timing("rag.search.latency_ms", elapsed_ms)
        metrics.incr("rag.search.hits", hits)
        scope = _scope(pack.filters)
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
        if _record_packs.get():
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


# --- context-pack artifacts and breadcrumbs ---------------------------------


def run_dir_name(run_id: str | None) -> str:
    """A run id made safe as one directory name (no separators, no dot-files), one per run id.

    An id that had to be changed to be safe (`a*b`, `a?b`, an id with a zero-width space) gets
    a short hash of the original appended: otherwise two runs would share one directory and
    each would list the other's packs as its own "Context used".
    """
    raw = run_id or ""
    name = _UNSAFE_RUN.sub("_", raw).strip("._")[:128]
    if not name:
        return ADHOC_RUN if not raw else "run-" + _digest(raw)
    return name if name == raw else f"{name[:119]}-{_digest(raw)}"


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _settings(settings: Any):
    if settings is not None:
        return settings
    from .settings import get_settings

    return get_settings()


def packs_dir(run_id: str | None, settings: Any = None) -> Path:
    return _settings(settings).artifacts_root / run_dir_name(run_id) / PACKS_DIR


def record_pack(pack: Any, settings: Any = None) -> Path | None:
    """Cache the pack JSON for the run, write one breadcrumb line, and announce it.

    The breadcrumb goes to `<artifacts>/<run>/breadcrumbs.jsonl` and to the
    `moonmind_worker.breadcrumbs` logger (a Celery worker's run log), never to stdout.
    """
    settings = _settings(settings)
    run_id = pack.filters.get("run_id") or settings.run_id
    run_dir = settings.artifacts_root / run_dir_name(run_id)
    target = run_dir / PACKS_DIR / f"{pack.telemetry_id}.json"
    sources = [
        {"source": i.source, "lines": f"L{i.line_start}-L{i.line_end}", "score": i.score, "trust_class": i.trust_class}
        for i in pack.items
    ]
    written: Path | None = None
    try:
        if target.parent not in _made_dirs:
            target.parent.mkdir(parents=True, exist_ok=True)
            _made_dirs.add(target.parent)
        tmp = target.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(pack.model_dump_json(), encoding="utf-8")
        tmp.replace(target)
        written = target
    except OSError:
        _made_dirs.discard(target.parent)  # removed underneath us: create it again next time
    crumb = {
        "event": "context_pack_created",
        "context_pack_id": pack.telemetry_id,
        "retrieved_at": pack.retrieved_at,
        "run_id": run_id or "",
        "job_id": settings.job_id or "",
        "query": pack.query,
        "transport": pack.transport,
        "hits": len(pack.items),
        "latency_ms": pack.usage.latency_ms,
        "sources": sources,
        "artifact": str(written) if written else None,
    }
    line = json.dumps(crumb, separators=(",", ":"))
    try:
        fd = os.open(run_dir / BREADCRUMBS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line + "\n").encode("utf-8"))
        finally:
            os.close(fd)
    except OSError:
        pass
    log.info(line)
    publish(
        "context_pack_created",
        telemetry_id=pack.telemetry_id,
        sources=[s["source"] for s in sources],
        hits=len(sources),
        artifact=str(written) if written else None,
        **_scope(pack.filters),
    )
    return written


def prune_artifacts(settings: Any = None, now: float | None = None) -> int:
    """Delete the cached packs of runs with no search for MOONMIND_ARTIFACTS_RETENTION_DAYS (0 keeps all).

    Why: every search caches its pack, so a long-lived worker host would fill its disk. A run
    goes as a whole (never half of a "Context used" list) once its breadcrumb file, appended
    by every search of the run, is older than the window. Directories without a breadcrumb
    file or packs directory are not ours and are left alone. Returns the runs removed.
    """
    import shutil

    settings = _settings(settings)
    root: Path = settings.artifacts_root
    if not settings.artifacts_retention_days or not root.is_dir():
        return 0
    cutoff = (time.time() if now is None else now) - settings.artifacts_retention_days * 86400
    removed = 0
    for run_dir in root.iterdir():
        if run_dir.is_symlink() or not run_dir.is_dir():
            continue
        marks = [p for p in (run_dir / BREADCRUMBS_FILE, run_dir / PACKS_DIR) if p.exists()]
        if not marks:
            continue
        try:
            last = max(p.stat().st_mtime for p in marks)
        except OSError:
            continue  # removed meanwhile
        if last < cutoff:
            shutil.rmtree(run_dir, ignore_errors=True)
            _made_dirs.discard(run_dir / PACKS_DIR)
            removed += 1
    return removed


def list_packs(run_id: str | None, settings: Any = None) -> list[dict[str, Any]]:
    """Summaries of the packs cached for a run, oldest first (telemetry ids sort by time)."""
    out = []
    d = packs_dir(run_id, settings)
    if not d.is_dir():
        return out
    for path in sorted(d.glob("ctx_*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a pack being written right now, or damaged: skip it
        items = data.get("items", [])
        out.append(
            {
                "telemetry_id": data.get("telemetry_id", path.stem),
                "retrieved_at": data.get("retrieved_at", ""),
                "query": data.get("query", ""),
                "transport": data.get("transport", ""),
                "hits": len(items),
                "sources": [f"{i.get('source')}#L{i.get('line_start')}-L{i.get('line_end')}" for i in items],
                "path": str(path),
            }
        )
    return out


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
                is_mm = isinstance(err, MoonmindError)
                publish(
                    "embedding_aborted",
                    reason=err.code if is_mm else "internal_error",
                    stage="embed",
                    attempts=err.details.get("attempts", 1) if is_mm else 1,
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
