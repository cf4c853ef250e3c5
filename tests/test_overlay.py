"""Workspace overlays (issue 4; spec 01 US4 + FR-007, spec 02 "Workspace Overlay Indexing").

Every behaviour runs on both real engines: Qdrant Edge on disk and
qdrant-client's local mode. The CLI is exercised as a subprocess at the end.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from moonmind_worker.contracts import WORKSPACE_OVERLAY, parse_query
from moonmind_worker.errors import MoonmindError
from moonmind_worker.indexing.indexer import index_repository
from moonmind_worker.indexing.overlay import clean_overlay, list_overlay, parse_duration, upsert_overlay
from moonmind_worker.retrieval.overlay_plan import plan_search
from moonmind_worker.retrieval.pipeline import retrieve_context_pack
from moonmind_worker.retrieval.ranking import Candidate
from moonmind_worker.store import Match, Range, SearchSpec, Where
from moonmind_worker.text.files import IGNORED_BY_GIT

from conftest import FIXTURE_FILES, write_tree

EDITED_TOKENS = '''"""Bearer token checks for the API."""

import hmac


def verify_bearer_credentials(header: str, signing_keys: list[str]) -> bool:
    """Validate an `Authorization: Bearer <token>` header against every rotated signing key."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return any(hmac.compare_digest(token, key) for key in signing_keys)
'''


class World:
    """One engine with the fixture repository indexed canonically as repo=demo, tenant=acme."""

    def __init__(self, root: Path, settings, embedder, store) -> None:
        self.root, self.settings, self.embedder, self.store = root, settings, embedder, store

    def upsert(self, paths, run_id="run-a", ttl_s=3600.0, repo="demo", tenant="acme", root=None):
        return upsert_overlay(
            paths, root=root or self.root, run_id=run_id, ttl_s=ttl_s, repo=repo, tenant=tenant,
            settings=self.settings, embedder=self.embedder, store=self.store,
        )

    def search(self, query, run_id=None, overlay="include", top_k=8, threshold=None, **filters):
        f = {"repo": "demo", "tenant": "acme", **filters}
        if run_id is not None:
            f["run_id"] = run_id
        q = parse_query({"query": query, "filters": f, "overlay_policy": overlay, "top_k": top_k,
                         "score_threshold": threshold})
        return retrieve_context_pack(q, settings=self.settings, embedder=self.embedder, store=self.store)

    def count(self, *must) -> int:
        return self.store.count(Where(must=tuple(must)))

    def canonical_snapshot(self) -> list[tuple[str, str]]:
        return sorted(
            (h.id, h.payload["chunk_hash"])
            for h in self.store.scroll(Where(must=(Match("trust_class", "canonical"),)), ["chunk_hash"])
        )


@pytest.fixture(scope="module")
def edge_template(tmp_path_factory):
    """The fixture repository indexed once into an embedded store; each test gets a copy of it."""
    from moonmind_worker.runtime import get_embedder
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import EdgeStore

    home = tmp_path_factory.mktemp("edge-template")
    settings = Settings(
        MOONMIND_HOME=str(home), QDRANT_URL=None, MOONMIND_COLLECTION="moonmind__repo",
        MOONMIND_EMBEDDING_PROVIDER="static", MOONMIND_EMBEDDING_MODEL=None,
    )
    root = write_tree(home / "ws", FIXTURE_FILES)
    store = EdgeStore(settings.data_dir, settings.collection)
    index_repository(root, repo="demo", tenant="acme", settings=settings, embedder=get_embedder(settings), store=store)
    store.close()
    return settings.data_dir


@pytest.fixture(params=["edge", "local"])
def world(request, env, home, tmp_path, monkeypatch, edge_template):
    from moonmind_worker.runtime import get_embedder
    from moonmind_worker.settings import get_settings
    from moonmind_worker.store import open_store

    if request.param == "local":
        monkeypatch.setenv("QDRANT_URL", ":memory:")
    get_settings.cache_clear()
    settings = get_settings()
    root = write_tree(tmp_path / "ws", FIXTURE_FILES)
    embedder = get_embedder(settings)
    if request.param == "edge":
        shutil.copytree(edge_template, settings.data_dir)
        store = open_store(settings)
    else:
        store = open_store(settings)
        index_repository(root, repo="demo", tenant="acme", settings=settings, embedder=embedder, store=store)
    yield World(root, settings, embedder, store)
    store.close()


def _overlay_first(items) -> bool:
    classes = [i.trust_class for i in items]
    return classes == sorted(classes, key=lambda c: c != "overlay")


def _key(pack):
    return [(i.source, i.chunk_hash, i.offset_start, i.score, i.trust_class) for i in pack.items]


# ------------------------------------------------------------- merge rules ---


@pytest.mark.slow
def test_edited_file_new_text_surfaces_ahead_of_canonical_and_old_text_is_gone(world):
    (world.root / "auth/tokens.py").write_text(EDITED_TOKENS)
    summary = world.upsert(["auth/tokens.py"])
    assert summary.files == ["auth/tokens.py"] and summary.chunks_written >= 1

    pack = world.search("where are bearer tokens checked", run_id="run-a", top_k=20, threshold=0.0)
    top = pack.items[0]
    assert top.trust_class == "overlay" and top.source == "auth/tokens.py"
    assert "verify_bearer_credentials" in top.text
    assert top.payload["trust_class"] == WORKSPACE_OVERLAY and top.payload["run_id"] == "run-a"
    assert not any("check_bearer_token" in i.text for i in pack.items)
    assert any(i.trust_class == "canonical" for i in pack.items)
    assert _overlay_first(pack.items)
    assert "trust=overlay" in pack.context_text

    # the canonical index still holds the old text for everyone else
    other = world.search("where are bearer tokens checked", top_k=20, threshold=0.0)
    assert any("check_bearer_token" in i.text for i in other.items)
    assert all(i.trust_class == "canonical" for i in other.items)


@pytest.mark.slow
def test_reupsert_replaces_the_files_previous_overlay_chunks(world):
    long_version = "\n\n".join(f"def helper_{n}(x):\n    return x + {n}  # step {n} of the token pipeline\n" * 6 for n in range(12))
    (world.root / "auth/tokens.py").write_text(long_version)
    first = world.upsert(["auth/tokens.py"])
    assert first.chunks_written > 1
    (world.root / "auth/tokens.py").write_text(EDITED_TOKENS)
    second = world.upsert(["auth/tokens.py"])

    assert second.chunks_replaced == first.chunks_written - second.chunks_written
    assert world.count(Match("trust_class", WORKSPACE_OVERLAY), Match("run_id", "run-a")) == second.chunks_written
    [row] = list_overlay(run_id="run-a", settings=world.settings, store=world.store)
    assert row["path"] == "auth/tokens.py" and row["chunks"] == second.chunks_written and not row["expired"]
    texts = [i.text for i in world.search("token pipeline helper step", run_id="run-a").items]
    assert not any("helper_" in t for t in texts)


def test_multiple_files_are_deduped_by_path_and_chunk_hash(world):
    (world.root / "auth/tokens.py").write_text(EDITED_TOKENS)
    # db/pool.py is overlaid unchanged: its chunks are identical to the canonical ones
    world.upsert(["auth/tokens.py", "db/pool.py", "docs/guide.md"])

    pack = world.search("bearer token connection pool caching", run_id="run-a", top_k=20, threshold=0.0)
    keys = [(i.source, i.chunk_hash) for i in pack.items]
    assert len(keys) == len(set(keys))
    overlaid = {"auth/tokens.py", "db/pool.py", "docs/guide.md"}
    assert all(i.trust_class == "overlay" for i in pack.items if i.source in overlaid)
    assert {i.source for i in pack.items if i.trust_class == "overlay"} == overlaid
    assert _overlay_first(pack.items)


def test_deleted_file_tombstone_hides_its_canonical_chunks_for_that_run_only(world):
    (world.root / "db/pool.py").unlink()
    summary = world.upsert(["db/pool.py"])
    assert summary.tombstones == ["db/pool.py"] and summary.chunks_written == 0

    pack = world.search("database connection pool", run_id="run-a", top_k=20)
    assert "db/pool.py" not in {i.source for i in pack.items}
    assert all(i.text for i in pack.items)  # the tombstone itself is never an item
    other = world.search("database connection pool", run_id="run-b", top_k=20)
    assert "db/pool.py" in {i.source for i in other.items}
    [row] = list_overlay(run_id="run-a", settings=world.settings, store=world.store)
    assert row["tombstone"] and row["chunks"] == 0


@pytest.mark.slow
def test_a_tombstone_hides_its_own_repositorys_file_not_the_same_path_in_another(world, tmp_path):
    other = write_tree(tmp_path / "other", FIXTURE_FILES)
    index_repository(other, repo="other", tenant="acme", settings=world.settings, embedder=world.embedder, store=world.store)
    (world.root / "db/pool.py").unlink()
    world.upsert(["db/pool.py"], run_id="run-a")  # tombstone in repo demo only

    both = world.search("database connection pool", run_id="run-a", top_k=30, repo=None)  # a scope spanning both repos
    files = {(i.payload["repo"], i.source) for i in both.items}
    assert ("other", "db/pool.py") in files and ("demo", "db/pool.py") not in files


def test_the_same_file_in_two_repositories_is_two_results(world, tmp_path):
    other = write_tree(tmp_path / "other", FIXTURE_FILES)
    index_repository(other, repo="other", tenant="acme", settings=world.settings, embedder=world.embedder, store=world.store)
    for run_id in (None, "run-a"):  # with and without the overlay merge
        pack = world.search("bearer token signing keys", run_id=run_id, top_k=30, repo=None)
        repos = {i.payload["repo"] for i in pack.items if i.source == "auth/tokens.py"}
        assert repos == {"demo", "other"}, (run_id, repos)


@pytest.mark.slow
def test_expired_overlay_returns_canonical_only_in_canonical_order(world):
    (world.root / "auth/tokens.py").write_text(EDITED_TOKENS)
    summary = world.upsert(["auth/tokens.py"], ttl_s=4.0)
    assert world.search("where are bearer tokens checked", run_id="run-a").items[0].trust_class == "overlay"
    deadline = time.monotonic() + 60
    while time.time() <= summary.expires_at:  # until the overlay is past its expiry
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # canonical order at the same collection state (BM25's statistics count canonical chunks only)
    baseline = world.search("where are bearer tokens checked")
    expired = world.search("where are bearer tokens checked", run_id="run-a")
    assert _key(expired) == _key(baseline)  # same state, so same scores too
    # expired points are filtered in the query: they never take a top_k slot
    assert len(world.search("where are bearer tokens checked", run_id="run-a", top_k=1).items) == 1


@pytest.mark.slow
def test_overlay_skip_returns_canonical_only_in_canonical_order(world):
    (world.root / "db/pool.py").write_text("class ConnectionPool:\n    '''Pool of connections, now lazily created.'''\n")
    world.upsert(["db/pool.py"])
    baseline = world.search("database connection pool")  # canonical view, same collection state
    assert world.search("database connection pool", run_id="run-a").items[0].trust_class == "overlay"
    skipped = world.search("database connection pool", run_id="run-a", overlay="skip")
    assert _key(skipped) == _key(baseline)  # same state, so same scores too


@pytest.mark.slow
def test_identical_input_gives_identical_merged_order(world):
    (world.root / "auth/tokens.py").write_text(EDITED_TOKENS)
    world.upsert(["auth/tokens.py", "docs/guide.md"])
    a = world.search("token caching", run_id="run-a", top_k=20)
    b = world.search("token caching", run_id="run-a", top_k=20)
    assert _key(a) == _key(b)
    for group in ("overlay", "canonical"):
        keys = [(-i.score, i.source, i.offset_start) for i in a.items if i.trust_class == group]
        assert keys == sorted(keys)


def test_ties_break_by_score_then_path_then_offset(world):
    """Equal scores: path then offset decide, whatever order the store returned."""
    q = parse_query({"query": "x", "filters": {"run_id": "r"}})
    active = plan_search(q, [SearchSpec(where=Where(), limit=8, dense=np.ones(4, dtype=np.float32))])
    assert active.active

    def cand(path, offset, score, trust):
        payload = {"path": path, "offset_start": offset, "chunk_hash": f"sha256:{path}{offset}", "trust_class": trust}
        return Candidate(payload, cosine=score, bm25=0.0, score=score)

    cands = [
        cand("b.py", 0, 0.5, WORKSPACE_OVERLAY), cand("a.py", 40, 0.5, WORKSPACE_OVERLAY),
        cand("a.py", 0, 0.5, WORKSPACE_OVERLAY), cand("z.py", 0, 0.9, "canonical"),
        cand("c.py", 0, 0.7, WORKSPACE_OVERLAY), cand("m.py", 0, 0.5, "canonical"), cand("d.py", 0, 0.5, "canonical"),
    ]
    expected = ["c.py", "a.py", "a.py", "b.py", "z.py", "d.py", "m.py"]
    for seed in range(5):
        shuffled = cands[:]
        random.Random(seed).shuffle(shuffled)
        got = active.order(sorted(shuffled, key=lambda c: (-c.score, c.payload["path"], c.payload["offset_start"])))
        assert [c.payload["path"] for c in got] == expected
        assert [c.payload["offset_start"] for c in got][1:3] == [0, 40]


# --------------------------------------------------------------- isolation ---


@pytest.mark.slow
def test_runs_are_isolated_under_adversarial_filters(world):
    (world.root / "auth/tokens.py").write_text(EDITED_TOKENS.replace("rotated signing key", "ALPHA secret rotation"))
    world.upsert(["auth/tokens.py"], run_id="run-a")
    (world.root / "auth/tokens.py").write_text(EDITED_TOKENS.replace("rotated signing key", "BRAVO secret rotation"))
    world.upsert(["auth/tokens.py"], run_id="run-b")

    attempts = [
        {"run_id": "run-b"},
        {"run_id": "run-b", "path": "auth/tokens.py"},
        {"run_id": "run-b", "path": "auth/tokens.py", "language": "python"},
        {"run_id": " run-b "},
    ]
    for filters in attempts:
        pack = world.search("ALPHA secret rotation bearer", top_k=20, **filters)
        assert not any("ALPHA" in i.text for i in pack.items), filters
        assert {i.payload.get("run_id") for i in pack.items if i.trust_class == "overlay"} == {"run-b"}
    # a query without a run id never sees any overlay, whatever else it filters on
    for filters in ({}, {"path": "auth/tokens.py"}, {"run_id": ""}, {"run_id": "   "}):
        pack = world.search("ALPHA BRAVO secret rotation bearer", top_k=20, **filters)
        assert pack.items and all(i.trust_class == "canonical" for i in pack.items), filters
    # a run that overlaid nothing sees canonical only
    pack = world.search("ALPHA BRAVO secret rotation bearer", run_id="run-c", top_k=20)
    assert all(i.trust_class == "canonical" for i in pack.items)


@pytest.mark.slow
def test_tenants_are_isolated_even_with_the_same_run_id(world, tmp_path):
    other = write_tree(tmp_path / "globex", FIXTURE_FILES)
    index_repository(other, repo="demo", tenant="globex", settings=world.settings, embedder=world.embedder, store=world.store)
    (other / "auth/tokens.py").write_text(EDITED_TOKENS.replace("rotated signing key", "GLOBEX private rotation"))
    world.upsert(["auth/tokens.py"], run_id="job-1", tenant="globex", root=other)
    (world.root / "auth/tokens.py").write_text(EDITED_TOKENS.replace("rotated signing key", "ACME private rotation"))
    world.upsert(["auth/tokens.py"], run_id="job-1", tenant="acme")

    acme = world.search("GLOBEX private rotation bearer", run_id="job-1", top_k=20)
    assert not any("GLOBEX" in i.text for i in acme.items)
    assert {i.payload["tenant"] for i in acme.items} == {"acme"}
    assert any("ACME" in i.text for i in acme.items if i.trust_class == "overlay")
    globex = world.search("ACME private rotation bearer", run_id="job-1", tenant="globex", top_k=20)
    assert not any("ACME" in i.text for i in globex.items)
    # cleaning one tenant's run (a job exports its tenant) leaves the other's alone
    job = world.settings.model_copy(update={"tenant": "acme"})
    removed = clean_overlay(run_id="job-1", settings=job, store=world.store)
    assert removed >= 1
    assert world.count(Match("trust_class", WORKSPACE_OVERLAY), Match("tenant", "globex")) >= 1
    assert world.count(Match("trust_class", WORKSPACE_OVERLAY), Match("tenant", "acme")) == 0


@pytest.mark.slow
def test_overlay_writes_never_touch_canonical_points(world):
    before = world.canonical_snapshot()
    (world.root / "auth/tokens.py").write_text(EDITED_TOKENS)
    (world.root / "db/pool.py").unlink()
    world.upsert(["auth/tokens.py", "db/pool.py", "docs/guide.md"])
    world.upsert(["auth/tokens.py"])
    clean_overlay(run_id="run-a", settings=world.settings, store=world.store)
    clean_overlay(expired=True, settings=world.settings, store=world.store, now=time.time() + 10**7)
    assert world.canonical_snapshot() == before


def test_canonical_and_overlay_branches_go_in_one_batched_search(world):
    calls = []
    real = world.store.search

    def counting(specs, *a, **kw):
        calls.append(len(specs))
        return real(specs, *a, **kw)

    world.store.search = counting
    try:
        world.upsert(["auth/tokens.py"])
        world.search("bearer token", run_id="run-a")
        world.search("bearer token", run_id="run-a", overlay="skip")
    finally:
        del world.store.search
    # dense + sparse canonical, their two overlay mirrors, the manifest — in one call; skip → canonical only
    assert calls == [5, 2]


# ------------------------------------------------------------------- sweep ---


@pytest.mark.slow
def test_sweep_removes_exactly_the_expired_points_while_an_upsert_and_searches_run(world):
    overlay = Match("trust_class", WORKSPACE_OVERLAY)
    world.upsert(["auth/tokens.py", "db/pool.py"], run_id="old-1", ttl_s=60)
    world.upsert(["docs/guide.md", "web/render.js"], run_id="old-2", ttl_s=60)
    world.upsert(["auth/tokens.py"], run_id="live", ttl_s=3600)
    later = time.time() + 600  # the sweep runs "ten minutes later": old-* have expired, live has not
    expired_before = world.count(overlay, Range("expires_at", lte=later))
    live_before = world.count(overlay, Range("expires_at", gt=later))
    canonical_before = world.count(Match("trust_class", "canonical"))
    assert expired_before > 0 and live_before > 0

    errors: list[BaseException] = []
    started = threading.Event()

    def upsert_meanwhile():
        started.set()
        try:
            world.upsert(["auth/tokens.py", "db/pool.py", "docs/guide.md", "web/render.js"], run_id="fresh")
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    def search_meanwhile():
        try:
            for _ in range(3):
                pack = world.search("bearer token connection pool", run_id="live", top_k=20)
                assert all(i.payload["run_id"] == "live" for i in pack.items if i.trust_class == "overlay")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=upsert_meanwhile), threading.Thread(target=search_meanwhile)]
    for t in threads:
        t.start()
    started.wait()
    removed = clean_overlay(expired=True, settings=world.settings, store=world.store, now=later)
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)

    assert removed == expired_before
    assert world.count(overlay, Range("expires_at", lte=later)) == 0
    assert world.count(overlay, Match("run_id", "live")) == live_before
    fresh = list_overlay(run_id="fresh", settings=world.settings, store=world.store)
    assert [r["path"] for r in fresh] == ["auth/tokens.py", "db/pool.py", "docs/guide.md", "web/render.js"]
    assert world.count(Match("trust_class", "canonical")) == canonical_before
    # idempotent: nothing left to sweep
    assert clean_overlay(expired=True, settings=world.settings, store=world.store, now=later) == 0


@pytest.mark.slow
def test_clean_run_removes_only_that_run(world):
    world.upsert(["auth/tokens.py"], run_id="run-a")
    world.upsert(["db/pool.py"], run_id="run-b")
    n = world.count(Match("run_id", "run-a"))
    assert clean_overlay(run_id="run-a", settings=world.settings, store=world.store) == n
    assert clean_overlay(run_id="run-a", settings=world.settings, store=world.store) == 0
    assert [r["run_id"] for r in list_overlay(settings=world.settings, store=world.store)] == ["run-b"]
    with pytest.raises(MoonmindError) as e:
        clean_overlay(settings=world.settings, store=world.store)
    assert e.value.code == "invalid_argument"


# ------------------------------------------------------------------ safety ---


@pytest.fixture
def edge_world(world):
    if world.settings.qdrant_url:
        pytest.skip("path checks happen before the store is touched; one engine is enough")
    return world


def test_path_escape_attempts_are_rejected_and_nothing_is_written(edge_world, tmp_path):
    w = edge_world
    outside = tmp_path / "outside.py"
    outside.write_text("SECRET = 'do not index'\n")
    (w.root / "link_out.py").symlink_to(outside)
    (w.root / "linkdir").symlink_to(tmp_path)
    attempts = ["../outside.py", str(outside), "auth/../../outside.py", "link_out.py", "linkdir/outside.py", "/etc/passwd"]
    for bad in attempts:
        with pytest.raises(MoonmindError) as e:
            w.upsert(["auth/tokens.py", bad])  # a valid path alongside: still nothing written
        assert e.value.code == "path_outside_workspace", bad
        assert e.value.exit_code == 2 and "outside the workspace" in e.value.message
    assert w.count(Match("trust_class", WORKSPACE_OVERLAY)) == 0


def test_paths_are_stored_repo_relative(edge_world):
    w = edge_world
    s = w.upsert([str(w.root / "auth" / "tokens.py"), "db/../db/pool.py"])
    assert s.files == ["auth/tokens.py", "db/pool.py"]
    paths = {h.payload["path"] for h in w.store.scroll(Where(must=(Match("trust_class", WORKSPACE_OVERLAY),)), ["path"])}
    assert paths == {"auth/tokens.py", "db/pool.py"}


@pytest.mark.slow
def test_binary_oversized_and_ignored_files_are_skipped_with_a_reason(edge_world):
    w = edge_world
    (w.root / "blob.dat").write_bytes(b"\x00\x01binary")
    (w.root / "big.py").write_text("x = 1\n" * (w.settings.max_file_bytes // 6 + 10))
    (w.root / ".gitignore").write_text("secrets.env\n")
    (w.root / "secrets.env").write_text("TOKEN=abc\n")
    (w.root / "package-lock.json").write_text("{}\n")
    s = w.upsert(["blob.dat", "big.py", "secrets.env", "package-lock.json", "docs/guide.md"])
    reasons = {k.path: k.reason for k in s.skipped}
    assert reasons["blob.dat"] == "binary"
    assert "larger than" in reasons["big.py"]
    assert reasons["secrets.env"] == IGNORED_BY_GIT
    assert reasons["package-lock.json"] == "lock/vendored/binary type"
    assert s.files == ["docs/guide.md"]


def test_missing_scope_is_a_clear_error(edge_world):
    for kwargs, hint in (({"run_id": " "}, "MOONMIND_RUN_ID"), ({"repo": ""}, "MOONMIND_REPO"), ({"tenant": None}, "MOONMIND_TENANT")):
        with pytest.raises(MoonmindError) as e:
            edge_world.upsert(["auth/tokens.py"], **kwargs)
        assert e.value.code == "invalid_argument" and hint in e.value.action


def test_ttl_durations_parse_and_bad_ones_are_refused():
    assert parse_duration("90") == 90 and parse_duration("30m") == 1800 and parse_duration("2h") == 7200
    assert parse_duration("1d") == 86400
    for bad in ("", "0", "-5m", "soon", "31d", "5w"):
        with pytest.raises(MoonmindError) as e:
            parse_duration(bad)
        assert e.value.code == "invalid_argument"


# --------------------------------------------------------------------- CLI ---


@pytest.mark.slow
def test_cli_upsert_search_list_clean(cli, indexed):
    (indexed / "auth/tokens.py").write_text(EDITED_TOKENS)
    job = {"MOONMIND_RUN_ID": "job-7", "MOONMIND_REPO": "demo", "MOONMIND_TENANT": "acme"}

    r = cli("rag", "overlay", "upsert", "auth/tokens.py", "--ttl", "2h", "--json", cwd=indexed, extra_env=job)
    assert r.code == 0, r.stderr
    out = r.json()
    assert out["run_id"] == "job-7" and out["files"] == ["auth/tokens.py"] and out["chunks_written"] >= 1

    r = cli("rag", "search", "--query", "where are bearer tokens checked", "--json", extra_env=job)
    assert r.code == 0, r.stderr
    items = r.json()["items"]
    assert items[0]["trust_class"] == "overlay" and "verify_bearer_credentials" in items[0]["text"]
    r = cli("rag", "search", "--query", "where are bearer tokens checked", "--overlay", "skip", "--json", extra_env=job)
    assert all(i["trust_class"] == "canonical" for i in r.json()["items"])

    r = cli("rag", "overlay", "list", extra_env=job)
    assert r.code == 0 and "job-7\tacme/demo\tauth/tokens.py" in r.stdout and "expires" in r.stdout
    rows = cli("rag", "overlay", "list", "--json", "--run-id", "job-7").json()
    assert [(x["path"], x["expired"]) for x in rows] == [("auth/tokens.py", False)]

    r = cli("rag", "overlay", "clean", "--json", extra_env=job)
    assert r.code == 0 and r.json() == {"removed": out["chunks_written"], "run_id": "job-7", "expired": False}
    assert cli("rag", "overlay", "list", "--json").json() == []


@pytest.mark.slow
def test_cli_overlay_errors_are_clear_and_write_nothing(cli, indexed):
    scope = {"MOONMIND_REPO": "demo", "MOONMIND_TENANT": "acme"}
    r = cli("rag", "overlay", "upsert", "auth/tokens.py", "--json", cwd=indexed, extra_env=scope)
    assert r.code == 2 and r.stdout == "" and r.error()["code"] == "invalid_argument"
    assert "MOONMIND_RUN_ID" in r.error()["action"]

    r = cli("rag", "overlay", "upsert", "../outside.py", "--run-id", "r1", "--json", cwd=indexed, extra_env=scope)
    assert r.code == 2 and r.stdout == "" and r.error()["code"] == "path_outside_workspace"
    assert "Traceback" not in r.stderr

    r = cli("rag", "overlay", "clean")
    assert r.code == 2 and r.stdout == "" and "--expired" in r.stderr
    r = cli("rag", "overlay", "clean", "--run-id", "r1", "--expired")
    assert r.code == 2 and r.stdout == ""
    assert cli("rag", "overlay", "list", "--json").json() == []


@pytest.mark.slow
def test_overlay_branches_keep_every_scope_condition_of_the_canonical_branch(world):
    """A caller-side allow-list (the gateway's token scope) narrows the overlay branches too."""
    from moonmind_worker.store import MatchAny

    (world.root / "auth/tokens.py").write_text(EDITED_TOKENS.replace("rotated signing key", "ACME rotation"))
    world.upsert(["auth/tokens.py"], run_id="job-1", tenant="acme")
    world.upsert(["auth/tokens.py"], run_id="job-1", tenant="globex")
    q = parse_query({"query": "bearer rotation", "filters": {"run_id": "job-1"}})  # no tenant filter at all
    allow = Where(must=(Match("trust_class", "canonical"), MatchAny("tenant", ("acme",))))
    specs = [SearchSpec(where=allow, limit=40, dense=world.embedder.embed_query("bearer rotation"))]
    plan = plan_search(q, specs)
    merged = plan.combine(world.store.search(specs + plan.specs))
    overlay_hits = [h for h in merged[0] if h.payload["trust_class"] == WORKSPACE_OVERLAY]
    assert overlay_hits and {h.payload["tenant"] for h in overlay_hits} == {"acme"}
    assert {h.payload["tenant"] for h in merged[0]} == {"acme"}


@pytest.mark.slow
def test_special_files_are_skipped_never_read(edge_world, tmp_path):
    """A FIFO would block the upsert forever and a device never ends: only regular files are read."""
    import os

    w = edge_world
    os.mkfifo(w.root / "pipe.py")
    s = w.upsert(["pipe.py", "docs/guide.md"])
    assert {k.path: k.reason for k in s.skipped} == {"pipe.py": "not a regular file"}
    assert s.files == ["docs/guide.md"]
    s = w.upsert(["/dev/zero"], root=Path("/dev"))
    assert {k.path: k.reason for k in s.skipped} == {"zero": "not a regular file"} and s.files == []
