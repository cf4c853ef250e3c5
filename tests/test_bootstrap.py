"""The job hook: capability resolution (direct / gateway / none), banner, manifest fields,
doctor failure blocking the job, queue events consumed from real Redis, and the Celery path."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from celery_helpers import BROKER, configure_app, purge, queue_env, redis, unique_queues

BANNER = "RAG available: run `moonmind rag search` to pull context from the knowledge base."
SNIPPET = "Before coding, call `moonmind rag search` to load repo knowledge from Qdrant."


@pytest.fixture
def bus(env):
    """A queue bound to every RAG event on the `moonmind.events` exchange (this helper's Redis DB)."""
    from kombu import Connection, Exchange, Queue

    from moonmind_worker.observe import events

    events.reset()
    conn = Connection(BROKER)
    q = Queue(f"test-bus-{uuid.uuid4().hex}", Exchange("moonmind.events", type="topic", durable=True), routing_key="rag.#")
    bound = q(conn.default_channel)
    bound.declare()

    def drain(*names: str, wait_s: float = 5.0) -> dict[str, dict]:
        """The first event of each name, waiting until all arrived; other events (search telemetry) are skipped."""
        out: dict[str, dict] = {}
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not set(names) <= set(out):
            m = bound.get(no_ack=True)
            if m is None:
                time.sleep(0.02)
            elif m.payload["event"] in names:
                out.setdefault(m.payload["event"], m.payload)
        return out

    yield drain
    bound.delete()
    conn.release()
    events.reset()


def manifest(tmp_path, **extra) -> str:
    data = {"job_id": f"job-{uuid.uuid4().hex[:6]}", "run_id": "run-42", "repo": "demo", "tenant": "acme", "capabilities": {}}
    data.update(extra)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    return str(path)


def job_env(env, **extra) -> dict:
    sq, iq = unique_queues()
    e = queue_env(env, sq, iq)
    e["MOONMIND_EVENTS_TIMEOUT_S"] = "5"  # a loaded CI box must not drop the events under test
    e.update(extra)
    return e


@pytest.mark.slow
def test_direct_capability_prints_the_banner_and_fills_the_manifest(indexed, cli, env, tmp_path, bus):
    path = manifest(tmp_path)
    r = cli("job", "start", "--manifest", path, "--env-file", str(tmp_path / "job.env"), extra_env=job_env(env))
    assert r.code == 0, r.stderr
    assert r.stdout == BANNER + "\n"
    m = json.loads(open(path).read())
    assert m["capabilities"]["rag"] == "direct-qdrant"
    rag = m["rag"]
    assert rag["available"] and rag["prompt_snippet"] == SNIPPET and rag["banner"] == BANNER
    assert rag["doctor"]["ok"] is True and any(c["name"] == "query" and c["ok"] for c in rag["doctor"]["checks"])
    assert rag["environment"] == {"MOONMIND_JOB_ID": m["job_id"], "MOONMIND_RUN_ID": "run-42", "MOONMIND_REPO": "demo",
                                  "MOONMIND_TENANT": "acme"}
    assert f"export MOONMIND_JOB_ID={m['job_id']}\n" in (tmp_path / "job.env").read_text()
    event = bus("rag_capability_resolved")["rag_capability_resolved"]
    assert event["capability"] == "direct-qdrant"
    assert (event["job_id"], event["run_id"], event["repo"], event["tenant"]) == (m["job_id"], "run-42", "demo", "acme")
    assert event["event_id"].startswith("evt_") and event["timestamp"]


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        body = json.dumps({"status": "ok"}).encode() if self.path == "/retrieval/health" else b"{}"
        self.send_response(200 if self.path == "/retrieval/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def gateway():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_a_healthy_gateway_resolves_to_the_gateway_capability(cli, env, tmp_path, gateway, bus):
    path = manifest(tmp_path, requires=["rag"])
    r = cli("job", "start", "--manifest", path, extra_env=job_env(env, MOONMIND_RETRIEVAL_URL=gateway))
    assert r.code == 0, r.stderr
    assert r.stdout == BANNER + "\n"
    m = json.loads(open(path).read())
    assert m["capabilities"]["rag"] == "gateway" and m["rag"]["blocked"] is False
    assert bus("rag_capability_resolved")["rag_capability_resolved"]["capability"] == "gateway"


def test_no_retrieval_leaves_the_capability_absent_with_the_reason(invoke, env, tmp_path, bus):
    path = manifest(tmp_path, capabilities={"git": True})
    r = invoke("job", "start", "--manifest", path, extra_env=job_env(env))
    assert r.code == 0 and r.stdout == ""
    assert "RAG unavailable" in r.stderr and "rag index" in r.stderr
    m = json.loads(open(path).read())
    assert m["capabilities"] == {"git": True}
    assert m["rag"]["available"] is False and m["rag"]["prompt_snippet"] is None
    assert "does not exist" in m["rag"]["reason"] and m["rag"]["blocked"] is False
    got = bus("rag_capability_resolved", "doctor_failed")
    assert got["rag_capability_resolved"]["capability"] is None
    assert got["doctor_failed"]["blocked"] is False and got["doctor_failed"]["checks"][0]["name"] == "collection"


@pytest.mark.slow
def test_doctor_failure_blocks_a_job_that_requires_rag_with_the_remedy(cli, env, tmp_path, bus):
    path = manifest(tmp_path, requires=["rag"])
    r = cli("job", "start", "--manifest", path, "--json", extra_env=job_env(env))
    assert r.code == 3 and r.stdout == ""
    err = r.error()
    assert err["code"] == "job_blocked" and "moonmind rag index" in err["action"]
    m = json.loads(open(path).read())
    assert m["rag"]["blocked"] is True and m["rag"]["remedy"] == err["action"]
    got = bus("rag_capability_resolved", "doctor_failed")
    assert got["doctor_failed"]["blocked"] is True and got["rag_capability_resolved"]["blocked"] is True


@pytest.mark.slow
def test_job_finish_removes_the_runs_overlay_at_once_with_no_worker_and_tags_every_event_with_the_manifest(
    prebuilt, cli, env, tmp_path, bus,
):
    """Reported: with no owner and no worker the clean was only queued (worker_unavailable), and `overlay_cleaned`
    from a shell's `job finish --manifest` carried no job, repo or tenant."""
    e = job_env(env)
    edit = prebuilt / "auth" / "tokens.py"
    edit.write_text("def rotate_bearer_tokens():\n    return 'rotated'\n")
    up = cli("rag", "overlay", "upsert", str(edit), "--root", str(prebuilt), "--repo", "demo", "--tenant", "acme",
             extra_env={**e, "MOONMIND_RUN_ID": "run-42"})
    assert up.code == 0, up.stderr
    path = manifest(tmp_path)
    res = cli("job", "finish", "--manifest", path, "--outcome", "failure", extra_env=e)
    assert res.code == 0, res.stderr
    m = json.loads(open(path).read())
    clean = m["rag"]["overlay_clean"]
    assert clean["run_id"] == "run-42" and clean["removed"] >= 1, clean
    listed = cli("rag", "overlay", "list", "--run-id", "run-42", "--json", extra_env=e)
    assert listed.code == 0 and json.loads(listed.stdout) == []
    got = bus("overlay_cleaned", "job_rag_finished")
    cleaned = got["overlay_cleaned"]
    assert (cleaned["job_id"], cleaned["run_id"], cleaned["repo"], cleaned["tenant"]) == (m["job_id"], "run-42", "demo", "acme")
    assert got["job_rag_finished"]["outcome"] == "failure" and got["job_rag_finished"]["overlay_clean"] == clean


@pytest.mark.slow
def test_a_gateway_only_worker_queues_the_overlay_clean_instead_of_touching_the_store(cli, env, tmp_path, bus):
    e = job_env(env, MOONMIND_RETRIEVAL_URL="http://127.0.0.1:9", MOONMIND_RETRIEVAL_FALLBACK="none")
    iq = e["MOONMIND_INDEX_QUEUE"]
    r = redis()
    r.zadd(f"moonmind:consumers:{iq}", {"test@host": time.time()})  # a worker consuming the bulk queue
    try:
        path = manifest(tmp_path)
        res = cli("job", "finish", "--manifest", path, extra_env=e)
        assert res.code == 0, res.stderr
        clean = json.loads(open(path).read())["rag"]["overlay_clean"]
        assert clean["run_id"] == "run-42" and res.stdout.strip().endswith(clean["task_id"])
        message = json.loads(r.lindex(iq, 0))
        assert message["headers"]["task"] == "moonmind.rag.overlay_clean" and message["headers"]["id"] == clean["task_id"]
        assert bus("job_rag_finished")["job_rag_finished"]["overlay_clean"]["task_id"] == clean["task_id"]
    finally:
        purge(iq)


@pytest.mark.slow
def test_a_queued_overlay_clean_run_by_a_worker_reports_the_manifests_job_not_the_workers(prebuilt, cli, env, tmp_path, bus):
    """Reported: the queued clean carried only run_id, so `overlay_cleaned` said job None, repo None, tenant None."""
    from celery_helpers import start_worker_process, stop, wait_for_consumer

    e = job_env(env, MOONMIND_RETRIEVAL_URL="http://127.0.0.1:9", MOONMIND_RETRIEVAL_FALLBACK="none")
    sq, iq = e["MOONMIND_SEARCH_QUEUE"], e["MOONMIND_INDEX_QUEUE"]
    edit = prebuilt / "db" / "pool.py"
    edit.write_text("def drain_pool():\n    return 0\n")
    up = cli("rag", "overlay", "upsert", str(edit), "--root", str(prebuilt), "--repo", "demo", "--tenant", "acme",
             extra_env={**e, "MOONMIND_RETRIEVAL_URL": "", "MOONMIND_RUN_ID": "run-42"})
    assert up.code == 0, up.stderr
    worker = start_worker_process(queue_env(env, sq, iq), [sq, iq], tmp_path / "worker.log")
    try:
        wait_for_consumer(iq, proc=worker)
        path = manifest(tmp_path)
        res = cli("job", "finish", "--manifest", path, extra_env=e)
        assert res.code == 0, res.stderr
        job_id = json.loads(open(path).read())["job_id"]
        cleaned = bus("overlay_cleaned", wait_s=60)["overlay_cleaned"]
    finally:
        stop(worker)
        purge(sq, iq)
    assert (cleaned["job_id"], cleaned["run_id"], cleaned["repo"], cleaned["tenant"]) == (job_id, "run-42", "demo", "acme")
    assert cleaned["removed"] >= 1


@pytest.mark.slow
def test_job_start_says_rag_is_not_available_for_a_repository_that_was_never_indexed(prebuilt, cli, env, tmp_path):
    path = manifest(tmp_path, repo="never-indexed")
    r = cli("job", "start", "--manifest", path)
    assert r.code == 0, r.stderr
    rag = json.loads(open(path).read())["rag"]
    assert rag["available"] is False and "never-indexed" in rag["reason"]
    assert "moonmind rag index" in rag["remedy"] and "--repo never-indexed" in rag["remedy"]
    assert BANNER not in r.stdout


def test_a_bad_manifest_is_a_clear_usage_error(invoke, env, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = invoke("job", "start", "--manifest", str(bad))
    assert r.code == 2 and r.stdout == "" and "not valid JSON" in r.stderr


# ------------------------------------------------------------ Celery path ---


@pytest.fixture
def job_app(env, monkeypatch):
    sq, iq = unique_queues()
    for k, v in queue_env({}, sq, iq).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MOONMIND_JOB_TASKS", "test.job.run")
    app = configure_app(sq, iq)
    from bootstrap.celery_signals import JobTask

    seen: dict = {}

    @app.task(name="test.job.run", base=JobTask, bind=True, shared=False)
    def run_job(self, manifest):
        import os

        seen["capability"] = manifest.get("capabilities", {}).get("rag")
        seen["env_job_id"] = os.environ.get("MOONMIND_JOB_ID")
        seen["snippet"] = manifest["rag"]["prompt_snippet"]
        return "done"

    yield app, sq, iq, seen
    app.tasks.pop("test.job.run", None)
    purge(sq, iq)
    for var in ("MOONMIND_JOB_ID", "MOONMIND_RUN_ID", "MOONMIND_REPO", "MOONMIND_TENANT"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.slow
def test_celery_job_task_sees_the_capability_and_its_environment_then_its_overlay_is_cleaned_at_once(indexed, job_app, bus, tmp_path):
    """The worker owns the store, so the job's end removes the run's overlay right there (nothing left queued)."""
    from celery.contrib.testing.worker import start_worker

    from moonmind_worker import runtime
    from moonmind_worker.indexing.overlay import upsert_overlay
    from moonmind_worker.settings import get_settings
    from moonmind_worker.store import Match, Where

    app, sq, iq, seen = job_app
    settings = get_settings()
    store = runtime.get_store(settings)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.py").write_text("def rotate_tokens():\n    return 'rotated'\n")
    upsert_overlay([ws / "notes.py"], root=ws, run_id="run-celery", ttl_s=3600, repo="demo", tenant="acme",
                   settings=settings, embedder=runtime.get_embedder(settings), store=store)
    overlay = store.count(Where(must=(Match("run_id", "run-celery"),)))
    assert overlay > 0
    m = {"job_id": "job-celery", "run_id": "run-celery", "repo": "demo", "tenant": "acme", "capabilities": {}}
    with start_worker(app, pool="solo", perform_ping_check=False, queues=[sq, iq], shutdown_timeout=10):
        assert app.send_task("test.job.run", kwargs={"manifest": m}, queue=sq).get(timeout=60) == "done"
        got = bus("rag_capability_resolved", "job_rag_finished")
    assert seen == {"capability": "direct-qdrant", "env_job_id": "job-celery", "snippet": SNIPPET}
    # the worker's environment is its own again: a later task's events carry no job identity
    assert [v for v in ("MOONMIND_JOB_ID", "MOONMIND_RUN_ID", "MOONMIND_REPO", "MOONMIND_TENANT") if v in os.environ] == []
    assert got["rag_capability_resolved"]["job_id"] == "job-celery"
    assert got["job_rag_finished"]["overlay_clean"] == {"removed": overlay, "run_id": "run-celery"}
    assert store.count(Where(must=(Match("run_id", "run-celery"),))) == 0


def test_celery_job_requiring_rag_is_blocked_before_its_body_runs(job_app):
    from celery.contrib.testing.worker import start_worker

    app, sq, iq, seen = job_app
    m = {"job_id": "job-blocked", "run_id": "run-b", "repo": "demo", "tenant": "acme", "requires": ["rag"]}
    with start_worker(app, pool="solo", perform_ping_check=False, queues=[sq], shutdown_timeout=10):
        res = app.send_task("test.job.run", kwargs={"manifest": m}, queue=sq)
        res.get(timeout=60, propagate=False)
    assert res.state == "FAILURE" and seen == {}
    code, message, action = res.result.args
    assert code == "job_blocked" and "rag index" in action
