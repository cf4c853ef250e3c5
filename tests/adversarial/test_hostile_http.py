"""Hostile HTTP against a real gateway: malformed bodies and requests, idle and trickling connections.

Issue 18 (minor): lone surrogates and JSON nested ~1,000 deep gave 500s with tracebacks; idle
connections were held forever; uvicorn's own 400 was plain text; `top_k: 44.0` was refused
although the schema says integer; 405 came without `Allow`; `--access-log` logged nothing.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time

import httpx
import pytest

from conftest import FIXTURE_FILES, MOONMIND, write_tree
from gateway_helpers import add_token, clean_env, index_in_process, start_gateway

pytestmark = pytest.mark.slow

READ_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile-http")
    repo = write_tree(base / "repo", FIXTURE_FILES)
    home = base / "home"
    home.mkdir()
    index_in_process(home, repo, [("demo", "acme")])
    env = clean_env(home, MOONMIND_GATEWAY_READ_TIMEOUT_S=str(READ_TIMEOUT_S))
    token = add_token(env, "t", ["demo"], ["acme"])
    gw = start_gateway(home, env, base, "--access-log")
    yield gw, token, env
    gw.stop()


def _post(gw, token: str, body: bytes) -> httpx.Response:
    with gw.client(token) as c:
        return c.post("/retrieval/context", content=body, headers={"content-type": "application/json"})


def _error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) >= {"error"} and set(body["error"]) == {"code", "message", "action"}, body
    return body["error"]


def _raw(gw, data: bytes, wait_s: float = 10.0) -> bytes:
    """What the server sends back on a fresh connection after `data`, until it closes (a server that
    holds the connection past `wait_s` fails the test with a socket timeout)."""
    from http_servers import raw_exchange

    return raw_exchange(int(gw.url.rsplit(":", 1)[1]), data, wait_s)


def _logged(gw, token: str) -> None:
    """Until a fresh request's access line is in the log: everything the gateway logged before it is there too."""
    marker = f"/retrieval/health?after={time.monotonic_ns()}"
    with gw.client(token) as c:
        c.get(marker)
    deadline = time.monotonic() + 30
    while marker not in gw.logs():
        assert time.monotonic() < deadline, "the access line never reached the log"
        time.sleep(0.02)


@pytest.mark.parametrize("field", ["repo", "tenant", "run_id", "path", "language", "resource_type"])
def test_a_lone_surrogate_in_a_filter_is_the_callers_error(gateway, field):
    gw, token, _ = gateway
    r = _post(gw, token, ('{"query": "token", "filters": {"%s": "a\\udc80"}}' % field).encode())
    assert r.status_code == 400 and _error(r)["code"] == "invalid_query"
    assert "not valid Unicode" in _error(r)["message"]


def test_a_lone_surrogate_in_the_query_is_the_callers_error(gateway):
    gw, token, _ = gateway
    r = _post(gw, token, b'{"query": "to\\ud800ken"}')
    assert r.status_code == 400 and "not valid Unicode" in _error(r)["message"]


def test_json_nested_a_thousand_deep_is_a_400_without_a_traceback(gateway):
    gw, token, _ = gateway
    r = _post(gw, token, b'{"query": "x", "filters": ' + b"[" * 1000 + b"]" * 1000 + b"}")
    assert r.status_code == 400 and _error(r)["code"] == "invalid_query"
    assert "RecursionError" not in gw.logs() and "Traceback" not in gw.logs()


@pytest.mark.parametrize("top_k,status", [(44.0, 200), (44, 200), (44.5, 400), (True, 400), ("44", 400)])
def test_top_k_is_an_integer_as_json_schema_means_it(gateway, top_k, status):
    gw, token, _ = gateway
    r = _post(gw, token, json.dumps({"query": "token", "top_k": top_k}).encode())
    assert r.status_code == status, r.text
    if status == 200:
        assert r.json()["top_k"] == 44


def test_a_wrong_method_answers_405_with_allow(gateway):
    gw, token, _ = gateway
    with gw.client(token) as c:
        r = c.delete("/retrieval/context")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert _error(r)["code"] == "method_not_allowed"


def test_a_request_that_is_not_http_gets_the_envelope(gateway):
    gw, _, _ = gateway
    data = _raw(gw, b"GARBAGE\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert json.loads(body)["error"]["code"] == "invalid_query"


def test_a_connection_that_never_sends_is_closed_with_a_408(gateway):
    gw, _, _ = gateway
    data = _raw(gw, b"")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and json.loads(body)["error"]["code"] == "request_timeout"
    assert f"within {READ_TIMEOUT_S:g}s" in json.loads(body)["error"]["message"]  # the configured deadline cut it


def test_a_trickling_body_is_cut_off_at_the_deadline_without_a_traceback(gateway):
    gw, token, _ = gateway
    data = _raw(gw, b"POST /retrieval/context HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"query\"")
    assert data.startswith(b"HTTP/1.1 408")
    _logged(gw, token)
    assert "Traceback" not in gw.logs()


def test_half_sent_headers_are_cut_off_at_the_deadline(gateway):
    gw, _, _ = gateway
    data = _raw(gw, b"POST /retrieval/con")
    assert data.startswith(b"HTTP/1.1 408")


def test_two_hundred_idle_connections_are_all_released(gateway):
    gw, token, _ = gateway
    port = int(gw.url.rsplit(":", 1)[1])
    socks = [socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S + 10) for _ in range(200)]
    try:
        closed = 0
        for s in socks:
            while s.recv(65536):
                pass
            closed += 1
        assert closed == 200
        assert _post(gw, token, b'{"query": "token"}').status_code == 200, "still serving afterwards"
    finally:
        for s in socks:
            s.close()


def test_keep_alive_requests_each_get_the_whole_deadline(gateway):
    gw, token, _ = gateway
    with gw.client(token) as c:
        for _ in range(3):
            assert c.post("/retrieval/context", json={"query": "token"}).status_code == 200
            time.sleep(READ_TIMEOUT_S * 0.6)  # inside uvicorn's 5 s keep-alive, so one connection serves all three


def test_access_log_prints_every_request(gateway):
    gw, token, _ = gateway
    _post(gw, token, b'{"query": "access log line"}')
    _logged(gw, token)
    assert '"POST /retrieval/context HTTP/1.1" 200' in gw.logs()


@pytest.mark.parametrize("args", [
    ["rag", "search", "--query", "x", "--filters", "run_id=a\udcff"],
    ["rag", "search", "--query", "x\udcff"],
    ["rag", "index", ".", "--repo", "a\udcff"],
    ["rag", "stats", "--repo", "a\udcff"],
    ["rag", "packs", "--run-id", "a\udcff"],
    ["rag", "overlay", "list", "--run-id", "a\udcff"],
    ["rag", "overlay", "clean", "--run-id", "a\udcff"],
], ids=["filter", "query", "index-repo", "stats", "packs", "overlay-list", "overlay-clean"])
def test_the_cli_refuses_argument_bytes_that_are_not_utf8_as_a_usage_error(gateway, args, tmp_path):
    _, _, env = gateway
    argv = [MOONMIND, *(a.encode("utf-8", "surrogateescape") for a in args)]
    r = subprocess.run(argv, env=env, capture_output=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == b""
    assert b"error[invalid_argument]" in r.stderr and b"not valid UTF-8" in r.stderr and b"Traceback" not in r.stderr
