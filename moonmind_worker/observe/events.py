"""Queue events: small JSON messages the control plane consumes, sent with kombu on the Celery broker.

Wire format (documented in docs/celery.md, "Queue events"):

* exchange ``moonmind.events`` (type ``topic``, durable), routing key ``rag.<event>``
  — bind a queue with ``rag.#`` to receive them all, or e.g. ``rag.doctor_failed`` for one;
* body: JSON object ``{"schema": 1, "event", "event_id", "timestamp", "job_id", "run_id",
  "repo", "tenant", ...fields}``; ``timestamp`` is ISO-8601 UTC, ``event_id`` is ``evt_`` + a ULID.

Every broker goes through a kombu producer (one connection per process, reused): the process
that publishes is usually the box's warm owner or a Celery worker, which has kombu loaded anyway.

Why fire-and-forget: events are breadcrumbs, never part of the answer. `publish` is bounded
by ``MOONMIND_EVENTS_TIMEOUT_S`` (connect and send, no retries), never raises, and after a
failure stays quiet for a short cool-down so a dead broker costs one timeout, not one per event.
With no broker configured (neither ``MOONMIND_EVENTS_URL`` nor ``CELERY_BROKER_URL``) it is a
no-op, said once in the debug log.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import threading
import time
from typing import Any

from ..errors import redact
from ..ids import ulid, utc_timestamp

EXCHANGE = "moonmind.events"
EXCHANGE_TYPE = "topic"
ROUTING_PREFIX = "rag."
SCHEMA_VERSION = 1

#: Events this package emits (the control plane may bind to any of them).
EVENTS = (
    "rag_capability_resolved",
    "doctor_failed",
    "job_rag_finished",
    "qdrant_query_completed",
    "embedding_aborted",
    "overlay_upserted",
    "overlay_cleaned",
    # observe/artifacts.py and observe/hooks.py (docs/operations.md "Observability")
    "context_pack_created",
    "budget_exceeded",
    "overlay_swept",
    "repository_indexed",
)

#: Seconds to skip publishing after a failure (one slow broker must not slow every event).
COOL_DOWN_S = 30.0

#: Scope fields every event carries, and the environment variables they come from.
SCOPE_ENV = {
    "job_id": "MOONMIND_JOB_ID",
    "run_id": "MOONMIND_RUN_ID",
    "repo": "MOONMIND_REPO",
    "tenant": "MOONMIND_TENANT",
}

log = logging.getLogger("moonmind.events")

#: A request's own scope, set by a process that serves other processes (the store's owner, see
#: `owner.server`): its events carry the client's job, not whatever the serving process's environment says.
scope_override: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("moonmind_event_scope", default=None)

_lock = threading.Lock()
_state: dict[str, Any] = {"conn": None, "url": None, "down_until": 0.0, "said_noop": False}


def routing_key(event: str) -> str:
    return ROUTING_PREFIX + event


def build_event(event: str, **fields: Any) -> dict[str, Any]:
    """The event body: scope (env first — a job exports it after settings were read — then settings) + fields."""
    from ..settings import get_settings

    try:
        settings = get_settings()
    except Exception:  # noqa: BLE001 - a broken .env must not stop an event from being built
        settings = None
    body: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "event": event,
        "event_id": "evt_" + ulid(),
        "timestamp": utc_timestamp(timespec="milliseconds"),
    }
    override = scope_override.get()
    for key, var in SCOPE_ENV.items():
        if override is not None:
            body[key] = override.get(key)
        else:
            body[key] = os.environ.get(var) or (getattr(settings, key, None) if settings else None)
    for key, value in fields.items():
        if key not in ("schema", "event", "event_id", "timestamp"):
            body[key] = value
    return body


def publish(event: str, **fields: Any) -> None:
    """Send one event to ``moonmind.events`` with routing key ``rag.<event>``; bounded in time, never raises."""
    try:
        _publish(event, fields)
    except Exception as exc:  # noqa: BLE001 - an event must never break the caller
        log.debug("event %s not published: %s", event, type(exc).__name__)


def _publish(event: str, fields: dict[str, Any]) -> None:
    from ..settings import get_settings

    settings = get_settings()
    url = settings.events_broker
    if url is None:
        if not _state["said_noop"]:
            _state["said_noop"] = True
            log.debug("queue events are off: no broker configured (set CELERY_BROKER_URL or MOONMIND_EVENTS_URL)")
        return
    now = time.monotonic()
    if now < _state["down_until"]:
        return
    body = json.dumps(build_event(event, **fields), default=str, sort_keys=True)
    timeout = settings.events_timeout_s
    with _lock:
        try:
            producer = _producer(url, timeout)
            producer.publish(
                body,
                exchange=_exchange(),
                routing_key=routing_key(event),
                content_type="application/json",
                content_encoding="utf-8",
                declare=[_exchange()],
                retry=False,
                timeout=timeout,
            )
        except Exception as exc:  # noqa: BLE001
            _drop_connection()
            _state["down_until"] = time.monotonic() + COOL_DOWN_S
            log.warning(
                "queue event %s not published (%s at %s); events paused for %.0fs",
                event, type(exc).__name__, redact(url), COOL_DOWN_S,
            )


def _exchange():
    from kombu import Exchange

    return Exchange(EXCHANGE, type=EXCHANGE_TYPE, durable=True)


def _producer(url: str, timeout: float):
    """One connection per process, reused; built with short socket timeouts and no reconnect loop."""
    from kombu import Connection

    if _state["conn"] is None or _state["url"] != url:
        _drop_connection()
        conn = Connection(
            url,
            connect_timeout=timeout,
            transport_options={
                "socket_timeout": timeout,
                "socket_connect_timeout": timeout,
                "max_retries": 0,
                "retry_on_timeout": False,
            },
        )
        conn.ensure_connection(max_retries=0, interval_start=0, interval_step=0, timeout=timeout)
        _state["conn"] = conn
        _state["url"] = url
        _state["producer"] = conn.Producer(serializer="json")
    return _state["producer"]


def _drop_connection() -> None:
    conn = _state.get("conn")
    _state["conn"] = None
    _state["producer"] = None
    if conn is not None:
        try:
            conn.release()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


def reset() -> None:
    """Forget the cached connection and cool-down (after a fork, or between tests)."""
    with _lock:
        _drop_connection()
        _state["down_until"] = 0.0
        _state["said_noop"] = False


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()
    _state.update(conn=None, producer=None)


if hasattr(os, "register_at_fork"):
    # a forked child (prefork pool) must not share the parent's broker socket or a held lock
    os.register_at_fork(after_in_child=_after_fork)
