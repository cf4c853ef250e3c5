"""Send a Celery task and wait for its result — with the standard library only.

Why not `celery.send_task`: the point of `--execution queue` is a fast CLI in front of a
warm worker. Importing celery + kombu + redis-py costs more than the whole search on a
warm worker, so this module speaks the two small protocols involved directly:

* Celery message protocol v2 (JSON body, base64 envelope) pushed with ``LPUSH`` onto the
  queue's Redis list — exactly what kombu's Redis transport does;
* the Redis result backend: the worker ``SET``s ``celery-task-meta-<id>`` and ``PUBLISH``es
  it on the channel of the same name; we ``SUBSCRIBE`` before sending, so no result is missed.

"No worker consuming" is known before anything is sent: workers of this package keep a
heartbeat in the sorted set ``moonmind:consumers:<queue>`` (member = worker hostname,
score = unix time, refreshed every few seconds); a queue with no fresh member is refused.
Only Redis brokers are supported here (the `tasks` app itself runs on any Celery broker).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import MoonmindError, redact

#: Stable task names (the `tasks` package registers exactly these).
SEARCH = "moonmind.rag.search"
INDEX = "moonmind.rag.index"
OVERLAY_UPSERT = "moonmind.rag.overlay_upsert"
OVERLAY_CLEAN = "moonmind.rag.overlay_clean"
SWEEP = "moonmind.rag.sweep_expired_overlays"

CONSUMERS_KEY = "moonmind:consumers:{queue}"


def queue_keys(queue: str) -> tuple[str, ...]:
    """Every Redis key a queue leaves: its messages, worker heartbeats and kombu's bindings (for cleanup)."""
    return (queue, CONSUMERS_KEY.format(queue=queue), f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")

#: A worker whose heartbeat is older than this is not counted as consuming.
HEARTBEAT_S = 5.0
PRESENCE_TTL_S = 20.0

RESULT_KEY = "celery-task-meta-{id}"
READY_STATES = ("SUCCESS", "FAILURE", "REVOKED")


class RespError(Exception):
    """An error reply from Redis (`-ERR ...`)."""


class Redis:
    """A minimal RESP2 client: enough for AUTH, SELECT, LPUSH, ZCOUNT, GET, DEL and SUBSCRIBE."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(url)
        self.url = url
        sock = socket.create_connection((parts.hostname or "localhost", parts.port or 6379), timeout=timeout)
        if parts.scheme == "rediss":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
        sock.settimeout(timeout)
        self._sock = sock
        self._buf = b""
        if parts.password:
            user = unquote(parts.username) if parts.username else None
            self.command("AUTH", *([user] if user else []), unquote(parts.password))
        db = (parts.path or "/").lstrip("/")
        if db and db != "0":
            self.command("SELECT", db)

    def settimeout(self, timeout: float) -> None:
        self._sock.settimeout(max(timeout, 0.001))

    def send(self, *args: Any) -> None:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            data = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self._sock.sendall(b"".join(out))

    def command(self, *args: Any) -> Any:
        self.send(*args)
        return self.read()

    def _line(self) -> bytes:
        while b"\r\n" not in self._buf:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed by Redis")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\r\n")
        return line

    def _exact(self, n: int) -> bytes:
        while len(self._buf) < n + 2:
            chunk = self._sock.recv(max(65536, n + 2 - len(self._buf)))
            if not chunk:
                raise ConnectionError("connection closed by Redis")
            self._buf += chunk
        data, self._buf = self._buf[:n], self._buf[n + 2 :]
        return data

    def read(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ConnectionError(f"unexpected reply from Redis: {line[:40]!r}")

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


def celery_message(task: str, task_id: str, kwargs: dict[str, Any], queue: str, expires_s: float | None) -> bytes:
    """A Celery protocol v2 message as kombu's Redis transport stores it on the queue list."""
    body = json.dumps([[], kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    expires = None
    if expires_s is not None:
        expires = (datetime.now(timezone.utc) + timedelta(seconds=expires_s)).isoformat()
    headers: dict[str, Any] = {
        "lang": "py", "task": task, "id": task_id, "shadow": None, "eta": None, "expires": expires,
        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": task_id,
        "parent_id": None, "argsrepr": "()", "kwargsrepr": _short(kwargs),
        "origin": f"moonmind-cli@{socket.gethostname()}:{os.getpid()}", "ignore_result": False,
        "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
    }
    return kombu_message(body, headers=headers, exchange="", routing_key=queue,
                         properties={"correlation_id": task_id, "reply_to": ""})


def kombu_message(body: str, *, headers: dict[str, Any], exchange: str, routing_key: str,
                  properties: dict[str, Any] | None = None) -> bytes:
    """A JSON message as kombu's Redis transport stores it on a queue list (body base64-encoded)."""
    message = {
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            **(properties or {}), "delivery_mode": 2,
            "delivery_info": {"exchange": exchange, "routing_key": routing_key}, "priority": 0,
            "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(message).encode()


def _short(kwargs: dict[str, Any]) -> str:
    text = repr(kwargs)
    return text if len(text) <= 200 else text[:197] + "..."


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
        f"Start Redis / check {setting}, or run with --execution sync.",
    )


def _connect(url: str, timeout: float, role: str = "broker") -> Redis:
    if urlsplit(url).scheme not in ("redis", "rediss"):
        raise MoonmindError(
            "invalid_argument",
            f"--execution queue needs a Redis broker and result backend; got {redact(url).split(':', 1)[0]}://.",
            "Point CELERY_BROKER_URL (and CELERY_RESULT_BACKEND) at redis://…, or use --execution sync.",
        )
    try:
        return Redis(url, timeout)
    except RespError as exc:
        what, setting = _ROLES[role]
        raise MoonmindError(
            "broker_unreachable",
            f"The {what} at {redact(url)} refused the connection: {exc}.",
            f"Check the credentials and database in {setting}.",
        ) from None
    except (OSError, ConnectionError) as exc:
        raise broker_unreachable(url, exc, role) from None


def consumers(conn: Redis, queue: str, now: float | None = None) -> int:
    """Workers whose heartbeat for `queue` is fresh."""
    now = time.time() if now is None else now
    return int(conn.command("ZCOUNT", CONSUMERS_KEY.format(queue=queue), f"({now - PRESENCE_TTL_S}", "+inf"))


def run_task(
    task: str,
    kwargs: dict[str, Any],
    *,
    queue: str,
    broker_url: str,
    backend_url: str,
    timeout_s: float,
    wait: bool = True,
) -> Any:
    """Send `task(**kwargs)` to `queue`; return the task id (wait=False) or its JSON result.

    Raises MoonmindError: `broker_unreachable`, `worker_unavailable` (nobody consumes the
    queue; nothing was sent), `task_timeout` (sent, no result in time; the message expires
    so a late worker does not run it), or the task's own error code when it failed.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    task_id = str(uuid.uuid4())
    conn = _connect(broker_url, min(timeout_s, 5.0))
    sub = None
    try:
        try:
            if consumers(conn, queue) == 0:
                raise MoonmindError(
                    "worker_unavailable",
                    f"No worker is consuming the queue {queue!r} (no heartbeat in the last {PRESENCE_TTL_S:.0f}s).",
                    f"Start one: `celery -A tasks worker -Q {queue}` (or `-B` for one box), or use --execution sync.",
                    queue=queue,
                )
            if wait:
                sub = _connect(backend_url, min(timeout_s, 5.0), "backend")
                try:
                    sub.command("SUBSCRIBE", RESULT_KEY.format(id=task_id))
                except (OSError, ConnectionError) as exc:
                    raise broker_unreachable(backend_url, exc, "backend") from None
            message = celery_message(task, task_id, kwargs, queue, expires_s=timeout_s if wait else None)
            conn.command("LPUSH", queue, message)
        except (OSError, ConnectionError) as exc:
            raise broker_unreachable(broker_url, exc) from None
        if not wait or sub is None:  # a wait always subscribed above
            return task_id
        meta = _wait(sub, task_id, deadline, timeout_s, queue)
        try:
            backend = conn if backend_url == broker_url else _connect(backend_url, 1.0, "backend")
            backend.command("DEL", RESULT_KEY.format(id=task_id))
        except Exception:  # noqa: BLE001 - tidying the result key is best effort
            pass
        return _outcome(meta, task)
    finally:
        conn.close()
        if sub is not None:
            sub.close()


def _wait(sub: Redis, task_id: str, deadline: float, timeout_s: float, queue: str) -> dict[str, Any]:
    channel = RESULT_KEY.format(id=task_id).encode()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        sub.settimeout(remaining)
        try:
            reply = sub.read()
        except (socket.timeout, TimeoutError):
            break
        except (OSError, ConnectionError) as exc:
            raise broker_unreachable(sub.url, exc, "backend") from None
        if isinstance(reply, list) and len(reply) == 3 and reply[0] == b"message" and reply[1] == channel:
            meta = json.loads(reply[2])
            if meta.get("status") in READY_STATES:
                return meta
    raise MoonmindError(
        "task_timeout",
        f"No result from the worker within {timeout_s:g}s (task {task_id} on queue {queue!r}).",
        "The worker is busy or stuck: raise the timeout (--budget latency_ms=… or MOONMIND_QUEUE_TIMEOUT_S), "
        "check the worker's log, or use --execution sync.",
        task_id=task_id,
    )


def _outcome(meta: dict[str, Any], task: str) -> Any:
    status = meta.get("status")
    if status == "SUCCESS":
        return meta.get("result")
    result = meta.get("result") or {}
    if isinstance(result, dict) and result.get("exc_type") == "RagTaskError":
        args = result.get("exc_message") or []
        if isinstance(args, list) and len(args) >= 3:
            from ..errors import CODES

            code = args[0] if args[0] in CODES else "internal_error"
            raise MoonmindError(code, str(args[1]), str(args[2]))
    exc_type = result.get("exc_type", status) if isinstance(result, dict) else status
    raise MoonmindError(
        "internal_error",
        f"The task {task} failed on the worker ({exc_type}).",
        "Check the worker's log for the traceback.",
    )

