"""Real HTTP servers on loopback for what cannot run here: a hosted embeddings API, a Qdrant that says 401/403.

`EmbeddingsServer` is the one OpenAI-compatible embeddings server of the suite.
By default its vectors come from the shipped static model, repeated `repeat`
times, so a collection embedded through it retrieves as well as the offline
model does while having a different name and dimension; `embed` swaps in other
vectors. Tests script its failures: the first N calls fail with a
status, every call fails, a 429 quota answer, a wrong bearer key, a delay, TCP
resets, or calls held mid-way until released.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class EmbeddingsServer:
    """POST /v1/embeddings like OpenAI (float or base64 answers), with scriptable failures.

    Vectors come from `embed` (texts -> vectors) when given, else from the shipped
    static model repeated `repeat` times. With `api_key` set, any other bearer gets
    OpenAI's 401 invalid_api_key answer; any path but /v1/embeddings gets 404.
    Every POST is recorded in `requests` (path, auth header and JSON body).
    """

    def __init__(self, repeat: int = 2, port: int = 0, embed: Callable[[list[str]], list[list[float]]] | None = None,
                 api_key: str | None = None) -> None:
        if embed is None:
            from moonmind_worker.embedding import StaticEmbedder

            model = StaticEmbedder()

            def embed(texts: list[str]) -> list[list[float]]:
                return [[float(x) for x in list(v) * repeat] for v in model.embed_documents(texts)]

        self._embed = embed
        self.api_key = api_key
        self.lock = threading.Lock()
        self.requests: list[dict] = []  # every POST, failed or not: {"path", "auth", **body}
        self.texts_embedded = 0  # texts in successful answers
        self.fail_first = 0  # the first N calls fail with fail_status
        self.fail_status = 503
        self.always_status: int | None = None  # every call answers this status
        self.quota = False  # answer 429 insufficient_quota
        self.delay_s = 0.0  # every call waits this long before answering
        self.reset_first = 0  # the first N calls get their TCP connection reset, no answer
        self.hold_after: int | None = None  # calls after the Nth wait for `released` (a sync caught mid-way)
        self.released = threading.Event()
        self.holding = threading.Event()  # set while a call is held
        self.pad_bytes = 0  # every answer carries this many bytes more (an answer too large to take)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with outer.lock:
                    outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                    n = len(outer.requests)
                    reset = outer.reset_first > 0
                    if reset:
                        outer.reset_first -= 1
                if reset:  # RST instead of an answer: a connection reset by peer
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                status, payload = outer._answer(n, self.path, self.headers.get("Authorization"), body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = _Server(("127.0.0.1", port), Handler)
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        # shutdown() waits up to one poll interval: a short one keeps every test's teardown short
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    @property
    def calls(self) -> int:
        """Every POST so far, reset, refused or answered."""
        return len(self.requests)

    def embedded_texts(self) -> list[str]:
        """Every text sent for embedding, in order (the last one is the latest query)."""
        return [t for r in self.requests if r["path"] == "/v1/embeddings"
                for t in (r["input"] if isinstance(r["input"], list) else [r["input"]])]

    def provider_env(self, api_key: str) -> dict[str, str]:
        """The variables that point the CLI's OpenAI-compatible provider here."""
        return {"MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": api_key, "OPENAI_BASE_URL": self.base_url}

    def _answer(self, n: int, path: str, auth: str | None, body: dict) -> tuple[int, dict]:
        if path != "/v1/embeddings":
            return 404, {"error": {"message": "not found"}}
        if self.api_key is not None and auth != f"Bearer {self.api_key}":
            return 401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.hold_after is not None and n > self.hold_after:
            self.holding.set()
            self.released.wait(timeout=120)
        if self.quota:
            return 429, {"error": {"message": "You exceeded your current quota, please check your plan.",
                                   "type": "insufficient_quota", "code": "insufficient_quota"}}
        status = self.always_status or (self.fail_status if n <= self.fail_first else None)
        if status:
            return status, {"error": {"message": f"scripted failure {status}", "type": "server_error"}}
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = []
        for i, vec in enumerate(self._embed(texts)):
            if body.get("encoding_format") == "base64":  # the openai client asks for this by default
                vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        with self.lock:
            self.texts_embedded += len(texts)
        words = sum(len(t.split()) for t in texts)
        answer = {"object": "list", "data": data, "model": body.get("model"),
                  "usage": {"prompt_tokens": words, "total_tokens": words}}
        if self.pad_bytes:
            answer["padding"] = "x" * self.pad_bytes
        return 200, answer

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class StatusServer:
    """Answers every request with one HTTP status and a Qdrant-shaped JSON error; counts requests."""

    def __init__(self, status: int, body: dict | None = None) -> None:
        self.status = status
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self) -> None:
                outer.requests.append(f"{self.command} {self.path}")
                length = int(self.headers.get("Content-Length", 0) or 0)
                if length:
                    self.rfile.read(length)
                data = json.dumps(body or {"status": {"error": f"HTTP {outer.status}"}, "time": 0.0}).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _reply  # noqa: N815

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentServer:
    """A TCP server on loopback that accepts every connection and never sends a byte (a wedged broker)."""

    def __init__(self) -> None:
        import threading

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
                self._held.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for c in self._held:
            c.close()
        self._sock.close()


def raw_exchange(port: int, data: bytes, wait_s: float = 10.0) -> bytes:
    """What a server on loopback sends back on a fresh connection after `data`, until it closes (a server
    that holds the connection past `wait_s` fails the test with a socket timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        if data:
            s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)
