"""Real parts for the gateway tests: a `moonmind gateway serve` subprocess on a free loopback port,
and in-process indexing of fixture trees (one model load for several repos/tenants)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx

from conftest import _SCRUB, MOONMIND


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


def start_gateway(home: Path, env: dict[str, str], log_dir: Path, *args: str) -> Gateway:
    """`moonmind gateway serve [args]` on a free port; returns once it answers."""
    port = free_port()
    log = log_dir / f"gateway-{port}.log"
    fh = open(log, "wb")
    proc = subprocess.Popen(
        [MOONMIND, "gateway", "serve", "--host", "127.0.0.1", "--port", str(port), *args],
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


def index_in_process(home: Path, root: Path, pairs: list[tuple[str, str]], **settings_kw) -> None:
    """Index `root` once per (repo, tenant) in this process (one model load), then release the store."""
    from moonmind_worker.embedding import make_embedder
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store

    settings = Settings(_env_file=None, moonmind_home=home, **settings_kw)
    embedder, store = make_embedder(settings), open_store(settings)
    try:
        for repo, tenant in pairs:
            index_repository(root, repo=repo, tenant=tenant, settings=settings, embedder=embedder, store=store)
    finally:
        store.close()


def overlay_in_process(home: Path, root: Path, paths: list[str], runs: list[tuple[str, str, str]]) -> None:
    """Write workspace overlays for `paths` once per (run_id, repo, tenant), then release the store."""
    from moonmind_worker.embedding import make_embedder
    from moonmind_worker.indexing.overlay import upsert_overlay
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store

    settings = Settings(_env_file=None, moonmind_home=home)
    embedder, store = make_embedder(settings), open_store(settings)
    try:
        for run_id, repo, tenant in runs:
            upsert_overlay([root / p for p in paths], root=root, run_id=run_id, ttl_s=3600, repo=repo, tenant=tenant,
                           settings=settings, embedder=embedder, store=store)
    finally:
        store.close()


@contextmanager
def scoped_client(repos: list[str], tenants: list[str]) -> Iterator[tuple[Any, str]]:
    """The gateway app in process (FastAPI's TestClient) and a new bearer token scoped to `repos` × `tenants`."""
    from fastapi.testclient import TestClient

    from moonmind_worker.contracts import TokenGrant
    from moonmind_worker.gateway.app import create_app
    from moonmind_worker.gateway.auth import add_token as add_grant
    from moonmind_worker.gateway.auth import hash_token, new_token
    from moonmind_worker.settings import get_settings

    settings = get_settings()
    token = new_token()
    add_grant(settings.tokens_file, TokenGrant(name="w", hash=hash_token(token), repos=repos, tenants=tenants))
    with TestClient(create_app(settings)) as client:
        yield client, token
