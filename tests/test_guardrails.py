"""Guardrails before any vector operation (issue 3; spec 01 US2, FR-003).

Each refusal is an acceptance scenario: the right code and exit class, expected
vs actual where it applies, the remedy, nothing on stdout, and — for a drifted
model — not a single query reaching the store.
"""

from __future__ import annotations

import pytest

from http_servers import EmbeddingsServer, StatusServer, closed_port


@pytest.fixture
def embeddings():
    server = EmbeddingsServer(repeat=2)
    yield server
    server.close()


class CountingStore:
    """The real store, with every data-plane call counted at the Store interface."""

    DATA_PLANE = ("search", "scroll", "count", "upsert", "delete", "delete_ids", "create", "set_metadata")

    def __init__(self, inner) -> None:
        self._inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name in self.DATA_PLANE:
            def counted(*a, **kw):
                self.calls.append(name)
                return attr(*a, **kw)
            return counted
        return attr


def _hosted(embeddings: EmbeddingsServer, model: str) -> dict[str, str]:
    return {"MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-guard", "OPENAI_BASE_URL": embeddings.base_url,
            "MOONMIND_EMBEDDING_MODEL": model}


@pytest.fixture(params=["edge", "local"])
def store_kind(request, env, monkeypatch, tmp_path):
    if request.param == "local":
        monkeypatch.setenv("QDRANT_URL", str(tmp_path / "qdrant-local"))
    return request.param


def _index_static(settings, repo):
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.store import open_store

    store = open_store(settings)
    index_repository(repo, repo="demo", tenant="acme", settings=settings, embedder=StaticEmbedder(), store=store)
    return store


@pytest.mark.slow
def test_dimension_mismatch_refuses_before_any_query_reaches_the_store(store_kind, repo, embeddings, monkeypatch):
    from moonmind_worker.contracts import RetrievalQuery
    from moonmind_worker.embedding import make_embedder
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import Settings

    store = _index_static(Settings(), repo)
    for k, v in _hosted(embeddings, "local-embed-512").items():
        monkeypatch.setenv(k, v)
    settings = Settings()
    counting = CountingStore(store)
    try:
        with pytest.raises(MoonmindError) as exc:
            retrieve_context_pack(RetrievalQuery(query="bearer token"), settings=settings,
                                  embedder=make_embedder(settings), store=counting)
    finally:
        store.close()
    err = exc.value
    assert err.code == "embedding_dimension_mismatch" and err.exit_code == 3
    assert err.message == "Collection moonmind__repo expects dim=256 but local-embed-512 outputs 512."
    assert err.action == "Run moonmind rag sync-embedding --collection moonmind__repo"
    assert counting.calls == []  # not one search, scroll or count
    assert embeddings.calls == 1  # the dimension probe only; the query itself was never embedded


@pytest.mark.slow
def test_cli_dimension_mismatch_prints_expected_vs_actual_and_caches_the_probe(cli, prebuilt, embeddings, home):
    r = cli("rag", "search", "--query", "bearer token", extra_env=_hosted(embeddings, "local-embed-512"))
    assert r.code == 3 and r.stdout == ""
    assert "error[embedding_dimension_mismatch]: Collection moonmind__repo expects dim=256 but local-embed-512 outputs 512." in r.stderr
    assert "action: Run moonmind rag sync-embedding --collection moonmind__repo" in r.stderr
    assert "Traceback" not in r.stderr
    assert embeddings.calls == 1
    assert "local-embed-512" in (home / "embedding-dimensions.json").read_text()
    r = cli("rag", "search", "--query", "bearer token", "--json", extra_env=_hosted(embeddings, "local-embed-512"))
    assert r.code == 3 and r.error()["code"] == "embedding_dimension_mismatch"
    assert embeddings.calls == 1  # the model's dimension was cached per model in MOONMIND_HOME


@pytest.mark.slow
def test_same_dimension_model_swap_is_refused(env, repo, monkeypatch):
    from moonmind_worker.contracts import RetrievalQuery
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import Settings

    store = _index_static(Settings(), repo)
    other = StaticEmbedder(name="other-minilm-256")  # same 256 dims, a different model
    counting = CountingStore(store)
    try:
        with pytest.raises(MoonmindError) as exc:
            retrieve_context_pack(RetrievalQuery(query="pool"), settings=Settings(), embedder=other, store=counting)
    finally:
        store.close()
    assert exc.value.code == "embedding_model_mismatch"
    assert "moonmind-static-code-256" in exc.value.message and "other-minilm-256" in exc.value.message
    assert "sync-embedding --collection moonmind__repo" in exc.value.action
    assert counting.calls == []


@pytest.mark.slow
def test_index_refuses_to_write_into_a_collection_of_another_model(cli, prebuilt, embeddings):
    r = cli("rag", "index", str(prebuilt), "--repo", "demo", "--tenant", "acme",
            extra_env=_hosted(embeddings, "local-embed-512"))
    assert r.code == 3 and r.stdout == ""
    assert "embedding_dimension_mismatch" in r.stderr
    assert embeddings.calls == 1  # probe only: nothing was embedded, nothing written
    assert cli("rag", "search", "--query", "bearer token").code == 0  # the collection is intact


@pytest.mark.slow
def test_missing_embedding_credential_names_the_variable_and_where_it_is_read(cli, prebuilt):
    r = cli("rag", "search", "--query", "bearer token", "--json", extra_env={"MOONMIND_EMBEDDING_PROVIDER": "google"})
    assert r.code == 3 and r.stdout == ""
    err = r.error()
    assert err["code"] == "missing_credentials"
    assert "GOOGLE_API_KEY is not set" in err["message"] and ".env" in err["message"]


def test_search_on_a_missing_collection_says_run_index(invoke):
    r = invoke("rag", "search", "--query", "bearer token")
    assert r.code == 3 and r.stdout == ""
    assert "error[collection_missing]" in r.stderr and "moonmind rag index" in r.stderr


@pytest.mark.slow
def test_unreadable_schema_version_is_refused(env, repo):
    from moonmind_worker.contracts import RetrievalQuery
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import Settings

    store = _index_static(Settings(), repo)
    store.set_metadata(schema_version=99)
    try:
        with pytest.raises(MoonmindError) as exc:
            retrieve_context_pack(RetrievalQuery(query="pool"), settings=Settings(), embedder=StaticEmbedder(),
                                  store=CountingStore(store))
    finally:
        store.close()
    assert exc.value.code == "schema_unsupported" and "v99" in exc.value.message


@pytest.mark.slow
def test_unreachable_qdrant_is_a_connectivity_error_with_no_partial_output(cli):
    r = cli("rag", "search", "--query", "bearer token", "--json",
            extra_env={"QDRANT_URL": f"http://127.0.0.1:{closed_port()}"})
    assert r.code == 4 and r.stdout == ""
    err = r.error()
    assert err["code"] == "qdrant_unreachable" and "cannot connect" in err["message"]
    assert "attempts" in err["message"] and "QDRANT_URL" in err["action"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "status,key,code",
    [(401, "qk-wrong", "unauthenticated"), (403, "qk-readonly", "forbidden"), (401, None, "missing_credentials")],
)
def test_qdrant_auth_failures_are_told_apart_and_not_retried(cli, status, key, code):
    server = StatusServer(status)
    extra = {"QDRANT_URL": server.url}
    if key:
        extra["QDRANT_API_KEY"] = key
    try:
        r = cli("rag", "search", "--query", "bearer token", "--json", extra_env=extra)
    finally:
        server.close()
    assert r.code == (3 if code == "missing_credentials" else 4) and r.stdout == ""
    err = r.error()
    assert err["code"] == code and f"HTTP {status}" in err["message"]
    assert "QDRANT_API_KEY" in err["action"]
    assert len(server.requests) == 1  # auth failures are never retried


@pytest.mark.slow
def test_overlay_write_with_a_drifted_model_is_refused_before_any_write(env, repo):
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.indexing.overlay import upsert_overlay
    from moonmind_worker.settings import Settings

    store = _index_static(Settings(), repo)
    (repo / "auth" / "tokens.py").write_text("def check_bearer_token(header):\n    return False\n")
    counting = CountingStore(store)
    before = store.count()
    try:
        with pytest.raises(MoonmindError) as exc:
            upsert_overlay(["auth/tokens.py"], root=repo, run_id="run-1", ttl_s=600, repo="demo", tenant="acme",
                           settings=Settings(), embedder=StaticEmbedder(name="other-minilm-256"), store=counting)
        assert exc.value.code == "embedding_model_mismatch"
        assert counting.calls == []  # no scroll, no upsert
        assert store.count() == before
    finally:
        store.close()


@pytest.mark.slow
def test_an_index_the_retired_static_model_embedded_is_sent_to_sync_embedding(env, repo):
    """Upgrading past moonmind-static-minilm-256: the old index is refused, and the one remedy is re-embedding it."""
    from moonmind_worker.contracts import RetrievalQuery
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store

    store = open_store(Settings())
    try:
        index_repository(repo, repo="demo", tenant="acme", settings=Settings(), store=store,
                         embedder=StaticEmbedder(name="moonmind-static-minilm-256"))
        with pytest.raises(MoonmindError) as exc:
            retrieve_context_pack(RetrievalQuery(query="pool"), settings=Settings(), embedder=StaticEmbedder(),
                                  store=store)
    finally:
        store.close()
    assert exc.value.code == "embedding_model_mismatch"
    assert exc.value.action == "Run moonmind rag sync-embedding --collection moonmind__repo."


def test_configuring_the_retired_static_model_names_the_upgrade_path(monkeypatch):
    from moonmind_worker.embedding import make_embedder
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.settings import Settings

    monkeypatch.setenv("MOONMIND_EMBEDDING_MODEL", "moonmind-static-minilm-256")
    with pytest.raises(MoonmindError) as exc:
        make_embedder(Settings())
    assert exc.value.code == "invalid_argument"
    assert "moonmind-static-code-256" in exc.value.message and "sync-embedding" in exc.value.action
