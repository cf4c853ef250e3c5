"""One store test-suite, run against both engines: Qdrant Edge and qdrant-client local mode.

Both stores must mean the same thing for every filter and operation, or a scope
filter could silently widen on one path; so every test here runs on both.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest

from moonmind_worker.settings import Settings
from moonmind_worker.store import (
    EdgeStore,
    Match,
    MatchAny,
    PointIn,
    QdrantClientStore,
    Range,
    SearchSpec,
    SparseVec,
    Where,
    edge,
)

DIMS = 4


def _id(n: int) -> str:
    return str(uuid.UUID(int=n + 1))


def _vec(*values: float) -> np.ndarray:
    v = np.asarray(values, dtype=np.float32)
    return v / np.linalg.norm(v)


#: (n, dense, sparse term ids, payload)
ROWS = [
    (0, _vec(1, 0, 0, 0), [1, 2], {"repo": "a", "tenant": "t1", "path": "x.py", "trust_class": "canonical", "expires_at": 10.0}),
    (1, _vec(0.9, 0.1, 0, 0), [2, 3], {"repo": "a", "tenant": "t1", "path": "y.py", "trust_class": "canonical", "expires_at": 20.0}),
    (2, _vec(0, 1, 0, 0), [3, 4], {"repo": "b", "tenant": "t1", "path": "x.py", "trust_class": "canonical", "expires_at": 30.0}),
    (3, _vec(0, 0, 1, 0), [4, 5], {"repo": "a", "tenant": "t2", "path": "z.md", "trust_class": "workspace_overlay", "expires_at": 40.0}),
    (4, _vec(0, 0, 0, 1), [5, 6], {"repo": "c", "tenant": "t2", "path": "y.py", "trust_class": "canonical", "expires_at": 50.0}),
]


def _points() -> list[PointIn]:
    out = []
    for n, dense, terms, payload in ROWS:
        out.append(
            PointIn(
                id=_id(n),
                dense=dense,
                sparse=SparseVec(terms, [1.0] * len(terms)),
                payload={**payload, "n": n, "text": f"chunk {n}", "chunk_hash": f"sha256:{n}", "offset_start": n},
            )
        )
    return out


@pytest.fixture(params=["edge", "edge-flat", "local"])
def store(request, tmp_path, monkeypatch):
    if request.param == "edge-flat":  # a store the previous version made: each keyword field flat, indexed on its own
        monkeypatch.setattr(edge, "KEYED_ON_CREATE", False)
    if request.param.startswith("edge"):
        s = EdgeStore(tmp_path / "edge", "test_coll")
    else:
        s = QdrantClientStore(Settings(QDRANT_URL=":memory:"), "test_coll")
    yield s
    s.close()


@pytest.fixture
def filled(store):
    store.create(DIMS, "test-model", 1)
    store.upsert(_points())
    store.flush()
    return store


def _ns(hits) -> list[int]:
    return [h.payload["n"] for h in hits]


def _dense(where: Where | None = None, limit: int = 10, q=(1, 0, 0, 0), **kw) -> SearchSpec:
    return SearchSpec(where=where or Where(), limit=limit, dense=_vec(*q), **kw)


def test_missing_collection_has_no_info(store):
    assert store.info() is None


@pytest.mark.slow
def test_create_records_dimensions_model_and_schema(store):
    store.create(DIMS, "test-model", 1)
    info = store.info()
    assert (info.name, info.dimensions, info.model, info.schema_version, info.points) == (
        "test_coll", DIMS, "test-model", 1, 0,
    )


@pytest.mark.slow
def test_metadata_is_kept_with_the_collection(filled):
    filled.set_metadata(last_indexed_at=123.5)
    info = filled.info()
    assert info.extra["last_indexed_at"] == 123.5
    assert info.model == "test-model" and info.schema_version == 1


@pytest.mark.slow
def test_create_again_starts_empty(filled):
    filled.create(DIMS, "other-model", 1)
    info = filled.info()
    assert info.points == 0 and info.model == "other-model"


@pytest.mark.slow
def test_dense_search_orders_by_cosine(filled):
    hits = filled.search([_dense()])[0]
    assert _ns(hits)[:2] == [0, 1]
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))


@pytest.mark.slow
def test_sparse_search_scores_only_matching_terms(filled):
    hits = filled.search([SearchSpec(where=Where(), limit=10, sparse=SparseVec([6], [1.0]))])[0]
    assert _ns(hits) == [4]
    assert hits[0].score > 0


@pytest.mark.slow
def test_batched_dense_and_sparse_branches_answer_in_order(filled):
    dense, sparse = filled.search([_dense(limit=1), SearchSpec(where=Where(), limit=10, sparse=SparseVec([3], [1.0]))])
    assert _ns(dense) == [0]
    assert sorted(_ns(sparse)) == [1, 2]


@pytest.mark.slow
def test_sparse_branch_hits_carry_their_cosine_to_the_dense_query(filled):
    q = _vec(1, 1, 0, 0)
    hits = filled.search([SearchSpec(where=Where(), limit=10, sparse=SparseVec([3, 4], [1.0, 1.0]), cosine_to=q)])[0]
    assert sorted(_ns(hits)) == [1, 2, 3]
    by_n = {h.payload["n"]: h for h in hits}
    for n, dense, _, _ in ROWS[1:4]:
        assert by_n[n].cosine == pytest.approx(float(np.dot(q, dense)), abs=1e-5)
    assert hits[0].payload["n"] == 2  # still ranked by BM25 (both terms), not by cosine


@pytest.mark.slow
def test_dense_branch_hits_carry_their_bm25_for_the_sparse_query(filled):
    hits = filled.search([_dense(limit=5, bm25_to=SparseVec([2, 3], [1.0, 1.0]))])[0]
    by_n = {h.payload["n"]: h for h in hits}
    assert [h.payload["n"] for h in hits][:2] == [0, 1]  # still ranked by cosine
    assert by_n[1].bm25 > by_n[0].bm25 > 0 and by_n[2].bm25 > 0  # n=1 has both terms; 0 and 2 one each
    assert by_n[3].bm25 == by_n[4].bm25 == 0.0  # no query term in them


@pytest.mark.slow
def test_a_branch_returns_only_the_payload_fields_it_asked_for(filled):
    narrow, wide = filled.search([_dense(limit=2, fields=("path",)), _dense(limit=2)])
    assert [set(h.payload) for h in narrow] == [{"path"}, {"path"}]
    assert all("text" in h.payload and "repo" in h.payload for h in wide)


@pytest.mark.slow
def test_match_filter(filled):
    assert sorted(_ns(filled.search([_dense(Where(must=(Match("repo", "a"),)))])[0])) == [0, 1, 3]


@pytest.mark.slow
def test_match_filters_combine_as_and(filled):
    where = Where(must=(Match("repo", "a"), Match("tenant", "t1")))
    assert sorted(_ns(filled.search([_dense(where)])[0])) == [0, 1]


@pytest.mark.slow
def test_match_any_filter(filled):
    where = Where(must=(MatchAny("repo", ("b", "c")),))
    assert sorted(_ns(filled.search([_dense(where)])[0])) == [2, 4]


@pytest.mark.slow
def test_range_filter(filled):
    where = Where(must=(Range("expires_at", gt=10.0, lte=40.0),))
    assert sorted(_ns(filled.search([_dense(where)])[0])) == [1, 2, 3]


@pytest.mark.slow
def test_must_not_filter(filled):
    where = Where(must_not=(Match("trust_class", "workspace_overlay"), Match("repo", "c")))
    assert sorted(_ns(filled.search([_dense(where)])[0])) == [0, 1, 2]


@pytest.mark.slow
def test_nested_should_filter(filled):
    """tenant t1 AND (path x.py OR path z.md): a nested boolean filter."""
    either = Where(should=(Match("path", "x.py"), Match("path", "z.md")))
    where = Where(must=(Match("tenant", "t1"), either))
    assert sorted(_ns(filled.search([_dense(where)])[0])) == [0, 2]


@pytest.mark.slow
def test_filter_that_matches_nothing_returns_no_hits(filled):
    assert filled.search([_dense(Where(must=(Match("repo", "nope"),)))])[0] == []


@pytest.mark.slow
def test_count_with_and_without_filter(filled):
    assert filled.count() == 5
    assert filled.count(Where(must=(Match("tenant", "t2"),))) == 2


@pytest.mark.slow
def test_scroll_returns_every_match_with_requested_fields(filled):
    hits = list(filled.scroll(Where(must=(Match("repo", "a"),)), ["path", "n"], batch=2))
    assert sorted(h.payload["n"] for h in hits) == [0, 1, 3]
    assert all(set(h.payload) == {"path", "n"} for h in hits)
    assert {h.id for h in hits} == {_id(0), _id(1), _id(3)}


@pytest.mark.slow
def test_scroll_everything(filled):
    assert len(list(filled.scroll(None, True))) == 5


@pytest.mark.slow
def test_delete_by_filter(filled):
    filled.delete(Where(must=(Match("repo", "a"), Match("tenant", "t1"))))
    assert filled.count() == 3
    assert sorted(h.payload["n"] for h in filled.scroll(None, ["n"])) == [2, 3, 4]


@pytest.mark.slow
def test_delete_by_ids(filled):
    filled.delete_ids([_id(0), _id(4)])
    filled.delete_ids([])
    assert sorted(h.payload["n"] for h in filled.scroll(None, ["n"])) == [1, 2, 3]


@pytest.mark.slow
def test_upsert_same_id_replaces_the_point(filled):
    p = _points()[0]
    p.payload["text"] = "replaced"
    filled.upsert([p])
    assert filled.count() == 5
    hits = filled.search([_dense(Where(must=(Match("path", "x.py"), Match("repo", "a"))))])[0]
    assert [h.payload["text"] for h in hits] == ["replaced"]


def test_data_survives_reopening(filled, tmp_path):
    if not isinstance(filled, EdgeStore):
        pytest.skip("in-memory local mode does not persist by design")
    filled.close()
    again = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        assert again.count() == 5
        assert again.info().model == "test-model"
    finally:
        again.close()


_ABRUPT_EXIT = """
import os, sys, uuid
from pathlib import Path
import numpy as np
from moonmind_worker.store import EdgeStore, Match, PointIn, SparseVec, Where
from moonmind_worker.store import edge
if __name__ == "__main__":
    root, step = Path(sys.argv[1]), sys.argv[2]
    edge.WAL_ON_CREATE = sys.argv[3] == "wal"
    store = EdgeStore(root, "test_coll")
    if step == "write":
        store.create(4, "test-model", 1)
        store.upsert([PointIn(id=str(uuid.UUID(int=n + 1)), dense=np.eye(4, dtype=np.float32)[n % 4], sparse=SparseVec([n + 1], [1.0]),
                              payload={"repo": "a", "tenant": "t", "path": f"m{n}.py"}) for n in range(6)])
    else:
        store.delete_ids([str(uuid.UUID(int=1))])
        store.delete(Where(must=(Match("path", "m1.py"),)))
    os._exit(0)  # no close, no flush: what a crash or SIGKILL leaves
"""


@pytest.mark.slow
@pytest.mark.parametrize("log", ["no_wal", "wal"])
def test_an_embedded_write_that_returned_survives_its_process_exiting_abruptly(log, tmp_path):
    """Writes (upsert, delete by id, delete by filter) then an exit with no flush and no close: the
    next open has every one of them, on a store with a write-ahead log (created before WAL_ON_CREATE)
    and on one without (each write is flushed before it returns)."""
    import subprocess
    import sys

    root = tmp_path / "edge"
    for step in ("write", "delete"):
        out = subprocess.run([sys.executable, "-c", _ABRUPT_EXIT, str(root), step, log], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
    assert (root / "test_coll" / "shard" / "wal").is_dir() == (log == "wal")
    store = EdgeStore(root, "test_coll")
    try:
        assert sorted(h.payload["path"] for h in store.scroll(None, ["path"])) == ["m2.py", "m3.py", "m4.py", "m5.py"]
    finally:
        store.close()


@pytest.mark.slow
def test_a_new_embedded_store_keeps_no_write_ahead_log(tmp_path):
    """Every open of a log maps and checks its retained files (tens of MB resident in each process
    holding the store, BENCHMARKS.md "no write-ahead log"): a new store has none, before and after a reopen."""
    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        store.upsert(_points())
    finally:
        store.close()
    again = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        assert again.count() == len(ROWS)
        again.delete_ids([_id(0)])
    finally:
        again.close()
    assert not (tmp_path / "edge" / "test_coll" / "shard" / "wal").exists()


def test_an_embedded_flush_acknowledges_an_empty_wal_entry_after_the_last_write(tmp_path, monkeypatch):
    """On a store with a write-ahead log (created before WAL_ON_CREATE), the entry every later open
    decodes again (the acknowledged one) is the empty delete, not the last batch.

    Read from the engine's own record of the acknowledged index (`wal/first-index`): a flush after
    one upsert moves it by two (the upsert, then the empty entry); a flush with nothing written adds none.
    """
    import json

    from moonmind_worker.store import edge

    monkeypatch.setattr(edge, "WAL_ON_CREATE", True)

    def acknowledged() -> int:
        return json.loads((tmp_path / "edge" / "test_coll" / "shard" / "wal" / "first-index").read_text())["ack_index"]

    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        store.upsert(_points()[:2])
        store.flush()
        before = acknowledged()
        store.upsert(_points()[2:])
        store.flush()
        assert acknowledged() == before + 2
        store.flush()
        assert acknowledged() == before + 2
    finally:
        store.close()
    again = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        assert again.count() == len(ROWS)  # every write is still there after the reopen
    finally:
        again.close()


def test_a_query_vector_may_be_a_plain_float32_array(filled):
    from array import array

    q = _vec(0.9, 0.1, 0, 0)
    as_numpy = filled.search([SearchSpec(where=Where(), limit=3, dense=q)])
    as_array = filled.search([SearchSpec(where=Where(), limit=3, dense=array("f", q.tolist()))])  # the numpy-free query path
    assert [(h.id, h.score) for h in as_array[0]] == [(h.id, h.score) for h in as_numpy[0]]


@pytest.mark.slow
def test_an_embedded_store_maps_its_graph_sparse_index_and_payload_indexes_instead_of_pinning_them(tmp_path):
    import json

    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        store.upsert(_points())
        store.optimize()
        store.flush()
    finally:
        store.close()
    shard = tmp_path / "edge" / "test_coll" / "shard"
    config = json.loads((shard / "edge_config.json").read_text())  # the engine's own record of the placement
    assert config["hnsw_config"]["memory"] == config["sparse_vectors"]["bm25"]["memory"] == "cached"
    indexes = [json.loads(p.read_text()) for p in shard.glob("segments/*/payload_index/config.json")]
    assert indexes and all(f["memory"] == "cached" for i in indexes for f in i["indexed_fields"].values())


@pytest.mark.slow
def test_a_write_larger_than_a_segment_is_optimized_as_it_goes_into_capped_segments(tmp_path, monkeypatch):
    """Every segment the engine builds stays near the cap, so no optimize handles more than one segment's worth.

    The cap is scaled down (128 points of 4 dims per segment, graphs from 64 points) so that a
    few hundred points cross it several times; every point stays readable and searchable across
    the optimizes (each reloads the shard) in between.
    """
    import json

    from moonmind_worker.store import edge

    monkeypatch.setattr(edge, "SEGMENT_KB", 2)  # 2 KB of 4-d float32 vectors = 128 points
    monkeypatch.setattr(edge, "INDEXING_KB", 1)
    reloads = []
    reload = EdgeStore._reload
    monkeypatch.setattr(EdgeStore, "_reload", lambda self, *graph: (reloads.append(self._unindexed), reload(self, *graph)))
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(400, DIMS)).astype(np.float32)
    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        for start in range(0, 400, 50):
            store.upsert([PointIn(id=_id(n), dense=vectors[n], sparse=SparseVec([n + 1], [1.0]),
                                  payload={"repo": "a", "tenant": "t1", "n": n}) for n in range(start, start + 50)])
        store.optimize()
        store.flush()
        assert store.count() == 400
        assert store._open().info().segments_count >= 3  # 400 points, at most 128 + one batch of 50 each
        assert reloads.count(0) >= 2  # each full segment's optimize is followed by a fresh load of the shard
        for n in (0, 199, 399):
            hit = store.search([SearchSpec(where=Where(), limit=1, dense=vectors[n] / np.linalg.norm(vectors[n]))])[0][0]
            assert (hit.id, hit.payload["n"]) == (_id(n), n)
    finally:
        store.close()
    config = json.loads((tmp_path / "edge" / "test_coll" / "shard" / "edge_config.json").read_text())
    assert config["optimizers"]["max_segment_size"] == 2  # the cap is the shard's own, kept by every later open


def _segment_links(shard) -> list[int]:
    """The graph's links per point (m) of each built segment of a shard: 0 is a segment scanned whole."""
    return sorted(json.loads(p.read_text())["m"] for p in (shard / "segments").glob("*/vector_index-dense/hnsw_config.json"))


def test_a_new_embedded_store_is_scanned_whole_until_it_grows_to_take_the_graph(tmp_path, monkeypatch):
    """Below `edge_shard.GRAPH_FROM_SEGMENTS` (2) segments' worth a new store's segments are built without a graph
    (exact search); the optimize after it reaches that size gives the shard the graph (m 16, beam 64), rebuilds
    every segment with it, and records it in meta.json; searches find the same before and after. Scaled down:
    64 points a segment, so the graph from 128."""
    from moonmind_worker.store import edge, edge_shard

    monkeypatch.setattr(edge, "SEGMENT_KB", 1)  # 1 KB of 4-d float32 vectors = 64 points
    monkeypatch.setattr(edge, "INDEXING_KB", 1)
    assert edge_shard.GRAPH_FROM_SEGMENTS == 2
    shard = tmp_path / "edge" / "test_coll" / "shard"
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(200, DIMS)).astype(np.float32)

    def write(store, numbers) -> None:
        store.upsert([PointIn(id=_id(n), dense=vectors[n], sparse=SparseVec([n + 1], [1.0]),
                              payload={"repo": "a", "tenant": "t1", "n": n}) for n in numbers])
        store.optimize()

    def nearest(store, n: int) -> int:
        return store.search([SearchSpec(where=Where(must=(Match("repo", "a"),)), limit=1, dense=vectors[n])])[0][0].payload["n"]

    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        write(store, range(120))
        assert _segment_links(shard) and set(_segment_links(shard)) == {0}
        assert store.info().extra["dense_search"] == "exact"
        assert [nearest(store, n) for n in (0, 70, 119)] == [0, 70, 119]
        write(store, range(120, 200))
    finally:
        store.close()
    assert set(_segment_links(shard)) == {16}
    config = json.loads((shard / "edge_config.json").read_text())["hnsw_config"]
    assert (config["m"], config["ef_construct"]) == (16, edge_shard.EF_CONSTRUCT) == (16, 64)
    again = EdgeStore(tmp_path / "edge", "test_coll")  # a later open keeps the graph
    try:
        assert again.info().extra["dense_search"] == "graph"
        assert [nearest(again, n) for n in (0, 70, 119, 199)] == [0, 70, 119, 199]
    finally:
        again.close()


def test_a_store_made_with_the_graph_before_keeps_it_however_small(tmp_path, monkeypatch):
    """A store an older version created (the graph from its creation, no `dense_search` in meta.json) is not
    rebuilt without it: its next optimize builds its segments with the graph, as before."""
    from moonmind_worker.store import edge, edge_shard

    monkeypatch.setattr(edge, "INDEXING_KB", 1)
    hnsw = edge_shard._hnsw
    monkeypatch.setattr(edge_shard, "_hnsw", lambda graph: hnsw(True))  # what older versions created
    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        meta = store.info().extra
        meta.pop("dense_search")
        store._write_meta(meta)
        monkeypatch.setattr(edge_shard, "_hnsw", hnsw)
        rng = np.random.default_rng(4)
        store.upsert([PointIn(id=_id(n), dense=rng.normal(size=DIMS).astype(np.float32), sparse=SparseVec([1], [1.0]),
                              payload={"n": n}) for n in range(100)])
        store.optimize()
        assert "dense_search" not in store.info().extra
    finally:
        store.close()
    assert set(_segment_links(tmp_path / "edge" / "test_coll" / "shard")) == {16}


@pytest.mark.slow  # builds a graph over ~1,800 embedded chunks: about a second
def test_a_dense_search_through_the_graph_finds_what_an_exact_search_finds(tmp_path, monkeypatch):
    """The shipped graph (m 16, built with a beam of 64) searched with `DENSE_SEARCH_BEAM` returns the top 80
    chunks an exact scan ranks (recall ≥ 0.99 on average), where the engine's default beam (the limit) missed ~2%.
    Real vectors: this package's own source, 12-line chunks, embedded by the shipped model."""
    from moonmind_worker.embedding.static import StaticEmbedder
    from moonmind_worker.store import edge, edge_shard

    monkeypatch.setattr(edge, "INDEXING_KB", 1)  # a graph for this small store
    monkeypatch.setattr(edge_shard, "GRAPH_FROM_SEGMENTS", 0)
    monkeypatch.setattr(edge_shard, "FULL_SCAN_KB", 1)  # and searched through it, not scanned whole
    package = Path(edge.__file__).resolve().parent.parent
    texts = []
    for path in sorted(package.glob("**/*.py")):
        lines = path.read_text().splitlines()
        texts += ["\n".join(lines[i:i + 12]) for i in range(0, len(lines), 12)]
    embedder = StaticEmbedder()
    vectors = embedder.embed_documents(texts)
    ids = [_id(n) for n in range(len(texts))]
    queries = embedder.embed_documents([
        "how is the store opened", "retry with backoff", "parse the query filters", "celery task routing",
        "where are payload indexes created", "the owner socket's peer check", "token budget of a context pack",
        "chunking python with tree-sitter", "statsd metrics", "overlay expiry sweep", "gateway authentication",
        "cache of token ids",
    ])
    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(vectors.shape[1], "test-model", 1)
        for start in range(0, len(texts), 1000):
            store.upsert([PointIn(id=ids[n], dense=vectors[n], sparse=SparseVec([1], [1.0]),
                                  payload={"repo": "a", "tenant": "t1"}) for n in range(start, min(len(texts), start + 1000))])
        store.optimize()
        recalls = []
        for q in queries:
            found = {h.id for h in store.search([SearchSpec(where=Where(), limit=80, dense=q)])[0]}
            exact = {ids[n] for n in np.argsort(-(vectors @ q))[:80]}
            recalls.append(len(found & exact) / 80)
    finally:
        store.close()
    assert len(texts) > 1000
    assert sum(recalls) / len(recalls) >= 0.99, recalls  # 0.993-0.996 here; 0.978-0.981 with the default beam


def test_a_store_says_how_many_points_it_takes_before_a_write_builds_a_segment(store, monkeypatch):
    """What an index run reads to stop its workers before a build (`Store.room`): the embedded engine
    counts down to its segment cap and starts again after each build; a server builds on its own."""
    from moonmind_worker.store import edge

    monkeypatch.setattr(edge, "SEGMENT_KB", 1)  # 1 KB of 4-d float32 vectors = 64 points
    store.create(DIMS, "test-model", 1)
    if isinstance(store, QdrantClientStore):
        store.upsert(_points())
        assert store.room() is None
        return
    assert store.room() == 64
    store.upsert(_points())
    assert store.room() == 64 - len(ROWS)
    rng = np.random.default_rng(0)
    store.upsert([PointIn(id=_id(n), dense=rng.normal(size=DIMS).astype(np.float32), sparse=SparseVec([1], [1.0]),
                          payload={"repo": "a", "tenant": "t1"}) for n in range(100, 100 + store.room())])
    assert store.room() == 64  # that write filled the segment, which was built: a new one starts
    assert store.count() == 64


def _dense_storage(shard) -> list[str]:
    """What each segment of a shard records as its dense vectors' storage (e.g. `InRamChunkedMmap`, `Mmap`)."""
    import json

    return sorted(json.loads((seg / "segment.json").read_text())["config"]["vector_data"]["dense"]["storage_type"]
                  for seg in (shard / "segments").iterdir())


@pytest.mark.slow
def test_dense_vectors_are_mapped_in_the_segment_being_written_and_in_every_built_segment(tmp_path, monkeypatch):
    """No segment copies its dense vectors into memory on open: they are read where a search goes.

    Scaled down as above (graphs from 64 points) so that the optimize builds an indexed segment.
    """
    from moonmind_worker.store import edge

    monkeypatch.setattr(edge, "INDEXING_KB", 1)
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(200, DIMS)).astype(np.float32)
    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        store.upsert([PointIn(id=_id(n), dense=vectors[n], sparse=SparseVec([n + 1], [1.0]), payload={"n": n})
                      for n in range(200)])
        store.optimize()
        hit = store.search([SearchSpec(where=Where(), limit=1, dense=vectors[7] / np.linalg.norm(vectors[7]))])[0][0]
        assert hit.payload["n"] == 7
    finally:
        store.close()
    kinds = _dense_storage(tmp_path / "edge" / "test_coll" / "shard")
    assert "Mmap" in kinds  # the built segment
    assert not [k for k in kinds if k.startswith("InRam")], kinds


@pytest.mark.slow
def test_a_store_created_before_the_segment_cap_takes_it_at_its_next_large_optimize(tmp_path, monkeypatch):
    """... and so does a store whose dense vectors were copied into memory (what older versions created)."""
    import json

    from qdrant_edge import Distance, EdgeOptimizersConfig, EdgeVectorParams

    from moonmind_worker.store import edge

    shard = tmp_path / "edge" / "test_coll" / "shard"
    monkeypatch.setattr(edge, "_optimizers", lambda: EdgeOptimizersConfig())  # what older versions created
    monkeypatch.setattr(edge, "_dense", lambda dims: EdgeVectorParams(size=dims, distance=Distance.Cosine))
    store = EdgeStore(tmp_path / "edge", "test_coll")
    store.create(DIMS, "test-model", 1)
    meta = store.info().extra
    meta.pop("dense_search")  # an older version wrote none
    store._write_meta(meta)
    store.upsert(_points())
    store.close()
    assert json.loads((shard / "edge_config.json").read_text())["optimizers"]["max_segment_size"] is None
    assert [k for k in _dense_storage(shard) if k.startswith("InRam")]
    monkeypatch.undo()
    monkeypatch.setattr(edge, "RELOAD_BEFORE_OPTIMIZE", 3)  # a write this large reloads the shard first
    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.upsert([PointIn(id=_id(10 + n), dense=_vec(1, 1, n, 0), sparse=SparseVec([9], [1.0]), payload={"n": 10 + n})
                      for n in range(3)])
        store.optimize()
        assert store.count() == len(ROWS) + 3
        assert _ns(store.search([_dense(q=(0, 0, 0, 1), limit=1)])[0]) == [4]
    finally:
        store.close()
    config = json.loads((shard / "edge_config.json").read_text())
    assert config["optimizers"]["max_segment_size"] == edge.SEGMENT_KB
    assert config["vectors"]["dense"]["memory"] == "cold"
    assert not [k for k in _dense_storage(shard) if k.startswith("InRam")]  # the segments it wrote since


def test_a_store_this_version_made_builds_after_a_large_write_without_loading_its_shard_again(tmp_path, monkeypatch):
    """It has this version's settings from its creation, so its optimize goes straight to the build: loading the
    shard again first cut no memory a run needs, and cost a Django run ~2% of its wall (BENCHMARKS.md)."""
    from moonmind_worker.store import edge

    monkeypatch.setattr(edge, "RELOAD_BEFORE_OPTIMIZE", 3)
    reloads: list[bool] = []
    reload = EdgeStore._reload
    monkeypatch.setattr(EdgeStore, "_reload", lambda self, graph=False: (reloads.append(graph), reload(self, graph)))
    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        store.upsert(_points())
        store.optimize()
        assert reloads == []
        assert _ns(store.search([_dense(q=(0, 0, 0, 1), limit=1)])[0]) == [4]
    finally:
        store.close()


# ------------------------------------------------- one owner per store ---


@pytest.mark.slow
def test_second_process_on_a_busy_embedded_store_gets_store_busy(cli, indexed, home):
    import os

    holder = EdgeStore(home / "qdrant-edge", "moonmind__repo")
    try:
        assert holder.count() > 0  # this process now owns the store
        r = cli("rag", "search", "--query", "bearer token", "--filters", "repo=demo", "--json",
                extra_env={"MOONMIND_STORE_WAIT_S": "0.3"})
        assert r.code == 3 and r.stdout == ""
        assert "Traceback" not in r.stderr
        err = r.error()
        assert err["code"] == "store_busy"
        assert f"in use by PID {os.getpid()} (waited 0.3 s)" in err["message"]
        assert "QDRANT_URL" in err["action"]
        r = cli("rag", "index", str(indexed), "--repo", "demo", extra_env={"MOONMIND_STORE_WAIT_S": "0.3"})
        assert r.code == 3 and "store_busy" in r.stderr and "Traceback" not in r.stderr
    finally:
        holder.close()
    assert cli("rag", "search", "--query", "bearer token", "--filters", "repo=demo").code == 0


@pytest.mark.slow
def test_second_process_on_a_busy_local_mode_path_gets_store_busy(cli, repo, tmp_path):
    local = tmp_path / "qdrant-local"
    assert cli("rag", "index", str(repo), "--repo", "demo", extra_env={"QDRANT_URL": str(local)}).code == 0
    holder = QdrantClientStore(Settings(QDRANT_URL=str(local)), "moonmind__repo")
    try:
        r = cli("rag", "search", "--query", "token", "--json", extra_env={"QDRANT_URL": str(local)})
        assert r.code == 3 and r.stdout == "" and "Traceback" not in r.stderr
        assert r.error()["code"] == "store_busy"
    finally:
        holder.close()


def _one_repository(store, numbers=range(3)) -> None:
    """Points of repository "a", tenant "t1", canonical: every filter condition on them holds for all."""
    store.upsert([PointIn(id=_id(n), dense=_vec(1, n, 0, 0), sparse=SparseVec([1], [1.0]),
                          payload={"repo": "a", "tenant": "t1", "trust_class": "canonical", "n": n}) for n in numbers])


CANONICAL_A = Where(must=(Match("trust_class", "canonical"), Match("repo", "a")))


def test_a_condition_every_point_held_still_filters_once_a_write_breaks_it(store):
    """A warm store may skip checking a condition all its points hold (edge_census.py), never one a write has
    since made false: a chunk of another repository, or an overlay, written after a search stays out of it."""
    store.create(DIMS, "test-model", 1)
    _one_repository(store)
    assert sorted(_ns(store.search([_dense(CANONICAL_A)])[0])) == [0, 1, 2]
    store.upsert([PointIn(id=_id(7), dense=_vec(1, 0, 0, 0), sparse=SparseVec([1], [1.0]),
                          payload={"repo": "b", "tenant": "t1", "trust_class": "canonical", "n": 7})])
    store.upsert([PointIn(id=_id(8), dense=_vec(1, 0, 0, 0), sparse=SparseVec([1], [1.0]),
                          payload={"repo": "a", "tenant": "t1", "trust_class": "workspace_overlay", "n": 8})])
    assert sorted(_ns(store.search([_dense(CANONICAL_A)])[0])) == [0, 1, 2]
    assert sorted(_ns(store.search([_dense(Where(must=(Match("repo", "b"),)))])[0])) == [7]


def test_a_condition_a_delete_made_true_filters_again_after_the_next_write(store):
    """Deleting the only other repository's chunks makes "repo a" hold everywhere; a later write of another
    repository's chunk (by id over one of a's, too) must still be filtered out."""
    store.create(DIMS, "test-model", 1)
    _one_repository(store)
    store.upsert([PointIn(id=_id(7), dense=_vec(1, 0, 0, 0), sparse=SparseVec([1], [1.0]),
                          payload={"repo": "b", "tenant": "t1", "trust_class": "canonical", "n": 7})])
    store.delete(Where(must=(Match("repo", "b"),)))
    assert sorted(_ns(store.search([_dense(CANONICAL_A)])[0])) == [0, 1, 2]
    store.upsert([PointIn(id=_id(1), dense=_vec(1, 1, 0, 0), sparse=SparseVec([1], [1.0]),
                          payload={"repo": "b", "tenant": "t1", "trust_class": "canonical", "n": 1})])
    assert sorted(_ns(store.search([_dense(CANONICAL_A)])[0])) == [0, 2]
    store.delete_ids([_id(1)])
    assert sorted(_ns(store.search([_dense(CANONICAL_A)])[0])) == [0, 2]


def test_the_census_drops_only_text_matches_every_point_of_the_loaded_shard_holds(tmp_path):
    """What the embedded store leaves out of the engine's filter: matches all points hold; not a match some
    point fails, not a Range (an overlay's expiry holds now, not later), not a nested filter."""
    from moonmind_worker.store import edge_census
    from moonmind_worker.store.edge_census import Census
    from moonmind_worker.store.edge_payloads import keyed_where

    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        _one_repository(store)
        store.upsert([PointIn(id=_id(9), dense=_vec(1, 0, 0, 0), sparse=SparseVec([1], [1.0]),
                              payload={"repo": "a", "tenant": "t2", "trust_class": "canonical", "n": 9})])
        nested = Where(should=(Match("repo", "a"),))
        where = keyed_where(Where(must=(Match("repo", "a"), MatchAny("trust_class", ("canonical",)), Match("tenant", "t1"),
                                        Range("n", gte=0), nested), must_not=(Match("repo", "b"),)))
        census = Census()
        trimmed = census.trimmed(store._open(), where)
        assert trimmed.must == (where.must[2], where.must[3], where.must[4])  # tenant t1 (one point is t2), the range, the nested
        assert trimmed.must_not == where.must_not
        for n in range(edge_census.MAX_KNOWN + 10):  # a warm owner's searches on many paths: what it keeps stays bounded
            census.trimmed(store._open(), keyed_where(Where(must=(Match("path", f"p{n}.py"),))))
        assert 0 < len(census._known) <= edge_census.MAX_KNOWN
    finally:
        store.close()


def test_search_returns_only_the_requested_payload_fields(filled):
    dense, sparse = filled.search([
        _dense(limit=2, fields=("path", "n")),
        SearchSpec(where=Where(), limit=10, sparse=SparseVec([3], [1.0]), fields=("n",)),
    ])
    assert [h.payload for h in dense] == [{"path": "x.py", "n": 0}, {"path": "y.py", "n": 1}]
    assert sorted(h.payload["n"] for h in sparse) == [1, 2] and all(set(h.payload) == {"n"} for h in sparse)


def test_retrieve_returns_full_payloads_in_the_order_asked(filled):
    hits = filled.retrieve([_id(3), _id(0), str(uuid.UUID(int=999)), _id(1)])
    assert [h.payload["n"] for h in hits] == [3, 0, 1]  # the unknown id is skipped
    assert hits[0].payload["text"] == "chunk 3" and hits[0].payload["path"] == "z.md"
    assert [h.payload for h in filled.retrieve([_id(2)], ["path"])] == [{"path": "x.py"}]
    assert filled.retrieve([]) == []


def test_a_warm_store_returns_the_payload_of_the_latest_write(filled):
    first = filled.search([_dense(limit=5, fields=("path", "n"))])[0]  # warms any payload cache
    assert {h.payload["n"]: h.payload["path"] for h in first}[0] == "x.py"
    moved = _points()[0]
    moved.payload = {**moved.payload, "path": "moved.py"}
    filled.upsert([moved])
    filled.delete_ids([_id(1)])
    again = filled.search([_dense(limit=5, fields=("path", "n"))])[0]
    by_n = {h.payload["n"]: h.payload["path"] for h in again}
    assert by_n[0] == "moved.py" and 1 not in by_n


@pytest.mark.slow
def test_a_search_waits_for_a_short_hold_of_the_embedded_store(cli, indexed, home):
    import threading

    holder = EdgeStore(home / "qdrant-edge", "moonmind__repo")
    assert holder.count() > 0  # this process owns the store ...
    release = threading.Timer(0.8, holder.close)  # ... for 0.8 s, like a parallel `rag search`
    release.start()
    try:
        r = cli("rag", "search", "--query", "bearer token", "--filters", "repo=demo", "--json",
                extra_env={"MOONMIND_STORE_WAIT_S": "20"})
    finally:
        release.join()
    assert r.code == 0 and r.json()["items"], r.stderr


def test_both_stores_implement_every_operation_the_store_protocol_declares():
    import inspect

    from moonmind_worker.store import EdgeStore, EmbeddedStore, QdrantClientStore, Store

    declared = {n for n, v in vars(Store).items() if not n.startswith("_") and callable(v)}
    assert {"optimize", "alias_target", "sibling", "release", "switch_alias", "drop_physical"} <= declared
    for cls in (EdgeStore, QdrantClientStore):
        for name in declared:
            impl = getattr(cls, name, None)
            assert callable(impl), f"{cls.__name__} lacks {name}"
            want = list(inspect.signature(getattr(Store, name)).parameters)
            assert list(inspect.signature(impl).parameters)[: len(want)] == want, f"{cls.__name__}.{name}"
    assert callable(EdgeStore.hold) and isinstance(inspect.getattr_static(EdgeStore, "holding"), property)
    assert {"hold", "holding"} <= set(vars(EmbeddedStore))


@pytest.mark.slow
def test_an_owners_searches_never_race_its_writers_reload_of_the_shard(tmp_path):
    """Reported: `info()` used the shard outside the engine lock and failed "Shard is not initialized"
    when the writer's thread reloaded it (one in ~1,500 searches end to end)."""
    import sys
    import threading

    store = EdgeStore(tmp_path / "edge", "test_coll")
    store.create(DIMS, "test-model", 1)
    store.upsert(_points())
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                assert store.info().points == len(ROWS)
                assert _ns(store.search([_dense(limit=2)])[0]) == [0, 1]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches between any two bytecodes: the race shows in a few reloads
    for t in threads:
        t.start()
    try:
        for _ in range(100):
            store._reload()
            store.optimize()
    finally:
        done.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(interval)
        store.close()
    assert [repr(e) for e in errors] == []


@pytest.mark.slow
def test_a_one_shot_command_queues_behind_another_one_shot_holder_past_the_owner_wait(cli, prebuilt, home):
    """Parallel one-shot commands under load: the next one waits for the lock instead of failing with store_busy."""
    import subprocess
    import time

    from conftest import MOONMIND

    holder = EdgeStore(home / "qdrant-edge", "moonmind__repo")
    assert holder.count() > 0  # a one-shot command's hold: no owner socket
    env = {**os.environ, "MOONMIND_HOME": str(home), "MOONMIND_OWNER": "off"}
    env.pop("MOONMIND_STORE_WAIT_S", None)
    proc = subprocess.Popen([MOONMIND, "rag", "search", "bearer token", "--filters", "repo=demo", "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        past_owner_wait = time.monotonic() + 4.0  # beyond the 3 s a command waits for an owner
        while time.monotonic() < past_owner_wait:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
    finally:
        holder.close()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["items"]


_FULL_PAYLOAD = {"schema_version": 1, "path": "pkg/a.py", "repo": "a", "tenant": "t1", "language": "python",
                 "chunk_id": "pkg/a.py#0", "text": 'def f():\n    return "ü"\n', "offset_start": 0, "line_start": 1,
                 "section_title": "", "chunk_sequence": 0, "total_chunks": 1, "trust_class": "canonical", "run_id": "",
                 "expires_at": None, "deleted": False, "symbols": ["f"], "definitions": [{"name": "f", "line": 1}],
                 "score_hint": 0.25}


def test_a_payload_reads_back_as_written_field_for_field_and_in_its_order(store):
    """Every read path (by id, scroll, search) gives the payload that was written: same values, same key order."""
    store.create(DIMS, "test-model", 1)
    store.upsert([PointIn(id=_id(0), dense=_vec(1, 0, 0, 0), sparse=SparseVec([1], [1.0]), payload=_FULL_PAYLOAD)])
    by_id = store.retrieve([_id(0)])[0].payload
    scrolled = next(iter(store.scroll(None, True))).payload
    searched = store.search([_dense()])[0][0].payload
    for payload in (by_id, scrolled, searched):
        assert payload == _FULL_PAYLOAD and list(payload) == list(_FULL_PAYLOAD)
    asked = ("definitions", "path", "chunk_id")  # a filtered field and two that no filter reads
    wanted = {k: v for k, v in _FULL_PAYLOAD.items() if k in asked}
    assert store.retrieve([_id(0)], list(asked))[0].payload == wanted
    assert next(iter(store.scroll(None, list(asked)))).payload == wanted
    assert store.search([_dense(fields=asked)])[0][0].payload == wanted


def test_the_embedded_store_hands_the_engine_the_unfiltered_fields_as_one_string(tmp_path):
    """What makes a point cheap to write: the small fields no filter reads travel (and are stored) as one JSON string."""
    from moonmind_worker.store import edge_payloads

    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        store.upsert([PointIn(id=_id(0), dense=_vec(1, 0, 0, 0), sparse=SparseVec([1], [1.0]), payload=_FULL_PAYLOAD)])
        raw = store._open().retrieve([_id(0)], with_payload=True, with_vector=False)[0].payload
    finally:
        store.close()
    assert set(raw) - {edge_payloads.PACKED, edge_payloads.KEYS} == {
        k for k in _FULL_PAYLOAD if k in edge_payloads.FLAT and k not in edge_payloads.KEYED}
    assert json.loads(raw[edge_payloads.PACKED])["chunk_id"] == _FULL_PAYLOAD["chunk_id"]


def test_a_new_embedded_store_holds_its_keyword_filter_fields_as_entries_of_one_indexed_list(tmp_path):
    """One payload index for every keyword field a filter matches (each index is a pass over every payload in a
    segment build), and the float one; the entries in the payload's order, one per element of a list."""
    from moonmind_worker.store import edge_payloads

    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        assert set(store._open().info().payload_schema) == {edge_payloads.KEYS, "expires_at"}
        store.upsert([PointIn(id=_id(0), dense=_vec(1, 0, 0, 0), sparse=SparseVec([1], [1.0]), payload=_FULL_PAYLOAD)])
        raw = store._open().retrieve([_id(0)], with_payload=True, with_vector=False)[0].payload
    finally:
        store.close()
    assert raw[edge_payloads.KEYS] == ["path=pkg/a.py", "repo=a", "tenant=t1", "language=python",
                                       "trust_class=canonical", "run_id=", "symbols=f"]


def test_keyword_fields_with_no_text_to_key_read_back_as_written(store):
    """None, an empty list, an empty string, a value holding '=': each reads back as it was written, in its place."""
    store.create(DIMS, "test-model", 1)
    odd = {**_FULL_PAYLOAD, "language": None, "symbols": [], "run_id": "", "path": "a=b.py"}
    store.upsert([PointIn(id=_id(0), dense=_vec(1, 0, 0, 0), sparse=SparseVec([1], [1.0]), payload=odd)])
    for payload in (store.retrieve([_id(0)])[0].payload, next(iter(store.scroll(None, True))).payload):
        assert payload == odd and list(payload) == list(odd)
    assert store.retrieve([_id(0)], ["symbols", "language"])[0].payload == {"symbols": [], "language": None}
    assert [h.payload for h in store.scroll(Where(must=(Match("path", "a=b.py"), Match("run_id", ""))), ["path"])] == [
        {"path": "a=b.py"}]


def test_an_embedded_store_written_before_the_packed_layout_reads_as_before(tmp_path, monkeypatch):
    """Points written with every field on its own (the older layout) read, filter and narrow as they did."""
    from moonmind_worker.store import edge_payloads

    monkeypatch.setattr(edge, "KEYED_ON_CREATE", False)  # the older store, whose fields were all flat
    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        with monkeypatch.context() as m:
            m.setattr(edge_payloads, "pack", lambda payload, keyed=False: dict(payload))  # the older writer
            store.upsert([PointIn(id=_id(0), dense=_vec(1, 0, 0, 0), sparse=SparseVec([1], [1.0]), payload=_FULL_PAYLOAD)])
        store.upsert([PointIn(id=_id(1), dense=_vec(0, 1, 0, 0), sparse=SparseVec([1], [1.0]),
                              payload={**_FULL_PAYLOAD, "path": "pkg/b.py"})])
        assert [h.payload for h in store.retrieve([_id(0), _id(1)])] == [_FULL_PAYLOAD, {**_FULL_PAYLOAD, "path": "pkg/b.py"}]
        assert [h.payload for h in store.scroll(Where(must=(Match("path", "pkg/a.py"),)), ["path", "text"])] == [
            {"path": "pkg/a.py", "text": _FULL_PAYLOAD["text"]}]
    finally:
        store.close()


def test_the_embedded_store_refuses_a_filter_on_a_field_it_keeps_packed(tmp_path):
    """A filter on such a field could never match: refused with the field named, not answered with nothing."""
    store = EdgeStore(tmp_path / "edge", "test_coll")
    try:
        store.create(DIMS, "test-model", 1)
        store.upsert(_points())
        with pytest.raises(ValueError, match="'chunk_hash'"):
            store.search([_dense(Where(must=(Match("chunk_hash", "sha256:1"),)))])
    finally:
        store.close()
