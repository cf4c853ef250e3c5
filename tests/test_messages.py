"""Messages that say what to do (issue 19): an unknown repo names the real ones, HTTP errors speak HTTP
fields, and citations name the repository when a pack spans several. Real CLI processes and a real gateway."""

from __future__ import annotations

import re

import pytest

from gateway_helpers import add_token, start_gateway

pytestmark = pytest.mark.slow


@pytest.fixture
def indexed(prebuilt):
    """The fixture repository indexed as repo=demo, tenant=acme: a copy of the session's index (these
    tests search it; how `rag index` builds it is test_indexing.py's subject), not a `rag index` each."""
    return prebuilt


CITATION = re.compile(r"^\d+\. \[([^\]]+)\] score=", re.M)


def test_an_unknown_repo_filter_names_the_indexed_repositories(indexed, cli):
    r = cli("rag", "search", "bearer token", "--filters", "repo=dem0")
    assert r.code == 0, r.stderr
    assert "repository 'dem0' is not indexed" in r.stderr and "indexed repositories: demo" in r.stderr


def test_the_unknown_repo_note_names_only_repositories_in_the_callers_tenant(cli, repo):
    assert cli("rag", "index", str(repo), "--repo", "demo", "--tenant", "acme").code == 0
    assert cli("rag", "index", str(repo), "--repo", "secret-project", "--tenant", "globex").code == 0
    r = cli("rag", "search", "bearer token", "--filters", "repo=dem0", "tenant=acme")
    assert "indexed repositories: demo\n" in r.stderr and "secret-project" not in r.stderr


def test_a_repo_filter_on_an_empty_store_says_nothing_is_indexed_yet(cli, repo):
    assert cli("rag", "index", str(repo), "--repo", "demo", "--tenant", "acme").code == 0
    r = cli("rag", "search", "bearer token", "--filters", "repo=demo", "tenant=nobody")
    assert "nothing is indexed for tenant 'nobody' yet" in r.stderr


def test_the_gateways_400_names_the_request_fields_not_cli_flags(indexed, env, home, tmp_path):
    token = add_token(env, "w", ["demo"], ["acme"])
    gw = start_gateway(home, env, tmp_path)
    try:
        with gw.client(token) as http:
            bad_top_k = http.post("/retrieval/context", json={"query": "bearer", "top_k": 99})
            empty = http.post("/retrieval/context", json={"query": "  "})
    finally:
        gw.stop()
    assert bad_top_k.status_code == empty.status_code == 400
    for r in (bad_top_k, empty):
        action = r.json()["error"]["action"]
        assert "--" not in action, action
    assert '"top_k"' in bad_top_k.json()["error"]["action"] and '"query"' in empty.json()["error"]["action"]


def test_citations_carry_the_repo_when_the_pack_spans_repositories(cli, repo):
    assert cli("rag", "index", str(repo), "--repo", "alpha").code == 0
    assert cli("rag", "index", str(repo), "--repo", "beta").code == 0
    both = cli("rag", "search", "bearer token check", "--top-k", "4", "--score-threshold", "0")
    assert both.code == 0, both.stderr
    cites = CITATION.findall(both.stdout)
    assert {c.split(":", 1)[0] for c in cites} == {"alpha", "beta"}
    assert any("auth/tokens.py#L" in c for c in cites)


def test_citations_stay_bare_paths_within_one_repository(cli, repo):
    assert cli("rag", "index", str(repo), "--repo", "alpha").code == 0
    assert cli("rag", "index", str(repo), "--repo", "beta").code == 0
    one = cli("rag", "search", "bearer token check", "--filters", "repo=alpha", "--score-threshold", "0")
    cites = CITATION.findall(one.stdout)
    assert cites and all(not c.startswith("alpha:") for c in cites)
    assert "auth/tokens.py#L" in cites[0]
