"""Real HTTP servers on loopback for what cannot run here: a hosted embeddings API, a Qdrant that says 401/403.

`EmbeddingsServer` speaks the OpenAI embeddings protocol (POST /v1/embeddings).
Its vectors come from the shipped static model, repeated `repeat` times, so a
collection embedded through it retrieves as well as the offline model does while
having a different name and dimension. Tests script its failures: the first N
calls fail with a status, a 429 quota answer, a 401, or a delay.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class EmbeddingsServer:
    def __init__(self, repeat: int = 2, port: int = 0) -> None:
        from moonmind_worker.embedding import StaticEmbedder

        self.repeat = repeat
        self._model = StaticEmbedder()
        self.lock = threading.Lock()
        self.calls = 0  # every POST, failed or not
        self.texts_embedded = 0  # texts in successful answers
        self.fail_first = 0  # the first N calls fail with fail_status
        self.fail_status = 503
        self.always_status: int | None = None  # every call answers this status
        self.quota = False  # answer 429 insufficient_quota
        self.delay_s = 0.0
        self.reset_first = 0  # the first N calls get their TCP connection reset, no answer
        self.hold_after: int | None = None  # calls after the Nth wait for `released` (a sync caught mid-way)
        self.released = threading.Event()
        self.holding = threading.Event()  # set while a call is held
        self.auth_header: str | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with outer.lock:
                    reset = outer.reset_first > 0
                    if reset:
                        outer.reset_first -= 1
                        outer.calls += 1
                if reset:  # RST instead of an answer: a connection reset by peer
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                outer.auth_header = self.headers.get("Authorization")
                status, payload = outer._answer(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = _Server(("127.0.0.1", port), Handler)
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def _answer(self, body: dict) -> tuple[int, dict]:
        import time

        with self.lock:
            self.calls += 1
            n = self.calls
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
        vecs = self._model.embed_documents(texts)
        with self.lock:
            self.texts_embedded += len(texts)
        data = [
            {"object": "embedding", "index": i, "embedding": [float(x) for x in list(v) * self.repeat]}
            for i, v in enumerate(vecs)
        ]
        return 200, {"object": "list", "data": data, "model": body.get("model"),
                     "usage": {"prompt_tokens": 1, "total_tokens": 1}}

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
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
