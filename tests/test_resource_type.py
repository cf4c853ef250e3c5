"""The `resource_type` filter (spec 02 GR-4): code, docs or config, on the CLI, the gateway and MCP.

It is derived from each chunk's stored `language` when the search runs (text/kinds.py), so an
index written before the filter existed answers it as well as a new one.
"""

from __future__ import annotations

import pytest

from moonmind_worker.contracts import RESOURCE_TYPES, parse_query
from moonmind_worker.errors import MoonmindError

from conftest import write_tree

TREE = {
    "app/server.py": "def serve_requests(port):\n    \"\"\"Serve the application on a port.\"\"\"\n    return port\n",
    "web/app.js": "export function serveStatic(dir) {\n  // serve the application's static files\n  return dir;\n}\n",
    "README.md": "# Application\n\nHow to serve the application on a port and configure it.\n",
    "NOTES": "Notes on serving the application in production.\n",
    "pyproject.toml": "[tool.app]\nport = 8080  # the port the application serves on\n",
    "compose.yaml": "services:\n  app:\n    ports: [\"8080:8080\"]  # serve the application\n",
    "Dockerfile": "FROM python:3.12\nCMD [\"python\", \"app/server.py\"]  # serve the application\n",
}
EXPECTED = {
    "code": {"app/server.py", "web/app.js"},
    "docs": {"README.md", "NOTES"},
    "config": {"pyproject.toml", "compose.yaml", "Dockerfile"},
}
QUERY = {"query": "serve the application on a port", "score_threshold": 0.0, "top_k": 20, "filters": {"repo": "kinds"}}


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """TREE indexed once as repo=kinds in a home of this module's own; returns a search function."""
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import EdgeStore

    base = tmp_path_factory.mktemp("kinds")
    settings = Settings(_env_file=None, moonmind_home=base / "home", qdrant_url=None, collection="moonmind__repo")
    embedder, store = StaticEmbedder(), EdgeStore(settings.data_dir, settings.collection)
    index_repository(write_tree(base / "kinds", TREE), repo="kinds", tenant="acme", settings=settings, embedder=embedder,
                     store=store)

    def search(**filters):
        query = parse_query({**QUERY, "filters": {**QUERY["filters"], **filters}})
        return retrieve_context_pack(query, settings=settings, embedder=embedder, store=store)

    search.store = store
    yield search
    store.close()


@pytest.mark.parametrize("kind", RESOURCE_TYPES)
def test_a_resource_type_filter_returns_only_that_kind_of_file(kinds, kind):
    assert {i.source for i in kinds(resource_type=kind).items} == EXPECTED[kind]


def test_without_the_filter_every_kind_is_searched(kinds):
    assert {i.source for i in kinds().items} == set(TREE)


def test_resource_type_narrows_together_with_the_other_filters(kinds):
    assert {i.source for i in kinds(resource_type="code", language="javascript").items} == {"web/app.js"}
    assert kinds(resource_type="docs", language="python").items == []


def test_an_index_that_stores_no_resource_type_answers_the_filter(kinds):
    from moonmind_worker.store import Where

    payloads = [h.payload for h in kinds.store.scroll(Where(), True)]
    assert payloads and all("resource_type" not in p for p in payloads)  # nothing new is stored: old indexes work
    assert kinds(resource_type="config").items


def test_every_language_the_indexer_knows_has_exactly_one_resource_type():
    from moonmind_worker.text.chunking import LANGUAGES, language_of
    from moonmind_worker.text.kinds import LANGUAGES_OF, resource_type

    known = set(LANGUAGES.values()) | {language_of("Dockerfile"), language_of("Makefile"), language_of("LICENSE")}
    for language in known:
        assert [k for k, langs in LANGUAGES_OF.items() if language in langs] == [resource_type(language)], language


@pytest.mark.parametrize("value", ["doc", "Code", "binary"])
def test_an_unknown_resource_type_is_invalid_query_naming_the_kinds(value):
    with pytest.raises(MoonmindError) as err:
        parse_query({"query": "x", "filters": {"resource_type": value}})
    assert err.value.code == "invalid_query" and err.value.exit_code == 2
    assert "code, docs, config" in err.value.message and "resource_type" in err.value.action


def test_the_gateway_takes_resource_type_in_filters_and_refuses_an_unknown_one(prebuilt):
    from fastapi.testclient import TestClient

    from moonmind_worker.contracts import TokenGrant
    from moonmind_worker.gateway.app import create_app
    from moonmind_worker.gateway.auth import add_token, hash_token, new_token
    from moonmind_worker.settings import get_settings

    settings = get_settings()
    token = new_token()
    add_token(settings.tokens_file, TokenGrant(name="w", hash=hash_token(token), repos=["demo"], tenants=["acme"]))
    body = {"query": "caching", "score_threshold": 0.0, "top_k": 20}
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {token}"}) as client:
        docs = client.post("/retrieval/context", json={**body, "filters": {"resource_type": "docs"}})
        bad = client.post("/retrieval/context", json={**body, "filters": {"resource_type": "doc"}})
    assert docs.status_code == 200, docs.text
    assert {i["source"] for i in docs.json()["items"]} == {"docs/guide.md"}
    assert docs.json()["filters"] == {"resource_type": "docs"}
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_query"


@pytest.mark.slow
def test_rag_search_filters_resource_type(cli, prebuilt):
    args = ("rag", "search", "caching", "--score-threshold", "0", "--top-k", "20", "--json", "--filters", "repo=demo")
    code = cli(*args, "resource_type=code")
    assert code.code == 0, code.stderr
    assert {i["source"] for i in code.json()["items"]} == {"auth/tokens.py", "db/pool.py", "web/render.js"}
    bad = cli(*args, "resource_type=binary")
    assert bad.code == 2 and bad.error()["code"] == "invalid_query"


@pytest.mark.slow
def test_the_mcp_search_tool_takes_resource_type(prebuilt, env, tmp_path):
    pytest.importorskip("mcp")
    from test_mcp import call

    (listing, result) = call(env, tmp_path, ("list", None),
                             ("search", {"query": "caching", "score_threshold": 0.0, "filters": {"resource_type": "docs"}}))
    search_tool = next(t for t in listing.tools if t.name == "search")
    assert "resource_type" in search_tool.input_schema["properties"]["filters"]["properties"]
    assert not result.is_error, result.content
    assert {i["source"] for i in result.structured_content["items"]} == {"docs/guide.md"}
