"""`moonmind worker doctor` (issue 3, spec 01 FR-008 / SC-005): a real probe of every prerequisite."""

from __future__ import annotations

import json

import pytest

from http_servers import EmbeddingsServer, StatusServer, closed_port


@pytest.fixture
def embeddings():
    server = EmbeddingsServer(repeat=2)
    yield server
    server.close()


def _lines(stdout: str) -> dict[str, str]:
    """check name -> its ✓/✗ line."""
    out = {}
    for line in stdout.splitlines():
        if line[:1] in "✓✗":
            out[line.split()[1]] = line
    return out


@pytest.mark.slow
def test_doctor_passes_on_a_healthy_embedded_setup(cli, prebuilt):
    r = cli("worker", "doctor")
    assert r.code == 0, r.stdout + r.stderr
    lines = _lines(r.stdout)
    for name in ("embedding", "qdrant", "collection", "dimension", "model", "schema", "query"):
        assert lines[name].startswith("✓"), r.stdout
    assert "moonmind-static-code-256" in lines["embedding"]
    assert "256 dims" in lines["embedding"]
    assert "test query returned 1 item" in lines["query"]
    assert r.stdout.rstrip().endswith("retrieval: usable")


@pytest.mark.slow
def test_doctor_json_is_the_same_checklist(cli, prebuilt):
    r = cli("worker", "doctor", "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert data["ok"] is True
    assert [c["name"] for c in data["checks"]] == [
        "embedding", "qdrant", "collection", "dimension", "model", "schema", "query"
    ]
    assert all(set(c) >= {"name", "ok", "detail", "remedy"} for c in data["checks"])


def test_doctor_fails_with_index_remedy_when_the_collection_is_missing(invoke):
    r = invoke("worker", "doctor", "--json")
    assert r.code == 3
    data = r.json()
    assert data["ok"] is False
    check = {c["name"]: c for c in data["checks"]}["collection"]
    assert check["ok"] is False and "moonmind rag index" in check["remedy"]
    assert data["error"]["code"] == "collection_missing"


@pytest.mark.slow
def test_doctor_names_the_missing_embedding_credential(cli, prebuilt):
    r = cli("worker", "doctor", extra_env={"MOONMIND_EMBEDDING_PROVIDER": "google"})
    assert r.code == 3
    line = _lines(r.stdout)["embedding"]
    assert line.startswith("✗") and "GOOGLE_API_KEY is not set" in line and ".env" in line


@pytest.mark.slow
def test_doctor_reports_dimension_and_model_drift_with_the_sync_remedy(cli, prebuilt, embeddings):
    env = {"MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": embeddings.base_url,
           "MOONMIND_EMBEDDING_MODEL": "local-embed-512"}
    r = cli("worker", "doctor", extra_env=env)
    assert r.code == 3, r.stdout
    lines = _lines(r.stdout)
    assert lines["embedding"].startswith("✓") and "512 dims" in lines["embedding"]
    assert lines["dimension"].startswith("✗")
    assert "Collection moonmind__repo expects dim=256 but local-embed-512 outputs 512." in lines["dimension"]
    assert "remedy: Run moonmind rag sync-embedding --collection moonmind__repo" in r.stdout
    assert lines["model"].startswith("✗") and "moonmind-static-code-256" in lines["model"]
    assert "query" not in lines  # no query against a collection it cannot read


@pytest.mark.slow
def test_doctor_reports_unreachable_qdrant_as_connectivity(cli):
    r = cli("worker", "doctor", "--json", extra_env={"QDRANT_URL": f"http://127.0.0.1:{closed_port()}"})
    assert r.code == 4
    check = {c["name"]: c for c in r.json()["checks"]}["qdrant"]
    assert check["ok"] is False and check["code"] == "qdrant_unreachable"
    assert "cannot connect" in check["detail"] and "QDRANT_URL" in check["remedy"]


@pytest.mark.slow
@pytest.mark.parametrize("status,code", [(401, "unauthenticated"), (403, "forbidden")])
def test_doctor_tells_a_rejected_qdrant_key_from_an_unreachable_server(cli, status, code):
    server = StatusServer(status)
    try:
        r = cli("worker", "doctor", "--json", extra_env={"QDRANT_URL": server.url, "QDRANT_API_KEY": "qk-doctor"})
    finally:
        server.close()
    assert r.code == 4
    check = {c["name"]: c for c in r.json()["checks"]}["qdrant"]
    assert check["code"] == code and f"HTTP {status}" in check["detail"]
    assert "QDRANT_API_KEY" in check["remedy"]
    assert r.stderr == ""  # no client warnings leak onto stderr


@pytest.mark.slow
def test_doctor_checks_gateway_health_when_a_gateway_is_configured(cli, prebuilt):
    server = StatusServer(200, {"status": "ok"})
    try:
        r = cli("worker", "doctor", extra_env={"MOONMIND_RETRIEVAL_URL": server.url})
    finally:
        server.close()
    assert r.code == 0, r.stdout
    assert _lines(r.stdout)["gateway"].startswith("✓")
    assert server.requests == ["GET /retrieval/health"]


@pytest.mark.slow
def test_doctor_fails_when_the_gateway_is_down_and_direct_fallback_is_off(cli, prebuilt):
    env = {"MOONMIND_RETRIEVAL_URL": f"http://127.0.0.1:{closed_port()}", "MOONMIND_RETRIEVAL_FALLBACK": "none"}
    r = cli("worker", "doctor", "--json", extra_env=env)
    assert r.code != 0
    check = {c["name"]: c for c in r.json()["checks"]}["gateway"]
    assert check["ok"] is False and check["required"] is True and "MOONMIND_RETRIEVAL_URL" in check["remedy"]


@pytest.mark.slow
def test_an_unreachable_broker_and_statsd_are_reported_but_do_not_block_retrieval(cli, prebuilt):
    env = {"CELERY_BROKER_URL": f"redis://:broker-pass@127.0.0.1:{closed_port()}/2", "STATSD_HOST": "127.0.0.1"}
    r = cli("worker", "doctor", "--json", extra_env=env)
    assert r.code == 0, r.stdout
    checks = {c["name"]: c for c in r.json()["checks"]}
    assert checks["broker"]["ok"] is False and checks["broker"]["required"] is False
    assert "CELERY_BROKER_URL" in checks["broker"]["remedy"]
    assert checks["statsd"]["ok"] is True
    assert "broker-pass" not in r.stdout + r.stderr


@pytest.mark.slow
def test_the_broker_configured_in_dotenv_is_the_one_checked(cli, prebuilt, tmp_path):
    """CELERY_BROKER_URL from `.env` in the working directory counts, like every other setting."""
    port = closed_port()
    work = tmp_path / "work"
    work.mkdir()
    (work / ".env").write_text(f"CELERY_BROKER_URL=redis://127.0.0.1:{port}/7\n")
    r = cli("worker", "doctor", "--json", cwd=work)
    assert r.code == 0, r.stdout
    broker = {c["name"]: c for c in r.json()["checks"]}["broker"]
    assert broker["ok"] is False and f"127.0.0.1:{port}" in broker["detail"]


def test_a_keyword_broker_beats_the_environment_in_run_checks(env, prebuilt, monkeypatch):
    """The doctor probes the broker of the Settings it is given, not whatever the process environment says."""
    from moonmind_worker.jobs.doctor import run_checks
    from moonmind_worker.settings import Settings

    monkeypatch.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{closed_port()}/7")
    report = run_checks(Settings(celery_broker_url="redis://127.0.0.1:6379/7"))
    broker = {c.name: c for c in report.checks}["broker"]
    assert broker.ok is True and broker.detail == "redis://127.0.0.1:6379/7: reachable"


@pytest.mark.slow
def test_run_checks_is_the_python_api_the_bootstrap_hook_uses(env, prebuilt):
    from moonmind_worker.jobs.doctor import run_checks
    from moonmind_worker.settings import Settings

    report = run_checks(Settings())
    assert report.ok is True
    assert all(c.ok for c in report.checks)
    assert {c.name for c in report.checks} >= {"embedding", "qdrant", "collection", "dimension", "query"}
    # the doctor released the embedded store: a search process can open it right after
    from moonmind_worker.store import open_store

    store = open_store(Settings())
    assert store.info().points > 0
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["redis", "amqp"])
def test_a_broker_that_accepts_and_never_answers_cannot_hang_doctor_or_job_start(cli, prebuilt, tmp_path, scheme):
    from http_servers import SilentServer

    silent = SilentServer()
    url = f"redis://127.0.0.1:{silent.port}/0" if scheme == "redis" else f"amqp://guest:guest@127.0.0.1:{silent.port}//"
    try:  # each command must end on its own broker timeout: a hang raises TimeoutExpired here
        r = cli("worker", "doctor", "--json", extra_env={"CELERY_BROKER_URL": url}, timeout=20)
        manifest = tmp_path / "m.json"
        manifest.write_text(json.dumps({"job_id": "j", "run_id": "r", "repo": "demo", "tenant": "acme"}))
        start = cli("job", "start", "--manifest", str(manifest), extra_env={"CELERY_BROKER_URL": url}, timeout=20)
    finally:
        silent.close()
    assert r.code == 0, r.stdout  # the broker is optional: retrieval itself is usable
    broker = {c["name"]: c for c in r.json()["checks"]}["broker"]
    assert broker["ok"] is False and str(silent.port) in broker["detail"]
    assert start.code == 0 and json.loads(manifest.read_text())["rag"]["available"] is True


@pytest.mark.slow
def test_doctor_says_exported_google_settings_are_unused_while_the_provider_is_the_offline_default(cli, prebuilt):
    r = cli("worker", "doctor", extra_env={"GOOGLE_API_KEY": "AIza-doctor-test", "GOOGLE_EMBEDDING_MODEL": "gemini-embedding-001"})
    assert r.code == 0, r.stdout + r.stderr  # still usable: the static model answers
    line = _lines(r.stdout)["provider"]
    assert "GOOGLE_API_KEY and GOOGLE_EMBEDDING_MODEL are set but unused" in line
    assert "MOONMIND_EMBEDDING_PROVIDER=google" in line and "AIza-doctor-test" not in r.stdout


@pytest.mark.slow
def test_doctor_adds_no_provider_line_when_the_static_model_was_chosen(cli, prebuilt):
    r = cli("worker", "doctor", extra_env={"GOOGLE_API_KEY": "AIza-x", "MOONMIND_EMBEDDING_PROVIDER": "static"})
    assert r.code == 0 and "provider" not in _lines(r.stdout)
