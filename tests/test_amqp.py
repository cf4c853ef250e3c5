"""The Celery side on RabbitMQ: queued search and index, overlay and sweep tasks, events, doctor and the job hook.

Everything is real: RabbitMQ on 127.0.0.1:5672 (guest/guest) as the broker, Redis as the result
backend, a `celery -A tasks worker` process. Without RabbitMQ the module is skipped with a loud
reason (`.ci/run` starts it when it is installed).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid

import pytest

from celery_helpers import BACKEND, start_worker_process, stop, unique_queues
from conftest import MOONMIND, write_tree

pytestmark = pytest.mark.slow

AMQP = "amqp://guest:guest@127.0.0.1:5672//"
QUERY = ["rag", "search", "--query", "where are bearer tokens checked", "--filters", "repo=demo", "--top-k", "3"]


def _rabbitmq_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
        return True
    except OSError:
        return False


if not _rabbitmq_up():
    pytest.skip("RabbitMQ is not running on 127.0.0.1:5672: the AMQP broker tests did NOT run", allow_module_level=True)


def run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([MOONMIND, *args], env=env, capture_output=True, text=True, timeout=timeout)


def amqp_env(env: dict[str, str], sq: str, iq: str) -> dict[str, str]:
    return {**env, "CELERY_BROKER_URL": AMQP, "CELERY_RESULT_BACKEND": BACKEND, "MOONMIND_SEARCH_QUEUE": sq,
            "MOONMIND_INDEX_QUEUE": iq}


def delete_queues(*names: str) -> None:
    from kombu import Connection

    with Connection(AMQP) as conn:
        channel = conn.channel()
        for name in names:
            try:
                channel.queue_delete(name)
            except conn.channel_errors:
                channel = conn.channel()


def consumed(queue: str, timeout: float = 60.0) -> None:
    """Until RabbitMQ counts a consumer on `queue` (the worker has started consuming)."""
    from kombu import Connection

    deadline = time.monotonic() + timeout
    with Connection(AMQP) as conn:
        while time.monotonic() < deadline:
            channel = conn.channel()
            try:
                if channel.queue_declare(queue=queue, passive=True)[2] > 0:
                    return
            except conn.channel_errors:
                pass
            finally:
                try:
                    channel.close()
                except Exception:  # noqa: BLE001 - closed by the broker after a 404
                    pass
            time.sleep(0.1)
    raise AssertionError(f"no consumer on {queue} within {timeout:g}s")


@pytest.fixture
def worker(env, prebuilt, tmp_path):
    sq, iq = unique_queues()
    e = amqp_env(env, sq, iq)
    proc = start_worker_process(e, [sq, iq], tmp_path / "worker.log")
    try:
        consumed(sq)
        consumed(iq)
        yield e, proc, tmp_path / "worker.log"
    finally:
        stop(proc)
        delete_queues(sq, iq)


def test_queued_search_on_rabbitmq_returns_the_sync_pack(worker):
    e, _, log = worker
    r = run(e, *QUERY, "--execution", "queue", "--json")
    assert r.returncode == 0, (r.stderr, log.read_text()[-2000:])
    pack = json.loads(r.stdout)
    assert pack["items"][0]["source"] == "auth/tokens.py"


def test_no_consumer_on_rabbitmq_is_said_before_anything_is_sent(env, prebuilt):
    sq, iq = unique_queues()
    try:
        r = run(amqp_env(env, sq, iq), *QUERY, "--execution", "queue", "--json")
        assert r.returncode == 4, r.stderr
        assert json.loads(r.stderr.strip().splitlines()[-1])["error"]["code"] == "worker_unavailable"
    finally:
        delete_queues(sq, iq)


def test_queued_index_and_overlay_upsert_on_rabbitmq(worker, tmp_path):
    e, _, log = worker
    repo = write_tree(tmp_path / "other", {"geo/distance.py": "def great_circle_distance(a, b):\n    return 0\n"})
    r = run(e, "rag", "index", str(repo), "--repo", "geo", "--execution", "queue", "--json")
    assert r.returncode == 0, (r.stderr, log.read_text()[-2000:])
    assert json.loads(r.stdout)["files_indexed"] == 1
    (repo / "geo" / "distance.py").write_text("def haversine_distance(a, b):\n    return 1\n")
    up = run({**e, "MOONMIND_RUN_ID": "run-amqp"}, "rag", "overlay", "upsert", str(repo / "geo/distance.py"), "--root", str(repo),
             "--repo", "geo", "--execution", "queue")
    assert up.returncode == 0, up.stderr
    found = run({**e, "MOONMIND_RUN_ID": "run-amqp"}, "rag", "search", "haversine distance", "--filters", "repo=geo",
                "--json")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["items"][0]["trust_class"] == "overlay"


def test_the_sweep_task_runs_on_rabbitmq(worker):
    from celery import Celery

    from moonmind_worker.transports.queue_client import SWEEP

    e, _, _ = worker
    app = Celery(broker=AMQP, backend=BACKEND)
    try:
        result = app.send_task(SWEEP, queue=e["MOONMIND_INDEX_QUEUE"], task_id=str(uuid.uuid4()))
        out = result.get(timeout=60)
    finally:
        app.close()
    assert "removed" in out and "artifacts_pruned" in out


def test_events_reach_a_queue_bound_on_rabbitmq(env, prebuilt, tmp_path):
    from kombu import Connection, Exchange, Queue

    name = f"test-events-{uuid.uuid4().hex[:8]}"
    with Connection(AMQP) as conn:
        queue = Queue(name, Exchange("moonmind.events", type="topic", durable=True), routing_key="rag.#",
                      auto_delete=True)(conn.default_channel)
        queue.declare()
        try:
            r = run({**env, "CELERY_BROKER_URL": AMQP, "MOONMIND_OWNER": "off"}, *QUERY, "--json")
            assert r.returncode == 0, r.stderr
            deadline = time.monotonic() + 30
            message = None
            while message is None and time.monotonic() < deadline:
                message = queue.get(no_ack=True)
                if message is None:
                    time.sleep(0.05)
            assert message is not None, "no event arrived"
            assert message.delivery_info["routing_key"].startswith("rag.")
            assert json.loads(message.body)["schema"] == 1
        finally:
            queue.delete()


def test_doctor_and_the_job_hook_on_rabbitmq(worker, tmp_path):
    e, _, _ = worker
    doctor = run(e, "worker", "doctor", "--json")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["broker"]["ok"], checks["broker"]
    manifest = tmp_path / "job.json"
    manifest.write_text(json.dumps({"job_id": "job-amqp", "run_id": "run-amqp", "repo": "demo", "tenant": "acme",
                                    "capabilities": {"rag": "direct-qdrant"}}))
    started = run(e, "job", "start", "--manifest", str(manifest))
    assert started.returncode == 0, started.stdout + started.stderr
    finished = run(e, "job", "finish", "--manifest", str(manifest))
    assert finished.returncode == 0, finished.stdout + finished.stderr


def test_beat_schedules_the_overlay_sweep_on_rabbitmq(env, prebuilt, tmp_path):
    sq, iq = unique_queues()
    e = {**amqp_env(env, sq, iq), "MOONMIND_OVERLAY_SWEEP_INTERVAL_S": "1"}
    log = tmp_path / "worker.log"
    proc = start_worker_process(e, [sq, iq], log, "-B", "-s", str(tmp_path / "beat-schedule"))
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "sweep_expired_overlays" not in _succeeded(log):
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        assert "sweep_expired_overlays" in _succeeded(log), log.read_text()[-3000:]
    finally:
        stop(proc)
        delete_queues(sq, iq)


def _succeeded(log) -> str:
    return "\n".join(line for line in log.read_text(errors="replace").splitlines() if "succeeded in" in line)
