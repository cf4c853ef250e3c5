"""Queue events: JSON on the `moonmind.events` topic exchange, bounded in time, never raising."""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid

import pytest

from moonmind_worker.observe import events

BROKER = "redis://127.0.0.1:6379/4"


@pytest.fixture
def fresh_events(env, monkeypatch):
    events.reset()
    yield monkeypatch
    events.reset()


def _bound_queue(conn, pattern: str = "rag.#"):
    from kombu import Exchange, Queue

    q = Queue(f"test-events-{uuid.uuid4().hex}", Exchange(events.EXCHANGE, type="topic", durable=True), routing_key=pattern)
    bound = q(conn.default_channel)
    bound.declare()
    return bound


def _get(bound, wait_s: float = 3.0):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        m = bound.get(no_ack=True)
        if m is not None:
            return m
        time.sleep(0.02)
    return None


def test_event_arrives_on_the_topic_exchange_with_scope_and_fields(fresh_events):
    from kombu import Connection

    fresh_events.setenv("CELERY_BROKER_URL", BROKER)
    for var, value in (("MOONMIND_JOB_ID", "job-7"), ("MOONMIND_RUN_ID", "run-7"), ("MOONMIND_REPO", "demo"), ("MOONMIND_TENANT", "acme")):
        fresh_events.setenv(var, value)
    with Connection(BROKER) as conn:
        bound = _bound_queue(conn)
        try:
            events.publish("doctor_failed", check="qdrant", remedy="start Qdrant")
            msg = _get(bound)
            assert msg is not None, "no event arrived"
            assert msg.delivery_info["exchange"] == "moonmind.events"
            assert msg.delivery_info["routing_key"] == "rag.doctor_failed"
            body = msg.payload
            assert body["event"] == "doctor_failed"
            assert body["schema"] == 1
            assert body["event_id"].startswith("evt_") and len(body["event_id"]) == 30
            assert body["timestamp"].endswith("Z")
            assert (body["job_id"], body["run_id"], body["repo"], body["tenant"]) == ("job-7", "run-7", "demo", "acme")
            assert body["check"] == "qdrant" and body["remedy"] == "start Qdrant"
        finally:
            bound.delete()


def test_a_binding_for_one_event_receives_only_that_event(fresh_events):
    from kombu import Connection

    fresh_events.setenv("CELERY_BROKER_URL", BROKER)
    with Connection(BROKER) as conn:
        bound = _bound_queue(conn, "rag.job_rag_finished")
        try:
            events.publish("doctor_failed")
            events.publish("job_rag_finished", outcome="success")
            msg = _get(bound)
            assert msg.payload["event"] == "job_rag_finished"
            assert _get(bound, 0.3) is None
        finally:
            bound.delete()


def test_no_broker_configured_is_a_no_op_said_once_in_debug(fresh_events, caplog):
    caplog.set_level(logging.DEBUG, logger="moonmind.events")
    events.publish("job_rag_finished")
    events.publish("job_rag_finished")
    assert events._state["conn"] is None  # no connection was even attempted
    said = [r for r in caplog.records if "queue events are off" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.DEBUG


def test_refused_broker_returns_without_raising_and_pauses_events_for_the_cool_down(fresh_events, caplog):
    caplog.set_level(logging.WARNING, logger="moonmind.events")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fresh_events.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{port}/4")
    events.publish("doctor_failed")
    assert events._state["conn"] is None
    assert events._state["down_until"] > time.monotonic()  # paused
    events.publish("doctor_failed")  # cool-down: the second event does not try the broker at all
    assert [r.getMessage() for r in caplog.records if "not published" in r.getMessage()] == [
        f"queue event doctor_failed not published (OperationalError at redis://127.0.0.1:{port}/4); "
        f"events paused for {events.COOL_DOWN_S:.0f}s"]


def test_a_broker_that_never_answers_costs_at_most_the_timeout(fresh_events):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    fresh_events.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{server.getsockname()[1]}/4")
    fresh_events.setenv("MOONMIND_EVENTS_TIMEOUT_S", "0.3")
    try:
        events.publish("job_rag_finished")  # returns: the socket timeout ended the wait for an answer
        assert accepted, "the broker's port was reached"
        assert events._state["conn"] is None and events._state["down_until"] > time.monotonic()
    finally:
        server.close()


def test_the_configured_event_timeout_bounds_the_connection_and_every_socket_wait(fresh_events):
    fresh_events.setenv("CELERY_BROKER_URL", BROKER)
    fresh_events.setenv("MOONMIND_EVENTS_TIMEOUT_S", "0.3")
    events.publish("job_rag_finished")
    conn = events._state["conn"]
    assert conn is not None and conn.connect_timeout == 0.3
    assert conn.transport_options["socket_timeout"] == conn.transport_options["socket_connect_timeout"] == 0.3
    assert conn.transport_options["max_retries"] == 0 and conn.transport_options["retry_on_timeout"] is False


def test_events_url_off_disables_publishing_even_with_a_broker(fresh_events, caplog):
    caplog.set_level(logging.DEBUG, logger="moonmind.events")
    fresh_events.setenv("CELERY_BROKER_URL", BROKER)
    fresh_events.setenv("MOONMIND_EVENTS_URL", "off")
    events.publish("doctor_failed")
    assert any("queue events are off" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_a_dead_broker_does_not_break_or_change_a_sync_search(indexed, cli):
    """Events are breadcrumbs: a configured broker that never answers costs at most the event timeout."""
    query = ["rag", "search", "--query", "where are bearer tokens checked", "--filters", "repo=demo"]
    clean = cli(*query)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        r = cli(*query, extra_env={"CELERY_BROKER_URL": f"redis://127.0.0.1:{server.getsockname()[1]}/4",
                                   "MOONMIND_EVENTS_TIMEOUT_S": "0.3"})
    finally:
        server.close()
    assert r.code == 0 and clean.code == 0
    assert r.stdout == clean.stdout and "auth/tokens.py" in r.stdout


def test_a_wildcard_binding_receives_events_published_from_another_process(env, tmp_path):
    """Events go through kombu's own topic-exchange routing on Redis too: a kombu consumer gets the event."""
    import subprocess
    import sys

    from kombu import Connection

    with Connection(BROKER) as conn:
        bound = _bound_queue(conn, "*.doctor_failed")
        try:
            code = (
                "import sys; from moonmind_worker.observe import events; "
                "events.publish('doctor_failed', check='qdrant'); events.publish('job_rag_finished')"
            )
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                                 env={**env, "CELERY_BROKER_URL": BROKER}, cwd=tmp_path)
            assert out.returncode == 0, out.stderr
            msg = _get(bound)
            assert msg is not None and msg.payload["event"] == "doctor_failed" and msg.payload["check"] == "qdrant"
            assert msg.delivery_info["routing_key"] == "rag.doctor_failed"
            assert _get(bound, 0.3) is None  # rag.job_rag_finished does not match *.doctor_failed
        finally:
            bound.delete()
