"""The retrieval loop end to end through the real CLI (issue: foundation)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def indexed(prebuilt):
    """The fixture repository indexed as repo=demo, tenant=acme: a copy of the session's index (these
    tests search it; how `rag index` builds it is test_indexing.py's subject), not a `rag index` each."""
    return prebuilt


SPEC04_ITEM_FIELDS = {"score", "source", "offset_start", "offset_end", "trust_class", "chunk_hash", "payload"}
SPEC05_FIELDS = {
    "chunk_id", "section_title", "text", "content_hash", "chunk_sequence", "total_chunks", "indexed_at",
    "token_count", "model_version", "score", "source",
}


def test_search_prints_markdown_context_with_citations(invoke, prebuilt):
    r = invoke("rag", "search", "--query", "where are bearer tokens checked", "--filters", "repo=demo")
    assert r.code == 0, r.stderr
    assert r.stdout.startswith("### Retrieved Context")
    assert "auth/tokens.py#L" in r.stdout
    assert "check_bearer_token" in r.stdout


@pytest.mark.slow
def test_json_output_is_the_full_context_pack(cli, indexed):
    r = cli("rag", "search", "--query", "bearer token", "--filters", "repo=demo", "--json")
    assert r.code == 0, r.stderr
    pack = r.json()
    for key in ("context_text", "items", "filters", "budgets", "usage", "transport", "retrieved_at", "telemetry_id"):
        assert key in pack
    assert pack["transport"] == "direct"
    assert pack["telemetry_id"].startswith("ctx_")
    assert pack["filters"] == {"repo": "demo"}
    item = pack["items"][0]
    assert SPEC04_ITEM_FIELDS <= set(item) and SPEC05_FIELDS <= set(item)
    assert item["source"] == "auth/tokens.py"
    assert item["chunk_hash"].startswith("sha256:")
    assert 0.0 <= item["score"] <= 1.0


@pytest.mark.slow
def test_item_text_is_the_exact_file_slice(cli, indexed):
    pack = cli("rag", "search", "--query", "connection pool", "--filters", "repo=demo", "--json").json()
    for item in pack["items"]:
        source = (indexed / item["source"]).read_text()
        assert source[item["offset_start"] : item["offset_end"]] == item["text"]
        lines = source.splitlines()
        assert item["text"].splitlines()[0] == lines[item["line_start"] - 1]


@pytest.mark.slow
def test_output_file_receives_the_pack_and_stdout_the_markdown(cli, indexed, tmp_path):
    out = tmp_path / "pack.json"
    r = cli("rag", "search", "--query", "bearer token", "--filters", "repo=demo", "--output-file", str(out))
    assert r.code == 0, r.stderr
    assert r.stdout.startswith("### Retrieved Context")
    assert json.loads(out.read_text())["context_text"] == r.stdout


@pytest.mark.slow
def test_same_query_twice_gives_identical_items(cli, indexed):
    a = cli("rag", "search", "--query", "database connections", "--filters", "repo=demo", "--json").json()
    b = cli("rag", "search", "--query", "database connections", "--filters", "repo=demo", "--json").json()
    assert a["items"] == b["items"]
    assert a["context_text"] == b["context_text"]


@pytest.mark.slow
def test_empty_query_is_refused_with_usage_exit_code(cli, indexed):
    r = cli("rag", "search", "--query", "   ", "--json")
    assert r.code == 2
    assert r.stdout == ""
    assert r.error()["code"] == "invalid_query"
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_unknown_filter_key_is_refused(cli, indexed):
    r = cli("rag", "search", "--query", "token", "--filters", "colour=blue")
    assert r.code == 2 and r.stdout == ""
    assert "unknown filter key 'colour'" in r.stderr


def test_search_before_index_says_to_run_index(invoke):
    r = invoke("rag", "search", "--query", "anything")
    assert r.code == 3 and r.stdout == ""
    assert "moonmind rag index" in r.stderr
