"""No API key, token or credential-bearing URL in any output of any failing path (issue 3, "Secrets").

Every path runs the real CLI with sentinel secrets configured, against real
loopback servers that fail the way the path needs, and greps stdout + stderr.
"""

from __future__ import annotations

import pytest

from http_servers import EmbeddingsServer, StatusServer, closed_port

QDRANT_KEY = "SENTINEL-QDRANT-KEY-7f3a91"
OPENAI_KEY = "SENTINEL-OPENAI-KEY-9b1c22"
GOOGLE_KEY = "SENTINEL-GOOGLE-KEY-2d4e83"
URL_PASS = "SENTINEL-URL-PASS-5e6f04"
TOKEN = "SENTINEL-GATEWAY-TOKEN-c0ffee"
QUERY_KEY = "SENTINEL-QUERY-KEY-8a7b65"  # a credential in a URL's query string, not a configured secret
SENTINELS = (QDRANT_KEY, OPENAI_KEY, GOOGLE_KEY, URL_PASS, TOKEN, QUERY_KEY)


def _with_creds(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://moonmind:{URL_PASS}@{rest}"


@pytest.fixture
def servers():
    emb, q401, q403 = EmbeddingsServer(), StatusServer(401), StatusServer(403)
    yield emb, q401, q403
    for s in (emb, q401, q403):
        s.close()


def _scenarios(emb: EmbeddingsServer, q401: StatusServer, q403: StatusServer) -> dict[str, tuple[list[str], dict, str]]:
    """name -> (argv, env, expected error code)."""
    search = ["rag", "search", "--query", "bearer token"]
    base = {"QDRANT_API_KEY": QDRANT_KEY, "OPENAI_API_KEY": OPENAI_KEY, "GOOGLE_API_KEY": GOOGLE_KEY,
            "MOONMIND_RETRIEVAL_TOKEN": TOKEN}
    openai = {**base, "MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_BASE_URL": _with_creds(emb.base_url),
              "MOONMIND_EMBEDDING_MODEL": "local-embed-512"}
    dead = f"http://127.0.0.1:{closed_port()}"
    return {
        "qdrant unreachable": (search, {**base, "QDRANT_URL": _with_creds(dead)}, "qdrant_unreachable"),
        "qdrant 401": (search + ["--json"], {**base, "QDRANT_URL": _with_creds(q401.url)}, "unauthenticated"),
        "qdrant 403": (["rag", "index", ".", "--repo", "r"], {**base, "QDRANT_URL": _with_creds(q403.url)}, "forbidden"),
        "provider 401": (search + ["--json"], {**openai, "_status": "401"}, "unauthenticated"),
        "provider quota": (search, {**openai, "_quota": "1"}, "quota_exhausted"),
        "provider down": (search, {**openai, "_status": "503"}, "embedding_provider_error"),
        "google unreachable": (search, {**base, "MOONMIND_EMBEDDING_PROVIDER": "google",
                                        "GOOGLE_OPENAI_BASE_URL": _with_creds(dead) + "/v1"},
                               "embedding_provider_error"),
        "dimension mismatch": (search + ["--json"], openai, "embedding_dimension_mismatch"),
        "sync, provider 401": (["rag", "sync-embedding", "--collection", "moonmind__repo"],
                               {**openai, "_status": "401"}, "unauthenticated"),
        "qdrant unreachable, key in the URL query": (search, {**base, "QDRANT_URL": f"{dead}?api_key={QUERY_KEY}"},
                                                     "qdrant_unreachable"),
        "doctor, keys in URL queries": (["worker", "doctor", "--json"],
                                        {**base, "QDRANT_URL": f"{dead}/?api_key={QUERY_KEY}&timeout=5",
                                         "MOONMIND_RETRIEVAL_URL": f"{dead}/gw?access_token={QUERY_KEY}",
                                         "CELERY_BROKER_URL": f"redis://127.0.0.1:{closed_port()}/2?password={QUERY_KEY}"},
                                        "qdrant_unreachable"),
        "doctor, all broken": (["worker", "doctor", "--json"],
                               {**openai, "_status": "401", "QDRANT_URL": _with_creds(q401.url),
                                "MOONMIND_RETRIEVAL_URL": _with_creds(dead),
                                "CELERY_BROKER_URL": f"redis://:{URL_PASS}@127.0.0.1:{closed_port()}/2"},
                               "unauthenticated"),
    }


SCENARIOS = ["qdrant unreachable", "qdrant 401", "qdrant 403", "provider 401", "provider quota", "provider down",
             "google unreachable", "dimension mismatch", "sync, provider 401", "doctor, all broken",
             "qdrant unreachable, key in the URL query", "doctor, keys in URL queries"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIOS)
def test_no_secret_appears_in_any_failing_output(cli, prebuilt, servers, name):
    emb, q401, q403 = servers
    argv, env, code = _scenarios(emb, q401, q403)[name]
    env = dict(env)
    if env.pop("_quota", None):
        emb.quota = True
    if status := env.pop("_status", None):
        emb.always_status = int(status)
    r = cli(*argv, extra_env=env, cwd=prebuilt)
    assert r.code != 0, r.stdout
    text = r.stdout + r.stderr
    assert code in text, text
    for secret in SENTINELS:
        assert secret not in text, f"{name}: leaked {secret[:12]}…"
    assert "Traceback" not in text
    if not argv[:2] == ["worker", "doctor"]:
        assert r.stdout == ""  # nothing partial on stdout


@pytest.mark.parametrize("text,expected", [
    ("https://generativelanguage.googleapis.com/v1beta/models/text-embedding-004:embedContent?key=AIzaSyA-x_9",
     "https://generativelanguage.googleapis.com/v1beta/models/text-embedding-004:embedContent?key=***"),
    ("Qdrant at http://qdrant:6333?api_key=qk-1: cannot connect.", "Qdrant at http://qdrant:6333?api_key=***: cannot connect."),
    ("redis://cache:6379/2?password=pw&socket_timeout=5", "redis://cache:6379/2?password=***&socket_timeout=5"),
    ("https://h/cb?state=ok&access_token=a.b-c#top", "https://h/cb?state=ok&access_token=***#top"),
    ("https://h/cb#id_token=abc&state=ok", "https://h/cb#id_token=***&state=ok"),
    ("https://h/?token=t1&apikey=t2&client_secret=t3", "https://h/?token=***&apikey=***&client_secret=***"),
    ("https://b.s3.amazonaws.com/o?X-Amz-Date=20240101&X-Amz-Signature=ff00",
     "https://b.s3.amazonaws.com/o?X-Amz-Date=20240101&X-Amz-Signature=***"),
    ("url 'http://h/v1?api_key=k' rejected", "url 'http://h/v1?api_key=***' rejected"),
    ("http://user:pw@h/v1?api_key=k", "http://***@h/v1?api_key=***"),
])
def test_redact_replaces_credential_query_values_and_keeps_the_names(text, expected):
    from moonmind_worker.errors import redact

    assert redact(text) == expected


@pytest.mark.parametrize("text", [
    "https://example.com/search?q=monkey&keyword=token&sort=key&page=2#section",
    "https://example.com/monkey=1/token=2?turkey=3&keys=4",
    "http://127.0.0.1:6333/collections/moonmind__repo/points/search?wait=true",
    "Set MOONMIND_RETRIEVAL_TOKEN=... or pass --token; key=value pairs are fine in prose.",
])
def test_redact_leaves_ordinary_urls_and_text_alone(text):
    from moonmind_worker.errors import redact

    assert redact(text) == text
