"""BM25 statistics per repository (issue 34, item 3): a search's results do not depend on what else is indexed.

Every test runs on both real engines: Qdrant Edge on disk and qdrant-client's local mode.
"""

from __future__ import annotations

import pytest

from moonmind_worker.contracts import parse_query
from moonmind_worker.indexing.indexer import index_repository
from moonmind_worker.retrieval.pipeline import retrieve_context_pack
from moonmind_worker.store import LEXICAL_FORMAT_KEY, Match, Where, lexstats

from conftest import FIXTURE_FILES, write_tree

#: Another repository: terms shared with the fixture repository (token, bearer, pool, connection) and its own.
OTHER_FILES = {
    "auth/session.py": '"""Session cookies and bearer token refresh."""\n\n\ndef refresh_bearer_token(session, token):\n'
                       '    """Swap an expiring bearer token for a new one."""\n    return session.exchange(token)\n',
    "db/pool.py": '"""A connection pool for the analytics warehouse."""\n\n\nclass WarehousePool:\n'
                  '    def acquire_connection(self):\n        return self.connections.pop()\n',
    "billing/invoice.py": '"""Invoices and their line items."""\n\n\ndef total_invoice(lines):\n'
                          '    return sum(line.amount for line in lines)\n',
}
QUERIES = ("where are bearer tokens checked", "database connection pool", "token")


@pytest.fixture(params=["edge", "local"])
def world(request, env, tmp_path, monkeypatch):
    """An empty collection on one engine; returns (index(name, files), search(query, **filters), store, embedder)."""
    from moonmind_worker.runtime import get_embedder
    from moonmind_worker.settings import get_settings
    from moonmind_worker.store import open_store

    if request.param == "local":
        monkeypatch.setenv("QDRANT_URL", ":memory:")
    get_settings.cache_clear()
    settings = get_settings()
    embedder = get_embedder(settings)
    store = open_store(settings)

    def index(name: str, files: dict[str, str]):
        root = write_tree(tmp_path / name, files)
        return index_repository(root, repo=name, tenant="acme", settings=settings, embedder=embedder, store=store)

    def search(query: str, **filters):
        q = parse_query({"query": query, "filters": filters, "top_k": 20, "score_threshold": 0.0})
        return retrieve_context_pack(q, settings=settings, embedder=embedder, store=store)

    yield index, search, store, embedder
    store.close()


def _results(pack) -> list[tuple[str, str, int, float]]:
    return [(i.source, i.chunk_hash, i.offset_start, i.score) for i in pack.items]


def _same(before, after) -> bool:
    return [r[:3] for r in before] == [r[:3] for r in after] and all(
        abs(a[3] - b[3]) <= 1e-6 for a, b in zip(before, after))


@pytest.mark.slow
def test_indexing_another_repository_changes_nothing_in_a_search_scoped_to_the_first(world):
    index, search, _, _ = world
    index("demo", FIXTURE_FILES)
    before = {q: _results(search(q, repo="demo")) for q in QUERIES}
    index("other", OTHER_FILES)
    after = {q: _results(search(q, repo="demo")) for q in QUERIES}
    assert all(before[q] for q in QUERIES)
    assert {q: _same(before[q], after[q]) for q in QUERIES} == {q: True for q in QUERIES}


@pytest.mark.slow
def test_a_search_over_two_repositories_counts_the_documents_of_both(world):
    index, _, store, _ = world
    index("demo", FIXTURE_FILES)
    index("other", OTHER_FILES)
    info = store.info()
    terms = sorted({t for ts in store.sparse_terms(Where(must=(Match("trust_class", "canonical"),))) for t in ts})[:50]
    both = lexstats.frequencies(store, info, parse_query({"query": "x"}), None, terms)
    one = [lexstats.frequencies(store, info, parse_query({"query": "x", "filters": {"repo": r}}), None, terms)
           for r in ("demo", "other")]
    assert both == (one[0][0] + one[1][0], [a + b for a, b in zip(one[0][1], one[1][1])])


@pytest.mark.slow
def test_the_stored_table_matches_a_count_of_the_repository_points_after_an_incremental_run(world):
    index, _, store, _ = world
    index("demo", FIXTURE_FILES)
    edited = {**FIXTURE_FILES, "auth/tokens.py": FIXTURE_FILES["auth/tokens.py"] + "\n\ndef revoke_token(token):\n    return None\n"}
    edited.pop(next(p for p in FIXTURE_FILES if p != "auth/tokens.py"))  # one file deleted, one changed
    index("demo", edited)
    entry = lexstats.entries(store.info())["acme/demo"]
    stored = store.read_term_table("acme/demo", entry["version"])
    counted = lexstats.count_repo(store, "acme", "demo", entry["version"])
    assert (stored.docs, list(stored.ids), list(stored.counts)) == (counted.docs, list(counted.ids), list(counted.counts))


def test_a_table_left_stale_by_a_cut_run_is_counted_from_the_points_with_the_same_results(world):
    index, search, store, _ = world
    index("demo", FIXTURE_FILES)
    before = _results(search("where are bearer tokens checked", repo="demo"))
    tables = lexstats.entries(store.info())
    tables["acme/demo"]["version"] = None  # what a run killed between its first and its last write leaves
    store.set_metadata(**{lexstats.TABLES_KEY: tables})
    assert _same(before, _results(search("where are bearer tokens checked", repo="demo")))


@pytest.mark.slow
def test_a_collection_made_before_the_tables_is_still_searched(world):
    index, search, store, _ = world
    index("demo", FIXTURE_FILES)
    store.set_metadata(**{LEXICAL_FORMAT_KEY: None})  # what a collection with the engine's IDF modifier holds
    assert not lexstats.scoped(store.info())
    assert search("where are bearer tokens checked", repo="demo").items


@pytest.mark.slow
def test_sync_embedding_rebuilds_a_collection_made_before_the_tables_with_the_same_results(world):
    from moonmind_worker.indexing.sync import sync_embedding

    index, search, store, embedder = world
    index("demo", FIXTURE_FILES)
    before = _results(search("where are bearer tokens checked", repo="demo"))
    store.set_metadata(**{LEXICAL_FORMAT_KEY: None, lexstats.TABLES_KEY: None})
    assert sync_embedding(store, embedder).switched
    version = lexstats.entries(store.info())["acme/demo"]["version"]
    assert lexstats.scoped(store.info()) and store.read_term_table("acme/demo", version) is not None
    assert _same(before, _results(search("where are bearer tokens checked", repo="demo")))
