"""Paging through one ranked list (spec 02 flow 3d) and `total_results` (spec 05's RetrievalResponse).

A pack says how many results matched above the threshold in the searched window (`total_results`),
where its page starts (`offset`) and how to get the next page (`next_cursor`); a request with that
cursor gets the next page of the same list. The pipeline runs in process on the session's prebuilt
index (repo=demo, tenant=acme); the gateway runs in process (TestClient) and as the CLI's transport;
the CLI and MCP tests run the installed commands.
"""

from __future__ import annotations

import json

import pytest

from moonmind_worker.contracts import parse_query
from moonmind_worker.errors import MoonmindError

#: Every chunk of the fixture repository scores above 0.0, so the list is the whole index.
LIST = {"query": "bearer token", "score_threshold": 0.0, "filters": {"repo": "demo"}}


@pytest.fixture
def search(prebuilt):
    from moonmind_worker import runtime
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import get_settings

    def run(**fields):
        settings = get_settings()
        embedder, store = runtime.get_embedder(settings), runtime.get_store(settings)
        return retrieve_context_pack(parse_query(fields), settings=settings, embedder=embedder, store=store)

    return run


def pages(search, **fields) -> list:
    """Every page of one search, following next_cursor to the end."""
    out = [search(**fields)]
    while out[-1].next_cursor:
        out.append(search(**fields, cursor=out[-1].next_cursor))
        assert len(out) < 50
    return out


def test_the_pages_of_a_search_are_its_whole_ranked_list_in_order_without_duplicates_or_gaps(search):
    whole = search(**LIST, top_k=20)
    assert whole.next_cursor is None and len(whole.items) >= 4
    paged = pages(search, **LIST, top_k=2)
    assert len(paged) == -(-len(whole.items) // 2)
    assert [i.chunk_id for p in paged for i in p.items] == [i.chunk_id for i in whole.items]
    assert [p.offset for p in paged] == list(range(0, len(whole.items), 2))


def test_page_two_continues_page_one_even_with_another_page_size(search):
    first = search(**LIST, top_k=1)
    second = search(**LIST, top_k=3, cursor=first.next_cursor)
    whole = search(**LIST, top_k=4)
    assert [i.chunk_id for i in first.items + second.items] == [i.chunk_id for i in whole.items]


def test_total_results_counts_what_matched_above_the_threshold_before_paging(search):
    whole = search(**LIST, top_k=20)
    page = search(**LIST, top_k=1)
    assert page.total_results == whole.total_results == len(whole.items) and len(page.items) == 1
    strict = search(**{**LIST, "score_threshold": whole.items[1].score}, top_k=1)
    assert strict.total_results == sum(i.score >= whole.items[1].score for i in whole.items)
    none = search(**{**LIST, "score_threshold": 1.0})
    assert none.total_results == 0 and none.items == [] and none.next_cursor is None


def test_the_last_page_has_no_next_cursor(search):
    last = pages(search, **LIST, top_k=3)[-1]
    assert last.next_cursor is None and last.offset + len(last.items) == last.total_results


def test_a_page_trimmed_to_the_token_budget_is_continued_from_its_last_item(search, monkeypatch):
    from moonmind_worker.settings import get_settings

    monkeypatch.setenv("MOONMIND_CHUNK_CHARS", "200")  # the budget's pre-check then admits a budget of two small chunks
    get_settings.cache_clear()
    whole = search(**LIST, top_k=20)
    budget = whole.items[0].token_count + whole.items[1].token_count  # two items fit, a third does not
    first = search(**LIST, top_k=4, budgets={"tokens": budget})
    assert first.truncated and len(first.items) < 4
    rest = search(**LIST, top_k=20, cursor=first.next_cursor)
    assert [i.chunk_id for i in first.items + rest.items] == [i.chunk_id for i in whole.items]


def test_a_cursor_sent_with_another_query_or_filters_is_invalid_argument(search):
    cursor = search(**LIST, top_k=1).next_cursor
    for changed in ({"query": "connection pool"}, {"filters": {"repo": "demo", "language": "python"}},
                    {"score_threshold": 0.1}):
        with pytest.raises(MoonmindError) as err:
            search(**{**LIST, **changed}, cursor=cursor)
        assert err.value.code == "invalid_argument" and "another search" in err.value.message
        assert err.value.exit_code == 2 and "next_cursor" in err.value.action


@pytest.mark.parametrize("cursor", ["", "nonsense", "p1.", "p1.!!!!", "p1.WzEsMl0", "p1.WyItMSIsODAsIngiXQ"])
def test_a_malformed_cursor_is_invalid_argument(cursor):
    from moonmind_worker.retrieval import paging  # what the pipeline and the gateway check first

    with pytest.raises(MoonmindError) as err:
        paging.read(parse_query({**LIST, "cursor": cursor}))
    assert err.value.code == "invalid_argument" and "cursor" in err.value.message


def test_the_pack_with_paging_fields_is_still_a_valid_context_pack(search):
    from moonmind_worker.contracts import ContextPack, json_dump

    page = search(**LIST, top_k=1)
    dumped = json_dump(page)
    assert ContextPack.model_validate(dumped).model_dump(mode="json") == dumped
    assert (dumped["total_results"], dumped["offset"]) == (page.total_results, 0) and dumped["next_cursor"]


# ---------------------------------------------------------------- gateway ---


@pytest.fixture
def gateway(prebuilt):
    from fastapi.testclient import TestClient

    from moonmind_worker.contracts import TokenGrant
    from moonmind_worker.gateway.app import create_app
    from moonmind_worker.gateway.auth import add_token, hash_token, new_token
    from moonmind_worker.settings import get_settings

    settings = get_settings()
    token = new_token()
    add_token(settings.tokens_file, TokenGrant(name="w", hash=hash_token(token), repos=["demo"], tenants=["acme"]))
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {token}"}) as client:
        yield client


def test_the_gateways_page_two_continues_its_page_one(gateway):
    whole = gateway.post("/retrieval/context", json={**LIST, "top_k": 20}).json()
    first = gateway.post("/retrieval/context", json={**LIST, "top_k": 2}).json()
    second = gateway.post("/retrieval/context", json={**LIST, "top_k": 2, "cursor": first["next_cursor"]}).json()
    assert first["total_results"] == whole["total_results"] == len(whole["items"])
    assert [i["chunk_id"] for i in first["items"] + second["items"]] == [i["chunk_id"] for i in whole["items"][:4]]
    assert second["offset"] == 2


def test_a_bad_cursor_on_the_gateway_is_a_400_invalid_argument_envelope(gateway):
    cursor = gateway.post("/retrieval/context", json={**LIST, "top_k": 1}).json()["next_cursor"]
    for body in ({**LIST, "cursor": "nonsense"}, {**LIST, "query": "connection pool", "cursor": cursor}):
        r = gateway.post("/retrieval/context", json=body)
        assert r.status_code == 400, r.text
        assert set(r.json()) == {"error"} and set(r.json()["error"]) == {"code", "message", "action"}
        assert r.json()["error"]["code"] == "invalid_argument"


# -------------------------------------------------------------------- CLI ---


@pytest.mark.slow
def test_rag_search_cursor_prints_the_next_page_and_a_bad_one_exits_2(cli, prebuilt):
    args = ("rag", "search", "bearer token", "--filters", "repo=demo", "--score-threshold", "0", "--json")
    first = cli(*args, "--top-k", "2")
    assert first.code == 0, first.stderr
    second = cli(*args, "--top-k", "2", "--cursor", first.json()["next_cursor"])
    assert second.code == 0, second.stderr
    whole = cli(*args, "--top-k", "4").json()
    assert [i["chunk_id"] for i in first.json()["items"] + second.json()["items"]] == [i["chunk_id"] for i in whole["items"]]
    bad = cli(*args, "--cursor", "nonsense")
    assert bad.code == 2 and bad.stdout == "" and bad.error()["code"] == "invalid_argument"


@pytest.mark.slow
def test_the_terminal_view_says_how_to_get_the_next_page(cli, prebuilt):
    r = cli("rag", "search", "bearer token", "--filters", "repo=demo", "--score-threshold", "0", "--top-k", "1", "--short")
    assert r.code == 0, r.stderr
    assert "--cursor p1." in r.stdout.splitlines()[-1]


# -------------------------------------------------------------------- MCP ---


@pytest.mark.slow
def test_the_mcp_search_tool_pages_with_cursor_and_refuses_a_bad_one(prebuilt, env, tmp_path):
    pytest.importorskip("mcp")
    from test_mcp import call, envelope

    args = {"query": LIST["query"], "score_threshold": 0.0, "filters": {"repo": "demo"}, "top_k": 2}
    (first,) = call(env, tmp_path, ("search", args))
    assert not first.is_error, first.content
    cursor = first.structured_content["next_cursor"]
    assert cursor in first.content[-1].text  # an agent reading only the text can page on too
    second, whole, bad = call(env, tmp_path, ("search", {**args, "cursor": cursor}), ("search", {**args, "top_k": 4}),
                              ("search", {**args, "cursor": "nonsense"}))
    ids = [i["chunk_id"] for r in (first, second) for i in r.structured_content["items"]]
    assert ids == [i["chunk_id"] for i in whole.structured_content["items"]]
    assert envelope(bad)["code"] == "invalid_argument"
    assert json.loads(bad.content[0].text)["error"]["action"]
