"""Transient failures are retried with backoff; auth and validation never are (issue 3; spec 01 edge cases).

The failures are real: a local OpenAI-compatible server that answers 503 / 429 /
401 or goes down and comes back, and a Qdrant client whose connection resets
beneath the store. tenacity runs for real (its waits included).
"""

from __future__ import annotations

import time

import pytest

from http_servers import EmbeddingsServer, closed_port


@pytest.fixture
def embeddings():
    server = EmbeddingsServer(repeat=2)
    yield server
    server.close()


def _embedder(monkeypatch, base_url: str, key: str = "sk-retry"):
    from moonmind_worker.embedding import make_embedder
    from moonmind_worker.settings import Settings

    monkeypatch.setenv("MOONMIND_EMBEDDING_PROVIDER", "openai")
    monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    monkeypatch.setenv("MOONMIND_EMBEDDING_MODEL", "local-embed-512")
    return make_embedder(Settings())


def test_provider_5xx_is_retried_until_it_answers(env, monkeypatch, embeddings):
    embeddings.fail_first = 2
    vec = _embedder(monkeypatch, embeddings.base_url).embed_query("connection pool")
    assert vec.shape == (512,)
    assert embeddings.calls == 3


def test_rate_limit_without_quota_is_retried(env, monkeypatch, embeddings):
    embeddings.fail_first, embeddings.fail_status = 1, 429
    _embedder(monkeypatch, embeddings.base_url).embed_query("connection pool")
    assert embeddings.calls == 2


def test_quota_exhausted_429_is_reported_as_quota_and_not_retried(env, monkeypatch, embeddings):
    from moonmind_worker.errors import MoonmindError

    embeddings.quota = True
    with pytest.raises(MoonmindError) as exc:
        _embedder(monkeypatch, embeddings.base_url).embed_query("connection pool")
    assert exc.value.code == "quota_exhausted" and exc.value.exit_code == 4
    assert "quota" in exc.value.message and "quota" in exc.value.action
    assert embeddings.calls == 1


@pytest.mark.parametrize("status,code", [(401, "unauthenticated"), (403, "forbidden"), (400, "embedding_provider_error")])
def test_auth_and_validation_errors_are_never_retried(env, monkeypatch, embeddings, status, code):
    from moonmind_worker.errors import MoonmindError

    embeddings.always_status = status
    with pytest.raises(MoonmindError) as exc:
        _embedder(monkeypatch, embeddings.base_url).embed_query("connection pool")
    assert exc.value.code == code and f"HTTP {status}" in exc.value.message
    assert embeddings.calls == 1
    if status == 401:
        assert "OPENAI_API_KEY" in exc.value.action


@pytest.mark.slow
def test_when_retries_run_out_the_error_says_what_failed_and_how_often(env, monkeypatch, embeddings):
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.retry import MAX_ATTEMPTS

    embeddings.always_status = 503
    with pytest.raises(MoonmindError) as exc:
        _embedder(monkeypatch, embeddings.base_url).embed_query("connection pool")
    err = exc.value
    assert err.code == "embedding_provider_error"
    assert "openai embeddings (local-embed-512)" in err.message and "HTTP 503" in err.message
    assert f"Gave up after {MAX_ATTEMPTS} attempts" in err.message and err.details["attempts"] == MAX_ATTEMPTS
    assert embeddings.calls == MAX_ATTEMPTS


@pytest.mark.slow
def test_connection_reset_by_the_provider_is_retried(env, monkeypatch, embeddings):
    embedder = _embedder(monkeypatch, embeddings.base_url)
    embedder.embed_query("warm up")  # dimension known, connection pooled
    embeddings.reset_first = 2
    calls_before = embeddings.calls
    vec = embedder.embed_query("connection pool")
    assert vec.shape == (512,)
    assert embeddings.calls - calls_before == 3  # two resets, then the answer


@pytest.mark.slow
def test_connection_refused_is_reported_as_cannot_connect(env, monkeypatch):
    from moonmind_worker.errors import MoonmindError

    with pytest.raises(MoonmindError) as exc:
        _embedder(monkeypatch, f"http://127.0.0.1:{closed_port()}/v1").embed_query("x")
    assert exc.value.code == "embedding_provider_error" and "cannot connect" in exc.value.message
    assert exc.value.details["attempts"] > 1


def test_retries_stop_at_the_callers_latency_budget(env, monkeypatch, embeddings):
    import openai

    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.retry import call_with_retries

    embeddings.always_status = 503
    client = openai.OpenAI(api_key="sk-budget", base_url=embeddings.base_url, max_retries=0)
    # a budget already spent: the first failure stops the retries, since any backoff would sleep past it
    with pytest.raises(MoonmindError) as exc:
        call_with_retries(lambda: client.embeddings.create(model="m", input=["x"]), what="embeddings",
                          deadline=time.monotonic(), attempts=50)
    assert embeddings.calls == 1 and exc.value.details["attempts"] == 1
    assert "latency budget" in exc.value.message


class _FlakyClient:
    """The real qdrant-client beneath the store, whose connection resets for the first `failures` queries."""

    def __init__(self, inner, failures: int, exc: BaseException) -> None:
        self._inner, self.failures, self._exc, self.attempts = inner, failures, exc, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def query_batch_points(self, *a, **kw):
        self.attempts += 1
        if self.attempts <= self.failures:
            raise self._exc
        return self._inner.query_batch_points(*a, **kw)


@pytest.fixture
def local_store(env, repo, monkeypatch, tmp_path):
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store

    monkeypatch.setenv("QDRANT_URL", str(tmp_path / "qdrant-local"))
    settings = Settings()
    store = open_store(settings)
    index_repository(repo, repo="demo", tenant="acme", settings=settings, embedder=StaticEmbedder(), store=store)
    yield settings, store
    store.close()


def test_qdrant_connection_reset_mid_query_is_retried(local_store):
    from moonmind_worker.contracts import RetrievalQuery
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack

    settings, store = local_store
    store._client = flaky = _FlakyClient(store._client, failures=2, exc=ConnectionResetError("reset by peer"))
    pack = retrieve_context_pack(RetrievalQuery(query="bearer token"), settings=settings,
                                 embedder=StaticEmbedder(), store=store)
    assert pack.items and pack.items[0].source == "auth/tokens.py"
    assert flaky.attempts == 3


@pytest.mark.slow
def test_qdrant_down_for_good_fails_with_connectivity_and_no_pack(local_store):
    from moonmind_worker.contracts import RetrievalQuery
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.retry import MAX_ATTEMPTS

    settings, store = local_store
    store._client = flaky = _FlakyClient(store._client, failures=99, exc=TimeoutError("timed out"))
    with pytest.raises(MoonmindError) as exc:
        retrieve_context_pack(RetrievalQuery(query="bearer token"), settings=settings,
                              embedder=StaticEmbedder(), store=store)
    assert exc.value.code == "qdrant_unreachable" and exc.value.exit_code == 4
    assert f"Gave up after {MAX_ATTEMPTS} attempts" in exc.value.message
    assert flaky.attempts == MAX_ATTEMPTS
