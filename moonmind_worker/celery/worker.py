"""The Celery application (`celery -A moonmind_worker.celery worker`), configured from the one settings
object, and its worker lifecycle.

Why these choices:
* JSON only (task arguments and results are the pydantic contracts as JSON);
* two queues — searches (``MOONMIND_SEARCH_QUEUE``, low latency) never wait behind bulk
  work (``MOONMIND_INDEX_QUEUE``: index, overlay upsert/clean, TTL sweep);
* warm resources: the embedder and the store are created once per worker process, so a
  search task never pays model load or client set-up;
* the embedded store allows one owning process: prefork with concurrency > 1 on it is
  refused at start (the default concurrency is 1 when no ``QDRANT_URL`` is set);
* heartbeats in ``moonmind:consumers:<queue>`` let the CLI say "no worker consuming"
  before it sends anything (see `moonmind_worker.transports.queue_client`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

from celery import Celery, bootsteps, signals
from celery.beat import PersistentScheduler
from kombu import Queue

from moonmind_worker.errors import EXIT_CONFIG, redact
from moonmind_worker.owner.trust import ensure_private_dirs
from moonmind_worker.settings import Settings, get_settings
from moonmind_worker.transports import queue_client

log = logging.getLogger("moonmind.tasks")


def _quiet_task_results() -> None:
    """Celery logs every task's return value at INFO ("succeeded in 0.1s: {...}"); for a search that is
    (a truncated copy of) retrieved code, which does not belong in worker logs. Keep the name, id and
    runtime: Celery reads this module-level format at each success."""
    from celery.app import trace

    trace.LOG_SUCCESS = "Task %(name)s[%(id)s] succeeded in %(runtime)ss"


_quiet_task_results()

SWEEP_SCHEDULE_NAME = "moonmind-sweep-expired-overlays"


class MoonmindCelery(Celery):
    """Celery whose result backend cannot turn a finished task into a redelivery loop.

    Why: storing a result is the last step of a task. With the backend down, Celery's Redis
    backend raises a redis ConnectionError out of the task's trace; a worker on a Redis broker
    takes that for a lost *broker* connection, reconnects, and the unacknowledged write
    (``acks_late``) is delivered again, about once a second, forever. The
    work itself is done (writes are idempotent), so the right outcome is: acknowledge, say once
    and clearly that the result could not be stored, and go on.
    """

    def _get_backend(self):
        backend = super()._get_backend()
        backend.store_result = _best_effort_store(backend)
        return backend


def _best_effort_store(backend):
    """`backend.store_result` that logs and drops a result the backend cannot take (see MoonmindCelery)."""
    from celery.exceptions import BackendStoreError

    store = backend.store_result
    unreachable = (*tuple(getattr(backend, "connection_errors", ()) or ()), BackendStoreError, OSError)

    def store_result(task_id, result, state, traceback=None, request=None, **kwargs):
        try:
            return store(task_id, result, state, traceback, request, **kwargs)
        except unreachable as exc:
            task = getattr(request, "task", None) or "task"
            log.error(
                "result backend unreachable (%s at %s): the %s result of %s[%s] was not stored, so a caller "
                "waiting for it will time out; the message is acknowledged and not run again.\n"
                "  action: start the result backend / check CELERY_RESULT_BACKEND (defaults to CELERY_BROKER_URL).",
                type(exc).__name__, redact(get_settings().result_backend), state, task, task_id,
            )
            return result

    return store_result


def make_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = MoonmindCelery("moonmind", broker=settings.celery_broker_url, backend=settings.result_backend)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        timezone="UTC",
        enable_utc=True,
        task_default_queue=settings.index_queue,
        task_routes={
            queue_client.SEARCH: {"queue": settings.search_queue},
            queue_client.INDEX: {"queue": settings.index_queue},
            queue_client.OVERLAY_UPSERT: {"queue": settings.index_queue},
            queue_client.OVERLAY_CLEAN: {"queue": settings.index_queue},
            queue_client.SWEEP: {"queue": settings.index_queue},
        },
        # every moonmind queue is declared, so `celery -A moonmind_worker.celery worker` with no -Q consumes them all
        # (Celery's habit); -Q still narrows a worker to some of them
        task_queues=(Queue(settings.search_queue), Queue(settings.index_queue)),
        task_create_missing_queues=True,
        # one message at a time per process: a long index must not hold a prefetched search
        worker_prefetch_multiplier=1,
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        # a write whose worker died is redelivered after this (Redis transport)
        broker_transport_options={
            "visibility_timeout": settings.broker_visibility_timeout_s,
            "unacked_restore_interval": min(10.0, settings.broker_visibility_timeout_s),
        },
        # beat writes its schedule file after every send, so the file says when the sweep last went
        # (the compose healthcheck reads it: moonmind_worker/celery/beat_health.py)
        beat_sync_every=1,
        # in MOONMIND_HOME, not beat's working directory: a schedule written into a checkout was indexed by the
        # owner's watcher (celerybeat-schedule.db); `--schedule FILE` still chooses (compose/docker-compose.yml)
        beat_schedule_filename=str(settings.moonmind_home / "celerybeat-schedule"),
        beat_scheduler="moonmind_worker.celery.worker:HomeScheduler",
        beat_schedule={
            SWEEP_SCHEDULE_NAME: {
                "task": queue_client.SWEEP,
                "schedule": settings.overlay_sweep_interval_s,
                "options": {"queue": settings.index_queue, "expires": settings.overlay_sweep_interval_s},
            }
        },
    )
    if settings.embedded_store:
        # the embedded store has one owner: one pool process unless told otherwise (then refused)
        app.conf.worker_concurrency = 1
    return app


class HomeScheduler(PersistentScheduler):
    """Celery's own shelve scheduler, creating MOONMIND_HOME (private, trust-checked) when its file is kept there."""

    def setup_schedule(self) -> None:
        home = get_settings().moonmind_home
        if Path(self.schedule_filename).parent == home:
            ensure_private_dirs(home)
        super().setup_schedule()


app = make_app()


# ------------------------------------------------------------------ guard ---


def embedded_store_refusal(pool: str, concurrency: int, settings: Settings) -> str | None:
    """Why this worker must not start, or None: prefork > 1 on the embedded store means two owners."""
    if not settings.embedded_store or concurrency <= 1:
        return None
    if pool not in ("prefork", "processes"):
        return None
    return (
        f"refusing to start: the embedded Qdrant store ({settings.data_dir}) has one owning process, "
        f"but this worker asked for --pool {pool} with concurrency {concurrency}.\n"
        "  action: use `--pool solo` (or `--pool threads`), or set QDRANT_URL to a Qdrant server to run many processes."
    )


def _pool_name(pool_cls) -> str:
    if isinstance(pool_cls, str):
        return pool_cls.split(":")[-1].lower()
    module = getattr(pool_cls, "__module__", "")
    return {"celery.concurrency.prefork": "prefork", "celery.concurrency.solo": "solo",
            "celery.concurrency.thread": "threads"}.get(module, module.rsplit(".", 1)[-1])


@signals.worker_init.connect
def _refuse_shared_embedded_store(sender=None, **_: object) -> None:
    concurrency = sender.concurrency
    if isinstance(concurrency, str):  # "auto": the prefork pool sizes itself to the CPUs
        import os

        concurrency = os.cpu_count() or 1
    reason = embedded_store_refusal(_pool_name(sender.pool_cls), int(concurrency or 1), get_settings())
    if reason:
        sys.stderr.write(f"error[store_busy]: {reason}\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_CONFIG)


# ---------------------------------------------------------- warm resources ---

_warm: dict[str, int | None] = {"pid": None}


def warm_resources() -> None:
    """Create the embedder and store once for this process (search tasks then pay neither)."""
    import os

    from moonmind_worker import runtime

    if _warm["pid"] == os.getpid():
        return
    settings = get_settings()
    started = time.perf_counter()
    embedder = runtime.get_embedder(settings)
    store = runtime.get_store(settings)
    _serve_the_box(settings)
    try:
        store.info()  # opens the shard / the client connection now, not on the first search
    except Exception as exc:  # noqa: BLE001 - a missing collection is fine until the first index
        log.info("store not ready yet (%s); it will be opened on first use", type(exc).__name__)
    _warm["pid"] = os.getpid()
    log.info("warm: embedder %s and store ready in %.0f ms", embedder.name, (time.perf_counter() - started) * 1000)


def _serve_the_box(settings: Settings) -> None:
    """Own the embedded store and answer this box's `moonmind` commands on its socket (owner/server.py).

    Why here: the worker process that runs the tasks is the one that can open the store, so it
    is the one that must serve the CLI a job runs beside it (a solo worker blocked in a job task
    still answers: the socket has its own thread).
    """
    serve_the_box(settings)


_not_serving: dict[str, str | None] = {"said": None}


def serve_the_box(settings: Settings) -> bool:
    """Own the store and serve it, taking it over from a `moonmind serve` / auto owner; False when another
    worker or a gateway keeps it (this worker's tasks then run on that owner, through its socket).

    Called at start and again before each task that needs the store while this process does not
    serve it: when the owner it used exits, this worker becomes the owner (it never holds the
    store without serving it).
    """
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.owner.server import current_server, serve_store

    if not settings.embedded_store:
        return False
    if current_server() is not None:
        return True
    try:
        serve_store(settings, role="celery worker")  # the server logs where it listens, once
        _not_serving["said"] = None
        return True
    except MoonmindError as err:
        if _not_serving["said"] != err.message:  # once per reason, not once per task
            _not_serving["said"] = err.message
            log.warning("not serving the embedded store to this box: %s %s", err.message, err.action)
        return False


@signals.worker_process_init.connect
def _warm_child(**_: object) -> None:
    warm_resources()


def result_backend_problem(settings: Settings) -> str | None:
    """Why this worker's results cannot be stored (a Redis result backend that does not answer), or None.

    Checked once at start so the operator reads it before the first task, not as a caller's timeout.
    """
    url = settings.result_backend
    if not url.startswith(("redis://", "rediss://")):
        return None
    try:
        client = queue_client.redis_client(url, 2.0)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - any failure means the same thing here
        return (
            f"result backend unreachable ({type(exc).__name__} at {redact(url)}): tasks will run, but their "
            "results cannot be stored, so callers waiting for them will time out.\n"
            "  action: start the result backend / check CELERY_RESULT_BACKEND (defaults to CELERY_BROKER_URL)."
        )
    return None


@signals.worker_ready.connect
def _on_ready(sender=None, **_: object) -> None:
    problem = result_backend_problem(get_settings())
    if problem:
        log.error(problem)
    # solo/threads pools run tasks in this process: warm here; prefork children warm themselves
    controller = getattr(sender, "controller", None)
    if controller is None or _pool_name(controller.pool_cls) != "prefork":
        warm_resources()


@signals.worker_shutdown.connect
def _on_shutdown(**_: object) -> None:
    from moonmind_worker import runtime

    runtime.close_all()  # stops serving the box too


@signals.worker_process_shutdown.connect
def _on_child_shutdown(**_: object) -> None:
    from moonmind_worker import runtime

    runtime.close_all()


# ---------------------------------------------------------------- presence ---


class _Presence:
    """Heartbeat per consumed queue on a Redis broker (which, unlike AMQP, cannot count a queue's consumers),
    so the CLI can tell "no worker" from "slow worker"."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queues: list[str] = []
        self._member = ""

    def start(self, queues: list[str], hostname: str) -> None:
        url = get_settings().celery_broker_url
        if not url.startswith(("redis://", "rediss://")) or not queues:
            return
        self._queues, self._member = queues, hostname
        self._stop.clear()
        self._beat(url)
        self._thread = threading.Thread(target=self._run, args=(url,), name="moonmind-presence", daemon=True)
        self._thread.start()

    def _beat(self, url: str, remove: bool = False) -> None:
        try:
            client = queue_client.redis_client(url, 2.0)
            try:
                for q in self._queues:
                    key = queue_client.CONSUMERS_KEY.format(queue=q)
                    if remove:
                        client.zrem(key, self._member)
                    else:
                        client.zadd(key, {self._member: time.time()})
                        client.expire(key, int(queue_client.PRESENCE_TTL_S * 3))
            finally:
                client.close()
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat only delays the CLI's check
            log.warning("presence heartbeat failed: %s", type(exc).__name__)

    def _run(self, url: str) -> None:
        while not self._stop.wait(queue_client.HEARTBEAT_S):
            self._beat(url)

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=2)
        self._thread = None
        self._beat(get_settings().celery_broker_url, remove=True)


_presence = _Presence()


class PresenceStep(bootsteps.StartStopStep):
    """Consumer bootstep: heartbeats start once the worker consumes its queues and stop when it stops."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, c) -> None:
        _presence.start(sorted(c.app.amqp.queues.consume_from.keys()), c.hostname)

    def stop(self, c) -> None:
        _presence.stop()

    shutdown = stop


app.steps["consumer"].add(PresenceStep)
