"""`moonmind gateway serve` as an operator meets it (issue 19): a start line, offline docs, and health
that tells "up, no collection yet" from "ready". Real gateway processes on loopback."""

from __future__ import annotations

import re
import subprocess
import time

import httpx
import pytest

from conftest import MOONMIND
from gateway_helpers import add_token, clean_env, start_gateway

pytestmark = pytest.mark.slow

START = re.compile(r"^moonmind gateway: listening on (http://127\.0\.0\.1:(\d+)) \(workers (\d+), store embedded (\S+), tokens (\S+)\)")


def test_serve_prints_a_start_line_with_the_real_address_workers_and_store(home, tmp_path):
    env = clean_env(home)
    add_token(env, "w", ["demo"], ["default"])
    proc = subprocess.Popen([MOONMIND, "gateway", "serve", "--port", "0"], env=env, stderr=subprocess.PIPE, text=True,
                            stdout=subprocess.DEVNULL)
    try:
        deadline, match = time.monotonic() + 60, None
        while match is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "the gateway exited before its start line"
            match = START.match(line)
        assert match, "no start line"
        url, port, workers, store, tokens = match.groups()
        assert int(port) > 0 and workers == "1"
        assert store == str(home / "qdrant-edge" / "moonmind__repo") and tokens == str(home / "gateway-tokens.json")
        assert httpx.get(url + "/retrieval/live", timeout=30).json() == {"status": "up"}
    finally:
        proc.terminate()
        proc.wait(15)


def test_docs_and_redoc_load_every_asset_from_the_gateway_itself(home, tmp_path):
    env = clean_env(home)
    add_token(env, "w", ["demo"], ["default"])
    gw = start_gateway(home, env, tmp_path)
    try:
        with gw.client() as http:
            for page in ("/docs", "/redoc"):
                r = http.get(page)
                assert r.status_code == 200 and "text/html" in r.headers["content-type"]
                refs = re.findall(r"""(?:src|href)=["']([^"']+)["']""", r.text) + re.findall(r"url: ?'([^']+)'", r.text)
                assert refs, r.text
                assert not [u for u in refs if "://" in u], f"{page} loads from elsewhere: {refs}"
                assert "googleapis" not in r.text and "jsdelivr" not in r.text
                for ref in refs:
                    asset = http.get(ref)
                    assert asset.status_code == 200 and asset.content, ref
    finally:
        gw.stop()


def test_a_fresh_gateway_is_live_but_not_ready_until_the_first_index(home, repo, tmp_path):
    env = clean_env(home)
    add_token(env, "w", ["demo"], ["default"])
    gw = start_gateway(home, env, tmp_path)
    try:
        with gw.client() as http:
            live, health = http.get("/retrieval/live"), http.get("/retrieval/health")
            assert live.status_code == 200 and live.json() == {"status": "up"}
            assert health.status_code == 503
            assert health.json()["reason"] == "collection_not_ready" and health.headers["retry-after"] == "10"
            # the gateway holds the embedded store and serves this box's commands: index through it
            indexed = subprocess.run([MOONMIND, "rag", "index", str(repo), "--repo", "demo"], env=env,
                                     capture_output=True, text=True, timeout=120)
            assert indexed.returncode == 0, indexed.stderr
            deadline = time.monotonic() + 10
            while (health := http.get("/retrieval/health")).status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.2)  # the health answer is cached for a second
            assert health.status_code == 200 and health.json() == {"status": "ok"}
            assert "retry-after" not in health.headers
    finally:
        gw.stop()
