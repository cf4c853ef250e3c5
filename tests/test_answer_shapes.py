"""Answers sized for an agent's budget (issue 38, item 3): `max_lines` and `locations_only`.

The real pipeline on the session's prebuilt index (repo=demo, tenant=acme), the gateway app in
process, and the installed CLI and MCP server as subprocesses (marked slow).
"""

from __future__ import annotations

import json

import pytest

from moonmind_worker.contracts import ContextPack, json_dump, parse_query
from moonmind_worker.errors import MoonmindError
from moonmind_worker.retrieval.context_pack import parse_context_text

QUERY = "where are bearer tokens checked"


def search(**fields):
    from moonmind_worker import runtime
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import get_settings

    settings = get_settings()
    request = {"query": QUERY, "score_threshold": 0.0, **fields}
    return retrieve_context_pack(parse_query(request, fields="json"), settings=settings,
                                 embedder=runtime.get_embedder(settings), store=runtime.get_store(settings))


def assert_valid(pack: ContextPack) -> None:
    """Valid against the ContextPack contract: validating its dump changes nothing, and its markdown reads back."""
    assert ContextPack.model_validate(pack.model_dump()).model_dump() == pack.model_dump()
    assert json_dump(pack) == pack.model_dump(mode="json")
    parsed = parse_context_text(pack.context_text)
    assert [p.citation for p in parsed] == [i.citation for i in pack.items]
    assert pack.usage.tokens == sum(i.token_count for i in pack.items)


def test_max_lines_cuts_each_hit_to_n_lines_that_are_exactly_the_files_lines(prebuilt):
    pack = search(max_lines=3, top_k=10)
    assert pack.items and pack.max_lines == 3
    assert_valid(pack)
    for item in pack.items:
        text = (prebuilt / item.source).read_text()
        assert item.line_end - item.line_start + 1 <= 3
        assert item.text == text[item.offset_start:item.offset_end]
        assert item.text == "".join(text.splitlines(keepends=True)[item.line_start - 1:item.line_end])
        # the stored chunk it was cut from is still named, to read the rest of it
        assert item.payload["line_start"] <= item.line_start and item.line_end <= item.payload["line_end"]


def test_max_lines_keeps_the_lines_that_hold_the_querys_words(prebuilt):
    full = search(query="hmac compare_digest", top_k=1).items[0]
    cut = search(query="hmac compare_digest", top_k=1, max_lines=2).items[0]
    assert full.source == cut.source == "auth/tokens.py"
    assert "compare_digest" in cut.text and cut.line_start > full.line_start


def test_max_lines_keeps_the_first_n_lines_of_a_hit_without_the_querys_words(prebuilt):
    from moonmind_worker.retrieval.shaping import cut_to_lines

    item = search(top_k=1).items[0]
    cut = cut_to_lines(item, 2, frozenset())
    assert cut.line_start == item.line_start and cut.text == "".join(item.text.splitlines(keepends=True)[:2])


def test_locations_only_keeps_citation_score_and_symbol_and_drops_the_text(prebuilt):
    full, bare = search(top_k=10), search(top_k=10, locations_only=True)
    assert bare.locations_only and bare.usage.tokens == 0
    assert_valid(bare)
    assert [(i.citation, i.score, i.section_title, i.chunk_hash) for i in bare.items] == \
           [(i.citation, i.score, i.section_title, i.chunk_hash) for i in full.items]
    assert all(i.text == "" and i.token_count == 0 for i in bare.items)
    assert "```" not in bare.context_text and len(bare.context_text) < len(full.context_text)


def test_a_token_budget_counts_the_shaped_items_not_whole_chunks(prebuilt):
    with pytest.raises(MoonmindError) as refused:
        search(budgets={"tokens": 60})
    assert refused.value.code == "token_budget_exceeded"
    pack = search(budgets={"tokens": 60}, max_lines=2)
    assert pack.items and pack.usage.tokens <= 60


@pytest.mark.parametrize("fields, named", [
    ({"max_lines": 0}, '"max_lines" as an integer >= 1'),
    ({"max_lines": 3, "locations_only": True}, '"locations_only": true or "max_lines", not both'),
    ({"locations_only": "yes"}, "locations_only"),
])
def test_a_bad_shape_is_an_invalid_query_naming_the_fix(fields, named):
    with pytest.raises(MoonmindError) as err:
        parse_query({"query": QUERY, **fields}, fields="json")
    assert err.value.code == "invalid_query" and named in err.value.message + " " + err.value.action


@pytest.fixture
def gateway(prebuilt):
    from gateway_helpers import scoped_client

    with scoped_client(["demo"], ["acme"]) as (client, token):
        yield client, {"Authorization": f"Bearer {token}"}


def test_the_gateway_shapes_the_pack_it_returns(gateway):
    client, auth = gateway
    bare = client.post("/retrieval/context", json={"query": QUERY, "locations_only": True}, headers=auth)
    assert bare.status_code == 200, bare.text
    assert bare.json()["locations_only"] and all(i["text"] == "" for i in bare.json()["items"])
    cut = client.post("/retrieval/context", json={"query": QUERY, "max_lines": 2}, headers=auth)
    assert cut.status_code == 200 and all(i["line_end"] - i["line_start"] < 2 for i in cut.json()["items"])
    ContextPack.model_validate(cut.json())


def test_the_gateway_answers_both_shapes_at_once_with_a_400_envelope(gateway):
    client, auth = gateway
    r = client.post("/retrieval/context", json={"query": QUERY, "locations_only": True, "max_lines": 2}, headers=auth)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_query"
    assert set(r.json()["error"]) == {"code", "message", "action"}


@pytest.mark.slow
def test_rag_search_locations_only_prints_citations_without_text(cli, indexed):
    r = cli("rag", "search", QUERY, "--locations-only", "--full")
    assert r.code == 0, r.stderr
    items = parse_context_text(r.stdout)
    assert items and items[0].citation.startswith("auth/tokens.py#L") and all(i.body == "" for i in items)


@pytest.mark.slow
def test_rag_search_max_lines_gives_a_pack_of_short_hits(cli, indexed):
    r = cli("rag", "search", QUERY, "--max-lines", "2", "--json")
    assert r.code == 0, r.stderr
    pack = r.json()
    assert pack["max_lines"] == 2 and all(i["text"].count("\n") <= 2 for i in pack["items"])


@pytest.mark.slow
def test_rag_search_with_a_bad_max_lines_exits_2_with_the_envelope(cli, indexed):
    r = cli("rag", "search", QUERY, "--max-lines", "0", "--json")
    assert r.code == 2 and r.stdout == ""
    assert r.error()["code"] == "invalid_query" and "--max-lines" in r.error()["action"]


@pytest.mark.slow
def test_the_mcp_search_tool_takes_both_shapes(indexed, env, tmp_path):
    from test_mcp import call, envelope

    listing, bare, both = call(env, tmp_path, ("list", None),
                               ("search", {"query": QUERY, "locations_only": True}),
                               ("search", {"query": QUERY, "locations_only": True, "max_lines": 2}))
    schema = next(t for t in listing.tools if t.name == "search").input_schema["properties"]
    assert schema["max_lines"]["type"] == "integer" and schema["locations_only"]["type"] == "boolean"
    assert not bare.is_error and all(i["text"] == "" for i in bare.structured_content["items"])
    assert json.loads(json.dumps(bare.structured_content))["locations_only"] is True
    assert envelope(both)["code"] == "invalid_query"
