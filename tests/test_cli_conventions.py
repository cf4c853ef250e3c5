"""CLI conventions (issue 19): --version, `python -m moonmind_worker`, a positional query, one default tenant.

Real processes throughout: the installed console script, `python -m`, and a real gateway on loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gateway_helpers import start_gateway


def test_version_prints_the_installed_version(cli):
    from importlib.metadata import version

    r = cli("--version")
    assert r.code == 0 and r.stdout == f"moonmind {version('moonmind-worker')}\n" and r.stderr == ""


def test_python_dash_m_moonmind_worker_is_the_moonmind_command(env, tmp_path):
    p = subprocess.run([sys.executable, "-m", "moonmind_worker", "rag", "search"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error[invalid_argument]: No query given.")


@pytest.mark.slow
def test_the_query_may_be_positional_and_gives_the_same_pack_as_the_flag(indexed, cli):
    positional = cli("rag", "search", "bearer token check", "--filters", "repo=demo", "--json")
    flag = cli("rag", "search", "--query", "bearer token check", "--filters", "repo=demo", "--json")
    assert positional.code == flag.code == 0, positional.stderr
    assert [i["chunk_hash"] for i in positional.json()["items"]] == [i["chunk_hash"] for i in flag.json()["items"]]


def test_a_query_given_both_ways_is_a_usage_error(invoke):
    r = invoke("rag", "search", "one", "--query", "two", "--json")
    assert r.code == 2 and r.stdout == ""
    assert r.error()["code"] == "invalid_argument" and "twice" in r.error()["message"]


@pytest.mark.slow
def test_index_and_overlay_upsert_default_to_the_same_tenant_and_search_finds_both(cli, repo):
    assert cli("rag", "index", str(repo), "--repo", "demo").code == 0
    (repo / "auth" / "sessions.py").write_text('def rotate_session_cookie(session):\n    """Fresh cookie after login."""\n')
    up = cli("rag", "overlay", "upsert", "auth/sessions.py", "--run-id", "r1", "--repo", "demo", "--root", str(repo),
             "--json", cwd=repo)
    assert up.code == 0, up.stderr  # it used to refuse without --tenant
    listed = cli("rag", "overlay", "list", "--json").json()
    assert {row["tenant"] for row in listed} == {"default"}
    found = cli("rag", "search", "rotate the session cookie", "--filters", "run_id=r1", "tenant=default",
                "--score-threshold", "0", "--json").json()
    assert {i["trust_class"] for i in found["items"]} == {"overlay", "canonical"}


@pytest.mark.slow
def test_moonmind_tenant_is_the_default_of_index_overlay_and_search_alike(cli, repo):
    acme = {"MOONMIND_TENANT": "acme"}
    assert cli("rag", "index", str(repo), "--repo", "demo", extra_env=acme).code == 0
    pack = cli("rag", "search", "bearer token check", "--json", extra_env=acme).json()
    assert pack["filters"]["tenant"] == "acme" and pack["items"]
    assert {i["payload"]["tenant"] for i in pack["items"]} == {"acme"}
    other = cli("rag", "search", "bearer token check", "--json", extra_env={"MOONMIND_TENANT": "globex"}).json()
    assert other["items"] == []


@pytest.mark.slow
def test_a_gateway_token_defaults_to_the_tenant_rag_index_wrote(cli, repo, env, home, tmp_path):
    assert cli("rag", "index", str(repo), "--repo", "demo").code == 0
    token = cli("gateway", "add-token", "--name", "w", "--repo", "demo")
    assert token.code == 0, token.stderr
    grants = json.loads((home / "gateway-tokens.json").read_text())["tokens"]
    assert grants[0]["tenants"] == ["default"]
    gw = start_gateway(home, env, tmp_path)
    try:
        r = cli("rag", "search", "bearer token check", "--filters", "repo=demo", "--json", "--no-fallback",
                extra_env={"MOONMIND_RETRIEVAL_URL": gw.url, "MOONMIND_RETRIEVAL_TOKEN": token.stdout.strip()})
    finally:
        gw.stop()
    assert r.code == 0, r.stderr
    assert r.json()["transport"] == "gateway" and r.json()["items"][0]["source"] == "auth/tokens.py"




def test_a_query_written_after_filters_gets_told_to_put_it_first(invoke):
    r = invoke("rag", "search", "--filters", "repo=demo", "bearer token", "--json")
    assert r.code == 2 and r.error()["code"] == "invalid_query"
    assert "the query goes before --filters" in r.error()["action"]
