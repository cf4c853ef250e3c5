"""Helpers for tests that run real Celery workers on this helper's Redis DBs (4 = broker, 5 = results)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from moonmind_worker.transports.queue_client import CONSUMERS_KEY

BROKER = "redis://127.0.0.1:6379/4"
BACKEND = "redis://127.0.0.1:6379/5"
ROOT = Path(__file__).resolve().parent.parent
CELERY = shutil.which("celery") or str(Path(sys.executable).parent / "celery")


def queue_keys(queue: str) -> tuple[str, ...]:
    """Every Redis key a test queue leaves: its messages, worker heartbeats and kombu's bindings."""
    return (queue, CONSUMERS_KEY.format(queue=queue), f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")


def unique_queues() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:10]
    return f"test-search-{tag}", f"test-index-{tag}"


def queue_env(base: dict[str, str], search_q: str, index_q: str) -> dict[str, str]:
    e = dict(base)
    e.update(
        CELERY_BROKER_URL=BROKER,
        CELERY_RESULT_BACKEND=BACKEND,
        MOONMIND_SEARCH_QUEUE=search_q,
        MOONMIND_INDEX_QUEUE=index_q,
    )
    return e


def configure_app(search_q: str, index_q: str):
    """Point the importable `tasks.app` at the test DBs and queues (it may have been imported already)."""
    from moonmind_worker.settings import get_settings

    get_settings.cache_clear()
    import tasks
    from tasks.celeryapp import make_app

    fresh = make_app(get_settings())
    tasks.app.conf.update(
        broker_url=BROKER,
        result_backend=BACKEND,
        task_routes=fresh.conf.task_routes,
        task_default_queue=index_q,
        beat_schedule=fresh.conf.beat_schedule,
        broker_transport_options=fresh.conf.broker_transport_options,
    )
    return tasks.app


def redis(db: int = 4):
    import redis as redis_py

    return redis_py.Redis(host="127.0.0.1", port=6379, db=db)


def wait_for_consumer(queue: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Until a worker's heartbeat for `queue` is in Redis (what the CLI checks before sending)."""
    r = redis()
    deadline = time.monotonic() + timeout
    key = f"moonmind:consumers:{queue}"
    while time.monotonic() < deadline:
        if r.zcount(key, time.time() - 20, "+inf") > 0:
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"worker exited with {proc.returncode}")
        time.sleep(0.1)
    raise AssertionError(f"no worker consumed {queue} within {timeout}s")


def start_worker_process(env: dict[str, str], queues: list[str], log: Path, *extra: str) -> subprocess.Popen:
    """A real `celery -A tasks worker` in its own process group (so a test can kill -9 all of it)."""
    cmd = [CELERY, "-A", "tasks", "worker", "-Q", ",".join(queues), "--pool", "solo", "-l", "INFO",
           "--without-gossip", "--without-mingle", "-n", f"test-{uuid.uuid4().hex[:8]}@%h", *extra]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def purge(*queues: str) -> None:
    """A test's queues gone from Redis: messages, heartbeats and kombu's bindings for them."""
    r = redis()
    for q in queues:
        r.delete(*queue_keys(q))


def socket_of(home: Path) -> Path:
    """The owner's socket for the default collection under MOONMIND_HOME `home`."""
    return home / "qdrant-edge" / "moonmind__repo" / "owner.sock"


def wait_for_socket(home: Path, proc: subprocess.Popen, timeout: float = 60.0, log: Path | None = None) -> Path:
    """The owner's socket once `proc` (a worker, gateway or `moonmind serve`) has created it."""
    path = socket_of(home)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path
        if proc.poll() is not None:
            raise AssertionError(f"the owner exited with {proc.returncode}" + (f":\n{log.read_text()[-3000:]}" if log else ""))
        time.sleep(0.05)
    raise AssertionError("the owner never created its socket" + (f":\n{log.read_text()[-3000:]}" if log else ""))


@contextmanager
def solo_worker(app: str, app_dir: Path, env: dict[str, str], home: Path, log_dir: Path,
                name: str) -> Iterator[tuple[subprocess.Popen, str, str, Path]]:
    """`celery -A app worker --pool solo` on fresh queues with `app_dir` importable, once it consumes and owns the store.

    Yields (process, search queue, index queue, log); stops it and purges its queues after.
    """
    sq, iq = unique_queues()
    e = queue_env(env, sq, iq)
    e["PYTHONPATH"] = os.pathsep.join([str(app_dir), str(ROOT)])
    log = log_dir / "worker.log"
    proc = subprocess.Popen(
        [CELERY, "-A", app, "worker", "-Q", f"{sq},{iq}", "--pool", "solo", "-l", "INFO", "--without-gossip",
         "--without-mingle", "-n", f"{name}-{sq}@%h"],
        env=e, cwd=log_dir, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        wait_for_consumer(sq, proc=proc)
        wait_for_socket(home, proc, log=log)
        yield proc, sq, iq, log
    finally:
        stop(proc)
        purge(sq, iq)

