"""`rag related` and `rag symbols` (issue 38, item 2): on both engines in process, then the real CLI, gateway and MCP.

The fixture (tests/fixtures/navigation) has known answers in three languages: each of
auth/tokens.py (Python), server/router.go (Go) and web/retry.ts (TypeScript) has a near copy of
one of its functions in another file (auth/legacy.py, server/mux.go, web/backoff.ts), which
`related` must put first; `symbols` must find each definition with its kind, lines and signature.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from moonmind_worker.contracts import ContextPack, RetrievalQuery, SymbolsResult
from moonmind_worker.errors import MoonmindError

FIXTURE = Path(__file__).parent / "fixtures" / "navigation"

#: location -> the file its nearest neighbour must be
RELATED = {
    "auth/tokens.py#L6-L11": "auth/legacy.py",
    "server/router.go#L16": "server/mux.go",
    "web/retry.ts#L14-L18": "web/backoff.ts",
}
#: name -> (path, kind, line_start, line_end, signature) of its first place
SYMBOLS = {
    "verify_token": ("auth/tokens.py", "function", 6, 11, "def verify_token(header: str, secret: str) -> bool:"),
    "TokenStore.revoke": ("auth/tokens.py", "method", 15, 16, "def revoke(self, token: str) -> None:"),
    "Router.Handle": ("server/router.go", "method", 16, 23,
                      "func (r *Router) Handle(path string, w http.ResponseWriter, req *http.Request) {"),
    "Router": ("server/router.go", "struct", 6, 8, "type Router struct {"),
    "computeBackoff": ("web/retry.ts", "function", 14, 18,
                       "export function computeBackoff(attempt: number, baseDelayMs: number): number {"),
    "RetryPolicy": ("web/retry.ts", "class", 6, 12, "export class RetryPolicy {"),
}


def _settings(home: Path, **kw):
    from moonmind_worker.settings import Settings

    return Settings(_env_file=None, moonmind_home=home, **kw)


def _index(store, settings, repo: str = "nav", tenant: str = "acme") -> None:
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing.indexer import index_repository

    index_repository(FIXTURE, repo=repo, tenant=tenant, settings=settings, embedder=StaticEmbedder(), store=store)


@pytest.fixture(scope="module", params=["edge", "local"])
def engine(request, tmp_path_factory):
    """The fixture indexed once per engine (repo=nav, tenant=acme; and repo=other, tenant=beta for scope tests)."""
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.store import EdgeStore
    from moonmind_worker.store.remote import QdrantClientStore

    home = tmp_path_factory.mktemp(request.param)
    settings = _settings(home, QDRANT_URL=":memory:" if request.param == "local" else None)
    store = EdgeStore(settings.data_dir, settings.collection) if request.param == "edge" else QdrantClientStore(settings, "nav")
    _index(store, settings)
    _index(store, settings, repo="other", tenant="beta")
    yield settings, StaticEmbedder(), store
    store.close()


def _query(text: str, **filters) -> RetrievalQuery:
    return RetrievalQuery(query=text, filters=filters)


def _related(engine, text: str, scope=None, **filters) -> dict:
    from moonmind_worker.contracts import json_dump
    from moonmind_worker.retrieval.related import related_pack

    settings, embedder, store = engine
    return json_dump(related_pack(_query(text, **filters), settings=settings, embedder=embedder, store=store, scope=scope))


def _symbols(engine, name: str, scope=None, top_k: int | None = None, **filters) -> dict:
    from moonmind_worker.retrieval.symbols import find_symbols

    settings, _, store = engine
    query = RetrievalQuery(query=name, filters=filters, top_k=top_k)
    return find_symbols(query, settings=settings, store=store, scope=scope)


# ------------------------------------------------------------------ chunker ---


def test_the_chunker_records_each_definition_with_its_kind_lines_and_signature():
    from moonmind_worker.text.chunking import chunk_text

    found = {}
    for path in ("auth/tokens.py", "server/router.go", "web/retry.ts"):
        for c in chunk_text((FIXTURE / path).read_text(), path):
            for d in c.definitions:
                assert c.line_start <= d.start <= d.end <= c.line_end
                found[d.name] = (path, d.kind, d.start, d.end, d.signature)
    for name, want in SYMBOLS.items():
        assert found[name] == want, name
    assert found["NewRouter"][1] == "function" and found["RetryOptions"][1] == "interface"


def test_payload_symbol_keys_are_lower_cased_qualified_and_short_names():
    from moonmind_worker.indexing.points import symbol_keys
    from moonmind_worker.text.code_chunks import Definition

    defs = [Definition("Router.Handle", "method", 1, 2, ""), Definition("res.type, res.contentType", "function", 3, 3, "")]
    assert symbol_keys(defs) == ["contenttype", "handle", "res.contenttype", "res.type", "router.handle", "type"]


# ----------------------------------------------------------- both engines ---


@pytest.mark.parametrize("location,expected", sorted(RELATED.items()))
def test_related_puts_the_near_copy_first_and_leaves_the_location_out(engine, location, expected):
    pack = _related(engine, location, repo="nav")
    ContextPack.model_validate(pack)  # spec 04's contract, like a search's pack
    sources = [i["source"] for i in pack["items"]]
    assert sources[0] == expected, sources
    assert location.split("#")[0] not in sources  # the location (and its file's overlapping chunks) left out
    assert pack["query"].startswith(location.split("#")[0]) and pack["filters"] == {"repo": "nav"}
    assert all(0 <= i["score"] <= 1 for i in pack["items"])
    assert pack["context_text"].count("auth/") + pack["context_text"].count("server/") + pack["context_text"].count("web/")


def test_related_takes_a_chunk_id_and_a_whole_file(engine):
    by_id = _related(engine, "web/retry.ts#0", repo="nav")
    assert by_id["items"][0]["source"] == "web/backoff.ts"
    whole = _related(engine, "./server/router.go", repo="nav")
    assert whole["items"][0]["source"] == "server/mux.go"


def test_related_results_obey_the_filters_and_the_anchor_the_scope(engine):
    from moonmind_worker.store.scopes import Scope

    pack = _related(engine, "auth/tokens.py#L6", repo="nav", language="go")
    assert pack["items"] and {i["source"].split("/")[0] for i in pack["items"]} == {"server"}
    assert {i["payload"]["repo"] for i in _related(engine, "auth/tokens.py#L6", repo="nav")["items"]} == {"nav"}
    # the same path in another tenant's repository is not reachable from outside its scope
    with pytest.raises(MoonmindError) as err:
        _related(engine, "auth/tokens.py#L6", scope=Scope(repos=("nav",), tenants=("acme",)), repo="other")
    assert err.value.code == "not_found"
    # a path held by two repositories, no repo named: ambiguous, say which
    with pytest.raises(MoonmindError) as err:
        _related(engine, "auth/tokens.py#L6")
    assert err.value.code == "invalid_argument" and "nav" in err.value.message and "other" in err.value.message


@pytest.mark.parametrize("location,code", [
    ("auth/nope.py#L1-L5", "not_found"), ("auth/tokens.py#L900", "not_found"), ("auth/tokens.py#40", "not_found"),
    ("auth/tokens.py#L9-L3", "invalid_argument"), ("/abs/path.py", "invalid_argument"), ("a#b#c", "invalid_argument"),
])
def test_an_unknown_or_malformed_location_is_a_clear_error(engine, location, code):
    with pytest.raises(MoonmindError) as err:
        _related(engine, location, repo="nav")
    assert err.value.code == code and err.value.action


@pytest.mark.parametrize("name", sorted(SYMBOLS))
def test_symbols_finds_each_definition_first_with_kind_lines_and_signature(engine, name):
    result = _symbols(engine, name, repo="nav")
    SymbolsResult.model_validate(result)
    first = result["symbols"][0]
    assert (first["path"], first["kind"], first["line_start"], first["line_end"], first["signature"]) == SYMBOLS[name]
    assert first["match"] == "exact" and first["citation"] == f"{first['path']}#L{first['line_start']}-L{first['line_end']}"
    assert not first["guessed"]


def test_symbols_ranks_exact_then_qualified_then_partial_then_mentions(engine):
    places = _symbols(engine, "verify_token", repo="nav")["symbols"]
    assert [(p["path"], p["match"]) for p in places] == [("auth/tokens.py", "exact"), ("app/main.py", "mention")]
    assert places[1]["kind"] == "mention" and "verify_token" in places[1]["signature"]
    handle = _symbols(engine, "handle", repo="nav")["symbols"]  # any case, a member's short name
    assert (handle[0]["name"], handle[0]["match"]) == ("Router.Handle", "qualified")
    assert [p["match"] for p in handle] == sorted((p["match"] for p in handle),
                                                  key=["exact", "qualified", "partial", "mention"].index)
    retry = _symbols(engine, "RetryPolicy", repo="nav")["symbols"]
    assert retry[0]["match"] == "exact" and {p["match"] for p in retry[1:]} <= {"partial", "mention"}


def test_symbols_obeys_the_filters_and_the_scope(engine):
    from moonmind_worker.store.scopes import Scope

    assert {p["path"] for p in _symbols(engine, "verify_token", language="python", top_k=20)["symbols"]} == {
        "auth/tokens.py", "app/main.py"}
    with pytest.raises(MoonmindError) as err:
        _symbols(engine, "verify_token", language="go")  # defined and mentioned in Python only
    assert err.value.code == "not_found" and "language=go" in err.value.message
    both = _symbols(engine, "verify_token", top_k=20)["symbols"]
    assert {(p["repo"], p["tenant"]) for p in both} == {("nav", "acme"), ("other", "beta")}
    scoped = _symbols(engine, "verify_token", scope=Scope(repos=("nav",), tenants=("acme",)), top_k=20)["symbols"]
    assert {p["repo"] for p in scoped} == {"nav"}
    assert {p["tenant"] for p in _symbols(engine, "verify_token", tenant="beta", top_k=20)["symbols"]} == {"beta"}


def test_an_unknown_name_is_not_found(engine):
    with pytest.raises(MoonmindError) as err:
        _symbols(engine, "no_such_symbol_anywhere", repo="nav")
    assert err.value.code == "not_found" and "no_such_symbol_anywhere" in err.value.message


def test_an_index_without_symbol_metadata_still_answers_and_says_so(tmp_path):
    """Chunks written before `symbols`/`definitions` existed: definitions read from their title and text."""
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing.indexer import build_points, content_hash
    from moonmind_worker.retrieval.symbols import find_symbols
    from moonmind_worker.store import EdgeStore
    from moonmind_worker.text.chunking import chunk_text

    settings = _settings(tmp_path)
    store = EdgeStore(settings.data_dir, settings.collection)
    embedder = StaticEmbedder()
    store.create(embedder.dimensions, embedder.name, 1)
    docs = [(p, content_hash(t), chunk_text(t, p)) for p, t in
            ((str(f.relative_to(FIXTURE)), f.read_text()) for f in sorted(FIXTURE.rglob("*.*")))]
    points = build_points(embedder, docs, repo="nav", tenant="acme")
    for p in points:
        del p.payload["symbols"], p.payload["definitions"]
    store.upsert(points)
    try:
        result = find_symbols(RetrievalQuery(query="verify_token"), settings=settings, store=store)
    finally:
        store.close()
    first = result["symbols"][0]
    assert (first["path"], first["line_start"], first["guessed"], first["kind"]) == ("auth/tokens.py", 6, True, "definition")
    assert first["signature"].startswith("def verify_token(")
    assert any("before symbol metadata" in n and "rag index" in n for n in result["notes"])


def test_inside_a_job_related_and_symbols_cannot_widen_the_tenant():
    from moonmind_worker.job_scope import JobScope, confine

    job = JobScope("job-1", tenant="acme", run_id="run-1")
    for op in ("related", "symbols"):
        filled = confine(op, {"query": {"query": "x", "filters": {}}}, job)
        assert filled["query"]["filters"] == {"tenant": "acme"}
        with pytest.raises(MoonmindError) as err:
            confine(op, {"query": {"query": "x", "filters": {"tenant": "beta"}}}, job)
        assert err.value.code == "forbidden"


# ------------------------------------------------- gateway app in process ---


@pytest.fixture
def nav_home(env, home: Path, tmp_path: Path, _nav_template: Path) -> Path:
    """The fixture indexed (nav/acme and other/beta) in this test's MOONMIND_HOME (a copy of one session build)."""
    shutil.copytree(_nav_template / "qdrant-edge", home / "qdrant-edge", ignore=shutil.ignore_patterns("owner.lock"))
    return home


@pytest.fixture(scope="session")
def _nav_template(tmp_path_factory) -> Path:
    from moonmind_worker.store import EdgeStore

    home = tmp_path_factory.mktemp("navhome")
    settings = _settings(home, collection="moonmind__repo")
    store = EdgeStore(settings.data_dir, settings.collection)
    _index(store, settings)
    _index(store, settings, repo="other", tenant="beta")
    store.close()
    return home


@pytest.fixture
def gateway(nav_home):
    from gateway_helpers import scoped_client

    with scoped_client(["nav"], ["acme"]) as (client, token):
        yield client, {"Authorization": f"Bearer {token}"}


def test_the_gateway_serves_related_and_symbols_inside_the_tokens_scope(gateway):
    client, auth = gateway
    r = client.post("/retrieval/related", json={"query": "web/retry.ts#L14-L18"}, headers=auth)
    assert r.status_code == 200, r.text
    pack = ContextPack.model_validate(r.json())
    assert pack.transport == "gateway" and pack.items[0].source == "web/backoff.ts"
    assert {i.payload["repo"] for i in pack.items} == {"nav"}  # the token's repository only, though `other` holds copies
    r = client.post("/retrieval/symbols", json={"query": "Router.Handle"}, headers=auth)
    assert r.status_code == 200, r.text
    result = SymbolsResult.model_validate(r.json())
    assert result.symbols[0].path == "server/router.go" and {s.repo for s in result.symbols} == {"nav"}


def test_the_gateway_refuses_without_a_token_outside_the_scope_and_for_unknown_places(gateway):
    client, auth = gateway
    for path in ("/retrieval/related", "/retrieval/symbols"):
        assert client.post(path, json={"query": "x.py#L1"}).status_code == 401
        outside = client.post(path, json={"query": "auth/tokens.py#L6", "filters": {"repo": "other"}}, headers=auth)
        assert outside.status_code == 403 and set(outside.json()["error"]) == {"code", "message", "action"}
    missing = client.post("/retrieval/related", json={"query": "nope/none.py#L1"}, headers=auth)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    unknown = client.post("/retrieval/symbols", json={"query": "no_such_symbol_anywhere"}, headers=auth)
    assert unknown.status_code == 404 and set(unknown.json()["error"]) == {"code", "message", "action"}
    bad = client.post("/retrieval/related", json={"query": "a#b#c"}, headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_argument"
    assert "/retrieval/related" in client.get("/openapi.json").json()["paths"]


# ------------------------------------------------------- real processes ---


@pytest.mark.slow
def test_the_cli_prints_related_as_a_pack_and_symbols_as_lines_and_json(nav_home, cli):
    r = cli("rag", "related", "auth/tokens.py#L6-L11", "--repo", "nav", "--json")
    assert r.code == 0, r.stderr
    pack = ContextPack.model_validate(r.json())
    assert pack.items[0].source == "auth/legacy.py" and "auth/tokens.py" not in {i.source for i in pack.items}
    full = cli("rag", "related", "server/router.go#L16", "--repo", "nav", "--top-k", "2")  # piped: the context block
    assert full.code == 0 and full.stdout.startswith("### Retrieved Context")
    assert "server/mux.go#L" in full.stdout and "server/router.go" not in full.stdout
    r = cli("rag", "symbols", "computeBackoff", "--repo", "nav")
    assert r.code == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("web/retry.ts#L14-L18  function  computeBackoff  export function computeBackoff(")
    result = SymbolsResult.model_validate(cli("rag", "symbols", "Router", "--filters", "repo=nav", "language=go", "--json").json())
    assert (result.symbols[0].path, result.symbols[0].kind) == ("server/router.go", "struct")


@pytest.mark.slow
def test_the_cli_reports_an_unknown_place_as_an_envelope_and_exit_2_without_a_traceback(nav_home, cli):
    for args in (("related", "auth/nope.py#L1-L3", "--repo", "nav"), ("symbols", "no_such_symbol_anywhere", "--repo", "nav"),
                 ("related", "a#b#c")):
        r = cli("rag", *args, "--json")
        assert r.code == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == ""
        err = r.error()
        assert set(err) == {"code", "message", "action"} and err["code"] in ("not_found", "invalid_argument")
    plain = cli("rag", "symbols", "no_such_symbol_anywhere", "--repo", "nav")
    assert plain.code == 2 and "error[not_found]" in plain.stderr and "action:" in plain.stderr


@pytest.mark.slow
def test_the_cli_goes_through_the_gateway_when_it_is_configured(nav_home, env, home, tmp_path, cli):
    from gateway_helpers import add_token, start_gateway

    token = add_token(env, "agent", ["nav"], ["acme"])
    gw = start_gateway(home, env, tmp_path)
    try:
        via = {"MOONMIND_RETRIEVAL_URL": gw.url, "MOONMIND_RETRIEVAL_TOKEN": token, "MOONMIND_RETRIEVAL_FALLBACK": "none"}
        pack = cli("rag", "related", "web/retry.ts#L14-L18", "--json", extra_env=via)
        symbols = cli("rag", "symbols", "verify_token", "--json", extra_env=via)
        refused = cli("rag", "symbols", "verify_token", "--repo", "other", "--json", extra_env=via)
    finally:
        gw.stop()
    assert pack.code == 0, pack.stderr
    assert pack.json()["transport"] == "gateway" and pack.json()["items"][0]["source"] == "web/backoff.ts"
    assert symbols.code == 0 and symbols.json()["symbols"][0]["path"] == "auth/tokens.py"
    assert refused.code != 0 and refused.error()["code"] == "forbidden"


@pytest.mark.slow
def test_mcp_lists_related_and_symbols_with_schemas_and_both_work(nav_home, env, tmp_path):
    from test_mcp import call, envelope

    listing, related, symbols, unknown = call(
        env, tmp_path, ("list", None),
        ("related", {"location": "server/router.go#L16", "filters": {"repo": "nav"}}),
        ("symbols", {"name": "verify_token", "filters": {"repo": "nav"}}),
        ("symbols", {"name": "no_such_symbol_anywhere"}),
    )
    tools = {t.name: t for t in listing.tools}
    assert tools["related"].input_schema["required"] == ["location"]
    assert tools["symbols"].input_schema["required"] == ["name"]
    assert tools["related"].output_schema["title"] == "ContextPack"
    assert tools["symbols"].output_schema["title"] == "SymbolsResult"
    assert not related.is_error, related.content
    assert related.structured_content["items"][0]["source"] == "server/mux.go"
    assert related.content[0].text == related.structured_content["context_text"]
    assert not symbols.is_error, symbols.content
    assert symbols.content[0].text.splitlines()[0].startswith("auth/tokens.py#L6-L11  function  verify_token")
    assert json.dumps(symbols.structured_content["symbols"][0]["signature"]).startswith('"def verify_token(')
    assert envelope(unknown)["code"] == "not_found"


@pytest.mark.slow
def test_a_warm_owner_answers_related_and_symbols_as_one_shot_does(nav_home, cli, env, home):
    """Both are owner operations (owner/ops.py), like search: beside `moonmind serve`, the owner answers."""
    from test_owner import comparable, socket_of, start_owner, stop

    asks = (("related", "web/retry.ts#L14-L18", "--repo", "nav", "--json"), ("symbols", "handle", "--repo", "nav", "--json"))
    one_shot = [cli("rag", *a) for a in asks]
    proc = start_owner(env, home)
    try:
        served = [cli("rag", *a) for a in asks]
        assert (socket_of(home).parent / "owner.lock").read_text().strip() == str(proc.pid)  # held by the owner throughout
    finally:
        stop(proc)
    assert all(r.code == 0 for r in one_shot + served), [r.stderr for r in one_shot + served]
    assert comparable(served[0].json()) == comparable(one_shot[0].json())
    assert {**served[1].json(), "latency_ms": 0} == {**one_shot[1].json(), "latency_ms": 0}


def test_an_older_embedded_store_gains_the_symbols_index_on_its_next_index_run(tmp_path, monkeypatch):
    """Created without the `symbols` payload index (an earlier version): the next run's optimize adds it."""
    from moonmind_worker.store import EdgeStore, edge

    settings = _settings(tmp_path)
    monkeypatch.setattr(edge, "KEYED_ON_CREATE", False)  # each keyword field indexed on its own, as then
    monkeypatch.setattr(edge, "PAYLOAD_INDEXES", tuple(i for i in edge.PAYLOAD_INDEXES if i[0] != "symbols"))
    store = EdgeStore(settings.data_dir, settings.collection)
    from moonmind_worker.embedding import StaticEmbedder

    store.create(StaticEmbedder().dimensions, StaticEmbedder().name, 1)
    assert "symbols" not in store._open().info().payload_schema
    monkeypatch.undo()
    _index(store, settings)  # ends with optimize()
    assert "symbols" in store._open().info().payload_schema
    store.close()
    again = EdgeStore(settings.data_dir, settings.collection)
    try:
        assert "symbols" in again._open().info().payload_schema  # durable
    finally:
        again.close()


@pytest.mark.slow
def test_inside_a_job_the_cli_sees_only_the_jobs_tenant_and_cannot_widen_it(nav_home, cli):
    job = {"MOONMIND_JOB_ID": "job-1", "MOONMIND_TENANT": "acme", "MOONMIND_RUN_ID": "run-1"}
    mine = cli("rag", "symbols", "verify_token", "--top-k", "20", "--json", extra_env=job)
    assert mine.code == 0, mine.stderr
    assert {(s["repo"], s["tenant"]) for s in mine.json()["symbols"]} == {("nav", "acme")}  # `other`/beta holds it too
    related = cli("rag", "related", "auth/tokens.py#L6", "--json", extra_env=job)  # unambiguous: beta's copy is out of reach
    assert related.code == 0 and {i["payload"]["tenant"] for i in related.json()["items"]} == {"acme"}
    for args in (("symbols", "verify_token"), ("related", "auth/tokens.py#L6")):
        wider = cli("rag", *args, "--filters", "tenant=beta", "--json", extra_env=job)
        assert wider.code == 4 and wider.error()["code"] == "forbidden", wider.stderr


def test_a_mention_in_the_lines_two_chunks_share_is_listed_once(tmp_path):
    """Issue 57: chunks overlap by a few lines, and `rag symbols` printed a mention there twice."""
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing.indexer import build_points, content_hash
    from moonmind_worker.retrieval.symbols import find_symbols
    from moonmind_worker.store import EdgeStore
    from moonmind_worker.text.chunking import chunk_text

    text = "".join(f"Step {i} of the rotation runbook: check the pager, then the dashboards.\n" for i in range(13))
    text += "Then call rotate_signing_keys from the admin shell.\n"
    text += "".join(f"Afterwards {i}: confirm the new key is served by every replica.\n" for i in range(12))
    chunks = chunk_text(text, "runbook.md", 400, 2)
    holding = [c for c in chunks if "rotate_signing_keys" in c.text]
    assert len(holding) >= 2  # the line sits where two chunks overlap: the case at hand
    settings = _settings(tmp_path)
    store = EdgeStore(settings.data_dir, settings.collection)
    embedder = StaticEmbedder()
    store.create(embedder.dimensions, embedder.name, 1)
    store.upsert(build_points(embedder, [("runbook.md", content_hash(text), chunks)], repo="nav", tenant="acme"))
    try:
        result = find_symbols(RetrievalQuery(query="rotate_signing_keys"), settings=settings, store=store)
    finally:
        store.close()
    places = [(s["path"], s["line_start"], s["kind"]) for s in result["symbols"]]
    assert places == [("runbook.md", 14, "mention")]
