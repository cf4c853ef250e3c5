"""`moonmind rag sync-embedding` (issue 3): change the model, sync, search works; interrupt, re-run, nothing lost.

The new model is served by a real local OpenAI-compatible server (the static
model's vectors, doubled to 512 dims), so retrieval quality after the sync is
checked, not just shapes.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from conftest import MOONMIND
from http_servers import EmbeddingsServer


@pytest.fixture
def embeddings():
    server = EmbeddingsServer(repeat=2)
    yield server
    server.close()


def _hosted(server: EmbeddingsServer, **extra: str) -> dict[str, str]:
    env = {"MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-sync", "OPENAI_BASE_URL": server.base_url,
           "MOONMIND_EMBEDDING_MODEL": "local-embed-512"}
    env.update(extra)
    return env


def _snapshot() -> tuple[dict[str, str], object]:
    """(point id -> chunk_hash, collection info) of the configured collection, read in-process."""
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store

    store = open_store(Settings())
    try:
        points = {h.id: h.payload["chunk_hash"] for h in store.scroll(None, ["chunk_hash"])}
        return points, store.info()
    finally:
        store.close()


@pytest.mark.slow
def test_sync_moves_the_collection_to_the_new_model_and_search_works_again(cli, prebuilt, embeddings, home):
    before, info = _snapshot()
    assert info.model == "moonmind-static-code-256" and len(before) > 0
    hosted = _hosted(embeddings)
    assert cli("rag", "search", "--query", "bearer token", extra_env=hosted).code == 3  # refused: drifted

    dry = cli("rag", "sync-embedding", "--collection", "moonmind__repo", "--dry-run", "--json", extra_env=hosted)
    assert dry.code == 0, dry.stderr
    plan = dry.json()["plan"]
    assert plan["to_embed"] == plan["points"] == len(before) and plan["already_done"] == 0
    assert (plan["source_dimensions"], plan["target_dimensions"]) == (256, 512)
    assert embeddings.texts_embedded == 1  # the dimension probe: a dry run embeds nothing
    assert _snapshot()[1].model == "moonmind-static-code-256"  # and writes nothing

    r = cli("rag", "sync-embedding", "--collection", "moonmind__repo", extra_env=hosted)
    assert r.code == 0, r.stderr
    assert r.stdout.startswith("synced moonmind__repo:") and "local-embed-512" in r.stdout
    after, info = _snapshot()
    assert after == before  # same points, same chunk hashes: nothing lost, nothing duplicated
    assert (info.model, info.dimensions, info.points) == ("local-embed-512", 512, len(before))

    r = cli("rag", "search", "--query", "where are bearer tokens checked", "--json", extra_env=hosted)
    assert r.code == 0, r.stderr
    assert r.json()["items"][0]["source"] == "auth/tokens.py"
    assert r.json()["items"][0]["model_version"] == "local-embed-512"
    # the old data is gone; the old model is now the one refused
    assert not (home / "qdrant-edge" / "moonmind__repo" / "shard").exists()
    r = cli("rag", "search", "--query", "bearer token")
    assert r.code == 3 and "embedding_dimension_mismatch" in r.stderr


@pytest.mark.slow
def test_sync_on_an_up_to_date_collection_changes_nothing(cli, prebuilt):
    r = cli("rag", "sync-embedding", "--collection", "moonmind__repo")
    assert r.code == 0 and "nothing to sync" in r.stdout


def test_sync_of_a_missing_collection_says_index_first(invoke):
    r = invoke("rag", "sync-embedding", "--collection", "nope", "--json")
    assert r.code == 3 and r.stdout == ""
    assert r.error()["code"] == "collection_missing" and "moonmind rag index" in r.error()["action"]


def _start_sync(env: dict[str, str], tmp_path) -> subprocess.Popen:
    return subprocess.Popen([MOONMIND, "rag", "sync-embedding", "--collection", "moonmind__repo"], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_an_interrupted_sync_resumes_without_duplicates_or_losses(cli, prebuilt, embeddings, env, tmp_path):
    before, _ = _snapshot()
    hosted = _hosted(embeddings, MOONMIND_EMBEDDING_BATCH_SIZE="1")
    embeddings.delay_s = 0.15
    proc = _start_sync({**env, **hosted}, tmp_path)
    _wait_for(lambda: embeddings.texts_embedded >= 4)  # the probe and three chunks
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    embeddings.delay_s = 0.0

    dry = cli("rag", "sync-embedding", "--collection", "moonmind__repo", "--dry-run", "--json", extra_env=hosted)
    plan = dry.json()["plan"]
    assert plan["already_done"] >= 2 and plan["to_embed"] == len(before) - plan["already_done"]
    embedded_before_rerun = embeddings.texts_embedded

    r = cli("rag", "sync-embedding", "--collection", "moonmind__repo", "--json", extra_env=hosted)
    assert r.code == 0, r.stderr
    assert r.json()["embedded"] == plan["to_embed"]  # continued where it stopped
    assert embeddings.texts_embedded - embedded_before_rerun == plan["to_embed"]
    after, info = _snapshot()
    assert after == before and info.points == len(before) and info.model == "local-embed-512"


@pytest.mark.slow
def test_searches_keep_working_against_the_old_collection_during_the_sync(cli, prebuilt, embeddings, env, tmp_path):
    expected = cli("rag", "search", "--query", "connection pool", "--json").json()["items"]
    hosted = _hosted(embeddings, MOONMIND_EMBEDDING_BATCH_SIZE="1")
    embeddings.hold_after = 3  # the probe and two chunks, then the sync waits on the provider
    proc = _start_sync({**env, **hosted}, tmp_path)
    try:
        assert embeddings.holding.wait(timeout=60)  # the sync is mid-way through re-embedding
        during = cli("rag", "search", "--query", "connection pool", "--json")  # the old model, another process
        assert proc.poll() is None
    finally:
        embeddings.released.set()
        out, err = proc.communicate(timeout=120)
    assert during.code == 0, during.stderr
    assert during.json()["items"] == expected
    assert proc.returncode == 0, err
    assert _snapshot()[1].model == "local-embed-512"


@pytest.mark.slow
def test_qdrant_client_path_switches_an_alias_and_drops_the_old_collection(env, repo, embeddings, monkeypatch, tmp_path):
    from moonmind_worker.contracts import RetrievalQuery
    from moonmind_worker.embedding import StaticEmbedder, make_embedder
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.indexing.sync import sync_embedding
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store

    monkeypatch.setenv("QDRANT_URL", str(tmp_path / "qdrant-local"))
    store = open_store(Settings())
    static = StaticEmbedder()
    index_repository(repo, repo="demo", tenant="acme", settings=Settings(), embedder=static, store=store)
    old_physical = store.alias_target()
    assert old_physical is not None  # created behind an alias from the start
    before = {h.id: h.payload["chunk_hash"] for h in store.scroll(None, ["chunk_hash"])}
    query = RetrievalQuery(query="connection pool")
    expected = retrieve_context_pack(query, settings=Settings(), embedder=static, store=store).items

    for k, v in _hosted(embeddings).items():
        monkeypatch.setenv(k, v)
    hosted = make_embedder(Settings())
    seen_during: list = []

    def progress(done: int, total: int) -> None:
        if not seen_during:  # mid-sync: the name still serves the old model's vectors
            seen_during.append(retrieve_context_pack(query, settings=Settings(), embedder=static, store=store).items)

    try:
        result = sync_embedding(store, hosted, batch_size=2, progress=progress)
        assert seen_during == [expected]
        assert result.switched and store.alias_target() == result.plan.target
        assert not store._client.collection_exists(old_physical)
        assert {h.id: h.payload["chunk_hash"] for h in store.scroll(None, ["chunk_hash"])} == before
        pack = retrieve_context_pack(RetrievalQuery(query="where are bearer tokens checked"), settings=Settings(),
                                     embedder=hosted, store=store)
        assert pack.items[0].source == "auth/tokens.py"
    finally:
        store.close()
