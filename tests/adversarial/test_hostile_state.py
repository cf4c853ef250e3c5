"""Hostile state (issue 32, items 5, 7 and 8): a sync cut between its switch and its drop, frames
the MCP SDK's reader cannot parse, and who may read a fresh store.

Real processes only: the installed `moonmind` runs as a subprocess, crashes are injected with
MOONMIND_FAULT (moonmind_worker/store/faults.py), MCP is spoken as raw lines on its stdin.
"""

from __future__ import annotations

import json
import os
import queue
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from moonmind_worker.store.faults import CRASH_EXIT

from conftest import _SCRUB, FIXTURE_FILES, MOONMIND, write_tree
from http_servers import EmbeddingsServer

COLLECTION = "moonmind__repo"


def _env(home: Path, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    e.update(MOONMIND_HOME=str(home), MOONMIND_OWNER="off")
    e.update(extra)
    return e


def _run(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # a permissive umask, as most logins have: what moonmind writes must be private despite it
    return subprocess.run([MOONMIND, *args], env=env, capture_output=True, text=True, timeout=180, cwd=cwd,
                          preexec_fn=lambda: os.umask(0o022))


# ------------------------------------------------------------------- sync ---


@pytest.fixture
def embeddings():
    server = EmbeddingsServer(repeat=2)
    yield server
    server.close()


def _hosted(server: EmbeddingsServer, model: str) -> dict[str, str]:
    return {"MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-sync", "OPENAI_BASE_URL": server.base_url,
            "MOONMIND_EMBEDDING_MODEL": model}


@pytest.mark.slow
@pytest.mark.parametrize("syncs_before", [0, 1], ids=["first-sync", "second-sync"])
def test_a_sync_crashed_between_the_switch_and_the_drop_has_its_old_data_dropped_by_the_next_run(
    syncs_before, tmp_path, embeddings,
):
    """The first sync leaves the collection's own shard behind, a later one the physical collection it
    switched away from; either way the next run finds it (nothing points at it), drops it and says so."""
    home = tmp_path / "home"
    repo = write_tree(tmp_path / "repo", FIXTURE_FILES)
    assert _run(_env(home), "rag", "index", str(repo), "--repo", "demo", "--tenant", "acme").returncode == 0
    data = home / "qdrant-edge"
    sync = ("rag", "sync-embedding", "--collection", COLLECTION)
    if syncs_before:
        r = _run(_env(home, **_hosted(embeddings, "embed-a")), *sync)
        assert r.returncode == 0, r.stderr
    before = {p.name for p in data.iterdir()}
    hosted = _hosted(embeddings, "embed-b")

    crashed = _run(_env(home, MOONMIND_FAULT="drop_physical#1:before", **hosted), *sync)
    assert crashed.returncode == CRASH_EXIT, crashed.stderr
    old = COLLECTION if not syncs_before else (before - {COLLECTION}).pop()
    leftover = data / COLLECTION / "shard" if not syncs_before else data / old
    assert leftover.exists(), "the crash came before the drop: the old data is still there"

    again = _run(_env(home, **hosted), *sync, "--json")
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    assert result["plan"]["up_to_date"] is True and result["dropped_leftover"] == old
    assert not leftover.exists()
    line = _run(_env(home, **hosted), *sync)
    assert line.returncode == 0 and "nothing to sync" in line.stdout and "interrupted" not in line.stdout
    r = _run(_env(home, **hosted), "rag", "search", "--query", "where are bearer tokens checked", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["items"][0]["source"] == "auth/tokens.py"


@pytest.mark.slow
def test_the_report_of_the_run_that_drops_a_crashed_syncs_old_data_says_so(tmp_path, embeddings):
    home = tmp_path / "home"
    repo = write_tree(tmp_path / "repo", FIXTURE_FILES)
    assert _run(_env(home), "rag", "index", str(repo), "--repo", "demo").returncode == 0
    hosted = _hosted(embeddings, "embed-b")
    sync = ("rag", "sync-embedding", "--collection", COLLECTION)
    assert _run(_env(home, MOONMIND_FAULT="drop_physical#1:before", **hosted), *sync).returncode == CRASH_EXIT
    dry = _run(_env(home, **hosted), *sync, "--dry-run")
    assert dry.returncode == 0 and "interrupted sync left behind" in dry.stdout, dry.stdout
    assert (home / "qdrant-edge" / COLLECTION / "shard").exists(), "a dry run drops nothing"
    again = _run(_env(home, **hosted), *sync)
    assert again.returncode == 0, again.stderr
    assert "nothing to sync" in again.stdout and f"dropped {COLLECTION}" in again.stdout, again.stdout
    assert "interrupted sync left behind" in again.stdout


# -------------------------------------------------------------------- MCP ---


class _Mcp:
    """`moonmind mcp` as a subprocess, spoken to in raw lines after the MCP initialize handshake."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen([MOONMIND, "mcp"], env=env, cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "hostile", "version": "0"}}}))
        assert self.answer()["id"] == 0
        self.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 60) -> dict:
        try:
            return json.loads(self.lines.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(f"no answer within {timeout:g} s") from None

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture
def mcp(tmp_path):
    server = _Mcp(_env(tmp_path / "home", MOONMIND_OWNER="use"), tmp_path)
    yield server
    server.close()


@pytest.mark.slow
def test_an_mcp_call_whose_arguments_hold_a_lone_surrogate_gets_a_tool_error(mcp):
    mcp.send('{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search","arguments":{"query":"\\ud800"}}}')
    answer = mcp.answer(timeout=30)
    assert answer["id"] == 7 and answer["result"]["isError"] is True, answer
    assert answer["result"]["structuredContent"]["error"]["code"] == "invalid_argument"
    mcp.send('{"jsonrpc":"2.0","id":8,"method":"tools/list"}')
    assert mcp.answer()["id"] == 8  # and the server keeps serving


@pytest.mark.slow
def test_a_malformed_mcp_frame_gets_a_json_rpc_parse_error(mcp):
    mcp.send('{"jsonrpc": "2.0", "id": 3, "method": "tools/list"')
    answer = mcp.answer(timeout=30)
    assert answer["id"] is None and answer["error"]["code"] == -32700, answer
    mcp.send('{"jsonrpc":"2.0","id":4,"method":"tools/list"}')
    assert mcp.answer()["id"] == 4  # and the server keeps serving


@pytest.mark.slow
@pytest.mark.parametrize("rid", ['{"a": 1}', "[1]", "1.5", "null", "true"])
def test_a_request_whose_id_is_not_a_string_or_an_integer_gets_an_invalid_request_error(mcp, rid):
    """Issue 52: the SDK took such a request for a notification, and the client waited for good."""
    mcp.send(f'{{"jsonrpc":"2.0","id":{rid},"method":"tools/list"}}')
    answer = mcp.answer(timeout=30)
    assert answer["id"] is None and answer["error"]["code"] == -32600, answer
    assert "string or an integer" in answer["error"]["message"]
    mcp.send('{"jsonrpc":"2.0","id":5,"method":"tools/list"}')
    assert mcp.answer()["id"] == 5  # and the server keeps serving


# ------------------------------------------------------------- file modes ---


def _modes(root: Path) -> dict[str, int]:
    """The permission bits of every directory and file under root, root included, by relative path."""
    out = {".": stat.S_IMODE(root.lstat().st_mode)}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def _index_and_search(tmp_path: Path, **extra: str) -> Path:
    home = tmp_path / "fresh-home"  # does not exist yet: moonmind creates it
    repo = write_tree(tmp_path / "repo", FIXTURE_FILES)
    env = _env(home, MOONMIND_RUN_ID="run-7", **extra)
    r = _run(env, "rag", "index", str(repo), "--repo", "demo")
    assert r.returncode == 0, r.stderr
    r = _run(env, "rag", "search", "--query", "bearer token")
    assert r.returncode == 0, r.stderr
    assert list(home.glob("artifacts/run-7/context-packs/ctx_*.json")), "the search cached no pack"
    return home


@pytest.mark.slow
def test_a_fresh_home_store_and_pack_are_readable_by_their_owner_only(tmp_path):
    home = _index_and_search(tmp_path)
    modes = _modes(home)
    assert {"qdrant-edge/moonmind__repo/meta.json", "qdrant-edge/moonmind__repo/owner.lock",
            "artifacts/run-7/breadcrumbs.jsonl"} <= set(modes)
    assert any(p.startswith("qdrant-edge/moonmind__repo/shard/") for p in modes)
    shared = {p: f"{m:04o}" for p, m in modes.items() if m & 0o077}
    assert not shared, f"readable or writable by group or others: {shared}"
    for p in ("qdrant-edge/moonmind__repo/meta.json", "artifacts/run-7/breadcrumbs.jsonl"):
        assert modes[p] == 0o600
    assert modes["."] == modes["artifacts"] == modes["artifacts/run-7/context-packs"] == 0o700


@pytest.mark.slow
def test_moonmind_umask_opens_a_store_and_its_packs_to_a_group_that_only_reads(tmp_path):
    home = _index_and_search(tmp_path, MOONMIND_UMASK="027")
    modes = _modes(home)
    wrong = {p: f"{m:04o}" for p, m in modes.items() if m & 0o027}
    assert not wrong, f"writable by the group or open to others: {wrong}"
    assert modes["qdrant-edge/moonmind__repo/meta.json"] == 0o640
    pack = next(home.glob("artifacts/run-7/context-packs/ctx_*.json"))
    assert stat.S_IMODE(pack.stat().st_mode) == 0o640
    assert modes["."] == modes["qdrant-edge"] == modes["qdrant-edge/moonmind__repo"] == 0o750
