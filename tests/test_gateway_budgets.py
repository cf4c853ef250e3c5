"""Gateway latency budgets against a slow or failing embedding provider (issue 6, spec 03 "Budget Semantics").

The gateway embeds through a real local HTTP server speaking the OpenAI embeddings protocol
(tests/http_servers.py), which the tests make slow or failing. The budget must cut the wait short,
not be checked only after the provider finally answers."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURE_FILES, write_tree
from gateway_helpers import add_token, clean_env, index_in_process, run_cli, start_gateway
from http_servers import EmbeddingsServer

pytestmark = pytest.mark.slow

SECRET = "sk-gateway-test-secret-0123456789"
QUERY = "where are bearer tokens checked"


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    base = tmp_path_factory.mktemp("gateway-slow")
    repo = write_tree(base / "repo", FIXTURE_FILES)
    server = EmbeddingsServer()
    provider = {"MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": SECRET}
    gw_home = base / "gateway-home"
    gw_home.mkdir()
    index_in_process(gw_home, repo, [("demo", "acme")], embedding_provider="openai",
                     openai_base_url=server.base_url, openai_api_key=SECRET)
    direct_home = base / "direct-home"  # the worker's own (offline model) store, for fallback
    direct_home.mkdir()
    index_in_process(direct_home, repo, [("demo", "acme")])
    gw_env = clean_env(gw_home, **provider)
    token = add_token(gw_env, "w", ["demo"], ["acme"])
    gw = start_gateway(gw_home, gw_env, base)
    cli_env = clean_env(direct_home, MOONMIND_RETRIEVAL_URL=gw.url, MOONMIND_RETRIEVAL_TOKEN=token)
    yield server, gw, token, cli_env
    gw.stop()
    server.close()


@pytest.fixture
def server(slow):
    srv = slow[0]
    yield srv
    srv.delay_s, srv.always_status = 0.0, None


def test_fast_provider_answers_within_the_budget(slow, server):
    _, gw, token, _ = slow
    with gw.client(token) as c:
        r = c.post("/retrieval/context", json={"query": QUERY, "budgets": {"latency_ms": 5000}})
    assert r.status_code == 200, r.text
    assert r.json()["items"] and r.json()["usage"]["latency_ms"] < 5000


def test_slow_provider_is_cut_off_at_the_latency_budget_with_408(slow, server):
    _, gw, token, _ = slow
    server.delay_s = 6.0
    with gw.client(token) as c:  # the client gives up before the provider answers: only the budget can answer in time
        r = c.post("/retrieval/context", json={"query": QUERY, "budgets": {"latency_ms": 500}}, timeout=5)
    assert r.status_code == 408, r.text
    body = r.json()
    assert body["error"]["code"] == "latency_budget_exceeded"
    assert body["usage"]["latency_ms"] >= 500  # the actual latency, reported
    assert body["budget"]["budget_type"] == "latency_ms" and body["budget"]["budget_limit"] == 500


def test_cli_falls_back_to_direct_when_the_gateway_exceeds_the_latency_budget(slow, server):
    _, _, token, cli_env = slow
    server.delay_s = 5.0
    r = run_cli("rag", "search", "--query", QUERY, "--budget", "latency_ms=2000", "--json", env=cli_env)
    assert r.returncode == 0, r.stderr
    assert "latency_budget_exceeded" in r.stderr and "falling back to direct" in r.stderr
    assert json.loads(r.stdout)["transport"] == "direct"
    assert token not in r.stderr


def test_cli_without_fallback_reports_the_budget_error(slow, server):
    _, _, _, cli_env = slow
    server.delay_s = 4.0
    r = run_cli("rag", "search", "--query", QUERY, "--budget", "latency_ms=500", "--no-fallback", "--json", env=cli_env)
    assert r.returncode == 5 and r.stdout == ""
    assert json.loads(r.stderr.strip().splitlines()[-1])["error"]["code"] == "latency_budget_exceeded"


def test_provider_failure_is_500_retrieval_failed_with_a_remedy_and_no_secret(slow, server):
    _, gw, token, _ = slow
    server.always_status = 500
    with gw.client(token) as c:
        r = c.post("/retrieval/context", json={"query": QUERY + " provider down"})
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["code"] == "retrieval_failed" and "moonmind worker doctor" in err["action"]
    for leak in (SECRET, "scripted failure", "Traceback", server.base_url, "openai"):
        assert leak not in r.text
    assert "embedding_provider_error" in gw.logs()  # the operator gets the detail
