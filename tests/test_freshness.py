"""Freshness (issue 38, item 1): the warm owner keeps the trees it indexed fresh, and a search says when it may not be.

Everything is real: `moonmind serve` owns the store and watches the indexed tree (MOONMIND_WATCH=on,
which conftest turns off for every other test), files are edited on disk, and searches go through the
owner's socket as every command's do. Each wait polls an observable result (a search's items, the
owner's `freshness` operation) until a deadline: the issue's bound where it sets one (FRESH_WITHIN_S),
otherwise one that only keeps a broken run from hanging (HANG_S).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from celery_helpers import stop, wait_for_socket
from conftest import MOONMIND, write_tree

#: The issue's bound: an edit is searchable this soon after it is saved.
FRESH_WITHIN_S = 2.0
#: How long a wait may take before the test calls it broken (no timing is asserted with it).
HANG_S = 120.0
SCOPE = {"repo": "demo", "tenant": "acme"}


def owner_call(home: Path, op: str, args: dict[str, Any]) -> Any:
    from moonmind_worker.owner.client import connect

    owner = connect(home / "qdrant-edge", "moonmind__repo")
    assert owner is not None, "no owner is serving the store"
    return owner.call(op, args)


def search(home: Path, query: str, **fields: Any) -> dict[str, Any]:
    return owner_call(home, "search", {"query": {"query": query, "filters": dict(SCOPE), **fields}, "record": False})


def until(condition: Callable[[], Any], within: float, what: str) -> Any:
    """Poll `condition` until it returns something truthy; fail once `within` seconds have passed."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within:g} s")
        time.sleep(0.02)  # the polling interval, not a synchronization


def freshness(home: Path) -> dict[str, Any]:
    return owner_call(home, "freshness", {})


def settled(home: Path) -> dict[str, Any] | None:
    """The owner's watch state once every tree is caught up and nothing is pending, else None."""
    state = freshness(home)
    trees = state["trees"]
    return state if trees and all(t["ready"] and not t["pending"] and not t["passing"] for t in trees) else None


def inotify_fds(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd) == "anon_inode:inotify"
        except OSError:
            pass
    return count


def start_owner(env: dict[str, str], home: Path, log: Path, watch: str) -> subprocess.Popen:
    with open(log, "w") as out:
        proc = subprocess.Popen([MOONMIND, "serve"], env={**env, "MOONMIND_WATCH": watch}, stdout=subprocess.DEVNULL,
                                stderr=out, start_new_session=True)
    wait_for_socket(home, proc)
    return proc


@pytest.fixture
def watching(indexed, env, home, tmp_path):
    """A live owner watching the indexed fixture tree, caught up with it."""
    proc = start_owner(env, home, tmp_path / "owner.log", "on")
    try:
        until(lambda: settled(home), HANG_S, "the owner's first pass over the tree")
        yield proc
    finally:
        stop(proc)


@pytest.fixture
def not_watching(indexed, env, home, tmp_path):
    proc = start_owner(env, home, tmp_path / "owner.log", "off")
    yield proc
    stop(proc)


@pytest.mark.slow
def test_an_edit_under_a_live_owner_is_searched_within_2_s_without_rag_index(watching, indexed, home):
    (indexed / "auth" / "tokens.py").write_text("def rotate_signing_keys_quarterly():\n    return 'zebra-orchid'\n")
    pack = until(lambda: (p := search(home, "rotate signing keys quarterly", top_k=3))
                 and any("zebra-orchid" in i["text"] for i in p["items"]) and p,
                 FRESH_WITHIN_S, "a search answering with the edited text")
    assert pack["items"][0]["source"] == "auth/tokens.py"
    assert not any("check_bearer_token" in i["text"] for i in pack["items"])  # the old version is gone
    until(lambda: settled(home), HANG_S, "the pass to end")
    assert search(home, "rotate signing keys quarterly", top_k=3)["freshness"] == "fresh"


@pytest.mark.slow
def test_a_deleted_file_loses_its_chunks(watching, indexed, home):
    in_pool = {"top_k": 50, "score_threshold": 0.0, "filters": {**SCOPE, "path": "db/pool.py"}}
    pool_chunks = len(search(home, "connection pool", **in_pool)["items"])
    chunks = owner_call(home, "chunks", dict(SCOPE))["chunks"]
    assert pool_chunks
    (indexed / "db" / "pool.py").unlink()
    until(lambda: not search(home, "connection pool", **in_pool)["items"], FRESH_WITHIN_S,
          "the deleted file's chunks to disappear")
    until(lambda: settled(home), HANG_S, "the pass to end")
    assert owner_call(home, "chunks", dict(SCOPE))["chunks"] == chunks - pool_chunks  # the other files' chunks stay


@pytest.mark.slow
def test_a_burst_of_1000_changes_is_one_re_index_pass_and_the_watcher_keeps_going(watching, indexed, home):
    before = freshness(home)["passes"]
    chunks = owner_call(home, "chunks", dict(SCOPE))["chunks"]
    for i in range(1000):
        (indexed / "auth" / f"generated_{i}.py").write_text(f"def generated_handler_{i}():\n    return 'burst-{i}'\n")
    state = until(lambda: (s := settled(home)) and s["passes"] > before and s, HANG_S, "the burst's re-index")
    assert state["passes"] == before + 1
    assert owner_call(home, "chunks", dict(SCOPE))["chunks"] == chunks + 1000
    # still watching: the next edit is searched as soon as ever
    (indexed / "db" / "pool.py").write_text("def drain_every_connection():\n    return 'after-the-burst'\n")
    until(lambda: any("after-the-burst" in i["text"] for i in search(home, "drain every connection", top_k=3)["items"]),
          FRESH_WITHIN_S, "a search answering with the edit after the burst")


@pytest.mark.slow
def test_watch_off_watches_nothing_and_a_search_says_its_hit_changed(not_watching, watching_pid_probe, indexed, home, cli):
    state = freshness(home)
    assert state == {"watch": "off", "passes": 0, "trees": []}
    assert inotify_fds(not_watching.pid) == 0 < watching_pid_probe
    (indexed / "auth" / "tokens.py").write_text("def check_bearer_token(header):\n    return header == 'changed'\n")
    r = cli("rag", "search", "where is the bearer token checked", "--filters", "repo=demo", "tenant=acme", "--json")
    assert r.code == 0, r.stderr
    pack = r.json()
    assert "header == 'changed'" not in pack["items"][0]["text"]  # nothing re-indexed it
    assert pack["freshness"] == "stale" and pack["stale_paths"] == ["auth/tokens.py"]
    assert "1 file(s) changed since they were indexed (auth/tokens.py)" in r.stderr
    assert freshness(home)["passes"] == 0


@pytest.fixture
def watching_pid_probe(env, tmp_path):
    """How many inotify instances a watching owner holds (of another home): what `off` must not have."""
    home = tmp_path / "probe-home"
    tree = write_tree(tmp_path / "probe", {"a.py": "def probe():\n    return 1\n"})
    e = {**env, "MOONMIND_HOME": str(home)}
    r = subprocess.run([MOONMIND, "rag", "index", str(tree), "--repo", "probe"], env=e, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    proc = start_owner(e, home, tmp_path / "probe-owner.log", "on")
    try:
        until(lambda: settled(home), HANG_S, "the probe owner's first pass")
        return inotify_fds(proc.pid)
    finally:
        stop(proc)


@pytest.mark.slow
def test_without_an_owner_a_search_says_which_hits_changed_and_is_fresh_after_rag_index(indexed, cli):
    query = ("rag", "search", "where is the bearer token checked", "--filters", "repo=demo", "tenant=acme", "--json")
    one_shot = {"MOONMIND_OWNER": "off"}
    clean = cli(*query, extra_env=one_shot)
    assert clean.code == 0 and clean.json()["freshness"] == "fresh" and clean.stderr == ""
    (indexed / "auth" / "tokens.py").write_text("def check_bearer_token(header):\n    return header == 'changed'\n")
    stale = cli(*query, extra_env=one_shot)
    assert stale.json()["freshness"] == "stale" and stale.json()["stale_paths"] == ["auth/tokens.py"]
    assert "changed since they were indexed (auth/tokens.py)" in stale.stderr and "moonmind rag index" in stale.stderr
    assert cli("rag", "index", str(indexed), "--repo", "demo", "--tenant", "acme", extra_env=one_shot).code == 0
    again = cli(*query, extra_env=one_shot)
    assert again.json()["freshness"] == "fresh" and again.stderr == ""
    # touched, same content: the hash says it is not stale
    os.utime(indexed / "auth" / "tokens.py")
    assert cli(*query, extra_env=one_shot).json()["freshness"] == "fresh"


@pytest.mark.slow
def test_an_overlay_keeps_its_precedence_over_what_the_watcher_re_indexes(watching, indexed, home, cli, tmp_path):
    ws = write_tree(tmp_path / "ws", {"auth/tokens.py": "def check_bearer_token(header):\n    return 'overlay-text'\n"})
    (ws / ".git").mkdir()
    run = {"MOONMIND_RUN_ID": "run-f", "MOONMIND_REPO": "demo", "MOONMIND_TENANT": "acme"}
    assert cli("rag", "overlay", "upsert", "auth/tokens.py", cwd=ws, extra_env=run).code == 0
    (indexed / "auth" / "tokens.py").write_text("def check_bearer_token(header):\n    return 'canonical-new'\n")
    until(lambda: any("canonical-new" in i["text"] for i in search(home, "check bearer token", top_k=3)["items"]),
          FRESH_WITHIN_S, "the canonical edit to be searched")
    scoped = search(home, "check bearer token", top_k=3, filters={**SCOPE, "run_id": "run-f"})
    tokens = [i for i in scoped["items"] if i["source"] == "auth/tokens.py"]
    assert [i["trust_class"] for i in tokens] == ["overlay"] and "overlay-text" in tokens[0]["text"]


def test_the_registry_records_each_indexed_tree_once_per_repository(env, tmp_path):
    from moonmind_worker.owner import freshness as fr
    from moonmind_worker.settings import get_settings

    settings = get_settings()
    settings.moonmind_home.mkdir(parents=True, exist_ok=True)
    fr.indexed(settings, tmp_path, "demo", "acme", 1.0)
    fr.indexed(settings, tmp_path, "demo", "acme", 2.0)
    fr.indexed(settings, tmp_path / "other", "other", "acme", 3.0)
    rows = sorted(fr.entries(settings), key=lambda r: r["repo"])
    assert [(r["repo"], r["root"], r["indexed_at"]) for r in rows] == [
        ("demo", str(tmp_path.resolve()), 2.0), ("other", str((tmp_path / "other").resolve()), 3.0)]
    assert json.loads((settings.moonmind_home / fr.REGISTRY).read_text())["roots"]
    assert fr.entries(settings.model_copy(update={"collection": "elsewhere"})) == []


def test_indexing_only_the_paths_a_watcher_saw_leaves_the_rest_of_the_tree_as_stored(prebuilt, env):
    from moonmind_worker import runtime
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.settings import get_settings
    from moonmind_worker.store.scopes import canonical_repo

    settings = get_settings()
    embedder, store = runtime.get_embedder(settings), runtime.get_store(settings)

    def stored() -> dict[str, str]:
        return {h.payload["path"]: h.payload["content_hash"] for h in store.scroll(canonical_repo("demo", "acme"),
                                                                                   ["path", "content_hash"])}

    before = stored()
    (prebuilt / "auth" / "tokens.py").write_text("def rotated():\n    return 1\n")
    (prebuilt / "db" / "pool.py").write_text("def not_named_in_this_pass():\n    return 2\n")
    (prebuilt / "docs" / "guide.md").unlink()
    (prebuilt / "yarn.lock").write_text("lock\n")
    summary = index_repository(prebuilt, repo="demo", tenant="acme", settings=settings, embedder=embedder, store=store,
                               paths=["auth/tokens.py", "docs", "web/render.js", "yarn.lock", "missing.py"])
    assert (summary.files_indexed, summary.files_unchanged, summary.files_deleted) == (1, 1, 1)
    assert [(s.path, s.reason) for s in summary.skipped] == [("yarn.lock", "lock/vendored/binary type")]
    after = stored()
    assert set(after) == set(before) - {"docs/guide.md"}
    assert after["auth/tokens.py"] != before["auth/tokens.py"] and after["db/pool.py"] == before["db/pool.py"]
    # what the paths left out, a whole run still finds: the file changed and not named
    whole = index_repository(prebuilt, repo="demo", tenant="acme", settings=settings, embedder=embedder, store=store)
    assert (whole.files_indexed, whole.files_deleted) == (1, 0)


@pytest.fixture
def watching_with_catalogs(indexed, cli, env, home, tmp_path):
    """The fixture tree indexed again with MOONMIND_INDEX_CATALOGS=on, then watched by a live owner."""
    r = cli("rag", "index", str(indexed), "--repo", "demo", "--tenant", "acme", extra_env={"MOONMIND_INDEX_CATALOGS": "on"})
    assert r.code == 0, r.stderr
    proc = start_owner(env, home, tmp_path / "owner.log", "on")  # the owner's own setting is the default, off
    try:
        until(lambda: settled(home), HANG_S, "the owner's first pass over the tree")
        yield proc
    finally:
        stop(proc)


def _catalog(tree: Path) -> None:
    locale = tree / "locale" / "fr" / "LC_MESSAGES"
    locale.mkdir(parents=True)
    (locale / "django.po").write_text('msgid "Quarterly zebra orchid report"\nmsgstr "Rapport trimestriel zèbre orchidée"\n')


@pytest.mark.slow
def test_a_tree_indexed_with_its_catalogs_keeps_them_as_the_watcher_re_indexes(watching_with_catalogs, indexed, home):
    _catalog(indexed)
    until(lambda: any(i["source"] == "locale/fr/LC_MESSAGES/django.po"
                      for i in search(home, "quarterly zebra orchid report", top_k=3)["items"]),
          FRESH_WITHIN_S, "a search answering with the new catalog")


@pytest.mark.slow
def test_a_tree_indexed_without_its_catalogs_leaves_a_new_one_out_as_the_watcher_re_indexes(watching, indexed, home):
    _catalog(indexed)
    (indexed / "auth" / "report.py").write_text("def quarterly_zebra_orchid_report():\n    return 'report'\n")
    until(lambda: any(i["source"] == "auth/report.py" for i in search(home, "quarterly zebra orchid report", top_k=3)["items"]),
          FRESH_WITHIN_S, "a search answering with the new code file")
    until(lambda: settled(home), HANG_S, "the pass to end")
    found = search(home, "quarterly zebra orchid report", top_k=10, score_threshold=0.0)["items"]
    assert not any(i["source"].endswith(".po") for i in found)


# ------------------------------------------- issue 52: a watched root swapped ---


def _swap_for_a_link(root: Path, tmp_path: Path) -> Path:
    """Move the indexed tree away and put a link to another directory (one holding a private file) in its place."""
    private = tmp_path / "private"
    private.mkdir()
    (private / "vault.py").write_text("def unseal_the_vault():\n    return 'walrus-quartz'\n")
    moved = root.with_name("repo-moved")
    root.rename(moved)
    root.symlink_to(private, target_is_directory=True)
    return moved


def _answers_from_the_link(home: Path) -> bool:
    return any("walrus-quartz" in i["text"] for i in search(home, "unseal the vault", top_k=5)["items"])


@pytest.mark.slow
@pytest.mark.parametrize("whose", ["the same user's", "another user's"])
def test_an_owner_starting_does_not_index_a_recorded_root_that_became_a_link(indexed, env, home, tmp_path, whose):
    _swap_for_a_link(indexed, tmp_path)
    if whose == "another user's":  # a 0700 directory of uid 4242: the owner (root here) could read it, its user could not
        if os.geteuid() != 0:
            pytest.skip("making another user's directory needs root")
        os.chown(tmp_path / "private", 4242, 4242)
        (tmp_path / "private").chmod(0o700)
    proc = start_owner(env, home, tmp_path / "owner.log", "on")
    try:
        assert freshness(home)["trees"] == []  # not watched, so never passed over
        assert not _answers_from_the_link(home)
    finally:
        stop(proc)
    assert "replaced by a symbolic link" in (tmp_path / "owner.log").read_text()


@pytest.mark.slow
def test_a_watched_root_swapped_for_a_link_is_refused_before_the_next_pass(watching, indexed, home, tmp_path):
    moved = _swap_for_a_link(indexed, tmp_path)
    (moved / "auth" / "tokens.py").write_text("def changed():\n    return 1\n")  # the watcher still follows this one
    state = until(lambda: (s := freshness(home)) and s["trees"][0]["error"] and s, HANG_S, "the refused pass")
    assert "replaced by a symbolic link" in state["trees"][0]["error"]
    assert "rag index" in state["trees"][0]["error"]
    assert not _answers_from_the_link(home)


# ----------------------------------------------- issue 52: a job's edits stay in the job ---


def _job(cli, tmp_path: Path, tree: Path, name: str, tenant: str = "acme") -> Path:
    """`moonmind job start` of a job run in `tree` (the documented flow: the job works in the indexed tree)."""
    manifest = tmp_path / f"{name}.json"
    manifest.write_text(json.dumps({"job": {"job_id": f"job-{name}", "run_id": f"run-{name}", "repo": "demo",
                                            "tenant": tenant, "capabilities": {}}}))
    r = cli("job", "start", "--manifest", str(manifest), cwd=tree)
    assert r.code == 0, r.stderr
    assert json.loads(manifest.read_text())["job"]["rag"]["workspace"] == str(tree.resolve())
    return manifest


def _texts(pack: dict[str, Any]) -> str:
    return "\n".join(i["text"] for i in pack["items"])


@pytest.mark.slow
def test_a_jobs_edits_reach_its_own_searches_and_no_other_jobs_or_tenants(watching, indexed, home, cli, tmp_path):
    job_a = _job(cli, tmp_path, indexed, "a")
    job_b = _job(cli, tmp_path, write_tree(tmp_path / "tree-b", {"notes.md": "job B's own clone\n"}), "b")
    (indexed / "auth" / "tokens.py").write_text("def check_bearer_token(header):\n    return 'zebra-orchid'\n")
    (indexed / "db" / "pool.py").unlink()
    as_a = {"filters": {**SCOPE, "run_id": "run-a"}, "top_k": 5}
    until(lambda: "zebra-orchid" in _texts(search(home, "check bearer token", **as_a)), FRESH_WITHIN_S,
          "job A's search to answer with its edit")
    until(lambda: settled(home), HANG_S, "the pass to end")
    assert "ConnectionPool" not in _texts(search(home, "connection pool", **as_a))  # its deletion hides the file for it

    as_b = {"filters": {**SCOPE, "run_id": "run-b"}, "top_k": 5}
    for seen in (search(home, "check bearer token", **as_b), search(home, "check bearer token", top_k=5)):
        assert "zebra-orchid" not in _texts(seen) and "hmac.compare_digest" in _texts(seen)
    assert "ConnectionPool" in _texts(search(home, "connection pool", **as_b))
    other = owner_call(home, "search", {"query": {"query": "check bearer token", "filters": {"repo": "demo",
                                                                                            "tenant": "globex"}}, "record": False})
    assert "zebra-orchid" not in _texts(other)

    # after the job: its edits stay out of the canonical index, even when the tree changes again
    assert cli("job", "finish", "--manifest", str(job_a)).code == 0
    assert cli("job", "finish", "--manifest", str(job_b)).code == 0
    passes = freshness(home)["passes"]
    (indexed / "web" / "render.js").write_text("export function renderTemplate() { return 'after-the-job'; }\n")
    until(lambda: freshness(home)["passes"] > passes and settled(home), HANG_S, "a pass over the changed tree")
    after = search(home, "check bearer token", top_k=5)
    assert "zebra-orchid" not in _texts(after) and "after-the-job" not in _texts(search(home, "render template", top_k=5))


@pytest.mark.slow
def test_rag_index_of_a_tree_a_job_left_takes_in_what_it_holds_now(watching, indexed, home, cli, tmp_path):
    job = _job(cli, tmp_path, indexed, "c")
    (indexed / "auth" / "tokens.py").write_text("def check_bearer_token(header):\n    return 'merged-change'\n")
    assert cli("job", "finish", "--manifest", str(job)).code == 0
    assert "merged-change" not in _texts(search(home, "check bearer token", top_k=5))
    assert cli("rag", "index", str(indexed), "--repo", "demo", "--tenant", "acme").code == 0  # the owner's word
    assert "merged-change" in _texts(search(home, "check bearer token", top_k=5))


def test_the_record_of_job_trees_keeps_running_jobs_and_one_row_per_watched_tree_a_job_left(env, tmp_path):
    from moonmind_worker.owner import freshness as fr
    from moonmind_worker.settings import get_settings

    settings = get_settings()
    settings.moonmind_home.mkdir(parents=True, exist_ok=True)
    watched, scratch = tmp_path / "watched", tmp_path / "scratch"
    watched.mkdir()
    scratch.mkdir()
    fr.indexed(settings, watched, "demo", "acme", 1.0)
    for i in range(5):
        fr.hold_tree(settings, watched, run_id=f"run-{i}", repo="demo", tenant="acme")
        fr.hold_tree(settings, scratch, run_id=f"run-{i}", repo="demo", tenant="acme")
        if i < 4:
            fr.release_trees(settings, f"run-{i}")
    rows = fr.job_trees(settings)
    running = sorted((r["root"], r["run_id"]) for r in rows if r["released_at"] is None)
    assert running == [(str(scratch.resolve()), "run-4"), (str(watched.resolve()), "run-4")]
    assert [r["root"] for r in rows if r["released_at"] is not None] == [str(watched.resolve())]
    fr.indexed(settings, watched, "demo", "acme", 2.0)  # rag index of it: nothing of past jobs holds it back
    assert [r for r in fr.job_trees(settings) if r["released_at"] is not None] == []
