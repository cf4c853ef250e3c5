"""Indexing and settings without surprises (issue 35, items 1 and 2), through the installed CLI.

Settings that cannot mean two things: `QDRANT_URL` is an http(s) URL, `:memory:` or an explicit
local path, and a read never creates a store directory. Safe indexing: `/` and `$HOME` are refused
unless `--force`, a tree with nothing to index says so, the summary's numbers add up, and progress
keeps a line through every phase up to the summary.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest

from conftest import FIXTURE_FILES, MOONMIND, write_tree

# ------------------------------------------------------------------ QDRANT_URL ---


@pytest.mark.parametrize("url", ["localhost:6333", "qdrant:6333", "qdrant-store"])
def test_a_qdrant_url_that_is_neither_a_url_nor_an_explicit_path_is_an_invalid_setting(invoke, tmp_path, url):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = invoke("rag", "search", "token", "--json", extra_env={"QDRANT_URL": url}, cwd=cwd)
    assert r.code == 2, r.stderr
    err = r.error()
    assert err["code"] == "invalid_setting" and "QDRANT_URL" in err["message"] and url in err["message"]
    assert "http://" in err["message"] and ":memory:" in err["message"] and "./" in err["message"]
    assert list(cwd.iterdir()) == []  # no `qdrant:6333/` directory left behind


def test_a_search_in_local_mode_creates_no_directory_where_nothing_is_stored(invoke, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = invoke("rag", "search", "token", "--json", extra_env={"QDRANT_URL": "./qdrant-local"}, cwd=cwd)
    assert r.code == 3 and r.error()["code"] == "collection_missing", r.stderr
    assert list(cwd.iterdir()) == []


@pytest.mark.slow
def test_an_explicit_relative_path_is_local_mode_the_index_creates_it(cli, repo, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    local = {"QDRANT_URL": "./qdrant-local"}
    assert cli("rag", "index", str(repo), "--repo", "demo", extra_env=local, cwd=cwd).code == 0
    assert (cwd / "qdrant-local").is_dir()
    r = cli("rag", "search", "bearer token", "--repo", "demo", "--json", extra_env=local, cwd=cwd)
    assert r.code == 0 and r.json()["items"], r.stderr


def test_a_read_on_an_empty_home_starts_no_owner_and_creates_no_store(invoke, home):
    auto = {"MOONMIND_OWNER": "auto", "MOONMIND_OWNER_IDLE_S": "1"}
    search = invoke("rag", "search", "token", "--json", extra_env=auto)
    assert search.code == 3 and search.error()["code"] == "collection_missing", search.stderr
    stats = invoke("rag", "stats", "--repo", "demo", "--json", extra_env=auto)
    assert stats.code == 3, stats.stderr
    assert list(home.iterdir()) == []  # no qdrant-edge/<collection>/ for a lock or socket, no owner.log


# ------------------------------------------------------------ what is indexed ---


def test_indexing_the_root_of_the_file_system_is_refused_with_the_fix(cli, home):
    r = cli("rag", "index", "/", "--repo", "everything", "--json", timeout=60)
    assert r.code == 2, r.stderr
    err = r.error()
    assert err["code"] == "invalid_argument" and "root of the file system" in err["message"]
    assert "--force" in err["action"]
    assert list(home.iterdir()) == []  # refused before anything was opened


def test_indexing_the_home_directory_is_refused_with_the_fix(invoke, tmp_path):
    user_home = write_tree(tmp_path / "user", {"notes.md": "# Notes\n\nshopping list\n"})
    r = invoke("rag", "index", str(user_home), "--repo", "mine", "--json", extra_env={"HOME": str(user_home)},
               cwd=user_home)
    assert r.code == 2, r.stderr
    err = r.error()
    assert "home directory" in err["message"] and "--force" in err["action"]


@pytest.mark.slow
def test_force_indexes_the_home_directory_anyway(cli, tmp_path):
    user_home = write_tree(tmp_path / "user", {"notes.md": "# Notes\n\nshopping list\n"})
    r = cli("rag", "index", ".", "--repo", "mine", "--force", "--json", extra_env={"HOME": str(user_home)}, cwd=user_home)
    assert r.code == 0, r.stderr
    assert r.json()["files_indexed"] == 1


@pytest.mark.slow
def test_a_tree_with_no_indexable_file_warns_with_what_was_skipped_and_why(cli, tmp_path):
    tree = tmp_path / "assets"
    tree.mkdir()
    (tree / "logo.png").write_bytes(b"\x89PNG\r\n")
    (tree / "blob.dat").write_bytes(b"\x00\x01\x02")
    (tree / "package-lock.json").write_text("{}\n")
    r = cli("rag", "index", str(tree), "--repo", "assets")
    assert r.code == 0, r.stderr
    warning = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1, r.stderr
    assert "no indexable file" in warning[0] and "3 files seen" in warning[0]
    assert "2 lock/vendored/binary type" in warning[0] and "1 binary" in warning[0] and "--json" in warning[0]


@pytest.mark.slow
def test_an_empty_tree_warns_that_there_was_nothing_to_index(cli, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("rag", "index", str(empty), "--repo", "empty", "--json")
    assert r.code == 0 and r.json()["files_seen"] == 0, r.stderr
    assert "warning: no file to index" in r.stderr and str(empty) in r.stderr


SUMMARY = re.compile(r": (\d+) files seen = (\d+) indexed \+ (\d+) unchanged \+ (\d+) skipped \(([^)]*)\)")


@pytest.mark.slow
def test_the_summary_adds_up_in_text_and_json_with_skips_counted_by_reason(cli, repo):
    (repo / "blob.dat").write_bytes(b"\x00bearer\x00")
    (repo / "yarn.lock").write_text("# lock\n")
    (repo / "big.txt").write_text("x" * 5000 + "\n")
    (repo / "empty.py").write_text("")
    # a pattern too costly to apply: a note about an ignore rule, not a file of the tree
    (repo / ".gitignore").write_text("*" + "a*" * 9 + "\n")
    env = {"MOONMIND_MAX_FILE_BYTES": "4000"}
    first = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=env).json()
    files = len(FIXTURE_FILES) + 1  # the fixture and .gitignore
    assert first["skipped_by_reason"] == {"binary": 1, "lock/vendored/binary type": 1, "larger than 4000 bytes": 1,
                                          "no text to index": 1}
    assert first["files_seen"] == files + 4
    assert first["files_seen"] == first["files_indexed"] + first["files_unchanged"] + first["files_skipped"]
    assert first["files_skipped"] == 4 == sum(first["skipped_by_reason"].values())
    assert [s["kind"] for s in first["skipped"] if s["path"] == ".gitignore"] == ["ignore rule"]
    text = cli("rag", "index", str(repo), "--repo", "demo", extra_env=env)
    seen, indexed, unchanged, skipped, reasons = SUMMARY.search(text.stdout).groups()
    assert (int(seen), int(indexed), int(unchanged), int(skipped)) == (files + 4, 0, files, 4), text.stdout
    assert "1 binary" in reasons and "1 no text to index" in reasons


# ----------------------------------------------------------------- progress ---


@pytest.fixture
def slow_embedder(env):
    """A local OpenAI-compatible server answering each batch of 16 after 0.2 s: the run has phases that last."""
    from http_servers import EmbeddingsServer

    server = EmbeddingsServer(repeat=2)
    server.delay_s = 0.2
    yield {**env, "MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-progress",
           "OPENAI_BASE_URL": server.base_url, "MOONMIND_EMBEDDING_MODEL": "local-embed-512",
           "MOONMIND_EMBEDDING_BATCH_SIZE": "16"}
    server.close()


@pytest.mark.slow
def test_progress_keeps_a_line_through_every_phase_and_ends_right_before_the_summary(slow_embedder, tmp_path):
    """The last batch (180 chunks) is embedded after the last file is read, ~2.4 s in which no file finishes:
    a log still gets a line every interval, and the last one comes right before the summary."""
    tree = write_tree(tmp_path / "tree", {f"pkg/mod_{i}.py": f"def handler_{i}(request):\n    return {i}\n" * 100
                                          for i in range(60)})
    interval = 0.2
    started = time.monotonic()
    proc = subprocess.Popen([MOONMIND, "rag", "index", str(tree), "--repo", "big"], cwd=tmp_path, text=True,
                            env={**slow_embedder, "MOONMIND_PROGRESS_INTERVAL_S": str(interval)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stderr), daemon=True)
    reader.start()
    out = proc.stdout.read()
    assert proc.wait(120) == 0, lines
    ended = time.monotonic()
    reader.join(5)
    progress = [(t, line.rstrip("\n")) for t, line in lines]
    assert all(line.startswith("progress: ") for _, line in progress), progress
    assert re.match(r"progress: 60/60 files \(100%\), \d+ chunks, [\d.]+ files/s, \S+ in all$", progress[-1][1]), progress
    assert progress[0][0] - started < 5, progress  # the first line once the process is up (and the interval passed)
    times = [t for t, _ in progress] + [ended]
    gaps = [round(b - a, 2) for a, b in zip(times, times[1:])]
    assert max(gaps) < 1.5, list(zip(gaps, [line for _, line in progress[1:]] + ["(exit)"]))  # never silent for long
    assert any("embedding and writing chunks" in line for _, line in progress), progress
    assert out.startswith("indexed repo=big")
