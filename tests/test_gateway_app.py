"""The gateway app in process (Starlette's TestClient runs its lifespan): auth, scope and the error
envelope against the session's prebuilt index, in the fast subset. test_gateway.py drives the same
app through a real `moonmind gateway serve` process on loopback."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from moonmind_worker.contracts import TokenGrant
from moonmind_worker.gateway.app import create_app
from moonmind_worker.gateway.auth import add_token, hash_token, new_token
from moonmind_worker.settings import get_settings

QUERY = "where are bearer tokens checked"


@pytest.fixture
def gateway(prebuilt):
    settings = get_settings()
    token = new_token()
    add_token(settings.tokens_file, TokenGrant(name="w", hash=hash_token(token), repos=["demo"], tenants=["acme"]))
    with TestClient(create_app(settings)) as client:
        yield client, token


def test_an_in_scope_request_gets_the_context_pack(gateway):
    client, token = gateway
    r = client.post("/retrieval/context", json={"query": QUERY}, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert items and items[0]["source"] == "auth/tokens.py"
    assert {i["payload"]["repo"] for i in items} == {"demo"} and {i["payload"]["tenant"] for i in items} == {"acme"}


def test_no_or_a_wrong_token_is_401_and_a_scope_outside_the_grant_403_in_the_envelope(gateway):
    client, token = gateway
    assert client.post("/retrieval/context", json={"query": QUERY}).status_code == 401
    wrong = client.post("/retrieval/context", json={"query": QUERY}, headers={"Authorization": "Bearer mmw_nope"})
    assert wrong.status_code == 401 and set(wrong.json()["error"]) == {"code", "message", "action"}
    outside = client.post("/retrieval/context", json={"query": QUERY, "filters": {"repo": "secret"}},
                          headers={"Authorization": f"Bearer {token}"})
    assert outside.status_code == 403 and set(outside.json()["error"]) == {"code", "message", "action"}


def test_a_403_says_how_to_get_a_token_that_allows_it_on_this_gateway(gateway):
    client, token = gateway
    auth = {"Authorization": f"Bearer {token}"}
    for filters, named in (({"repo": "secret"}, "--repo secret"), ({"tenant": "other"}, "--tenant other"),
                           ({"repo": "x; rm -rf ~"}, "--repo REPO")):  # only a plain name is pasted into the command
        r = client.post("/retrieval/context", json={"query": QUERY, "filters": filters}, headers=auth)
        assert r.status_code == 403, r.text
        action = r.json()["error"]["action"]
        assert "`moonmind gateway add-token --name NAME " in action and named in action, action
        assert "MoonMind admin" not in action


def test_health_is_ok_with_an_indexed_collection(gateway):
    client, _ = gateway
    assert client.get("/retrieval/live").json() == {"status": "up"}
    assert client.get("/retrieval/health").json() == {"status": "ok"}
