"""The OpenAI-compatible embedding provider against a real local HTTP server.

The server (tests/http_servers.py) speaks POST /v1/embeddings like OpenAI (float
or base64 encoding), checks the bearer key, and here returns deterministic hashed
bag-of-words vectors, so retrieval through it is meaningful: a query shares words
with the chunk it should find.
"""

from __future__ import annotations

import re
import zlib

import pytest

from conftest import FIXTURE_FILES
from http_servers import EmbeddingsServer

DIMS = 64
MODEL = "hash-bow-64"
KEY = "sk-test-0123456789abcdef"


def bow_vectors(texts: list[str]) -> list[list[float]]:
    out = []
    for text in texts:
        v = [0.0] * DIMS
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            v[zlib.crc32(word.encode()) % DIMS] += 1.0
        out.append(v)
    return out


@pytest.fixture
def server():
    s = EmbeddingsServer(embed=bow_vectors, api_key=KEY)
    yield s
    s.close()


@pytest.fixture
def openai_env(server):
    return {
        **server.provider_env(KEY),
        "MOONMIND_EMBEDDING_MODEL": MODEL,
        "MOONMIND_EMBEDDING_BATCH_SIZE": "3",
    }


@pytest.mark.slow
def test_index_and_search_end_to_end_through_the_provider(cli, repo, server, openai_env):
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=openai_env)
    assert r.code == 0, r.stderr
    assert r.json()["files_indexed"] == len(FIXTURE_FILES)
    assert server.requests and all(q["model"] == MODEL and q["auth"] == f"Bearer {KEY}" for q in server.requests)
    assert all(len(q["input"]) <= 3 for q in server.requests)  # MOONMIND_EMBEDDING_BATCH_SIZE

    r = cli("rag", "search", "--query", "where are bearer tokens checked", "--filters", "repo=demo", "--json",
            extra_env=openai_env)
    assert r.code == 0, r.stderr
    pack = r.json()
    assert pack["items"][0]["source"] == "auth/tokens.py"
    assert {i["model_version"] for i in pack["items"]} == {MODEL}
    assert server.embedded_texts()[-1] == "where are bearer tokens checked"


@pytest.mark.slow
def test_query_whitespace_is_normalised_before_embedding(cli, repo, server, openai_env):
    assert cli("rag", "index", str(repo), "--repo", "demo", extra_env=openai_env).code == 0
    r = cli("rag", "search", "--query", "  connection\n\tpool   ", "--filters", "repo=demo", extra_env=openai_env)
    assert r.code == 0, r.stderr
    assert server.embedded_texts()[-1] == "connection pool"


@pytest.mark.slow
def test_unchanged_re_index_makes_no_embedding_requests(cli, repo, server, openai_env):
    assert cli("rag", "index", str(repo), "--repo", "demo", extra_env=openai_env).code == 0
    before = len(server.requests)
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=openai_env)
    assert r.code == 0, r.stderr
    assert r.json()["files_unchanged"] == len(FIXTURE_FILES)
    assert len(server.requests) == before


@pytest.mark.slow
def test_rejected_key_is_unauthenticated_without_leaking_it(cli, repo, server, openai_env):
    env = {**openai_env, "OPENAI_API_KEY": "sk-wrong-secret-value"}
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=env)
    assert r.code == 4 and r.stdout == ""
    assert r.error()["code"] == "unauthenticated"
    assert "sk-wrong-secret-value" not in r.stderr and "Traceback" not in r.stderr
    assert len(server.requests) == 1  # auth failures are not retried


@pytest.mark.slow
def test_transient_server_error_is_retried(cli, repo, server, openai_env):
    server.fail_first, server.fail_status = 1, 503
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=openai_env)
    assert r.code == 0, r.stderr
    assert r.json()["files_indexed"] == len(FIXTURE_FILES)


def test_missing_key_is_refused_before_any_request(invoke, repo, server, openai_env):
    env = {**openai_env, "OPENAI_API_KEY": ""}
    r = invoke("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=env)
    assert r.code == 3 and r.error()["code"] == "missing_credentials"
    assert "OPENAI_API_KEY" in r.error()["message"]
    assert server.requests == []


# ------------------------------------------- issue 52: the provider's answers are checked ---


def _embedder(server: EmbeddingsServer, dims: int | None = None, timeout_s: float = 30.0):
    from pathlib import Path
    from tempfile import mkdtemp

    from moonmind_worker.embedding.openai_compatible import OpenAICompatibleEmbedder

    return OpenAICompatibleEmbedder(MODEL, KEY, server.base_url, "openai", None, timeout_s, 8, Path(mkdtemp()),
                                    known_dimensions=dims)


def _answering(vectors):
    s = EmbeddingsServer(embed=vectors, api_key=KEY)
    return s


@pytest.mark.parametrize("name, vectors, says", [
    ("a NaN", lambda texts: [[float("nan")] + v[1:] for v in bow_vectors(texts)], "not a finite number"),
    ("an infinity", lambda texts: [[float("inf")] + v[1:] for v in bow_vectors(texts)], "not a finite number"),
    ("one vector fewer", lambda texts: bow_vectors(texts)[:-1], "vectors (indices"),
    ("an all-zero vector", lambda texts: [[0.0] * DIMS for _ in texts], "all-zero vector"),
    ("vectors of two sizes", lambda texts: [v[: DIMS - i] for i, v in enumerate(bow_vectors(texts))], "sizes"),
])
def test_an_answer_that_is_not_one_good_vector_per_input_is_refused_before_anything_is_stored(name, vectors, says):
    from moonmind_worker.errors import MoonmindError

    server = _answering(vectors)
    try:
        with pytest.raises(MoonmindError) as caught:
            _embedder(server, DIMS).embed_documents(["check bearer token", "connection pool"])
    finally:
        server.close()
    assert caught.value.code == "embedding_provider_error"
    assert says in caught.value.message and "nothing was stored" in caught.value.action
    assert server.calls == 1  # a malformed answer is not retried


def test_a_vector_of_another_size_than_the_models_is_refused():
    from moonmind_worker.errors import MoonmindError

    server = _answering(lambda texts: [v + [1.0] for v in bow_vectors(texts)])
    try:
        with pytest.raises(MoonmindError) as caught:
            _embedder(server, DIMS).embed_query("check bearer token")
    finally:
        server.close()
    assert f"{DIMS + 1} dimensions where this model gives {DIMS}" in caught.value.message


def test_an_answer_larger_than_the_bound_is_an_error_that_says_so():
    from moonmind_worker.embedding.openai_compatible import MAX_ANSWER_BYTES
    from moonmind_worker.errors import MoonmindError

    server = _answering(bow_vectors)
    server.pad_bytes = MAX_ANSWER_BYTES + 1
    try:
        with pytest.raises(MoonmindError) as caught:
            _embedder(server, DIMS).embed_query("check bearer token")
    finally:
        server.close()
    assert caught.value.code == "embedding_provider_error"
    assert "larger than 32 MiB" in caught.value.message
    assert server.calls == 1
