"""The "RAG ready" badge and status page (spec 02 CAP4) on the RetrievalGateway.

The app in process (TestClient) against the session's prebuilt index (repo=demo, tenant=acme) for
what each caller may see; a real `moonmind gateway serve` on loopback, rendered by a real headless
Chromium (Debian's /usr/bin/chromium), for what a person's browser shows.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from moonmind_worker.contracts import TokenGrant
from moonmind_worker.gateway.app import create_app
from moonmind_worker.gateway.auth import add_token, hash_token, new_token
from moonmind_worker.settings import get_settings

CHROMIUM = Path("/usr/bin/chromium")


def grant(repos: list[str], tenants: list[str]) -> str:
    """A new token for repos x tenants, in the gateway's token file (which it reloads when it changes)."""
    token = new_token()
    add_token(get_settings().tokens_file, TokenGrant(name=f"{repos[0]}-{tenants[0]}", hash=hash_token(token), repos=repos,
                                                     tenants=tenants))
    return token


def gateway_app():
    if not get_settings().tokens_file.exists():  # the gateway will not start without its token file
        grant(["unused"], ["unused"])
    return create_app(get_settings())


@pytest.fixture
def client(prebuilt):
    with TestClient(gateway_app()) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_badge_says_rag_ready_when_retrieval_is_ready(client):
    r = client.get("/retrieval/badge.svg")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    assert r.text.startswith("<svg") and 'aria-label="RAG: ready"' in r.text and "demo" not in r.text


def test_the_badge_says_not_ready_before_anything_is_indexed(env):
    with TestClient(gateway_app()) as c:
        r = c.get("/retrieval/badge.svg")
    assert r.status_code == 200 and 'aria-label="RAG: not ready"' in r.text


def test_without_a_token_the_status_says_ready_and_names_no_repository(client):
    r = client.get("/retrieval/status")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["rag_ready"] is True and body["status"] == "ready" and body["reason"] is None
    assert "repositories" not in body and "bearer token" in body["hidden"]
    assert "demo" not in r.text and "acme" not in r.text


def test_a_token_sees_the_repositories_inside_its_scope_with_chunks_model_and_freshness(client):
    body = client.get("/retrieval/status", headers=bearer(grant(["demo"], ["acme"]))).json()
    (row,) = body["repositories"]
    assert (row["repo"], row["tenant"]) == ("demo", "acme") and row["chunks"] > 0 and row["files"] == 4
    assert row["model"] == body["model"] == "moonmind-static-code-256"
    assert row["last_indexed"] and row["fresh"] is True and body["freshness"] == "fresh"
    assert body["chunks"] == row["chunks"] and body["last_indexed"] == row["last_indexed"]
    assert body["owner"]["role"]


def test_a_token_for_other_repositories_sees_none_of_these(client):
    for repos, tenants in ((["other"], ["acme"]), (["demo"], ["globex"])):
        body = client.get("/retrieval/status", headers=bearer(grant(repos, tenants))).json()
        assert body["repositories"] == [] and body["chunks"] == 0 and body["rag_ready"] is True


def test_a_wrong_token_on_the_status_is_401_in_the_envelope(client):
    r = client.get("/retrieval/status", headers=bearer("mmw_nope"))
    assert r.status_code == 401 and set(r.json()["error"]) == {"code", "message", "action"}


def test_the_status_page_is_html_showing_what_the_caller_may_see(client):
    anonymous = client.get("/retrieval/status.html")
    assert anonymous.status_code == 200 and anonymous.headers["content-type"].startswith("text/html")
    assert "RAG ready" in anonymous.text and "demo" not in anonymous.text
    page = client.get("/retrieval/status.html", headers=bearer(grant(["demo"], ["acme"]))).text
    assert "<td>demo</td><td>acme</td>" in page and "moonmind-static-code-256" in page and "fresh, " in page


def test_the_status_names_the_last_retrieval_this_gateway_served(client):
    token = grant(["demo"], ["acme"])
    assert client.get("/retrieval/status", headers=bearer(token)).json()["last_retrieval"] is None
    pack = client.post("/retrieval/context", json={"query": "bearer token"}, headers=bearer(token)).json()
    assert client.get("/retrieval/status", headers=bearer(token)).json()["last_retrieval"] == pack["retrieved_at"]


def test_a_public_status_lists_every_repository_without_a_token(prebuilt, monkeypatch):
    monkeypatch.setenv("MOONMIND_GATEWAY_STATUS", "public")
    get_settings.cache_clear()
    with TestClient(gateway_app()) as c:
        body = c.get("/retrieval/status").json()
    assert [(r["repo"], r["tenant"]) for r in body["repositories"]] == [("demo", "acme")]


# ---------------------------------------------------------- a real browser ---

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="no headless browser: /usr/bin/chromium is absent (apt-get install -y chromium chromium-driver; .ci/run does)",
)


def dump_dom(url: str, profile: Path) -> str:
    """The DOM Chromium builds for `url`, headless, as it serialises it."""
    p = subprocess.run(
        [str(CHROMIUM), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", f"--user-data-dir={profile}",
         "--dump-dom", url],
        capture_output=True, text=True, timeout=90,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


@pytest.fixture
def public_gateway(prebuilt, env, home, tmp_path):
    from gateway_helpers import start_gateway

    grant(["unused"], ["unused"])  # the gateway will not start without its token file
    gw = start_gateway(home, {**env, "MOONMIND_GATEWAY_STATUS": "public"}, tmp_path)
    yield gw
    gw.stop()


@needs_chromium
@pytest.mark.slow
def test_a_headless_browser_shows_the_status_page_of_a_real_gateway(public_gateway, tmp_path):
    dom = dump_dom(public_gateway.url + "/retrieval/status.html", tmp_path / "profile")
    assert '<h1 id="headline">RAG ready</h1>' in dom
    assert "<td>demo</td><td>acme</td><td>4</td>" in dom  # repository, tenant, files
    assert "moonmind-static-code-256" in dom and "fresh, " in dom  # the age depends on when the shared index was built
    assert 'src="badge.svg"' in dom


@needs_chromium
@pytest.mark.slow
def test_a_headless_browser_renders_the_badge_of_a_real_gateway(public_gateway, tmp_path):
    dom = dump_dom(public_gateway.url + "/retrieval/badge.svg", tmp_path / "profile")
    assert "<svg" in dom and "<title>RAG: ready</title>" in dom
    shot = tmp_path / "badge.png"
    p = subprocess.run(
        [str(CHROMIUM), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", f"--user-data-dir={tmp_path / 'p2'}",
         "--window-size=200,40", f"--screenshot={shot}", public_gateway.url + "/retrieval/badge.svg"],
        capture_output=True, text=True, timeout=90,
    )
    assert p.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p.stderr[-2000:]

