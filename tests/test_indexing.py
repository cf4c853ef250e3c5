"""`moonmind rag index` through the installed CLI: incremental re-index, scope isolation, local mode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import FIXTURE_FILES


def _index(cli, root: Path, repo: str = "demo", tenant: str = "acme", **kw) -> dict:
    r = cli("rag", "index", str(root), "--repo", repo, "--tenant", tenant, "--json", **kw)
    assert r.code == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r.json()


def _search(cli, query: str, *filters: str, **kw) -> dict:
    r = cli("rag", "search", "--query", query, "--filters", *filters, "--score-threshold", "0", "--top-k", "50", "--json", **kw)
    assert r.code == 0, r.stderr
    return r.json()


@pytest.mark.slow
def test_first_index_embeds_every_file(cli, repo):
    s = _index(cli, repo)
    assert s["files_seen"] == len(FIXTURE_FILES)
    assert s["files_indexed"] == len(FIXTURE_FILES) and s["files_unchanged"] == 0
    assert s["chunks_written"] >= len(FIXTURE_FILES) and s["chunks_deleted"] == 0


@pytest.mark.slow
def test_unchanged_tree_re_embeds_nothing(cli, repo):
    first = _index(cli, repo)
    again = _index(cli, repo)
    assert again["files_unchanged"] == first["files_seen"]
    assert again["files_indexed"] == again["chunks_written"] == again["chunks_deleted"] == 0


@pytest.mark.slow
def test_changed_chunk_size_re_chunks_unchanged_files_once(cli, repo):
    first = _index(cli, repo)
    assert first["rechunked"] is False  # a new repo is not a re-chunk
    small = _index(cli, repo, extra_env={"MOONMIND_CHUNK_CHARS": "200"})
    assert small["rechunked"] is True
    assert small["files_indexed"] == first["files_indexed"] and small["files_unchanged"] == 0
    stored = sum(len(f["chunks"]) if isinstance(f.get("chunks"), list) else f["chunks"] for f in
                 cli("rag", "stats", "--repo", "demo", "--tenant", "acme", "--json").json()["files"])
    assert stored == small["chunks_written"] > first["chunks_written"]  # no chunk of the old cut is left
    again = _index(cli, repo, extra_env={"MOONMIND_CHUNK_CHARS": "200"})
    assert again["rechunked"] is False and again["files_indexed"] == 0
    text = cli("rag", "index", str(repo), "--repo", "demo", "--tenant", "acme", extra_env={"MOONMIND_CHUNK_CHARS": "300"})
    assert text.code == 0 and "every file re-chunked (chunking changed since the last run)" in text.stdout


@pytest.mark.slow
def test_modified_file_alone_is_re_embedded(cli, repo):
    _index(cli, repo)
    (repo / "db/pool.py").write_text("def drain_pool(pool):\n    \"\"\"Close every idle connection.\"\"\"\n    pool.clear()\n")
    s = _index(cli, repo)
    assert s["files_indexed"] == 1 and s["files_unchanged"] == len(FIXTURE_FILES) - 1
    assert s["chunks_written"] == 1
    items = _search(cli, "drain pool", "repo=demo", "path=db/pool.py")["items"]
    assert [i["text"] for i in items] == [(repo / "db/pool.py").read_text()]


@pytest.mark.slow
def test_shrunk_file_loses_its_stale_chunks(cli, repo):
    big = "".join(f"def handler_{n}(request):\n    return respond(request, {n})\n\n\n" for n in range(80))
    (repo / "web/handlers.py").write_text(big)
    first = _index(cli, repo)
    before = len(_search(cli, "handler", "repo=demo", "path=web/handlers.py")["items"])
    assert before > 1
    (repo / "web/handlers.py").write_text("def handler_0(request):\n    return respond(request, 0)\n")
    s = _index(cli, repo)
    assert s["files_indexed"] == 1 and s["chunks_written"] == 1 and s["chunks_deleted"] == before - 1
    items = _search(cli, "handler", "repo=demo", "path=web/handlers.py")["items"]
    assert len(items) == 1 and first["chunks_written"] > s["chunks_written"]


@pytest.mark.slow
def test_deleted_file_chunks_are_gone(cli, repo):
    first = _index(cli, repo)
    n_guide = len(_search(cli, "caching guide", "repo=demo", "path=docs/guide.md")["items"])
    (repo / "docs/guide.md").unlink()
    s = _index(cli, repo)
    assert s["files_deleted"] == 1 and s["chunks_deleted"] == n_guide and s["files_indexed"] == 0
    assert s["files_seen"] == first["files_seen"] - 1
    r = cli("rag", "search", "--query", "caching guide", "--filters", "repo=demo", "path=docs/guide.md", "--json")
    assert r.code == 0 and r.json()["items"] == []
    remaining = {i["source"] for i in _search(cli, "python", "repo=demo")["items"]}
    assert "docs/guide.md" not in remaining and "auth/tokens.py" in remaining


@pytest.mark.slow
def test_gitignored_binary_and_lock_files_are_not_indexed(cli, repo):
    (repo / ".gitignore").write_text("secret/\n*.log\n")
    (repo / "secret").mkdir()
    (repo / "secret/keys.py").write_text("API_KEY = 'x'\n")
    (repo / "debug.log").write_text("token check failed\n")
    (repo / "blob.dat").write_bytes(b"\x00\x01bearer\x00")
    (repo / "package-lock.json").write_text("{}\n")
    s = _index(cli, repo)
    reasons = {x["path"]: x["reason"] for x in s["skipped"]}
    assert reasons["blob.dat"] == "binary" and "package-lock.json" in reasons
    sources = {i["source"] for i in _search(cli, "token key", "repo=demo")["items"]}
    assert not sources & {"secret/keys.py", "debug.log", "blob.dat", "package-lock.json"}


@pytest.mark.slow
def test_filters_isolate_repos_and_tenants(cli, repo):
    """The same tree indexed three times under different scopes: each search sees only its own scope."""
    _index(cli, repo, repo="alpha", tenant="t1")
    _index(cli, repo, repo="beta", tenant="t1")
    _index(cli, repo, repo="alpha", tenant="t2")
    for repo_name, tenant in (("alpha", "t1"), ("beta", "t1"), ("alpha", "t2")):
        items = _search(cli, "bearer token", f"repo={repo_name}", f"tenant={tenant}")["items"]
        assert items
        assert {(i["payload"]["repo"], i["payload"]["tenant"]) for i in items} == {(repo_name, tenant)}
        # no chunk appears twice: each scope holds exactly one copy of the tree
        assert len({i["chunk_id"] for i in items}) == len(items)
    both = _search(cli, "bearer token", "repo=alpha")["items"]
    assert {i["payload"]["tenant"] for i in both} == {"t1", "t2"}


@pytest.mark.slow
def test_re_indexing_one_scope_leaves_the_other_alone(cli, repo):
    _index(cli, repo, repo="alpha", tenant="t1")
    _index(cli, repo, repo="beta", tenant="t1")
    (repo / "docs/guide.md").unlink()
    s = _index(cli, repo, repo="alpha", tenant="t1")
    assert s["files_deleted"] == 1
    beta = {i["source"] for i in _search(cli, "caching guide", "repo=beta")["items"]}
    assert "docs/guide.md" in beta


@pytest.mark.slow
def test_qdrant_local_mode_path_runs_the_same_flow(cli, repo, tmp_path):
    """QDRANT_URL set to a path: qdrant-client's local mode, persistent across processes."""
    local = {"QDRANT_URL": str(tmp_path / "qdrant-local")}
    first = _index(cli, repo, extra_env=local)
    assert first["files_indexed"] == len(FIXTURE_FILES)
    r = cli("rag", "search", "--query", "where are bearer tokens checked", "--filters", "repo=demo", "--json", extra_env=local)
    assert r.code == 0, r.stderr
    assert r.json()["items"][0]["source"] == "auth/tokens.py"
    (repo / "docs/guide.md").unlink()
    again = _index(cli, repo, extra_env=local)
    assert again["files_deleted"] == 1 and again["files_unchanged"] == len(FIXTURE_FILES) - 1
    assert "Traceback" not in r.stderr and "UserWarning" not in r.stderr


def test_index_of_a_missing_directory_is_a_usage_error(invoke, tmp_path):
    r = invoke("rag", "index", str(tmp_path / "nope"), "--repo", "demo")
    assert r.code == 2 and r.stdout == "" and "not a directory" in r.stderr


@pytest.mark.slow
def test_human_summary_is_one_line(cli, repo):
    r = cli("rag", "index", str(repo), "--repo", "demo")
    assert r.code == 0, r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.startswith("indexed repo=demo tenant=default:")


@pytest.mark.slow
def test_a_file_whose_name_is_not_utf8_is_skipped_and_the_rest_is_indexed(cli, repo):
    """Such names exist in real trees; one of them must not stop the whole repository from indexing."""
    import os

    os.makedirs(os.fsencode(repo / "src"), exist_ok=True)
    with open(os.fsencode(repo / "src") + b"/badname\xff.py", "wb") as f:
        f.write(b"def badly_named(): pass\n")
    os.makedirs(os.fsencode(repo) + b"/dir\xfe", exist_ok=True)
    with open(os.fsencode(repo) + b"/dir\xfe/inside.py", "wb") as f:
        f.write(b"def inside(): pass\n")
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json")
    assert r.code == 0, r.stderr
    report = r.json()
    assert report["files_indexed"] == len(FIXTURE_FILES) and report["chunks_written"] > 0
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    assert reasons == {"src/badname\ufffd.py": "its name is not valid UTF-8 (rename it to index it)",
                       "dir\ufffd": "its name is not valid UTF-8 (rename it to index it)"}
    hit = cli("rag", "search", "--query", "check_bearer_token", "--filters", "repo=demo", "--json").json()["items"][0]
    assert hit["source"] == "auth/tokens.py"


@pytest.mark.slow
def test_a_run_stopped_between_upsert_and_stale_delete_is_repaired_by_the_next_run(cli, repo, env):
    """Two versions of a file side by side (the new chunks written, the old not yet deleted) are never
    taken for "unchanged": the next run writes each such file again and leaves one complete version."""
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing.indexer import build_points, content_hash
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store
    from moonmind_worker.text.chunking import chunk_text

    names = [f"api/module_{n}.py" for n in range(16)]
    (repo / "api").mkdir()
    for name in names:
        (repo / name).write_text("\n\n".join(f"def handler_{i}(request):\n    return {{'value': {i}}}\n" * 6 for i in range(30)))
    _index(cli, repo)
    shrunk = {name: f"def only_{n}(request):\n    return 'v2'\n" * 40 for n, name in enumerate(names)}
    settings = Settings()
    store = open_store(settings)
    try:  # what a run leaves when it stops after a batch's upsert, before deleting that batch's stale chunks
        docs = []
        for name, text in shrunk.items():
            (repo / name).write_text(text)
            docs.append((name, content_hash(text), chunk_text(text, name, settings.chunk_chars, settings.chunk_overlap_lines)))
        store.upsert(build_points(StaticEmbedder(), docs, repo="demo", tenant="acme"))
    finally:
        store.close()
    assert cli("rag", "stats", "--repo", "demo", "--tenant", "acme", "--json").json()["incomplete"] == sorted(names)

    again = _index(cli, repo)
    assert again["files_indexed"] == len(names) and again["files_unchanged"] == len(FIXTURE_FILES)
    stats = cli("rag", "stats", "--repo", "demo", "--tenant", "acme", "--json").json()
    assert stats["incomplete"] == []
    for name, _, chunks in docs:
        stored = next(f for f in stats["files"] if f["path"] == name)
        assert (stored["chunks"], stored["total_chunks"], stored["complete"]) == (len(chunks), len(chunks), True)


@pytest.mark.slow
def test_a_nested_gitignore_negation_re_includes_what_the_root_excluded(cli, repo):
    """git's rule: the deepest .gitignore with a matching pattern decides."""
    from moonmind_worker.text.files import IGNORED_BY_GIT, excluded_reason

    (repo / ".gitignore").write_text("*.log\n")
    (repo / "debug.log").write_text("root level log line about the cache\n")
    (repo / "logs").mkdir()
    (repo / "logs" / ".gitignore").write_text("!*.log\n")
    (repo / "logs" / "audit.log").write_text("audit trail entry for bearer token rotation\n")
    s = _index(cli, repo)
    stats = cli("rag", "stats", "--repo", "demo", "--tenant", "acme", "--json").json()
    paths = {f["path"] for f in stats["files"]}
    assert "logs/audit.log" in paths and "debug.log" not in paths
    assert s["files_seen"] == len(FIXTURE_FILES) + 3  # both .gitignore files and logs/audit.log
    assert excluded_reason(repo, "logs/audit.log") is None
    assert excluded_reason(repo, "debug.log") == IGNORED_BY_GIT


@pytest.mark.slow  # two real index processes of ~1,000 chunks
def test_an_index_with_worker_processes_stores_the_very_same_points_as_one_without(tmp_path, monkeypatch):
    """Worker processes chunk and embed batches cut exactly where one process cuts them, so every
    point (payload, dense vector bytes, BM25 vector) is identical; the static model's vectors depend
    on the batch a text is embedded with (in the last bits), so a different cut would show here."""
    from bench.index_dump import dump

    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    for i in range(24):
        (root / f"pkg/mod_{i}.py").write_text("".join(
            f"def handler_{i}_{j}(request, value):\n    \"\"\"Handle case {j} of module {i}.\"\"\"\n"
            f"    return request.get('k{j}', value) * {j}\n\n\n" for j in range(40)))
    (root / "README.md").write_text("# Tree\n\nA tree indexed twice.\n")
    dumps = {}
    for workers in ("0", "2"):
        monkeypatch.setenv("MOONMIND_INDEX_WORKERS", workers)
        monkeypatch.setenv("MOONMIND_CHUNK_CHARS", "200")
        out = tmp_path / f"dump-{workers}.jsonl"
        assert dump(root, out) > 256 * 3  # several batches
        dumps[workers] = out.read_text()
    assert dumps["0"] == dumps["2"]


def test_every_built_payload_is_the_contracts_own_dump():
    """`build_points` copies one validated payload per batch: each must still be what `ChunkPayload` gives."""
    from moonmind_worker.contracts import CANONICAL, WORKSPACE_OVERLAY, ChunkPayload
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing.indexer import build_points, content_hash
    from moonmind_worker.indexing.points import symbol_keys
    from moonmind_worker.text.chunking import chunk_text, language_of

    files = {"src/app.py": "def getValue(self):\n    return 1\n" * 80, "README.md": "# Title\n\nSome text.\n", "Makefile": "all:\n\ttrue\n"}
    docs = [(path, content_hash(text), chunk_text(text, path, 400, 1)) for path, text in files.items()]
    for trust_class, run_id, expires_at in ((CANONICAL, "", None), (WORKSPACE_OVERLAY, "run-1", 1_900_000_000)):
        points = build_points(StaticEmbedder(), docs, repo="demo", tenant="acme", trust_class=trust_class, run_id=run_id,
                              expires_at=expires_at)
        chunks = [(path, fhash, c) for path, fhash, cs in docs for c in cs]
        assert len(points) == len(chunks) > 3
        for p, (path, fhash, c) in zip(points, chunks):
            want = ChunkPayload(
                path=path, repo="demo", tenant="acme", language=language_of(path), chunk_id=f"{path}#{c.chunk_sequence}",
                chunk_hash=c.chunk_hash, content_hash=fhash, offset_start=c.offset_start, offset_end=c.offset_end,
                line_start=c.line_start, line_end=c.line_end, section_title=c.section_title, chunk_sequence=c.chunk_sequence,
                total_chunks=c.total_chunks, text=c.text, token_count=c.token_count, model_version=StaticEmbedder().name,
                indexed_at=p.payload["indexed_at"], trust_class=trust_class, run_id=run_id, expires_at=expires_at,
                symbols=symbol_keys(c.definitions), definitions=[
                    {"name": d.name, "kind": d.kind, "line_start": d.start, "line_end": d.end, "signature": d.signature}
                    for d in c.definitions],
            ).model_dump()
            assert list(p.payload.items()) == list(want.items())
            assert [type(v) for v in p.payload.values()] == [type(v) for v in want.values()]  # 1_900_000_000 -> float


def test_an_index_run_collects_cycles_rarely_and_gives_the_collector_its_thresholds_back(env, tmp_path):
    """An index run makes millions of short-lived containers: it raises the cyclic collector's thresholds
    while it runs (`heap.collect_rarely`) and leaves them as it found them, so a long-lived owner is unchanged."""
    import gc

    from moonmind_worker.heap import BULK_GC_THRESHOLDS
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.runtime import get_embedder
    from moonmind_worker.settings import get_settings
    from moonmind_worker.store import open_store

    from conftest import write_tree

    get_settings.cache_clear()
    settings = get_settings()
    store = open_store(settings)
    before = gc.get_threshold()
    seen = []
    try:
        index_repository(write_tree(tmp_path / "tree", FIXTURE_FILES), repo="demo", tenant="acme", settings=settings,
                         embedder=get_embedder(settings), store=store, progress=lambda *a: seen.append(gc.get_threshold()))
    finally:
        store.close()
    assert seen and set(seen) == {BULK_GC_THRESHOLDS}
    assert gc.get_threshold() == before != BULK_GC_THRESHOLDS


def test_nested_bulk_work_gives_the_collector_its_thresholds_back_when_the_last_ends():
    """The owner may run two index runs at once: the first to end must not restore the default under the other."""
    import gc

    from moonmind_worker.heap import BULK_GC_THRESHOLDS, collect_rarely

    before = gc.get_threshold()
    with collect_rarely():
        with collect_rarely():
            pass
        assert gc.get_threshold() == BULK_GC_THRESHOLDS
    assert gc.get_threshold() == before


def test_index_workers_collect_cycles_rarely():
    """A worker process does bulk work only: its collector keeps `BULK_GC_THRESHOLDS` for its life."""
    import gc

    from moonmind_worker.embedding.static import StaticEmbedder
    from moonmind_worker.heap import BULK_GC_THRESHOLDS
    from moonmind_worker.indexing import workers
    from moonmind_worker.settings import Settings

    pool = workers.Pool(StaticEmbedder(), Settings(_env_file=None, index_workers=1))
    try:
        pool.result(pool.chunk([("m.py", "def f(x):\n    return x\n")], 200, 0, True))
        assert pool.parallel
        in_worker = pool._executor.submit(gc.get_threshold).result(timeout=60)  # type: ignore[union-attr]
    finally:
        pool.close()
    assert tuple(in_worker) == BULK_GC_THRESHOLDS


def test_index_workers_run_openblas_on_one_thread_unless_the_caller_chose_a_count(monkeypatch):
    """Each worker already holds a core: a second BLAS thread per worker only spins waiting for one (BENCHMARKS.md)."""
    import os

    from moonmind_worker.embedding.static import StaticEmbedder
    from moonmind_worker.indexing import workers
    from moonmind_worker.settings import Settings

    seen = []
    for chosen in (None, "3"):
        if chosen is None:
            monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OPENBLAS_NUM_THREADS", chosen)
        pool = workers.Pool(StaticEmbedder(), Settings(_env_file=None, index_workers=1))
        try:
            pool.result(pool.chunk([("m.py", "def f(x):\n    return x\n")], 200, 0, True))
            assert pool.parallel
            seen.append(pool._executor.submit(os.getenv, "OPENBLAS_NUM_THREADS").result(timeout=60))  # type: ignore[union-attr]
        finally:
            pool.close()
    assert seen == ["1", "3"]


def test_giving_back_the_heap_returns_the_pages_of_freed_objects_to_the_system():
    """What an index worker does after each job (`heap.give_back_heap`): glibc keeps a fragmented heap's
    free pages otherwise, and Django's workers crept up to ~140 MB anonymous each."""
    import subprocess
    import sys

    code = (
        "import gc\n"
        "from moonmind_worker.heap import give_back_heap\n"
        "def rss():\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS'))\n"
        "junk = [bytes(900) + bytes([i % 256]) for i in range(150_000)]\n"
        "keep = junk[::64]\n"
        "del junk\n"
        "gc.collect()\n"
        "before = rss()\n"
        "give_back_heap()\n"
        "print(before, rss(), len(keep))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    before, after = int(out[0]), int(out[1])
    assert before - after > 60_000, (before, after)  # of ~135 MB freed, in KB


def test_large_blocks_freed_under_a_live_object_go_back_to_the_system():
    """`heap.keep_large_blocks_out_of_the_heap`, which the indexing processes call: once glibc has freed
    one 8 MB block it serves later blocks of that size from the heap, where a small object allocated
    above them keeps their pages after they are freed; with the bar held at 128 KB they go back at once."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from moonmind_worker.heap import keep_large_blocks_out_of_the_heap\n"
        "if sys.argv[1] == 'fixed':\n"
        "    keep_large_blocks_out_of_the_heap()\n"
        "def rss():\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS'))\n"
        "big = bytearray(8 << 20)\n"
        "del big\n"  # one 8 MB block freed: glibc raises its bar to 8 MB
        "blocks = []\n"
        "for _ in range(16):\n"  # 64 MB in 4 MB blocks, every page touched
        "    b = bytearray(4 << 20)\n"
        "    b[::4096] = bytes(len(b[::4096]))\n"
        "    blocks.append(b)\n"
        "pin = [bytearray(600) for _ in range(10)]\n"  # small objects above them
        "before = rss()\n"
        "del blocks\n"
        "print(before, rss(), len(pin))\n"
    )
    freed = {}
    for arm in ("default", "fixed"):
        out = subprocess.run([sys.executable, "-c", code, arm], capture_output=True, text=True, check=True).stdout.split()
        freed[arm] = int(out[0]) - int(out[1])
    assert freed["fixed"] > 60_000, freed  # KB: the 64 MB went back
    assert freed["default"] < 16_000, freed  # glibc's own bar: they stay (the reason for the call)


def test_index_workers_build_points_without_loading_the_contracts():
    """The workers build each batch's points from a payload template validated in this process, so
    pydantic (~11 MB a process) is never loaded there; the points are the contract's own (see above)."""
    from moonmind_worker.contracts import ChunkPayload
    from moonmind_worker.embedding.static import StaticEmbedder
    from moonmind_worker.indexing import workers
    from moonmind_worker.settings import Settings
    from moonmind_worker.text.chunking import chunk_text

    text = "def f(x):\n    return x\n"
    pool = workers.Pool(StaticEmbedder(), Settings(_env_file=None, index_workers=1))
    try:
        job = pool.points([("m.py", "sha256:0", chunk_text(text, "m.py", 200, 0))], repo="r", tenant="t")
        assert pool.parallel
        (point,) = pool.result(job)
        (pid,) = list(pool._executor._processes)  # type: ignore[union-attr]
        with open(f"/proc/{pid}/maps") as f:
            mapped = f.read()
    finally:
        pool.close()
    assert "tokenizers" in mapped  # the worker did load the model
    assert "pydantic" not in mapped
    assert point.payload == ChunkPayload.model_validate(point.payload).model_dump()
    assert (point.payload["repo"], point.payload["tenant"], point.payload["path"]) == ("r", "t", "m.py")


def test_closing_a_pool_of_workers_ends_the_resource_tracker_too(monkeypatch):
    """The tracker multiprocessing starts for the pool's semaphores (~12 MB) does not outlive the pool
    into the run's last writes and its optimize; a later pool starts one again and works."""
    from multiprocessing import resource_tracker

    from moonmind_worker.embedding.static import StaticEmbedder
    from moonmind_worker.indexing import workers
    from moonmind_worker.settings import Settings
    from moonmind_worker.text.chunking import chunk_text

    monkeypatch.setattr(workers, "_running", 0)  # a pool an earlier test broke (a killed worker) keeps its tracker
    group = [("m.py", "def f(x):\n    return x\n")]
    for _ in range(2):
        pool = workers.Pool(StaticEmbedder(), Settings(_env_file=None, index_workers=1))
        try:
            job = pool.chunk(group, 200, 0, True)
            assert pool.parallel
            tracker = resource_tracker._resource_tracker._pid
            assert tracker is not None and os.path.exists(f"/proc/{tracker}")
            assert pool.result(job) == [chunk_text(group[0][1], "m.py", 200, 0)]
        finally:
            pool.close()
        assert resource_tracker._resource_tracker._pid is None
        assert not os.path.exists(f"/proc/{tracker}")  # exited and reaped
    # two runs' pools at once in one process (a threaded host): the first to close leaves it to the other
    first = workers.Pool(StaticEmbedder(), Settings(_env_file=None, index_workers=1))
    second = workers.Pool(StaticEmbedder(), Settings(_env_file=None, index_workers=1))
    try:
        jobs = [first.chunk(group, 200, 0, True), second.chunk(group, 200, 0, True)]
        first.close()
        assert resource_tracker._resource_tracker._pid is not None
        assert second.result(jobs[1]) == [chunk_text(group[0][1], "m.py", 200, 0)]
    finally:
        first.close()
        second.close()
    assert resource_tracker._resource_tracker._pid is None


def _die_while_sending_a_result(_model, parent: int, n: int) -> int:
    """In a worker: write the start of a result message on the pool's result pipe, then die (what a
    kill mid-send leaves). In the process that runs the job again: the answer."""
    import gc
    import struct
    from multiprocessing.queues import SimpleQueue

    if os.getpid() == parent:
        return 2 * n
    queue = next(o for o in gc.get_objects() if isinstance(o, SimpleQueue))
    os.write(queue._writer.fileno(), struct.pack("!i", 1 << 20) + b"the first bytes of a result")
    os._exit(1)


@pytest.mark.slow  # starts a worker process
def test_a_worker_that_dies_while_sending_its_result_does_not_hang_the_run(monkeypatch):
    """CPython's pool reads the rest of a message that will never come and never reports the death
    (no BrokenProcessPool): the job waited for good. Now the wait sees the dead worker and the job
    is done in this process."""
    import threading

    from moonmind_worker.embedding.static import StaticEmbedder
    from moonmind_worker.indexing import workers
    from moonmind_worker.settings import Settings

    monkeypatch.setattr(workers, "DEATH_CHECK_S", 0.2)
    pool = workers.Pool(StaticEmbedder(), Settings(_env_file=None, index_workers=1))
    pool.expect(10**9)  # start the worker with the first job
    got: list[int] = []
    try:
        job = pool._submit(_die_while_sending_a_result, os.getpid(), 21)
        assert pool.parallel
        waiter = threading.Thread(target=lambda: got.append(pool.result(job)), daemon=True)
        waiter.start()
        waiter.join(timeout=60)
        if waiter.is_alive():
            workers._unstick(pool._executor)  # end the pool, so that this failure does not hang the suite
            pytest.fail("the result of a job whose worker died mid-send was waited for without end")
    finally:
        pool.close()
    assert got == [42]
    assert not pool.parallel  # the rest of the run goes on in this process


@pytest.mark.slow  # starts a worker process
def test_the_kernels_oom_killer_takes_an_index_worker_before_the_indexing_process():
    """Out of memory, the kernel kills the process with the highest score: a worker, whose jobs this
    process can redo, rather than the indexing process, the largest, whose death ends the run."""
    from moonmind_worker.embedding.static import StaticEmbedder
    from moonmind_worker.indexing import workers
    from moonmind_worker.settings import Settings

    pool = workers.Pool(StaticEmbedder(), Settings(_env_file=None, index_workers=1))
    try:
        pool.result(pool.chunk([("m.py", "def f(x):\n    return x\n")], 200, 0, True))
        (worker,) = list(pool._executor._processes)  # type: ignore[union-attr]
        score = {pid: int(Path(f"/proc/{pid}/oom_score").read_text()) for pid in (worker, os.getpid())}
        adj = {pid: int(Path(f"/proc/{pid}/oom_score_adj").read_text()) for pid in (worker, os.getpid())}
    finally:
        pool.close()
    assert adj[worker] == 1000 and adj[os.getpid()] < 1000
    assert score[worker] > score[os.getpid()]


def test_a_chunking_job_a_dead_worker_took_is_done_here_once_for_every_file_of_it():
    """A chunking job carries several files and its result is asked once per file: after the worker
    died with it, every one of them must get its chunks (the second used to fail on a job already redone)."""
    import signal

    from moonmind_worker.embedding.static import StaticEmbedder
    from moonmind_worker.indexing import workers
    from moonmind_worker.settings import Settings
    from moonmind_worker.text.chunking import chunk_text

    group = [(f"pkg/m{i}.py", "".join(f"def f{i}_{j}(x):\n    return x + {j}\n\n\n" for j in range(40))) for i in range(3)]
    pool = workers.Pool(StaticEmbedder(), Settings(_env_file=None, index_workers=1))
    try:
        job = pool.chunk(group, 200, 0, True)
        assert pool.parallel
        for pid in list(pool._executor._processes):  # type: ignore[union-attr]
            os.kill(pid, signal.SIGKILL)
        got = [pool.result(job)[slot] for slot in range(len(group))]
    finally:
        pool.close()
    assert got == [chunk_text(text, rel, 200, 0) for rel, text in group]
    assert not pool.parallel  # the rest of the run goes on in this process


@pytest.mark.slow  # starts a worker process
def test_the_indexing_process_of_a_run_with_workers_never_loads_numpy(tmp_path):
    """What crosses from a worker is plain Python (points, float32 arrays): the process that reads and
    writes holds neither numpy nor the model through the run; its points are the very same (see above)."""
    import subprocess
    import sys

    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    for i in range(60):
        (root / f"pkg/mod_{i}.py").write_text("".join(f"def h_{i}_{j}(r, v):\n    return r.get('k{j}', v)\n\n\n" for j in range(20)))
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from moonmind_worker.embedding import StaticEmbedder\n"
        "from moonmind_worker.indexing.indexer import index_repository\n"
        "from moonmind_worker.settings import Settings\n"
        "from moonmind_worker.store import EdgeStore\n"
        "if __name__ == '__main__':\n"
        f"    s = Settings(_env_file=None, moonmind_home=Path({str(tmp_path / 'home')!r}), qdrant_url=None,\n"
        "                 collection='moonmind__repo', chunk_chars=200, index_workers=1)\n"
        "    store = EdgeStore(s.data_dir, s.collection)\n"
        f"    r = index_repository(Path({str(root)!r}), repo='demo', tenant='acme', settings=s, embedder=StaticEmbedder(), store=store)\n"
        "    print(r.chunks_written, store.count(), 'numpy' in sys.modules)\n"
        "    store.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    written, stored, numpy_loaded = out.stdout.split()
    assert int(written) == int(stored) > 0
    assert numpy_loaded == "False"


@pytest.mark.slow  # starts worker processes
def test_the_workers_of_a_run_exit_while_a_write_builds_a_segment_and_start_again_after_it(tmp_path, monkeypatch):
    """A run larger than a segment builds segments as it writes (`Store.room`): the workers, idle then,
    are not held beside the build, the run's largest moment; the run goes on with new ones, whole."""
    import multiprocessing

    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing import indexer
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import EdgeStore, edge

    monkeypatch.setattr(edge, "SEGMENT_KB", 1024)  # 1,024 points of 256 dims (1 KB each) per segment
    monkeypatch.setattr(edge, "INDEXING_KB", 256)
    monkeypatch.setattr(indexer, "WRITE_POINTS", 256)  # writes of a quarter of a segment (a sixteenth in earnest)
    builds: list[list[int]] = []  # the live worker processes at each optimize
    writers: set[int] = set()  # every worker process seen while the run wrote
    optimize, upsert = EdgeStore.optimize, EdgeStore.upsert
    monkeypatch.setattr(EdgeStore, "optimize", lambda self: (
        builds.append([p.pid for p in multiprocessing.active_children()]), optimize(self))[1])
    monkeypatch.setattr(EdgeStore, "upsert", lambda self, points: (
        writers.update(p.pid for p in multiprocessing.active_children()), upsert(self, points))[1])
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    for i in range(200):
        (root / f"pkg/mod_{i}.py").write_text("".join(
            f"def handler_{i}_{j}(request, value):\n    return request.get('k{j}', value) * {j}\n\n\n" for j in range(30)))
    settings = Settings(_env_file=None, moonmind_home=tmp_path / "home", qdrant_url=None, collection="moonmind__repo",
                        chunk_chars=200, index_workers=1, embedding_batch_size=64)  # batches of 256 chunks: 4 per segment
    store = EdgeStore(settings.data_dir, settings.collection)
    try:
        run = index_repository(root, repo="demo", tenant="acme", settings=settings, embedder=StaticEmbedder(), store=store)
        assert run.chunks_written == store.count() > 2.5 * 1024
        assert store._open().info().segments_count >= 3
    finally:
        store.close()
    assert len(builds) >= 3 and builds[:-1] == [[]] * (len(builds) - 1)  # no worker alive at a mid-run build
    assert len(writers) >= 2  # the one worker of this run was started again after a build


@pytest.mark.slow  # starts worker processes
def test_a_tree_of_large_files_holds_a_bounded_amount_of_their_text_in_flight(tmp_path, monkeypatch):
    """Issue 20, "stream, don't accumulate": files read ahead of the chunking are bounded by their text,
    not only by their number (192 files of ~1 MB pages held ~200 MB in the indexing process)."""
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing import workers
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import EdgeStore

    size, count = 400_000, 40  # 16 MB of text in 40 files: all of them fit the count bound (192 files)
    root = tmp_path / "tree"
    (root / "docs").mkdir(parents=True)
    for i in range(count):
        para = f"Paragraph about topic {i} and the handling of requests in module {i}.\n\n"
        (root / f"docs/page_{i:02d}.md").write_text((para * (size // len(para) + 1))[:size])
    sent: list[int] = []  # characters handed to chunking jobs, running total, at each job
    taken: list[int] = [0]  # files handed on, as the run reports them
    chunk = workers.Pool.chunk

    def counting_chunk(self, group, *args):
        sent.append((sent[-1] if sent else 0) + sum(len(text) for _, text in group))
        in_flight = sent[-1] - taken[0] * size
        # the bound, plus the group being sent, plus the file the run reports as done only once it is handed on
        bound = self.chars_in_flight + self.group_chars + 2 * size
        assert in_flight <= bound, f"{in_flight} characters read ahead of the chunking (bound {bound})"
        return chunk(self, group, *args)

    monkeypatch.setattr(workers.Pool, "chunk", counting_chunk)
    # large chunks: few per file, so the embedding's own backpressure (a few batches in flight) lets
    # the reading run ahead, and only the bound on text holds it
    settings = Settings(_env_file=None, moonmind_home=tmp_path / "home", qdrant_url=None, collection="moonmind__repo",
                        index_workers=2, chunk_chars=8000)
    store = EdgeStore(settings.data_dir, settings.collection)
    try:
        run = index_repository(root, repo="docs", tenant="acme", settings=settings, embedder=StaticEmbedder(), store=store,
                               progress=lambda done, files, chunks: taken.__setitem__(0, done))
        assert run.files_indexed == count and run.chunks_written == store.count() > 0
    finally:
        store.close()
    assert len(sent) >= count // 2 and sent[-1] == size * count


@pytest.mark.slow  # starts a worker process
def test_a_run_whose_new_files_are_large_starts_its_workers_before_this_process_loads_the_model(tmp_path, monkeypatch):
    """A cold index of a big tree chunks and embeds in the workers from its first file: the indexing
    process never loads the model, numpy and the tokenizer (their memory, the whole run long). A later
    run that changes one small file stays in this process, where starting workers would cost more."""
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing import workers
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import EdgeStore

    # the tree's new text passes START_CHARS; its first chunking job (GROUP_FILES files) does not, and
    # yields a batch of chunks (small chunks) before the second: without the hint, that batch is embedded here
    monkeypatch.setattr(workers, "START_CHARS", 150_000)
    monkeypatch.setattr(workers, "worker_count", lambda setting: 1 if setting is None else setting)  # auto, any box
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    for i in range(100):
        (root / f"pkg/mod_{i}.py").write_text("".join(
            f"def handler_{i}_{j}(request, value):\n    return request.get('k{j}', value) * {j}\n\n\n" for j in range(30)))
    sizes = sorted(p.stat().st_size for p in root.rglob("*.py"))
    assert sum(sizes[-workers.GROUP_FILES:]) < 150_000 < sum(sizes)
    settings = Settings(_env_file=None, moonmind_home=tmp_path / "home", qdrant_url=None, collection="moonmind__repo",
                        chunk_chars=200)
    store = EdgeStore(settings.data_dir, settings.collection)
    try:
        cold = StaticEmbedder()
        first = index_repository(root, repo="demo", tenant="acme", settings=settings, embedder=cold, store=store)
        assert first.chunks_written > 0
        assert cold._model is None  # every chunk was embedded by the worker
        (root / "pkg/mod_3.py").write_text("def changed(request):\n    return 0\n")
        warm = StaticEmbedder()
        second = index_repository(root, repo="demo", tenant="acme", settings=settings, embedder=warm, store=store)
        assert second.files_indexed == 1 and second.files_unchanged == 99
        assert warm._model is not None  # the one changed file was embedded here
    finally:
        store.close()


def _catalog_tree(root: Path) -> Path:
    locale = root / "locale" / "de" / "LC_MESSAGES"
    locale.mkdir(parents=True)
    (locale / "django.po").write_text('msgid "Bearer token"\nmsgstr "Inhabertoken"\n')
    (locale / "django.mo").write_bytes(b"\xde\x12\x04\x95\x00\x00\x00\x00")
    (root / "locale" / "django.pot").write_text('msgid "Bearer token"\nmsgstr ""\n')
    (root / "auth.py").write_text('from gettext import gettext as _\n\nMESSAGE = _("Bearer token")\n')
    return root


def test_gettext_catalogs_are_skipped_by_default_with_the_setting_that_indexes_them(tmp_path):
    from moonmind_worker.text.files import Skipped, walk

    skipped: list[Skipped] = []
    assert [rel for rel, _ in walk(_catalog_tree(tmp_path), skipped)] == ["auth.py"]
    reasons = {s.path: s.reason for s in skipped}
    assert reasons["locale/de/LC_MESSAGES/django.mo"] == "lock/vendored/binary type"  # compiled: skipped unread
    assert "MOONMIND_INDEX_CATALOGS=on" in reasons["locale/de/LC_MESSAGES/django.po"]
    assert "MOONMIND_INDEX_CATALOGS=on" in reasons["locale/django.pot"]


def test_gettext_catalogs_are_walked_when_asked_for_and_their_compiled_form_never(tmp_path):
    from moonmind_worker.text.files import Skipped, WalkRules, excluded_reason, walk

    skipped: list[Skipped] = []
    walked = [rel for rel, _ in walk(_catalog_tree(tmp_path), skipped, rules=WalkRules(catalogs=True))]
    assert walked == ["auth.py", "locale/de/LC_MESSAGES/django.po", "locale/django.pot"]
    assert [(s.path, s.reason) for s in skipped] == [("locale/de/LC_MESSAGES/django.mo", "lock/vendored/binary type")]
    assert excluded_reason(tmp_path, "locale/django.pot", rules=WalkRules(catalogs=True)) is None
    assert "MOONMIND_INDEX_CATALOGS" in excluded_reason(tmp_path, "locale/django.pot")


@pytest.mark.slow
def test_a_search_for_a_message_finds_the_code_not_the_catalogs_until_they_are_asked_for(cli, tmp_path):
    tree = _catalog_tree(tmp_path / "app")
    first = _index(cli, tree)
    assert first["files_indexed"] == 1
    assert first["skipped_by_reason"]["gettext catalog (MOONMIND_INDEX_CATALOGS=on indexes them)"] == 2
    assert {i["source"] for i in _search(cli, "Bearer token", "repo=demo")["items"]} == {"auth.py"}
    again = _index(cli, tree, extra_env={"MOONMIND_INDEX_CATALOGS": "on"})
    assert again["files_indexed"] == 2 and again["files_unchanged"] == 1
    assert {i["source"] for i in _search(cli, "Bearer token", "repo=demo")["items"]} == {
        "auth.py", "locale/de/LC_MESSAGES/django.po", "locale/django.pot"}
    off = _index(cli, tree)  # the setting off again: the catalogs leave the index
    assert off["files_deleted"] == 2
    assert {i["source"] for i in _search(cli, "Bearer token", "repo=demo")["items"]} == {"auth.py"}


def test_a_new_file_over_the_size_limit_does_not_start_the_workers(tmp_path, monkeypatch):
    """Such a file is skipped unread, so its size is no text to chunk: a run of one small file stays in this process."""
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing import workers
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import EdgeStore

    monkeypatch.setattr(workers, "START_CHARS", 150_000)
    monkeypatch.setattr(workers, "worker_count", lambda setting: 1 if setting is None else setting)  # auto, any box
    started: list[int] = []
    monkeypatch.setattr(workers.Pool, "_start", lambda self: started.append(1))  # stays in this process either way
    root = tmp_path / "tree"
    (root / "data").mkdir(parents=True)
    (root / "app.py").write_text("def rotate_bearer_token(store):\n    return store.rotate()\n")
    (root / "data" / "dump.json").write_text('{"rows": [' + ", ".join(["1"] * 100_000) + "]}\n")
    settings = Settings(_env_file=None, moonmind_home=tmp_path / "home", qdrant_url=None, collection="moonmind__repo",
                        max_file_bytes=100_000)
    store = EdgeStore(settings.data_dir, settings.collection)
    try:
        s = index_repository(root, repo="demo", tenant="acme", settings=settings, embedder=StaticEmbedder(), store=store)
    finally:
        store.close()
    assert s.files_indexed == 1 and s.skipped_by_reason() == {"larger than 100000 bytes": 1}
    assert started == []
