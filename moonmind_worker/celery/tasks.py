"""The RAG tasks: thin adapters over the same operations the CLI runs (`moonmind_worker.operations`).

Arguments and results are the pydantic contracts as JSON, validated on both sides of the
task: arguments on receipt (with the same function the sync CLI uses, e.g.
`contracts.parse_query`), results by being produced from the contract models. The CLI's
queue mode sends the request fields unvalidated and prints the result without
re-validating it (it imports no pydantic; see `moonmind_worker.cli.rag`), so this is
where validation happens — once. A task that fails raises `RagTaskError(code, message,
action)` — JSON-safe, so any client gets the same error envelope the sync CLI prints.

Delivery semantics:
* search — acknowledged on receipt, no task-level retry: a retried search would arrive
  after its caller's latency budget; the store client already retries transient errors;
* writes (index, overlay upsert/clean, sweep) — ``acks_late`` + ``reject_on_worker_lost``:
  a worker killed mid-write leaves the message to be redelivered, and point ids are
  deterministic, so finishing it twice writes the same points once;
  transient failures (store unreachable or busy) retry with exponential backoff;
* soft/hard time limits per task (enforced by the prefork pool; documented in docs/celery.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import ValidationError

from moonmind_worker import operations
from moonmind_worker.errors import MoonmindError, RagTaskError, TransientTaskError, task_error
from moonmind_worker.transports import queue_client

from .worker import app

if TYPE_CHECKING:
    from moonmind_worker.wire import QueryFields

#: Write tasks: redelivered when their worker dies (their writes are idempotent), and retried by
#: Celery itself on a transient failure (errors.TransientError), with exponential backoff and jitter.
WRITE_OPTIONS: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": (TransientTaskError,),
    "max_retries": 4,
    "retry_backoff": 2,
    "retry_backoff_max": 30,
    "retry_jitter": True,
}


def _fail(err: MoonmindError) -> RagTaskError:
    return task_error(err)


def _validate(model, data: Any, what: str):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RagTaskError("invalid_argument", f"Invalid {what}: {exc.errors()[0]['msg']}.", "Fix the task arguments.") from None


T = TypeVar("T")


def _in_job(scope: dict | None, operation: Callable[[Any], T]) -> T:
    """Run `operation(settings)` where the store is: here when this worker owns it, else on the box's owner.

    Why not always here: a worker started beside another owner (`moonmind serve`, the gateway)
    cannot open the embedded store; its tasks are then served by that owner instead of failing.
    A task sent from inside a job (`job_scope.task_kwargs`) runs with the job's scope in its settings,
    so the operation confines it (`job_scope.confine`, where every operation runs) as the job's own would.
    """
    from moonmind_worker.celery.worker import serve_the_box
    from moonmind_worker.job_scope import JobScope
    from moonmind_worker.observe.events import scope_override
    from moonmind_worker.settings import get_settings

    job = JobScope.from_wire(scope) if scope is not None else None
    settings = get_settings()
    serve_the_box(settings)  # the owner this worker used may have exited: own the store then
    token = None
    if job is not None:  # its events (here, or on the box's owner) name the job, not this worker
        settings = settings.model_copy(update={k: v for k, v in job.event_scope().items() if v})
        token = scope_override.set(job.event_scope())
    try:
        return operation(settings)
    finally:
        if token is not None:
            scope_override.reset(token)


#: A running task's progress is stored at most this often (a caller waiting on it polls the state).
PROGRESS_EVERY_S = 1.0


def _progress_state(task: Any):
    """A progress callback that stores (done, total[, chunks]) as the task's PROGRESS state for its caller."""
    import time

    last = [0.0]

    def report(done: int, total: int, chunks: int | None = None) -> None:
        now = time.monotonic()
        if done != total and now - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = now
        meta = {"done": done, "total": total, **({} if chunks is None else {"chunks": chunks})}
        try:
            task.update_state(state="PROGRESS", meta=meta)
        except Exception:  # noqa: BLE001 - progress is a courtesy: the index goes on without it
            pass

    return report


@app.task(name=queue_client.SEARCH, bind=True, soft_time_limit=30, time_limit=40)
def search(self, query: dict, scope: dict | None = None) -> dict:
    """RetrievalQuery JSON → ContextPack JSON, through `pipeline.retrieve_context_pack`."""
    try:
        # validated by `contracts.parse_query` where it runs
        return dict(_in_job(scope, lambda settings: operations.search(settings, cast("QueryFields", query))))
    except MoonmindError as err:
        raise _fail(err) from None
    except SoftTimeLimitExceeded:
        raise RagTaskError(
            "task_timeout", "The search hit the worker's time limit (30 s).",
            "Narrow the query or check the store.",
        ) from None


@app.task(name=queue_client.INDEX, bind=True, soft_time_limit=3600, time_limit=3660, **WRITE_OPTIONS)
def index(self, request: dict, scope: dict | None = None) -> dict:
    """IndexRequest JSON → IndexReport JSON, through `indexer.index_repository` (incremental, idempotent)."""
    from pathlib import Path

    from moonmind_worker.contracts import IndexRequest

    req = _validate(IndexRequest, request, "index request")
    if not Path(req.path).is_dir():
        raise RagTaskError(
            "invalid_argument", f"{req.path} is not a directory on the worker.",
            "Pass a path the worker can read (a shared workspace).",
        )
    try:
        progress = _progress_state(self)
        return dict(_in_job(scope, lambda settings: operations.index(
            settings, {"path": req.path, "repo": req.repo, "tenant": req.tenant}, progress=progress)))
    except MoonmindError as err:
        raise _fail(err) from None
    except SoftTimeLimitExceeded:
        raise RagTaskError(
            "task_timeout", "Indexing hit the worker's time limit (1 h); progress is kept.",
            "Re-run: unchanged files are skipped.",
        ) from None


@app.task(name=queue_client.OVERLAY_UPSERT, bind=True, soft_time_limit=300, time_limit=330, **WRITE_OPTIONS)
def overlay_upsert(self, request: dict, scope: dict | None = None) -> dict:
    """OverlayUpsertRequest JSON → OverlayReport JSON, through `overlay.upsert_overlay` (deterministic ids)."""
    from moonmind_worker.contracts import OverlayReport, OverlayUpsertRequest

    req = _validate(OverlayUpsertRequest, request, "overlay upsert request")
    try:
        report = _in_job(scope, lambda settings: operations.overlay_upsert(settings, {
            "paths": req.paths, "root": req.root, "run_id": req.run_id, "ttl": req.ttl, "repo": req.repo, "tenant": req.tenant,
        }))
    except MoonmindError as err:
        raise _fail(err) from None
    except SoftTimeLimitExceeded:
        raise RagTaskError(
            "task_timeout", "The overlay upsert hit the worker's time limit (5 min).",
            "Upsert fewer files per call.",
        ) from None
    return OverlayReport.model_validate(report).model_dump(mode="json")


@app.task(name=queue_client.OVERLAY_CLEAN, bind=True, soft_time_limit=120, time_limit=150, **WRITE_OPTIONS)
def overlay_clean(self, request: dict, scope: dict | None = None) -> dict:
    """OverlayCleanRequest JSON → OverlayCleanResult JSON, through `overlay.clean_overlay` (a filter delete: idempotent)."""
    return _clean(self, request, scope)


@app.task(name=queue_client.SWEEP, bind=True, soft_time_limit=120, time_limit=150, **WRITE_OPTIONS)
def sweep_expired_overlays(self) -> dict:
    """The beat job: remove every expired overlay point (never a live one), and cached packs past retention."""
    from moonmind_worker.contracts import SweepResult
    from moonmind_worker.observe import prune_artifacts
    from moonmind_worker.settings import get_settings

    removed = _clean(self, {"run_id": None, "expired": True})
    return SweepResult(**removed, artifacts_pruned=prune_artifacts(get_settings())).model_dump(mode="json")


def _clean(task, request: dict, scope: dict | None = None) -> dict:
    from moonmind_worker.contracts import OverlayCleanRequest, OverlayCleanResult

    req = _validate(OverlayCleanRequest, request, "overlay clean request")
    try:
        result = _in_job(scope, lambda settings: operations.overlay_clean(settings, run_id=req.run_id, expired=req.expired))
    except MoonmindError as err:
        raise _fail(err) from None
    return OverlayCleanResult(**result).model_dump(mode="json")

