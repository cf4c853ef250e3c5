"""Real parts for the gateway tests: a `moonmind gateway serve` subprocess on a free loopback port,
and a local HTTP server speaking the OpenAI embeddings protocol (deterministic, optionally slow or failing)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from conftest import MOONMIND, _SCRUB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    e["MOONMIND_HOME"] = str(home)
    e.update(extra)
    return e


def run_cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([MOONMIND, *args], capture_output=True, text=True, env=env, timeout=timeout)


def add_token(env: dict[str, str], name: str, repos: list[str], tenants: list[str], max_top_k: int | None = None) -> str:
    args = ["gateway", "add-token", "--name", name]
    for r in repos:
        args += ["--repo", r]
    for t in tenants:
        args += ["--tenant", t]
    if max_top_k:
        args += ["--max-top-k", str(max_top_k)]
    r = run_cli(*args, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@dataclass
class Gateway:
    proc: subprocess.Popen
    url: str
    log: Path

    def client(self, token: str | None = None, timeout: float = 30) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


def start_gateway(home: Path, env: dict[str, str], log_dir: Path) -> Gateway:
    """`moonmind gateway serve` on a free port; returns once it answers."""
    port = free_port()
    log = log_dir / f"gateway-{port}.log"
    fh = open(log, "wb")
    proc = subprocess.Popen(
        [MOONMIND, "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=fh, stderr=subprocess.STDOUT,
    )
    gw = Gateway(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}: {gw.logs()}")
        try:
            httpx.get(gw.url + "/retrieval/health", timeout=2)
            return gw
        except httpx.TransportError:
            time.sleep(0.1)
    gw.stop()
    raise RuntimeError("gateway did not start: " + gw.logs())


def copy_home(src: Path, dst: Path) -> Path:
    """A copy of an indexed MOONMIND_HOME: the embedded store has one owning process at a time."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("owner.lock"))
    return dst


# ------------------------------------------------- OpenAI-compatible embeddings server ---

DIMS = 64
_WORD = re.compile(r"[A-Za-z0-9_]+")


def fake_embedding(text: str) -> list[float]:
    """Deterministic bag-of-hashed-words vector: similar texts get similar vectors."""
    v = [0.0] * DIMS
    for w in _WORD.findall(text.lower()):
        h = int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "big")
        v[h % DIMS] += 1.0 if (h >> 16) & 1 else -1.0
    n = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / n for x in v]


class EmbeddingsServer:
    """POST /v1/embeddings like OpenAI's. `delay_s` makes it slow; `fail_status` makes it fail."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.fail_status: int | None = None
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):  # noqa: N802
                outer.requests += 1
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                if outer.fail_status:
                    out = json.dumps({"error": {"message": "upstream exploded", "type": "server_error"}}).encode()
                    self.send_response(outer.fail_status)
                else:
                    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                    data = [{"object": "embedding", "index": i, "embedding": fake_embedding(t)} for i, t in enumerate(inputs)]
                    out = json.dumps({"object": "list", "data": data, "model": body.get("model"),
                                      "usage": {"prompt_tokens": 1, "total_tokens": 1}}).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                try:
                    self.wfile.write(out)
                except OSError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def index_in_process(home: Path, root: Path, pairs: list[tuple[str, str]], **settings_kw) -> None:
    """Index `root` once per (repo, tenant) in this process (one model load), then release the store."""
    from moonmind_worker.embedding import make_embedder
    from moonmind_worker.indexer import index_repository
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store

    settings = Settings(_env_file=None, moonmind_home=home, **settings_kw)
    embedder, store = make_embedder(settings), open_store(settings)
    try:
        for repo, tenant in pairs:
            index_repository(root, repo=repo, tenant=tenant, settings=settings, embedder=embedder, store=store)
    finally:
        store.close()
