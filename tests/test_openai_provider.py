"""The OpenAI-compatible embedding provider against a real local HTTP server.

The server speaks POST /v1/embeddings like OpenAI (float or base64 encoding) and
returns deterministic hashed bag-of-words vectors, so retrieval through it is
meaningful: a query shares words with the chunk it should find.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import FIXTURE_FILES

DIMS = 64
MODEL = "hash-bow-64"
KEY = "sk-test-0123456789abcdef"


def bow_vector(text: str) -> list[float]:
    v = [0.0] * DIMS
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        v[zlib.crc32(word.encode()) % DIMS] += 1.0
    return v


class EmbeddingsServer:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.fail_next: list[int] = []  # HTTP statuses to answer before succeeding again
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                if self.path != "/v1/embeddings":
                    return self._send(404, {"error": {"message": "not found"}})
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    return self._send(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
                if server.fail_next:
                    return self._send(server.fail_next.pop(0), {"error": {"message": "try again"}})
                inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                data = []
                for i, text in enumerate(inputs):
                    vec = bow_vector(text)
                    if body.get("encoding_format") == "base64":
                        vec = base64.b64encode(struct.pack(f"<{DIMS}f", *vec)).decode()
                    data.append({"object": "embedding", "index": i, "embedding": vec})
                n = sum(len(t.split()) for t in inputs)
                self._send(200, {"object": "list", "data": data, "model": body["model"],
                                 "usage": {"prompt_tokens": n, "total_tokens": n}})

            def _send(self, status: int, payload: dict) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def embedded_texts(self) -> list[str]:
        return [t for r in self.requests if r.get("path") == "/v1/embeddings" for t in (r["input"] if isinstance(r["input"], list) else [r["input"]])]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = EmbeddingsServer()
    yield s
    s.close()


@pytest.fixture
def openai_env(server):
    return {
        "MOONMIND_EMBEDDING_PROVIDER": "openai",
        "OPENAI_BASE_URL": server.url,
        "OPENAI_API_KEY": KEY,
        "MOONMIND_EMBEDDING_MODEL": MODEL,
        "MOONMIND_EMBEDDING_BATCH_SIZE": "3",
    }


def test_index_and_search_end_to_end_through_the_provider(cli, repo, server, openai_env):
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=openai_env)
    assert r.code == 0, r.stderr
    assert r.json()["files_indexed"] == len(FIXTURE_FILES)
    assert server.requests and all(q["model"] == MODEL and q["auth"] == f"Bearer {KEY}" for q in server.requests)
    assert all(len(q["input"]) <= 3 for q in server.requests)  # MOONMIND_EMBEDDING_BATCH_SIZE

    r = cli("rag", "search", "--query", "where are bearer tokens checked", "--filters", "repo=demo", "--json",
            extra_env=openai_env)
    assert r.code == 0, r.stderr
    pack = r.json()
    assert pack["items"][0]["source"] == "auth/tokens.py"
    assert {i["model_version"] for i in pack["items"]} == {MODEL}
    assert server.embedded_texts()[-1] == "where are bearer tokens checked"


def test_query_whitespace_is_normalised_before_embedding(cli, repo, server, openai_env):
    assert cli("rag", "index", str(repo), "--repo", "demo", extra_env=openai_env).code == 0
    r = cli("rag", "search", "--query", "  connection\n\tpool   ", "--filters", "repo=demo", extra_env=openai_env)
    assert r.code == 0, r.stderr
    assert server.embedded_texts()[-1] == "connection pool"


def test_unchanged_re_index_makes_no_embedding_requests(cli, repo, server, openai_env):
    assert cli("rag", "index", str(repo), "--repo", "demo", extra_env=openai_env).code == 0
    before = len(server.requests)
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=openai_env)
    assert r.code == 0, r.stderr
    assert r.json()["files_unchanged"] == len(FIXTURE_FILES)
    assert len(server.requests) == before


def test_rejected_key_is_unauthenticated_without_leaking_it(cli, repo, server, openai_env):
    env = {**openai_env, "OPENAI_API_KEY": "sk-wrong-secret-value"}
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=env)
    assert r.code == 4 and r.stdout == ""
    assert r.error()["code"] == "unauthenticated"
    assert "sk-wrong-secret-value" not in r.stderr and "Traceback" not in r.stderr
    assert len(server.requests) == 1  # auth failures are not retried


def test_transient_server_error_is_retried(cli, repo, server, openai_env):
    server.fail_next = [503]
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=openai_env)
    assert r.code == 0, r.stderr
    assert r.json()["files_indexed"] == len(FIXTURE_FILES)


def test_missing_key_is_refused_before_any_request(cli, repo, server, openai_env):
    env = {**openai_env, "OPENAI_API_KEY": ""}
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=env)
    assert r.code == 3 and r.error()["code"] == "missing_credentials"
    assert "OPENAI_API_KEY" in r.error()["message"]
    assert server.requests == []
