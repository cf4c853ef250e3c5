"""The isolation matrix: scoped tokens × hostile filter values against a real gateway; 0 leaks, 0 server errors.

Three tenants' worth of data and two runs' overlays sit in one store. Each token may see one
scope; every request combines filter keys with hostile values (wildcards, blanks, look-alike and
zero-width characters, case variants, 5,000-character values, wrong JSON types, operator-looking
objects, duplicate keys, `\\u` escapes). A 200 may only hold chunks inside the token's scope, and
overlay chunks only of the run the request named.
"""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from conftest import FIXTURE_FILES, write_tree
from gateway_helpers import add_token, clean_env, index_in_process, overlay_in_process, start_gateway

pytestmark = pytest.mark.slow

VALUES = [
    "demo", "secret", "acme", "globex", "run-a", "run-b", "auth/tokens.py", "python",
    "*", "%", ".*", "", " ", "demo\u200b", "DEMO", "Acme", "d\u0435mo", "\uff44emo", "acme\x00", "x" * 5000,
    123, True, None, ["demo", "secret"], {"$ne": "acme"}, "demo' OR '1'='1", "../secret",
]
KEYS = ["repo", "tenant", "run_id", "path"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("isolation")
    repo = write_tree(base / "repo", FIXTURE_FILES)
    home = base / "home"
    home.mkdir()
    index_in_process(home, repo, [("demo", "acme"), ("secret", "acme"), ("demo", "globex")])
    overlay_in_process(home, repo, ["auth/tokens.py"], [("run-a", "demo", "acme"), ("run-b", "demo", "globex")])
    env = clean_env(home)
    tokens = {
        "narrow": (add_token(env, "narrow", ["demo"], ["acme"]), {("demo", "acme")}),
        "wide": (add_token(env, "wide", ["demo", "secret"], ["acme"]), {("demo", "acme"), ("secret", "acme")}),
        "globex": (add_token(env, "globex", ["demo"], ["globex"]), {("demo", "globex")}),
    }
    gw = start_gateway(home, env, base)
    yield gw, tokens
    gw.stop()


def _bodies():
    for key in KEYS:
        for v in VALUES:
            yield json.dumps({"query": "bearer token check", "top_k": 20, "filters": {key: v}})
    for (k1, k2) in itertools.combinations(KEYS, 2):
        for v1, v2 in itertools.product(VALUES[:8] + ["*", "", "DEMO"], repeat=2):
            yield json.dumps({"query": "bearer token check", "top_k": 20, "filters": {k1: v1, k2: v2}})
    yield '{"query": "bearer", "filters": {"tenant": "acme", "tenant": "globex"}}'
    yield '{"query": "bearer", "filters": {"tenant": "glob\\u0065x", "run_id": "run\\u002db"}}'
    yield '{"query": "bearer", "filters": {"repo": "secr\\u0065t"}}'


def test_no_request_reads_outside_its_tokens_scope_or_its_run(world):
    gw, tokens = world
    tried = leaks = server_errors = ok = 0
    problems: list[str] = []
    bodies = list(_bodies())
    for name, (token, allowed) in tokens.items():
        with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}", "content-type": "application/json"},
                          timeout=30) as c:
            for body in bodies:
                r = c.post("/retrieval/context", content=body)
                tried += 1
                if r.status_code >= 500:
                    server_errors += 1
                    problems.append(f"{name} {body[:120]} -> {r.status_code}")
                    continue
                if r.status_code != 200:
                    assert set(r.json()["error"]) == {"code", "message", "action"}
                    continue
                ok += 1
                asked_run = json.loads(body).get("filters", {}).get("run_id")
                for item in r.json()["items"]:
                    p = item["payload"]
                    scope = (p["repo"], p["tenant"])
                    foreign_run = item["trust_class"] == "overlay" and p.get("run_id") != asked_run
                    if scope not in allowed or foreign_run:
                        leaks += 1
                        problems.append(f"{name} {body[:120]} -> {scope} {item['trust_class']} {p.get('run_id')}")
    print(f"isolation matrix: {tried} requests, {ok} answered 200, {leaks} leaks, {server_errors} server errors")
    assert leaks == 0 and server_errors == 0, "\n".join(problems[:20])
    assert ok > 100 and tried > 1500
