"""A result backend that is down: the worker runs each message once and says so; the CLI names the backend.

Issue 18 (major 5): storing the result raised a redis ConnectionError out of the task's trace,
which a worker on a Redis broker handled as a lost *broker* connection, so the acks_late write
was delivered again about once a second, forever, and the CLI's message blamed the broker.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid

import pytest
from celery import Celery

from moonmind_worker.transports import queue_client

from celery_helpers import BROKER, purge, queue_env, redis, start_worker_process, stop, unique_queues, wait_for_consumer
from cli_runner import CliRunner
from conftest import _SCRUB


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    e["MOONMIND_HOME"] = str(tmp_path / "home")
    return e


@pytest.mark.slow
def test_a_write_whose_result_cannot_be_stored_runs_once_and_is_acknowledged(env, tmp_path):
    sq, iq = unique_queues()
    dead = f"redis://127.0.0.1:{_closed_port()}/0"
    e = {**queue_env(env, sq, iq), "CELERY_RESULT_BACKEND": dead}
    log = tmp_path / "worker.log"
    proc = start_worker_process(e, [sq, iq], log)
    try:
        wait_for_consumer(iq, proc=proc)
        task_id = str(uuid.uuid4())
        sender = Celery(broker=BROKER)  # no result backend on the sending side: only the worker's is dead
        try:
            sender.send_task(queue_client.SWEEP, queue=iq, task_id=task_id)
        finally:
            sender.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "was not stored" not in log.read_text():
            time.sleep(0.2)
        deadline = time.monotonic() + 60
        while task_id in (unacked := str(redis().hgetall("unacked"))):  # acknowledged: nothing left to redeliver
            assert time.monotonic() < deadline, "the message was never acknowledged"
            time.sleep(0.05)
        text = log.read_text()
    finally:
        stop(proc)
        purge(sq, iq)
    assert text.count(f"{queue_client.SWEEP}[{task_id}] received") == 1, text[-3000:]
    assert text.count(f"{queue_client.SWEEP}[{task_id}] succeeded") == 1
    assert "Connection to broker lost" not in text
    assert "result backend unreachable" in text and "CELERY_RESULT_BACKEND" in text
    assert "Traceback" not in text
    assert task_id not in unacked, "the message must be acknowledged, not left to be restored"


@pytest.mark.slow
def test_the_worker_says_at_start_that_results_cannot_be_stored(env, tmp_path):
    sq, iq = unique_queues()
    port = _closed_port()
    e = {**queue_env(env, sq, iq), "CELERY_RESULT_BACKEND": f"redis://:hunter2@127.0.0.1:{port}/0"}
    log = tmp_path / "worker.log"
    proc = start_worker_process(e, [sq, iq], log)
    try:
        wait_for_consumer(iq, proc=proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "result backend unreachable" not in log.read_text():
            time.sleep(0.2)
        text = log.read_text()
    finally:
        stop(proc)
        purge(sq, iq)
    assert re.search(rf"result backend unreachable \(\w+ at redis://\*\*\*@127\.0\.0\.1:{port}/0\)", text), text[-2000:]
    assert "hunter2" not in text


def test_the_cli_names_the_result_backend_not_the_broker(env, tmp_path):
    sq, iq = unique_queues()
    port = _closed_port()
    e = {**queue_env(env, sq, iq), "CELERY_RESULT_BACKEND": f"redis://127.0.0.1:{port}/0"}
    redis().zadd(f"moonmind:consumers:{sq}", {"alive@host": time.time()})  # so the CLI gets as far as the backend
    try:
        r = CliRunner(e, tmp_path).invoke("rag", "search", "--query", "x", "--execution", "queue", "--timeout", "3", "--json")
    finally:
        purge(sq, iq)
    assert r.code == 4 and r.stdout == ""
    err = json.loads(r.stderr.strip().splitlines()[-1])["error"]
    assert err["code"] == "broker_unreachable"
    assert f"Celery result backend at redis://127.0.0.1:{port}/0" in err["message"]
    assert "CELERY_RESULT_BACKEND" in err["action"]
    assert redis().llen(sq) == 0, "nothing is sent when the result cannot come back"
