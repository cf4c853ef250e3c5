"""The repository's file table (issue 36, "no-change re-index ≤ 1 s"): what a run reads instead of every chunk's payload.

The embedded store keeps, per repository, each file's content hash and chunk ids under the
version its metadata names; a run trusts it only while that is so and the repository's chunk
count agrees, and leaves one that says exactly what its chunks say.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from moonmind_worker.indexing.indexer import IndexRun, StoredFile, index_repository
from moonmind_worker.store import lexstats
from moonmind_worker.store.scopes import canonical_repo

from conftest import FIXTURE_FILES, write_tree

REPO, TENANT = "demo", "acme"


@pytest.fixture
def world(env, tmp_path):
    """(the tree, index(paths=None) -> summary, the store) on Qdrant Edge on disk."""
    from moonmind_worker.runtime import get_embedder
    from moonmind_worker.settings import get_settings
    from moonmind_worker.store import open_store

    get_settings.cache_clear()
    settings = get_settings()
    embedder = get_embedder(settings)
    store = open_store(settings)
    root = write_tree(tmp_path / "tree", FIXTURE_FILES)

    def index(paths=None):
        return index_repository(root, repo=REPO, tenant=TENANT, settings=settings, embedder=embedder, store=store,
                                paths=paths)

    yield root, index, store, (settings, embedder)
    store.close()


def _named_table(store):
    key = lexstats.table_key(TENANT, REPO)
    version = lexstats.entries(store.info())[key]["version"]
    table = store.read_file_table(key, version)
    assert table is not None, "no file table under the version the metadata names"
    return {path: (h, sorted(ids)) for path, (h, ids, _) in table.files.items()}


def _from_chunks(store):
    """What the chunks' own payloads say, per file (the read a run makes without a table)."""
    stored: dict[str, StoredFile] = {}
    for hit in store.scroll(canonical_repo(REPO, TENANT), ["path", "content_hash", "chunk_sequence", "total_chunks"]):
        stored.setdefault(hit.payload["path"], StoredFile()).add(hit.id, hit.payload)
    out = {}
    for path, f in stored.items():
        assert len(f.hashes) == 1 and f.complete(next(iter(f.hashes))), path
        out[path] = (next(iter(f.hashes)), sorted(f.ids))
    return out


def _reads_the_table(store, root: Path, settings, embedder) -> bool:
    run = IndexRun(root, repo=REPO, tenant=TENANT, settings=settings, embedder=embedder, store=store)
    run._begin()
    return run.table_read


def test_a_finished_first_run_leaves_a_table_equal_to_what_its_chunks_say(world):
    root, index, store, _ = world
    index()
    assert set(_named_table(store)) == set(FIXTURE_FILES)
    assert _named_table(store) == _from_chunks(store)


def test_a_run_over_edited_added_shrunk_and_deleted_files_leaves_the_table_equal_to_its_chunks(world):
    root, index, store, _ = world
    big = root / "pkg/big.py"
    big.parent.mkdir()
    big.write_text("".join(f"def handler_{i}(request):\n    return {{'value': {i}}}\n\n\n" * 4 for i in range(60)))
    index()
    assert len(_named_table(store)["pkg/big.py"][1]) > 2
    big.write_text("def only(request):\n    return 'v2'\n")  # its stale chunks go
    (root / "auth/tokens.py").write_text((root / "auth/tokens.py").read_text() + "\n\ndef revoke(token):\n    return None\n")
    (root / "docs/new.md").write_text("# Rotating keys\n\nHow signing keys are rotated.\n")
    (root / "web/render.js").unlink()
    summary = index()
    assert summary.files_deleted == 1 and summary.files_indexed == 3
    table = _named_table(store)
    assert table == _from_chunks(store)
    assert "web/render.js" not in table and "docs/new.md" in table and len(table["pkg/big.py"][1]) == 1


def test_a_run_over_a_few_paths_leaves_a_table_of_the_whole_repository(world):
    root, index, store, _ = world
    index()
    (root / "auth/tokens.py").write_text("def verify(token):\n    return bool(token)\n")
    summary = index(paths=["auth/tokens.py"])  # what the owner's watcher runs for one edit
    assert summary.files_indexed == 1
    table = _named_table(store)
    assert table == _from_chunks(store)
    assert set(table) == set(FIXTURE_FILES)


def test_a_run_after_a_finished_one_reads_the_table(world):
    root, index, store, (settings, embedder) = world
    index()
    assert _reads_the_table(store, root, settings, embedder)


def test_a_chunk_gone_behind_the_tables_back_is_seen_and_its_file_written_again(world):
    root, index, store, (settings, embedder) = world
    index()
    victim = "auth/tokens.py"
    store.delete_ids(_from_chunks(store)[victim][1][:1])  # the metadata still names the table
    assert not _reads_the_table(store, root, settings, embedder)  # the chunk count disagrees: read the chunks
    summary = index()
    assert summary.files_indexed == 1 and summary.files_unchanged == len(FIXTURE_FILES) - 1
    assert _named_table(store) == _from_chunks(store)


def test_a_run_that_was_cut_short_leaves_no_table_named_and_the_next_one_reads_the_chunks(world):
    root, index, store, (settings, embedder) = world
    index()
    run = IndexRun(root, repo=REPO, tenant=TENANT, settings=settings, embedder=embedder, store=store)
    run._begin()  # marks the run unfinished, and the table stale, before a first write; then the process dies
    assert lexstats.entries(store.info())[lexstats.table_key(TENANT, REPO)]["version"] is None
    assert not _reads_the_table(store, root, settings, embedder)
    summary = index()
    assert summary.files_unchanged == len(FIXTURE_FILES)
    assert _named_table(store) == _from_chunks(store)
    assert _reads_the_table(store, root, settings, embedder)


# -- files known by their stat ------------------------------------------------


@contextmanager
def _reads_of(monkeypatch, method: str) -> Iterator[list[str]]:
    """The files the real reader's `method` reads while the block runs (a spy)."""
    from moonmind_worker.text.files import TreeReader

    read: list[str] = []
    real = getattr(TreeReader, method)

    def spy(self, rel, max_bytes):
        read.append(rel)
        return real(self, rel, max_bytes)

    with monkeypatch.context() as m:
        m.setattr(TreeReader, method, spy)
        yield read


def _reads_in_a_run(world, monkeypatch, settings=None) -> tuple[list[str], object]:
    """The files a run reads, and its summary."""
    root, index, store, (default, embedder) = world
    with _reads_of(monkeypatch, "read") as read:
        summary = index_repository(root, repo=REPO, tenant=TENANT, settings=settings or default, embedder=embedder,
                                   store=store)
    return read, summary


def test_a_file_unchanged_since_it_settled_is_known_by_its_stat_and_not_read(world, monkeypatch):
    from moonmind_worker.indexing import indexer

    monkeypatch.setattr(indexer, "SETTLED_NS", 0)  # the tree was written a moment ago
    root, index, store, _ = world
    index()
    read, summary = _reads_in_a_run(world, monkeypatch)
    assert read == [] and summary.files_unchanged == len(FIXTURE_FILES)
    assert _named_table(store) == _from_chunks(store)


def test_a_file_whose_stat_changed_is_read_again_and_rewritten_only_if_its_text_did(world, monkeypatch):
    import os

    from moonmind_worker.indexing import indexer

    monkeypatch.setattr(indexer, "SETTLED_NS", 0)
    root, index, store, _ = world
    index()
    touched, edited = root / "db/pool.py", root / "auth/tokens.py"
    os.utime(touched)  # new times, same text
    text = edited.read_text()
    edited.write_text(text.replace("token", "TOKEN", 1))  # same size, new text
    read, summary = _reads_in_a_run(world, monkeypatch)
    assert sorted(read) == ["auth/tokens.py", "db/pool.py"]
    assert summary.files_indexed == 1 and summary.files_unchanged == len(FIXTURE_FILES) - 1
    assert _named_table(store) == _from_chunks(store)
    assert _reads_in_a_run(world, monkeypatch)[0] == []  # both known by their new stat


def test_a_file_changed_just_before_it_was_read_is_not_known_by_its_stat(world, monkeypatch):
    root, index, store, _ = world
    index()  # every file of the tree was written less than SETTLED_NS before it was read
    key = lexstats.table_key(TENANT, REPO)
    table = store.read_file_table(key, lexstats.entries(store.info())[key]["version"])
    assert {path: entry[2] for path, entry in table.files.items()} == {path: None for path in FIXTURE_FILES}
    assert sorted(_reads_in_a_run(world, monkeypatch)[0]) == sorted(FIXTURE_FILES)


def test_a_file_over_a_lowered_size_limit_is_skipped_though_its_stat_is_unchanged(world, monkeypatch):
    from moonmind_worker.indexing import indexer

    monkeypatch.setattr(indexer, "SETTLED_NS", 0)
    root, index, store, (settings, _) = world
    index()
    smaller = settings.model_copy(update={"max_file_bytes": 300})
    read, summary = _reads_in_a_run(world, monkeypatch, smaller)
    large = sorted(p for p in FIXTURE_FILES if (root / p).stat().st_size > 300)
    assert large and sorted(read) == large
    assert summary.files_deleted == len(large)
    assert set(_named_table(store)) == set(FIXTURE_FILES) - set(large)


def test_a_no_change_run_records_the_stat_of_files_that_have_settled_since(world, monkeypatch):
    from moonmind_worker.indexing import indexer

    root, index, store, _ = world
    index()  # the files had not settled: no stat recorded
    monkeypatch.setattr(indexer, "SETTLED_NS", 0)  # now they have
    read, summary = _reads_in_a_run(world, monkeypatch)
    assert sorted(read) == sorted(FIXTURE_FILES) and summary.files_unchanged == len(FIXTURE_FILES)
    assert _reads_in_a_run(world, monkeypatch)[0] == []


# -- `rag stats --root`: the same stat rule ------------------------------------


def _stats_reads(world, monkeypatch):
    """The files `rag stats --root` reads, and its result."""
    from moonmind_worker.indexing.stats import collect_stats

    root, _, store, (settings, embedder) = world
    with _reads_of(monkeypatch, "read_text") as read:
        stats = collect_stats(repo=REPO, tenant=None, root=root, settings=settings, embedder=embedder, store=store)
    return read, stats


def test_stats_over_the_tree_does_not_read_a_file_its_last_index_run_knew_by_its_stat(world, monkeypatch):
    from moonmind_worker.indexing import indexer

    monkeypatch.setattr(indexer, "SETTLED_NS", 0)
    world[1]()
    read, stats = _stats_reads(world, monkeypatch)
    assert read == [] and stats.root_checked
    assert stats.orphans == [] and stats.stale == [] and {f.path for f in stats.files} == set(FIXTURE_FILES)


def test_stats_over_the_tree_reads_what_changed_and_finds_a_new_file_and_an_emptied_one(world, monkeypatch):
    import os

    from moonmind_worker.indexing import indexer

    monkeypatch.setattr(indexer, "SETTLED_NS", 0)
    root, index, _, _ = world
    index()
    os.utime(root / "db/pool.py")  # same text, new stat: read, still indexable
    (root / "auth/tokens.py").write_text("")  # stored, now nothing to index: stale
    (root / "db/new.py").write_text("def new():\n    return 1\n")  # on disk, no chunk: an orphan
    read, stats = _stats_reads(world, monkeypatch)
    assert sorted(read) == ["auth/tokens.py", "db/new.py", "db/pool.py"]
    assert stats.unindexed == ["db/new.py"] and stats.stale == ["auth/tokens.py"]
