"""The RetrievalGateway (issue 6, spec 03): a real `moonmind gateway serve` on loopback, driven by httpx
and by the real CLI. The same fixture tree is indexed under several repos/tenants (including case and
Unicode look-alikes) so scope enforcement has something to leak."""

from __future__ import annotations

import itertools
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import FIXTURE_FILES, write_tree
from gateway_helpers import (
    Gateway,
    add_token,
    clean_env,
    copy_home,
    index_in_process,
    overlay_in_process,
    run_cli,
    start_gateway,
)

pytestmark = pytest.mark.slow

#: (repo, tenant) pairs indexed; only ("demo", "acme") is inside the narrow token's scope.
INDEXED = [("demo", "acme"), ("secret", "acme"), ("demo", "other"), ("Demo", "acme"), ("d\u0435mo", "acme")]
QUERY = "where are bearer tokens checked"
ENVELOPE_KEYS = {"code", "message", "action"}
#: A worker's uncommitted edit, overlaid for these (run_id, repo, tenant): only run-1 in demo/acme is in scope.
OVERLAY_TEXT = '''
    def check_bearer_token(header, expected):
        """Overlay edit: bearer tokens are checked by the new verify_bearer helper."""
        return verify_bearer(header, expected)
    '''
OVERLAYS = [("run-1", "demo", "acme"), ("run-1", "secret", "acme"), ("run-1", "demo", "other"), ("run-2", "demo", "acme")]
#: More auth-flavoured files, so a full pack is larger than the smallest budget the gateway accepts.
EXTRA_FILES = {
    f"auth/layer{n}.py": "\n".join(
        [f'"""Bearer token middleware layer {n}: checks tokens on every request."""', ""]
        + [f"def check_token_{n}_{i}(header, expected):\n    \"\"\"Check the bearer token in header {i}.\"\"\"\n"
           f"    scheme, _, token = header.partition(' ')\n    return scheme == 'Bearer' and token == expected\n"
           for i in range(12)]
    )
    for n in range(4)
}


@dataclass
class World:
    base: Path
    direct_home: Path
    gateway_home: Path
    gw: Gateway
    narrow: str  # repos [demo], tenants [acme], max_top_k 20
    wide: str  # repos [demo, secret], tenants [acme]

    def cli_env(self, token: str | None = None, **extra: str) -> dict[str, str]:
        e = clean_env(self.direct_home, **({"MOONMIND_RETRIEVAL_URL": self.gw.url} | extra))
        e["MOONMIND_RETRIEVAL_TOKEN"] = token if token is not None else self.narrow
        return e


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    base = tmp_path_factory.mktemp("gateway")
    repo = write_tree(base / "repo", FIXTURE_FILES | EXTRA_FILES)
    direct_home = base / "direct-home"
    direct_home.mkdir()
    index_in_process(direct_home, repo, INDEXED)
    edited = write_tree(base / "workspace", FIXTURE_FILES | {"auth/tokens.py": OVERLAY_TEXT})
    overlay_in_process(direct_home, edited, ["auth/tokens.py"], OVERLAYS)
    gateway_home = copy_home(direct_home, base / "gateway-home")
    gw_env = clean_env(gateway_home)
    narrow = add_token(gw_env, "narrow", ["demo"], ["acme"], max_top_k=20)
    wide = add_token(gw_env, "wide", ["demo", "secret"], ["acme"])
    gw = start_gateway(gateway_home, gw_env, base)
    yield World(base, direct_home, gateway_home, gw, narrow, wide)
    gw.stop()


def post(world: World, body, token: str | None = "narrow", **kw) -> httpx.Response:
    tok = {"narrow": world.narrow, "wide": world.wide}.get(token, token) if token else None
    with world.gw.client(tok) as c:
        if isinstance(body, (bytes, str)):
            return c.post("/retrieval/context", content=body, headers={"Content-Type": "application/json"}, **kw)
        return c.post("/retrieval/context", json=body, **kw)


def assert_envelope(resp: httpx.Response, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body["error"]) == ENVELOPE_KEYS
    assert body["error"]["code"] == code
    assert "Traceback" not in resp.text
    return body


# ------------------------------------------------------------------ parity ---


@pytest.mark.parametrize(
    "args",
    [
        ["--query", QUERY, "--filters", "repo=demo", "tenant=acme"],
        ["--query", "connection pool", "--filters", "repo=demo", "tenant=acme", "--top-k", "3"],
        ["--query", "caching redis ttl", "--filters", "repo=demo", "tenant=acme", "path=docs/guide.md"],
        ["--query", "render template", "--filters", "repo=demo", "tenant=acme", "--budget", "tokens=400"],
    ],
)
def test_gateway_and_direct_return_identical_packs(world, args):
    dj = run_cli("rag", "search", *args, "--transport", "direct", "--json", env=world.cli_env())
    gj = run_cli("rag", "search", *args, "--transport", "gateway", "--no-fallback", "--json", env=world.cli_env())
    d, g = json.loads(dj.stdout), json.loads(gj.stdout)
    assert (d["transport"], g["transport"]) == ("direct", "gateway")
    assert g["items"] == d["items"] and g["context_text"] == d["context_text"]
    assert g["usage"]["tokens"] == d["usage"]["tokens"] and g["usage"]["latency_ms"] > 0
    assert d["items"] and d["context_text"].startswith("### Retrieved Context")


def test_gateway_and_direct_print_identical_markdown(world):
    args = ["--query", QUERY, "--filters", "repo=demo", "tenant=acme"]
    direct = run_cli("rag", "search", *args, "--transport", "direct", env=world.cli_env())
    gateway = run_cli("rag", "search", *args, "--transport", "gateway", "--no-fallback", env=world.cli_env())
    assert direct.returncode == 0 and gateway.returncode == 0, direct.stderr + gateway.stderr
    assert direct.stdout.startswith("### Retrieved Context") and gateway.stdout == direct.stdout


def test_auto_transport_uses_the_gateway_without_any_qdrant_configuration(world, tmp_path):
    empty_home = tmp_path / "no-store"
    empty_home.mkdir()
    env = clean_env(empty_home, MOONMIND_RETRIEVAL_URL=world.gw.url, MOONMIND_RETRIEVAL_TOKEN=world.narrow)
    r = run_cli("rag", "search", "--query", QUERY, "--json", env=env)
    assert r.returncode == 0, r.stderr
    pack = json.loads(r.stdout)
    assert pack["transport"] == "gateway" and pack["items"]
    assert not (empty_home / "qdrant-edge").exists()


def test_gateway_transport_imports_no_qdrant_numpy_or_web_framework(world):
    code = (
        "import sys, io, contextlib\n"
        "from moonmind_worker.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['rag', 'search', '--query', {QUERY!r}, '--no-fallback'])\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules}\n"
        "               & {'numpy', 'qdrant_client', 'qdrant_edge', 'fastapi', 'uvicorn', 'openai', 'httpx', 'celery'})\n"
        "print(rc, heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=world.cli_env(), timeout=60)
    assert r.stdout.strip() == "0 []", r.stdout + r.stderr


# -------------------------------------------------------------------- auth ---


def test_missing_token_is_401(world):
    body = assert_envelope(post(world, {"query": QUERY}, token=None), 401, "unauthenticated")
    assert "bearer" in body["error"]["action"].lower()


def test_wrong_token_is_401(world):
    assert_envelope(post(world, {"query": QUERY}, token="mmw_not-a-real-token"), 401, "unauthenticated")


def test_unauthenticated_request_learns_nothing_about_its_body(world):
    # auth comes before validation: an anonymous caller cannot probe the schema
    assert_envelope(post(world, {"query": "", "bogus": 1}, token=None), 401, "unauthenticated")


def test_cli_shows_401_without_the_token(world):
    bad = "mmw_wrong-token-value-that-must-not-leak"
    r = run_cli("rag", "search", "--query", QUERY, "--no-fallback", env=world.cli_env(bad))
    assert r.returncode == 4 and r.stdout == ""
    assert "error[unauthenticated]" in r.stderr and bad not in r.stderr


def test_repo_outside_allow_list_is_403(world):
    body = assert_envelope(post(world, {"query": QUERY, "filters": {"repo": "secret"}}), 403, "forbidden")
    assert "secret" in body["error"]["message"]


def test_tenant_outside_allow_list_is_403(world):
    assert_envelope(post(world, {"query": QUERY, "filters": {"tenant": "other"}}), 403, "forbidden")


def test_cli_shows_403_and_does_not_fall_back_to_direct(world):
    r = run_cli("rag", "search", "--query", QUERY, "--filters", "repo=secret", env=world.cli_env())
    assert r.returncode == 4 and r.stdout == ""
    assert "error[forbidden]" in r.stderr and "falling back" not in r.stderr
    assert world.narrow not in r.stderr


def test_top_k_above_the_tokens_limit_is_403(world):
    assert_envelope(post(world, {"query": QUERY, "top_k": 21}), 403, "forbidden")
    assert post(world, {"query": QUERY, "top_k": 20}).status_code == 200


def _scope_of(resp: httpx.Response) -> set[tuple[str, str]]:
    return {(i["payload"]["repo"], i["payload"]["tenant"]) for i in resp.json()["items"]}


def test_request_without_filters_is_scoped_to_the_allow_list(world):
    # the data to leak is there: direct retrieval without filters sees other repos and tenants
    direct = run_cli("rag", "search", "--query", QUERY, "--top-k", "50", "--transport", "direct", "--json",
                     "--score-threshold", "0", env=world.cli_env())
    assert len({(i["payload"]["repo"], i["payload"]["tenant"]) for i in json.loads(direct.stdout)["items"]}) > 1
    narrow = post(world, {"query": QUERY, "top_k": 20, "score_threshold": 0})
    assert narrow.status_code == 200 and _scope_of(narrow) == {("demo", "acme")}
    wide = post(world, {"query": QUERY, "top_k": 50, "score_threshold": 0}, token="wide")
    assert _scope_of(wide) == {("demo", "acme"), ("secret", "acme")}


REPO_VALUES = [None, "demo", "Demo", "DEMO", "d\u0435mo", "demo\u200b", " demo ", "secret", "demo*", "", "x" * 5000, ".*"]
TENANT_VALUES = [None, "acme", "ACME", "\u0430cme", "other", "acme ", "", "y" * 5000]


def test_no_filter_combination_returns_a_chunk_outside_the_tokens_scope(world):
    allowed = 0
    combos = [(r, t, {}) for r, t in itertools.product(REPO_VALUES, TENANT_VALUES)]
    combos += [(r, t, {"path": "auth/tokens.py", "language": "python"}) for r, t in zip(REPO_VALUES, TENANT_VALUES * 2)]
    for repo, tenant, extra in combos:
        filters = {k: v for k, v in (("repo", repo), ("tenant", tenant)) if v is not None} | extra
        resp = post(world, {"query": QUERY, "top_k": 20, "score_threshold": 0, "filters": filters})
        assert resp.status_code in (200, 403), (filters, resp.text)
        if resp.status_code == 200:
            allowed += 1
            assert _scope_of(resp) <= {("demo", "acme")}, filters
        else:
            assert set(resp.json()["error"]) == ENVELOPE_KEYS
            assert len(resp.text) < 1000  # very long values are not reflected back whole
    assert allowed >= 4  # in-scope spellings (unset, exact, blank, surrounding spaces) do succeed


@pytest.mark.parametrize(
    "filters",
    [{"Repo": "secret"}, {"REPO": "secret"}, {"repo_": "secret"}, {"colour": "blue"}, {"repo": ["demo", "secret"]},
     {"repo": {"$ne": "demo"}}, {"tenant": 7}, "repo=secret", ["secret"]],
)
def test_unknown_or_malformed_filters_are_400_not_widened(world, filters):
    assert_envelope(post(world, {"query": QUERY, "filters": filters}), 400, "invalid_query")


def test_top_level_scope_keys_are_refused(world):
    assert_envelope(post(world, {"query": QUERY, "repo": "secret", "tenant": "other"}), 400, "invalid_query")


# ---------------------------------------------------------------- overlays ---


def _overlay_items(resp: httpx.Response) -> list[dict]:
    assert resp.status_code == 200, resp.text
    return [i for i in resp.json()["items"] if i["trust_class"] == "overlay"]


@pytest.mark.parametrize("run_id", ["run-1", "run-2"])
def test_overlays_come_only_from_the_requests_run_and_the_tokens_scope(world, run_id):
    body = {"query": "verify_bearer overlay edit bearer tokens", "top_k": 20, "score_threshold": 0,
            "filters": {"run_id": run_id}}
    for token in ("narrow", "wide"):
        overlays = _overlay_items(post(world, body, token=token))
        assert overlays, token
        assert {(i["payload"]["run_id"], i["payload"]["repo"], i["payload"]["tenant"]) for i in overlays} <= {
            (run_id, "demo", "acme"), (run_id, "secret", "acme")}
        if token == "narrow":
            assert {i["payload"]["repo"] for i in overlays} == {"demo"}


def test_no_overlays_without_a_run_id_or_with_overlay_skip(world):
    q = {"query": "verify_bearer overlay edit bearer tokens", "top_k": 20, "score_threshold": 0}
    assert _overlay_items(post(world, q, token="wide")) == []
    skip = q | {"filters": {"run_id": "run-1"}, "overlay_policy": "skip"}
    assert _overlay_items(post(world, skip, token="wide")) == []


# -------------------------------------------------------------- validation ---


@pytest.mark.parametrize(
    "body",
    [
        {"query": ""}, {"query": "   "}, {}, {"query": 5}, {"query": QUERY, "top_k": 0}, {"query": QUERY, "top_k": 51},
        {"query": QUERY, "top_k": "many"}, {"query": QUERY, "overlay_policy": "always"},
        {"query": QUERY, "budgets": {"tokens": -1}}, {"query": QUERY, "budgets": {"dollars": 3}},
        "not json", "[1, 2]", '"just a string"', "",
    ],
)
def test_invalid_requests_are_400_invalid_query_never_422(world, body):
    assert_envelope(post(world, body), 400, "invalid_query")


def test_oversized_body_is_refused(world):
    assert_envelope(post(world, {"query": "q " * 40_000}), 400, "invalid_query")


def test_unknown_path_and_method_answer_in_the_envelope(world):
    with world.gw.client() as c:
        assert_envelope(c.get("/nope"), 404, "not_found")
        assert_envelope(c.get("/retrieval/context"), 405, "method_not_allowed")


# ----------------------------------------------------------------- budgets ---


def test_token_budget_that_cannot_hold_one_chunk_is_413_before_searching(world):
    body = assert_envelope(post(world, {"query": QUERY, "budgets": {"tokens": 50}}), 413, "token_budget_exceeded")
    assert body["usage"] == {"tokens": 0, "latency_ms": 0.0}
    assert body["budget"]["budget_type"] == "tokens" and body["budget"]["budget_limit"] == 50
    assert body["budget"]["budget_spent"] > 50


def test_spec_example_budget_is_accepted_and_trimmed_to_fit(world):
    resp = post(world, {"query": QUERY, "top_k": 8, "score_threshold": 0, "budgets": {"tokens": 1200, "latency_ms": 5000}})
    assert resp.status_code == 200, resp.text
    pack = resp.json()
    assert pack["budgets"] == {"tokens": 1200, "latency_ms": 5000}
    assert 0 < pack["usage"]["tokens"] <= 1200
    assert pack["usage"]["tokens"] == sum(i["token_count"] for i in pack["items"])


def test_trimming_drops_whole_lowest_ranked_items_and_says_so(world):
    full = post(world, {"query": QUERY, "top_k": 8, "score_threshold": 0}).json()
    assert full["usage"]["tokens"] > 400 and not full["truncated"]
    trimmed = post(world, {"query": QUERY, "top_k": 8, "score_threshold": 0, "budgets": {"tokens": 400}}).json()
    assert trimmed["truncated"] is True and trimmed["usage"]["tokens"] <= 400
    assert trimmed["items"] == full["items"][: len(trimmed["items"])]
    assert any("token budget" in n for n in trimmed["notes"])


def test_cli_token_budget_refusal_exits_5_on_both_transports(world):
    for transport in ("direct", "gateway"):
        r = run_cli("rag", "search", "--query", QUERY, "--budget", "tokens=20", "--transport", transport, "--json",
                    "--no-fallback", env=world.cli_env())
        assert r.returncode == 5 and r.stdout == "", transport
        assert json.loads(r.stderr.strip().splitlines()[-1])["error"]["code"] == "token_budget_exceeded"


def test_tiny_latency_budget_is_408_with_actual_latency(world):
    body = assert_envelope(post(world, {"query": QUERY, "budgets": {"latency_ms": 1}}), 408, "latency_budget_exceeded")
    assert body["usage"]["latency_ms"] >= 1
    assert body["budget"] == {"budget_type": "latency_ms", "budget_limit": 1, "budget_spent": body["usage"]["latency_ms"]}


# ------------------------------------------------------------------ health ---


def test_health_is_ok_for_anonymous_callers(world):
    with world.gw.client() as c:
        r = c.get("/retrieval/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_unhealthy_gateway_gives_a_reason_but_no_names(world, tmp_path):
    home = tmp_path / "unindexed"
    home.mkdir()
    env = clean_env(home)
    token = add_token(env, "t", ["demo"], ["acme"])
    gw = start_gateway(home, env, tmp_path)
    try:
        with gw.client() as c:
            anon = c.get("/retrieval/health")
        assert anon.status_code == 503
        assert anon.json()["status"] == "unavailable" and anon.json()["reason"] == "collection_not_ready"
        assert "moonmind__repo" not in anon.text and str(home) not in anon.text
        with gw.client(token) as c:
            authed = c.get("/retrieval/health")
            assert "moonmind rag index" in authed.json()["error"]["action"]  # the operator's remedy, for a token holder
            failed = c.post("/retrieval/context", json={"query": QUERY})
        body = assert_envelope(failed, 500, "retrieval_failed")
        assert "moonmind__repo" not in failed.text and body["error"]["action"]
    finally:
        gw.stop()


# ----------------------------------------------------------------- openapi ---


def test_openapi_declares_every_error_response_and_docs_are_served(world):
    with world.gw.client() as c:
        spec = c.get("/openapi.json").json()
        assert c.get("/docs").status_code == 200
    op = spec["paths"]["/retrieval/context"]["post"]
    assert set(op["responses"]) == {"200", "400", "401", "403", "408", "413", "500"}
    assert "422" not in json.dumps(spec["paths"])
    assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/RetrievalQuery"}
    assert {"RetrievalQuery", "Filters", "Budgets", "ContextPack", "ErrorEnvelope"} <= set(spec["components"]["schemas"])
    assert set(spec["paths"]["/retrieval/health"]["get"]["responses"]) == {"200", "503"}


# ----------------------------------------------------------- token reloads ---


def test_a_token_added_while_running_works_without_restart(world):
    env = clean_env(world.gateway_home)
    token = add_token(env, f"late-{time.time_ns()}", ["demo"], ["acme"])
    assert post(world, {"query": QUERY}, token=token).status_code == 200


#: What the gateway logs each time it reads a token file it cannot use.
REFUSED_ALL = "every token is refused until it is fixed"


@pytest.mark.parametrize("tamper", ["deleted", "emptied", "broken", "world-writable"])
def test_a_token_file_that_is_deleted_emptied_broken_or_world_writable_revokes_every_token(world, tamper):
    """A credential file fails closed: nothing it used to grant stays in force until it is fixed."""
    path = world.gateway_home / "gateway-tokens.json"
    original, mode = path.read_text(), path.stat().st_mode
    assert post(world, {"query": QUERY}).status_code == 200
    try:
        if tamper == "deleted":
            path.unlink()
        elif tamper == "emptied":
            path.write_text("")
        elif tamper == "broken":
            path.write_text(original[:-3])
        else:
            path.chmod(0o666)
        assert_envelope(post(world, {"query": QUERY}), 401, "unauthenticated")
        refusals = world.gw.logs().count(REFUSED_ALL)
        world.gw.proc.send_signal(signal.SIGHUP)  # a reload asked for explicitly changes nothing
        deadline = time.monotonic() + 30
        while world.gw.logs().count(REFUSED_ALL) == refusals:  # until the gateway has re-read the file
            assert time.monotonic() < deadline, "the gateway did not reload its token file on SIGHUP"
            time.sleep(0.02)
        assert_envelope(post(world, {"query": QUERY}), 401, "unauthenticated")
    finally:
        path.write_text(original)
        path.chmod(mode & 0o777)
    assert post(world, {"query": QUERY}).status_code == 200
    assert REFUSED_ALL in world.gw.logs()


def test_a_gateway_does_not_start_on_a_world_writable_token_file(tmp_path):
    home = tmp_path / "home"
    env = clean_env(home)
    add_token(env, "t", ["demo"], ["acme"])
    (home / "gateway-tokens.json").chmod(0o666)
    r = run_cli("gateway", "serve", "--port", "0", env=env, timeout=60)
    assert r.returncode == 2 and "world-writable" in r.stderr and "chmod 600" in r.stderr and "Traceback" not in r.stderr


def test_sighup_reloads_the_token_file_without_dropping_requests(world):
    path = world.gateway_home / "gateway-tokens.json"
    original = path.read_text()
    data = json.loads(original)
    env = clean_env(world.base / "scratch-home")
    fresh = add_token(env, "fresh", ["demo"], ["acme"])
    fresh_hash = json.loads((world.base / "scratch-home" / "gateway-tokens.json").read_text())["tokens"][0]["hash"]
    victim = next(t for t in data["tokens"] if t["name"] == "wide")
    st = path.stat()
    # same size, same inode, same mtime: only SIGHUP can make the gateway notice
    with open(path, "r+") as f:
        f.write(original.replace(victim["hash"], fresh_hash))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert post(world, {"query": QUERY}, token=fresh).status_code == 401

    failures: list[int] = []
    stop = threading.Event()

    def hammer():
        with world.gw.client(world.narrow) as c:
            while not stop.is_set():
                r = c.post("/retrieval/context", json={"query": QUERY, "top_k": 2})
                if r.status_code != 200:
                    failures.append(r.status_code)

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(5):
            world.gw.proc.send_signal(signal.SIGHUP)
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert post(world, {"query": QUERY}, token=fresh).status_code == 200
    assert post(world, {"query": QUERY}, token="wide").status_code == 401  # its entry was replaced: revoked
    path.write_text(original)
    assert post(world, {"query": QUERY}, token="wide").status_code == 200


# ---------------------------------------------------------------- fallback ---


def test_unreachable_gateway_falls_back_to_direct_and_says_so(world):
    from gateway_helpers import free_port

    env = world.cli_env(MOONMIND_RETRIEVAL_URL=f"http://127.0.0.1:{free_port()}")
    r = run_cli("rag", "search", "--query", QUERY, "--filters", "repo=demo", "tenant=acme", env=env)
    direct = run_cli("rag", "search", "--query", QUERY, "--filters", "repo=demo", "tenant=acme", "--transport", "direct",
                     env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == direct.stdout
    assert "falling back to direct" in r.stderr and world.narrow not in r.stderr


def test_no_fallback_reports_the_unreachable_gateway(world):
    from gateway_helpers import free_port

    env = world.cli_env(MOONMIND_RETRIEVAL_URL=f"http://127.0.0.1:{free_port()}")
    r = run_cli("rag", "search", "--query", QUERY, "--no-fallback", env=env)
    assert r.returncode == 4 and r.stdout == ""
    assert "error[retrieval_failed]" in r.stderr and "MOONMIND_RETRIEVAL_URL" in r.stderr


def test_no_fallback_when_direct_is_not_available(world, tmp_path):
    from gateway_helpers import free_port

    env = clean_env(tmp_path, MOONMIND_RETRIEVAL_URL=f"http://127.0.0.1:{free_port()}", MOONMIND_RETRIEVAL_TOKEN="x")
    r = run_cli("rag", "search", "--query", QUERY, env=env)
    assert r.returncode == 4 and "falling back" not in r.stderr


def test_gateway_transport_without_url_or_token_says_what_to_set(world, tmp_path):
    r = run_cli("rag", "search", "--query", QUERY, "--transport", "gateway", env=clean_env(tmp_path))
    assert r.returncode == 3 and "MOONMIND_RETRIEVAL_URL" in r.stderr
    r = run_cli("rag", "search", "--query", QUERY, env=clean_env(tmp_path, MOONMIND_RETRIEVAL_URL=world.gw.url))
    assert r.returncode == 3 and "MOONMIND_RETRIEVAL_TOKEN" in r.stderr


def test_a_gateway_search_is_cached_with_the_workers_run_not_on_the_gateway(world):
    env = world.cli_env(MOONMIND_RUN_ID="run-gw-cache")
    r = run_cli("rag", "search", "--query", QUERY, "--filters", "repo=demo", "tenant=acme", "--transport", "gateway",
                "--no-fallback", "--json", env=env)
    assert r.returncode == 0, r.stderr
    pack_id = json.loads(r.stdout)["telemetry_id"]
    worker_run = world.direct_home / "artifacts" / "run-gw-cache"
    assert json.loads((worker_run / "context-packs" / f"{pack_id}.json").read_text())["telemetry_id"] == pack_id
    assert pack_id in (worker_run / "breadcrumbs.jsonl").read_text()
    assert not list((world.gateway_home / "artifacts").rglob(f"{pack_id}.json"))


def test_serve_refuses_a_concurrency_outside_its_range(tmp_path):
    r = run_cli("gateway", "serve", "--port", "0", "--concurrency", "0", env=clean_env(tmp_path))
    assert r.returncode == 2 and "--concurrency 0 is outside 1-256" in r.stderr and "Traceback" not in r.stderr


def test_serve_refuses_a_worker_count_outside_its_range(tmp_path):
    r = run_cli("gateway", "serve", "--port", "0", "--workers", "0", env=clean_env(tmp_path))
    assert r.returncode == 2 and "--workers 0 is outside 1-64" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------- several processes ---


@pytest.fixture(scope="module")
def workers(world):
    """`gateway serve --workers 2` on its own copy of the indexed home."""
    home = copy_home(world.direct_home, world.base / "workers-home")
    (home / "gateway-tokens.json").unlink(missing_ok=True)
    env = clean_env(home)
    token = add_token(env, "w", ["demo"], ["acme"])
    gw = start_gateway(home, env, world.base, "--workers", "2")
    yield gw, home, env, token
    gw.stop()


def child_pids(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_worker_processes_answer_exactly_like_the_direct_search_from_their_own_replicas(world, workers):
    gw, home, env, token = workers
    direct = json.loads(run_cli("rag", "search", "--query", QUERY, "--filters", "repo=demo", "tenant=acme", "--json",
                                env=world.cli_env()).stdout)
    results: list[httpx.Response] = []

    def client():
        with gw.client(token) as c:
            results.extend(c.post("/retrieval/context", json={"query": QUERY}) for _ in range(10))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200] * 40
    assert all(r.json()["items"] == direct["items"] for r in results)
    replicas = home / "gateway-replicas" / "moonmind__repo"

    def copied() -> bool:  # a worker that answered none of the 40 may still be copying its replica on a busy box
        dirs = list(replicas.iterdir())
        return len(dirs) == 2 and all((d / "moonmind__repo" / "meta.json").exists() for d in dirs)

    deadline = time.monotonic() + 60
    while not copied() and time.monotonic() < deadline:
        time.sleep(0.1)
    children = child_pids(gw.proc.pid)
    assert {int(p.name) for p in replicas.iterdir()} <= children and len(list(replicas.iterdir())) == 2
    assert copied()


def test_the_store_stays_held_while_workers_serve_so_a_writer_gets_store_busy(world, workers):
    gw, home, env, _ = workers
    r = run_cli("rag", "index", str(world.base / "repo"), "--repo", "demo", "--tenant", "acme",
                env=env | {"MOONMIND_STORE_WAIT_S": "0.2"})
    assert r.returncode == 3 and "store_busy" in r.stderr and f"PID {gw.proc.pid}" in r.stderr, r.stderr


def test_sighup_makes_every_worker_reload_the_token_file_without_a_restart(world, workers):
    gw, home, env, _ = workers
    before = child_pids(gw.proc.pid)
    path = home / "gateway-tokens.json"
    original, st = path.read_text(), path.stat()
    scratch = world.base / "workers-scratch"
    fresh = add_token(clean_env(scratch), "fresh", ["demo"], ["acme"])
    fresh_hash = json.loads((scratch / "gateway-tokens.json").read_text())["tokens"][0]["hash"]
    old_hash = json.loads(original)["tokens"][0]["hash"]
    with open(path, "r+") as f:  # same size, inode and mtime: only SIGHUP can make a worker notice
        f.write(original.replace(old_hash, fresh_hash))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with gw.client(fresh) as c:
        assert c.post("/retrieval/context", json={"query": QUERY}).status_code == 401
        gw.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and {c.post("/retrieval/context", json={"query": QUERY}).status_code
                                               for _ in range(6)} != {200}:
            time.sleep(0.2)
        assert {c.post("/retrieval/context", json={"query": QUERY}).status_code for _ in range(10)} == {200}
    assert child_pids(gw.proc.pid) == before  # reloaded in place, not restarted
    path.write_text(original)


def test_workers_without_a_token_file_fail_once_with_a_clear_error(tmp_path):
    r = run_cli("gateway", "serve", "--port", "0", "--workers", "2", env=clean_env(tmp_path), timeout=60)
    assert r.returncode != 0 and "token file" in r.stderr and "does not exist" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("does not exist") == 1


def established_per_pid(port: int, pids: set[int]) -> dict[int, int]:
    """Open TCP connections to `port` held by each of `pids` (read from /proc: no tool needed)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    counts = {}
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        counts[pid] = sum(1 for fd in fds.iterdir() if os.readlink(fd) in inodes)
    return counts


class BalanceFile:
    """The workers' shared counts file (gateway/balance.py), found through a worker's environment, and
    which slot each worker holds (its byte-range lock in /proc/locks)."""

    def __init__(self, worker_pid: int) -> None:
        environ = Path(f"/proc/{worker_pid}/environ").read_bytes().split(b"\0")
        spec = json.loads(next(v for k, _, v in (e.partition(b"=") for e in environ) if k == b"MOONMIND_GATEWAY_WORKER"))
        self.path = Path(spec["balance"])
        self._file = open(self.path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), 0)
        self.counts = memoryview(self._map).cast("q")

    def slot_of(self, pid: int) -> int:
        inode, deadline = self.path.stat().st_ino, time.monotonic() + 30  # (a worker claims its slot as it starts)
        while time.monotonic() < deadline:
            for line in Path("/proc/locks").read_text().splitlines():
                f = line.split()
                if "->" not in f and f[1] == "POSIX" and int(f[4]) == pid and int(f[5].rsplit(":", 1)[1]) == inode:
                    return int(f[6]) // self.counts.itemsize
            time.sleep(0.1)
        raise AssertionError(f"worker {pid} holds no slot of {self.path}")

    def close(self) -> None:
        self.counts.release()
        self._map.close()
        self._file.close()


def test_a_worker_publishes_its_connections_and_closes_keep_alives_over_its_share_of_the_published_total(workers):
    """The balancing mechanism in real worker processes: each worker's slot says how many connections it
    holds, and a worker answers `Connection: close` exactly when it holds more than total / workers (rounded
    up) of the published counts. Which worker the client then reconnects to is the kernel's choice, so the
    split reached under load is not asserted; the peer worker is stopped and its slot written by the test."""
    gw, home, env, token = workers
    port = int(gw.url.rsplit(":", 1)[1])
    replicas = home / "gateway-replicas" / "moonmind__repo"
    deadline = time.monotonic() + 30  # the fixture returns once one worker answers; the other may still be starting
    while len(list(replicas.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    a, b = sorted(int(p.name) for p in replicas.iterdir())  # one replica each
    shared = BalanceFile(a)
    slot_a, slot_b = shared.slot_of(a), shared.slot_of(b)
    assert slot_a != slot_b
    clients = [gw.client(token) for _ in range(12)]

    def ask(c: httpx.Client) -> httpx.Response:
        r = c.post("/retrieval/context", json={"query": QUERY, "top_k": 1})
        assert r.status_code == 200
        return r

    try:
        os.kill(b, signal.SIGSTOP)  # every connection opened now is accepted by `a`; `b` publishes nothing
        try:
            shared.counts[slot_b] = 1000  # as if `b` held far more: `a` is under its share and keeps every connection
            for _ in range(3):  # (a client whose connection idled out under load reconnects: to `a`)
                assert "close" not in [ask(c).headers.get("connection") for c in clients]
                held = established_per_pid(port, {a, b})
                if held == {a: 12, b: 0}:
                    break
            assert held == {a: 12, b: 0}
            assert shared.counts[slot_a] == 12  # what `a` published on its last response is what it holds

            shared.counts[slot_b] = 12  # an even split sheds nothing
            assert "close" not in [ask(c).headers.get("connection") for c in clients]
            shared.counts[slot_b] = 11  # nor does holding the rounded-up half (23 / 2 -> 12)
            assert "close" not in [ask(c).headers.get("connection") for c in clients]

            shared.counts[slot_b] = 10  # 12 of 22 is one over the share: the next answer closes its connection
            assert ask(clients[0]).headers.get("connection") == "close"
            deadline = time.monotonic() + 10
            while established_per_pid(port, {a})[a] != 11 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert established_per_pid(port, {a, b}) == {a: 11, b: 0}
            assert ask(clients[1]).headers.get("connection") != "close"  # 11 of 21 is the share: no more sheds
            assert shared.counts[slot_a] == 11
        finally:
            shared.counts[slot_b] = 0  # what `b` really holds; it publishes its own count on its next answer
            os.kill(b, signal.SIGCONT)
    finally:
        for c in clients:
            c.close()
        shared.close()


def test_a_worker_that_dies_is_replaced_by_one_with_a_fresh_replica_and_its_copy_is_removed(workers):
    gw, home, env, token = workers
    replicas = home / "gateway-replicas" / "moonmind__repo"
    before = {int(p.name) for p in replicas.iterdir()}
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = {int(p.name) for p in replicas.iterdir()}
        if victim not in now and len(now) == 2:
            break
        time.sleep(0.2)
    now = {int(p.name) for p in replicas.iterdir()}
    assert victim not in now and len(now) == 2 and now - before, now
    with gw.client(token) as c:
        assert {c.post("/retrieval/context", json={"query": QUERY}).status_code for _ in range(10)} == {200}


def test_stopping_the_workers_removes_the_replicas_and_lets_go_of_the_store(world, workers):
    gw, home, env, _ = workers
    gw.stop()
    assert gw.proc.returncode == 0, gw.logs()
    assert not (home / "gateway-replicas" / "moonmind__repo").exists()
    r = run_cli("rag", "search", "--query", QUERY, "--filters", "repo=demo", "tenant=acme", "--json",
                env=env | {"MOONMIND_STORE_WAIT_S": "0"})
    assert r.returncode == 0 and json.loads(r.stdout)["items"], r.stderr
