"""Send a Celery task and wait for its result, through Celery itself: any broker and result backend it supports.

`run_task` is `send_task` + `AsyncResult.get` on a small client app (one per broker and
backend, cached: a warm owner reuses its connections). "No worker consuming" is known before
anything is sent: on AMQP the broker counts the queue's consumers itself (a passive declare);
on Redis, which cannot, workers of this package keep a heartbeat in the sorted set
``moonmind:consumers:<queue>`` (member = worker hostname, score = unix time).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from ..errors import MoonmindError, redact

#: Stable task names (the `tasks` package registers exactly these).
from ..task_names import INDEX, OVERLAY_CLEAN, OVERLAY_UPSERT, SEARCH, SWEEP  # noqa: F401 - the names clients send

CONSUMERS_KEY = "moonmind:consumers:{queue}"


#: A worker whose heartbeat is older than this is not counted as consuming.
HEARTBEAT_S = 5.0
PRESENCE_TTL_S = 20.0

_apps: dict[tuple[str, str], Any] = {}
_apps_lock = threading.Lock()


def client_app(broker_url: str, backend_url: str):
    """A Celery app that only sends tasks and reads results (JSON only, as the workers speak)."""
    from celery import Celery

    key = (broker_url, backend_url)
    with _apps_lock:
        app = _apps.get(key)
        if app is None:
            app = Celery("moonmind-client", broker=broker_url, backend=backend_url, set_as_current=False)
            app.conf.update(
                task_serializer="json", result_serializer="json", accept_content=["json"],
                result_accept_content=["json"], broker_connection_retry=False,
                broker_connection_max_retries=0, broker_connection_timeout=5.0,
                redis_socket_connect_timeout=5.0, redis_socket_timeout=30.0,
            )
            _apps[key] = app
        return app


def redis_client(url: str, timeout: float):
    """A redis-py client for a Redis broker's own keys (worker heartbeats, a doctor's PING)."""
    import redis

    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


#: What a connection is for -> (its name in messages, the setting that names it).
_ROLES = {
    "broker": ("Celery broker", "CELERY_BROKER_URL"),
    "backend": ("Celery result backend", "CELERY_RESULT_BACKEND (it defaults to CELERY_BROKER_URL)"),
}


def broker_unreachable(url: str, exc: BaseException, role: str = "broker") -> MoonmindError:
    """The queue's infrastructure is down; the message names the part (broker or result backend)."""
    what, setting = _ROLES[role]
    return MoonmindError(
        "broker_unreachable",
        f"Cannot reach the {what} at {redact(url)} ({type(exc).__name__}).",
        f"Start the broker / check {setting}, or run with --execution sync.",
    )


def _broker_errors(app) -> tuple[type[BaseException], ...]:
    with app.connection_for_write() as conn:
        return (*conn.connection_errors, *conn.channel_errors, OSError)


def consumers(app, queue: str, broker_url: str) -> int | None:
    """Workers consuming `queue`, or None when the broker cannot tell (then nothing is refused up front)."""
    if broker_url.startswith(("redis://", "rediss://")):
        client = redis_client(broker_url, 5.0)
        try:
            return int(client.zcount(CONSUMERS_KEY.format(queue=queue), f"({time.time() - PRESENCE_TTL_S}", "+inf"))
        finally:
            client.close()
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=5.0)
        if conn.transport.driver_type != "amqp":
            return None
        channel = conn.channel()
        try:
            _, _, count = channel.queue_declare(queue=queue, passive=True)
            return int(count)
        except conn.channel_errors:  # 404: the queue was never declared, so nobody consumes it
            return 0
        finally:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - the broker may have closed it with the 404
                pass


def run_task(
    task: str,
    kwargs: dict[str, Any],
    *,
    queue: str,
    broker_url: str,
    backend_url: str,
    timeout_s: float | None,
    wait: bool = True,
    progress: Any = None,
) -> Any:
    """Send `task(**kwargs)` to `queue`; return the task id (wait=False) or its JSON result.

    `timeout_s` None: wait as long as the task runs (an index of a large tree), reporting the
    worker's progress to `progress(done, total[, chunks])` as it comes.
    Raises MoonmindError: `broker_unreachable`, `worker_unavailable` (nobody consumes the
    queue; nothing was sent), `task_timeout` (sent, no result in time; the message expires
    so a late worker does not run it), or the task's own error code when it failed.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    app = client_app(broker_url, backend_url)
    broker_down = _broker_errors(app)
    try:
        count = consumers(app, queue, broker_url)
    except (*broker_down, _redis_errors()) as exc:
        raise broker_unreachable(broker_url, exc) from None
    if count == 0:
        raise MoonmindError(
            "worker_unavailable",
            f"No worker is consuming the queue {queue!r}.",
            f"Start one: `celery -A moonmind_worker.celery worker -Q {queue}` (or `-B` for one box), or use --execution sync.",
            queue=queue,
        )
    if wait:
        _check_backend(app, backend_url)
    try:
        result = app.send_task(task, kwargs=kwargs, queue=queue, task_id=str(uuid.uuid4()),
                               expires=timeout_s if wait and timeout_s is not None else None, retry=False)
    except broker_down as exc:
        raise broker_unreachable(broker_url, exc) from None
    if not wait:
        return result.id
    return wait_for(result, task, queue, deadline, timeout_s, backend_url, progress)


def _redis_errors() -> type[BaseException]:
    import redis

    return redis.RedisError


def _check_backend(app, backend_url: str) -> None:
    """A result backend that cannot return results, or does not answer, is named before anything is sent."""
    from celery.backends.base import DisabledBackend

    if backend_url.startswith(("redis://", "rediss://")):
        client = redis_client(backend_url, 5.0)
        try:
            client.ping()
        except (OSError, _redis_errors()) as exc:
            raise broker_unreachable(backend_url, exc, "backend") from None
        finally:
            client.close()
    if isinstance(app.backend, DisabledBackend):
        raise MoonmindError(
            "invalid_argument",
            f"The result backend {redact(backend_url)!r} cannot return results, so a queued task cannot be waited for.",
            "Set CELERY_RESULT_BACKEND to a backend that stores results (redis://…, rpc://, a database), "
            "or pass --no-wait / use --execution sync.",
        )


#: How often a wait looks at the task's progress (a worker reports it with the PROGRESS state).
POLL_S = 0.5


def wait_for(result, task: str, queue: str, deadline: float | None, timeout_s: float | None, backend_url: str,
             progress: Any = None) -> Any:
    """The task's JSON result, or its error as a MoonmindError."""
    from celery.exceptions import TimeoutError as ResultTimeout

    unreachable: tuple[type[BaseException], ...] = (OSError, _redis_errors(), *_backend_errors(result))
    try:
        while True:
            step = POLL_S if progress is not None else None
            if deadline is not None:
                remaining = max(deadline - time.monotonic(), 0.001)
                step = remaining if step is None else min(step, remaining)
            try:
                value = result.get(timeout=step, propagate=False, disable_sync_subtasks=False)
                state = result.state
                break
            except ResultTimeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise _timed_out(result, queue, timeout_s) from None
                _report(result, progress)
    except unreachable as exc:
        raise broker_unreachable(backend_url, exc, "backend") from None
    try:
        result.forget()
    except Exception:  # noqa: BLE001 - tidying the result is best effort
        pass
    if state == "SUCCESS":
        return value
    raise task_error(value, task, state)


def _report(result, progress: Any) -> None:
    if progress is None or result.state != "PROGRESS" or not isinstance(result.info, dict):
        return
    info = result.info
    done, total = int(info.get("done", 0)), int(info.get("total", 0))
    progress(done, total, *([int(info["chunks"])] if "chunks" in info else []))


def _timed_out(result, queue: str, timeout_s: float | None) -> MoonmindError:
    return MoonmindError(
        "task_timeout",
        f"No result from the worker within {timeout_s:g}s (task {result.id} on queue {queue!r}); it may still be running.",
        f"Read it back later with `moonmind task status {result.id}`; raise --timeout (or MOONMIND_QUEUE_TIMEOUT_S, "
        "or --budget latency_ms=… for a search), check the worker's log, or use --execution sync.",
        task_id=result.id,
    )


def task_status(task_id: str, *, broker_url: str, backend_url: str) -> dict[str, Any]:
    """What the result backend knows of a task sent earlier (`--no-wait`): its state, and its result or error."""
    app = client_app(broker_url, backend_url)
    _check_backend(app, backend_url)
    result = app.AsyncResult(task_id)
    unreachable: tuple[type[BaseException], ...] = (OSError, _redis_errors(), *_backend_errors(result))
    try:
        state = result.state
        info = result.info
    except unreachable as exc:
        raise broker_unreachable(backend_url, exc, "backend") from None
    out: dict[str, Any] = {"task_id": task_id, "state": state}
    if state == "SUCCESS":
        out["result"] = info
    elif state in ("FAILURE", "REVOKED"):
        err = task_error(info, "the task", state)
        out["error"] = {"code": err.code, "message": err.message, "action": err.action}
    elif state == "PROGRESS" and isinstance(info, dict):
        out["progress"] = info
    return out


def _backend_errors(result) -> tuple[type[BaseException], ...]:
    return tuple(getattr(result.backend, "connection_errors", ()) or ())


def task_error(exc: Any, task: str, state: str) -> MoonmindError:
    """A failed task's exception as the MoonmindError it carries (a RagTaskError's args), else internal_error."""
    from ..errors import CODES, RagTaskError

    if isinstance(exc, RagTaskError):
        code = exc.code if exc.code in CODES else "internal_error"
        return MoonmindError(code, exc.message, exc.action)
    return MoonmindError(
        "internal_error",
        f"The task {task} failed on the worker ({type(exc).__name__ if isinstance(exc, BaseException) else state}).",
        "Check the worker's log for the traceback.",
    )
