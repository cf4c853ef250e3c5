"""`moonmind mcp`: the real server process, spoken to over stdio by the official SDK's client.

Nothing is mocked: the installed `moonmind mcp` runs as a subprocess, the SDK client does the
MCP handshake and calls the tools, and the store is the embedded one on disk (the `indexed`
fixture: repo=demo, tenant=acme).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import anyio
import pytest

from conftest import MOONMIND

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters  # noqa: E402

QUERY = "check the bearer token header"


def call(env: dict[str, str], cwd: Path, *calls: tuple[str, dict | None], **client_options) -> list:
    """Start `moonmind mcp`, run `calls` in order (("list", None) lists the tools), return the results.

    `client_options` go to the SDK's Client (e.g. list_roots_callback, mode).
    """

    async def run() -> list:
        params = StdioServerParameters(command=MOONMIND, args=["mcp"], env=env, cwd=str(cwd))
        out = []
        async with Client(params, read_timeout_seconds=120, **client_options) as client:
            for name, args in calls:
                if name == "list":
                    out.append(await client.list_tools())
                else:
                    out.append(await client.call_tool(name, args))
        return out

    return anyio.run(run)


def envelope(result) -> dict:
    assert result.is_error, result
    body = json.loads(result.content[0].text)
    assert body == result.structured_content
    return body["error"]


@pytest.mark.slow
def test_the_server_lists_search_index_overlay_upsert_and_stats(env, tmp_path):
    (listing,) = call(env, tmp_path, ("list", None))
    tools = {t.name: t for t in listing.tools}
    assert set(tools) == {"search", "index", "overlay_upsert", "stats", "related", "symbols"}  # the last two: test_navigation.py
    assert set(tools["search"].input_schema["properties"]) >= {"query", "top_k", "filters", "score_threshold", "budget",
                                                                "max_lines", "locations_only"}
    assert tools["search"].input_schema["required"] == ["query"]
    assert tools["search"].output_schema["title"] == "ContextPack"  # spec 04's contract, for clients that validate


@pytest.mark.slow
def test_search_returns_the_packs_markdown_as_text_and_the_context_pack_as_structured_content(indexed, env, cli, tmp_path):
    (result,) = call(env, tmp_path, ("search", {"query": QUERY, "top_k": 3, "filters": {"repo": "demo"}}))
    assert not result.is_error, result.content
    pack = result.structured_content
    assert result.content[0].text == pack["context_text"]
    assert pack["items"][0]["source"] == "auth/tokens.py"
    assert pack["filters"] == {"repo": "demo"} and len(pack["items"]) <= 3
    from_cli = cli("rag", "search", QUERY, "--top-k", "3", "--filters", "repo=demo", "--json").json()
    assert [i["chunk_hash"] for i in pack["items"]] == [i["chunk_hash"] for i in from_cli["items"]]


@pytest.mark.slow
def test_bad_input_is_a_tool_error_carrying_the_envelope_and_the_server_keeps_serving(indexed, env, tmp_path):
    bad_top_k, unknown_filter, not_a_tool, empty_path, no_run_id, after = call(
        env, tmp_path,
        ("search", {"query": QUERY, "top_k": 99}),
        ("search", {"query": QUERY, "filters": {"owner": "x"}}),
        ("reindex_everything", {}),
        ("index", {"path": "", "repo": "demo"}),
        ("overlay_upsert", {"paths": ["auth/tokens.py"], "root": str(indexed), "repo": "demo"}),
        ("search", {"query": QUERY}),
    )
    err = envelope(bad_top_k)
    assert err["code"] == "invalid_query" and "top_k" in err["message"]
    assert '"top_k"' in err["action"] and "--top-k" not in err["action"]  # it names the argument, not a CLI flag
    assert envelope(unknown_filter)["code"] == "invalid_query"
    assert envelope(not_a_tool)["code"] == "invalid_argument"
    assert envelope(empty_path)["message"] == "Missing argument(s) for index: path."  # never the server's own directory
    assert envelope(no_run_id)["action"] == "Pass run_id, or set MOONMIND_RUN_ID in the server's environment."
    assert not after.is_error and after.structured_content["items"]


@pytest.mark.slow
def test_index_then_search_finds_the_newly_indexed_tree(env, tmp_path):
    tree = tmp_path / "fresh"
    (tree / "geo").mkdir(parents=True)
    (tree / "geo" / "haversine.py").write_text(textwrap.dedent('''
        def great_circle_distance(lat1, lon1, lat2, lon2):
            """Distance in kilometres between two points on Earth (haversine formula)."""
            from math import asin, cos, radians, sin, sqrt
            dlat, dlon = radians(lat2 - lat1), radians(lon2 - lon1)
            a = sin(dlat / 2) ** 2 + cos(radians(lat1)) * cos(radians(lat2)) * sin(dlon / 2) ** 2
            return 2 * 6371 * asin(sqrt(a))
        '''))
    indexed, found = call(
        env, tmp_path,
        ("index", {"path": str(tree), "repo": "geo"}),
        ("search", {"query": "distance between two points on earth", "filters": {"repo": "geo"}}),
    )
    assert not indexed.is_error, indexed.content
    assert indexed.structured_content["files_indexed"] == 1 and indexed.structured_content["tenant"] == "default"
    assert "indexed repo=geo" in indexed.content[0].text
    assert found.structured_content["items"][0]["source"] == "geo/haversine.py"


@pytest.mark.slow
def test_overlay_upsert_makes_an_edit_searchable_for_its_run(indexed, env, tmp_path):
    edited = indexed / "auth" / "sessions.py"
    edited.write_text(
        'def rotate_session_cookie(session):\n    """Issue a fresh session cookie after login."""\n    return session.renew()\n'
    )
    upserted, found = call(
        env, tmp_path,
        ("overlay_upsert", {"paths": ["auth/sessions.py"], "root": str(indexed), "run_id": "run-7", "repo": "demo",
                            "tenant": "acme"}),
        ("search", {"query": "rotate the session cookie after login", "filters": {"run_id": "run-7", "repo": "demo"}}),
    )
    assert not upserted.is_error, upserted.content
    assert upserted.structured_content["run_id"] == "run-7" and "run=run-7" in upserted.content[0].text
    top = found.structured_content["items"][0]
    assert top["source"] == "auth/sessions.py" and top["trust_class"] == "overlay"


@pytest.mark.slow
def test_stats_reports_what_the_index_holds_for_a_repository(indexed, env, tmp_path):
    (result,) = call(env, tmp_path, ("stats", {"repo": "demo"}))
    assert not result.is_error, result.content
    stats = result.structured_content
    assert stats["repo"] == "demo" and stats["chunks"] > 0
    assert "auth/tokens.py" in {f["path"] for f in stats["files"]}
    assert "repo=demo" in result.content[0].text


@pytest.mark.slow
def test_search_beside_a_running_owner_is_answered_by_the_owner(indexed, env, home, tmp_path):
    """With `moonmind serve` holding the embedded store, a one-shot open would find it locked: the answer is the owner's."""
    from test_owner import start_owner, stop

    owner = start_owner(env, home)
    try:
        (result,) = call(env, tmp_path, ("search", {"query": QUERY, "filters": {"repo": "demo"}}))
    finally:
        stop(owner)
    assert not result.is_error, result.content
    assert result.structured_content["items"][0]["source"] == "auth/tokens.py"


def test_no_other_command_imports_the_mcp_sdk(env, tmp_path):
    """The SDK is imported by `moonmind mcp` only: every other command's parser and start-up stay as they were."""
    import subprocess
    import sys

    code = ("import sys; from moonmind_worker.cli.main import build_parser; "
            "[build_parser(a) for a in (['rag', 'search', 'x'], ['mcp'], None)]; "
            "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith(('mcp.', 'mcp_types'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_index_reports_progress_to_a_client_that_asks_for_it(env, repo, tmp_path):
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def run():
        params = StdioServerParameters(command=MOONMIND, args=["mcp"], env=env, cwd=str(tmp_path))
        async with Client(params, read_timeout_seconds=120) as client:
            return await client.call_tool("index", {"path": str(repo), "repo": "demo"}, progress_callback=on_progress)

    result = anyio.run(run)
    assert not result.is_error, result.content
    assert seen and seen[-1][0] == seen[-1][1] == 4  # the fixture's four files, 100% after the last write
    assert "4/4 files" in seen[-1][2]


@pytest.mark.slow
def test_search_goes_through_the_gateway_when_moonmind_retrieval_url_is_set(indexed, env, home, tmp_path):
    """The CLI's transport selection, not a second pipeline: with a gateway configured the pack is the gateway's."""
    from gateway_helpers import add_token, start_gateway

    token = add_token(env, "agent", ["demo"], ["acme"])
    gw = start_gateway(home, env, tmp_path)
    try:
        via = {**env, "MOONMIND_RETRIEVAL_URL": gw.url, "MOONMIND_RETRIEVAL_TOKEN": token, "MOONMIND_RETRIEVAL_FALLBACK": "none"}
        (result,) = call(via, tmp_path, ("search", {"query": QUERY, "filters": {"repo": "demo"}}))
    finally:
        gw.stop()
    assert not result.is_error, result.content
    assert result.structured_content["transport"] == "gateway"
    assert result.structured_content["items"][0]["source"] == "auth/tokens.py"


@pytest.mark.slow
def test_between_calls_the_server_lets_go_of_the_store_but_keeps_its_model(indexed, env):
    from moonmind_worker import mcp_server, runtime
    from moonmind_worker.settings import get_settings

    settings = get_settings()
    result = mcp_server.call("search", {"query": "bearer token", "filters": {"repo": "demo"}})
    assert not result.is_error
    assert runtime.existing_store(settings) is None, "the embedded store's lock goes back to the user's commands"
    embedder = runtime.get_embedder(settings)
    mcp_server.call("search", {"query": "connection pool", "filters": {"repo": "demo"}})
    assert runtime.get_embedder(settings) is embedder, "the model is loaded once, not per call"


# ------------------------------------------------ issue 35: the client's paths ---


def roots_of(*dirs: Path):
    """A client's `list_roots_callback` naming `dirs` as its workspace (MCP roots)."""
    import mcp_types

    async def list_roots(context):
        return mcp_types.ListRootsResult(roots=[mcp_types.Root(uri=d.as_uri(), name=d.name) for d in dirs])

    return list_roots


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "legacy"])  # 2026-07-28 asks in the call's result; older protocols mid-call
def test_a_relative_path_is_read_against_the_clients_mcp_roots_not_the_servers_directory(prebuilt, env, mode):
    """Claude Desktop starts servers in `/`: `auth/sessions.py` is the workspace's file, never a tombstone for /auth/."""
    (prebuilt / "auth" / "sessions.py").write_text(
        'def rotate_session_cookie(session):\n    """Issue a fresh session cookie after login."""\n    return session.renew()\n'
    )
    (upserted,) = call(env, Path("/"),
                       ("overlay_upsert", {"paths": ["auth/sessions.py"], "run_id": "run-r", "repo": "demo", "tenant": "acme"}),
                       list_roots_callback=roots_of(prebuilt), mode=mode)
    assert not upserted.is_error, upserted.content
    assert upserted.structured_content["files"] == ["auth/sessions.py"]
    assert upserted.structured_content["tombstones"] == []


@pytest.mark.slow
def test_without_mcp_roots_a_relative_path_is_read_against_moonmind_root(env, repo, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (indexed,) = call({**env, "MOONMIND_ROOT": str(repo)}, elsewhere, ("index", {"path": ".", "repo": "rooted"}))
    assert not indexed.is_error, indexed.content
    assert indexed.structured_content["files_indexed"] == 4  # the fixture's four files, not the server's directory


@pytest.mark.slow
def test_a_relative_path_without_roots_or_moonmind_root_is_a_tool_error_naming_the_fix(env, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    index, overlay = call(
        env, elsewhere,
        ("index", {"path": ".", "repo": "x"}),
        ("overlay_upsert", {"paths": ["auth/tokens.py"], "run_id": "run-x", "repo": "demo"}),
    )
    for result in (index, overlay):
        err = envelope(result)
        assert err["code"] == "invalid_argument" and "is relative" in err["message"], err
        assert "absolute path" in err["action"] and "MOONMIND_ROOT" in err["action"]


@pytest.mark.slow
@pytest.mark.parametrize("workspace", ["mcp roots", "MOONMIND_ROOT"])
def test_a_path_outside_the_workspace_is_refused_whether_absolute_or_reached_through_a_link(env, repo, tmp_path, workspace):
    """Issue 52: `index /etc` worked from a client with roots; a link inside a root led out of it."""
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "keys.py").write_text("def load_private_keys():\n    return open('/root/.ssh/id_rsa').read()\n")
    (repo / "escape").symlink_to(outside, target_is_directory=True)
    options = {"list_roots_callback": roots_of(repo)} if workspace == "mcp roots" else {}
    server_env = env if workspace == "mcp roots" else {**env, "MOONMIND_ROOT": str(repo)}
    absolute, linked, overlay, inside = call(
        server_env, tmp_path,
        ("index", {"path": str(outside), "repo": "x"}),
        ("index", {"path": "escape", "repo": "x"}),
        ("overlay_upsert", {"paths": [str(outside / "keys.py")], "run_id": "run-o", "repo": "demo"}),
        ("index", {"path": str(repo), "repo": "demo"}),
        **options,
    )
    for result in (absolute, linked, overlay):
        err = envelope(result)
        assert err["code"] == "invalid_argument" and "outside this client's workspace" in err["message"], err
        assert "MCP roots" in err["action"]
    assert "once its links are followed" in envelope(linked)["message"]
    assert not inside.is_error, inside.content
    assert inside.structured_content["files_indexed"] == 4  # the workspace itself, its link not followed


@pytest.mark.slow
def test_overlay_of_a_path_neither_on_disk_nor_indexed_is_an_error_not_a_tombstone(prebuilt, env, tmp_path):
    (prebuilt / "auth" / "tokens.py").unlink()
    scope = {"root": str(prebuilt), "run_id": "run-d", "repo": "demo", "tenant": "acme"}
    typo, deleted = call(
        env, tmp_path,
        ("overlay_upsert", {"paths": ["auth/tokns.py"], **scope}),
        ("overlay_upsert", {"paths": ["auth/tokens.py"], **scope}),
    )
    err = envelope(typo)
    assert err["code"] == "invalid_argument" and "auth/tokns.py" in err["message"] and "not indexed" in err["message"]
    assert not deleted.is_error, deleted.content  # a deleted file the index holds is still hidden for the run
    assert deleted.structured_content["tombstones"] == ["auth/tokens.py"]


@pytest.mark.slow
def test_index_refuses_the_file_system_root_and_the_home_directory_unless_forced(env, tmp_path):
    home = tmp_path / "user"
    (home / "notes").mkdir(parents=True)
    (home / "notes" / "todo.py").write_text("def remember_the_milk():\n    return 'milk'\n")
    root, own_home, forced = call(
        {**env, "HOME": str(home)}, tmp_path,
        ("index", {"path": "/", "repo": "everything"}),
        ("index", {"path": "~", "repo": "home"}),
        ("index", {"path": str(home), "repo": "home", "force": True}),
    )
    for result, where in ((root, "/"), (own_home, str(home.resolve()))):
        err = envelope(result)
        assert err["code"] == "invalid_argument" and f"Refusing to index {where}:" in err["message"], err
        assert "force: true" in err["action"]
    assert not forced.is_error, forced.content
    assert forced.structured_content["files_indexed"] == 1
