"""Fuzz the RetrievalGateway from its own OpenAPI schema with schemathesis (issue 6).

Over 1,000 requests generated from /openapi.json (schema-valid and schema-violating bodies) against a
real server. Each generated case is sent four ways (a narrow token, a wider token, a wrong token, no
token), which amortises Hypothesis' generation cost: no 5xx, every status and body as the schema
declares (schemathesis' checks), every error in the envelope, unauthenticated always 401, and no
chunk from outside the token's scope. It stops at 1,000 requests (~20-40 s on an idle 2-core
machine); TIME_CAP_S only bounds it on an overloaded one, where it fails rather than pass short."""

from __future__ import annotations

import time

import pytest
import requests
import schemathesis
import schemathesis.specs.openapi.schemas  # noqa: F401 - imported at module level, not deep inside a test:

# compiling it there (no .pyc yet) hit CPython 3.11.7's "AST constructor recursion depth mismatch"
# (gh-106905, fixed in 3.11.8) twice on a loaded machine
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from conftest import FIXTURE_FILES, write_tree
from gateway_helpers import add_token, clean_env, index_in_process, start_gateway

pytestmark = pytest.mark.slow

ENVELOPE_KEYS = {"code", "message", "action"}
STATUSES = {200, 400, 401, 403, 408, 413}
MIN_REQUESTS = 1000
TIME_CAP_S = 150.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    base = tmp_path_factory.mktemp("gateway-fuzz")
    repo = write_tree(base / "repo", FIXTURE_FILES)
    home = base / "home"
    home.mkdir()
    index_in_process(home, repo, [("demo", "acme"), ("secret", "acme"), ("demo", "other")])  # two to leak
    env = clean_env(home)
    tokens = {
        "narrow": (add_token(env, "narrow", ["demo"], ["acme"], max_top_k=10), {("demo", "acme")}),
        "wide": (add_token(env, "wide", ["demo", "secret"], ["acme"]), {("demo", "acme"), ("secret", "acme")}),
        "wrong": ("mmw_" + "x" * 43, set()),
        "anonymous": (None, set()),
    }
    gw = start_gateway(home, env, base)
    yield gw, tokens
    gw.stop()


def test_generated_requests_never_500_and_always_answer_per_schema(gateway):
    gw, tokens = gateway
    schema = schemathesis.openapi.from_url(gw.url + "/openapi.json")
    context = schema["/retrieval/context"]["POST"]
    health = schema["/retrieval/health"]["GET"]
    cases = st.one_of(
        context.as_strategy(GenerationMode.POSITIVE),
        context.as_strategy(GenerationMode.POSITIVE),
        context.as_strategy(GenerationMode.NEGATIVE),
        health.as_strategy(GenerationMode.POSITIVE),
    )
    statuses: dict[int, int] = {}
    session = requests.Session()
    started = [time.monotonic()]  # reset when the fuzz is run again

    def send(case, token: str | None, scope: set) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = case.call(base_url=gw.url, headers=headers, session=session)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, response.text
        body = response.json()
        if case.path == "/retrieval/health":
            assert response.status_code == 200 and body == {"status": "ok"}
            return
        assert response.status_code in STATUSES, response.text
        if not scope:
            assert response.status_code == 401
        if response.status_code == 200:
            assert {(i["payload"]["repo"], i["payload"]["tenant"]) for i in body["items"]} <= scope
            assert body["transport"] == "gateway"
        else:
            assert set(body["error"]) == ENVELOPE_KEYS, body
        # schema-valid bodies may still be refused by policy (403 scope, 408/413 budgets: spec 03), checked above
        case.validate_response(response, headers=headers, excluded_checks=[positive_data_acceptance],
                               transport_kwargs={"base_url": gw.url, "headers": headers})

    @settings(max_examples=MIN_REQUESTS, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def fuzz(case):
        if sum(statuses.values()) >= MIN_REQUESTS or time.monotonic() - started[0] > TIME_CAP_S:
            return
        for token, scope in tokens.values():
            send(case, token, scope)

    for attempt in (1, 2):
        started[0] = time.monotonic()
        try:
            fuzz()
            break
        except BaseException as e:  # noqa: BLE001 - only CPython's own AST race is retried, once
            if attempt == 2 or not _cpython_ast_race(e):
                raise
    session.close()
    total = sum(statuses.values())
    assert total >= MIN_REQUESTS, f"only {total} requests in {TIME_CAP_S:.0f} s (machine overloaded?): {statuses}"
    assert statuses.get(200, 0) > 100 and statuses.get(400, 0) > 50 and statuses.get(401, 0) > 400, statuses
    print(f"\nschemathesis: {total} requests in {time.monotonic() - started[0]:.1f} s: {dict(sorted(statuses.items()))}")


def _cpython_ast_race(error: BaseException) -> bool:
    """CPython 3.11.7 counts AST recursion in state shared by every thread (gh-106905, fixed in 3.11.8):
    Hypothesis' `ast.parse` of a lambda's source, run while another thread of the suite's process
    compiles, fails with this SystemError (seen in full runs of the suite, never with this test alone). It says
    nothing about the gateway, so the fuzz is run again; any other failure stands."""
    if isinstance(error, SystemError) and "AST constructor recursion depth mismatch" in str(error):
        return True
    nested = list(getattr(error, "exceptions", ())) + [error.__cause__, error.__context__]
    return any(e is not None and e is not error and _cpython_ast_race(e) for e in nested)

