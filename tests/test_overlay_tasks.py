"""Overlay tasks on real workers: a worker killed mid-upsert is finished by another with exactly
the expected points; the beat sweep removes expired overlays only; job end cleans the run."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest

from celery_helpers import (
    BACKEND,
    BROKER,
    configure_app,
    purge,
    queue_env,
    redis,
    start_worker_process,
    stop,
    unique_queues,
    wait_for_consumer,
)
from conftest import _SCRUB, FIXTURE_FILES, MOONMIND, write_tree

pytestmark = pytest.mark.slow


def _overlay_ids(home, run_id: str) -> dict[str, str]:
    """{point id: chunk_hash} of a run's overlay, read from the embedded store at `home` (no worker running)."""
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import Match, Where, open_store

    store = open_store(Settings(MOONMIND_HOME=str(home)))
    try:
        where = Where(must=(Match("run_id", run_id), Match("trust_class", "workspace_overlay")))
        return {h.id: h.payload["chunk_hash"] for h in store.scroll(where, ["chunk_hash"])}
    finally:
        store.close()


def _store_bytes(home) -> int:
    """The embedded store's size on disk: it grows when a write lands (a file, or the engine's temporary
    directory, may vanish while it is summed: os.walk skips a directory it can no longer list)."""
    total = 0
    for folder, _, files in os.walk(home / "qdrant-edge"):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


def _workspace(root, n_files: int):
    files = {}
    for i in range(n_files):
        body = "\n\n".join(
            f"def handler_{i}_{j}(request):\n    \"\"\"Handle request {j} of module {i}: validate, cache, respond.\"\"\"\n"
            f"    token = request.headers.get('Authorization', '')\n    return {{'module': {i}, 'step': {j}, 'token': token}}\n"
            for j in range(12)
        )
        files[f"pkg{i % 20}/mod_{i}.py"] = body
    return write_tree(root, files)


def test_a_worker_killed_mid_upsert_is_finished_by_another_with_exactly_the_expected_points(tmp_path):
    import subprocess

    base_env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    sq, iq = unique_queues()
    home, ref_home = tmp_path / "home", tmp_path / "ref-home"
    env = queue_env({**base_env, "MOONMIND_HOME": str(home)}, sq, iq)
    env["MOONMIND_BROKER_VISIBILITY_TIMEOUT_S"] = "2"  # a lost write comes back after 2 s, not 1 h
    ref_env = {**env, "MOONMIND_HOME": str(ref_home)}
    repo = write_tree(tmp_path / "repo", FIXTURE_FILES)
    ws = _workspace(tmp_path / "ws", 300)
    paths = sorted(str(p) for p in ws.rglob("*.py"))
    run_id = f"run-{uuid.uuid4().hex[:6]}"
    for e in (env, ref_env):
        assert subprocess.run([MOONMIND, "rag", "index", str(repo), "--repo", "demo", "--tenant", "acme"], env=e,
                              capture_output=True, timeout=120).returncode == 0
    # the reference: the same upsert, uninterrupted, in a store of its own
    ref = subprocess.run([MOONMIND, "rag", "overlay", "upsert", *paths, "--root", str(ws), "--run-id", run_id,
                          "--repo", "demo", "--tenant", "acme", "--json"], env=ref_env, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    expected = _overlay_ids(ref_home, run_id)
    assert len(expected) == json.loads(ref.stdout)["chunks_written"] >= 600

    first = start_worker_process(env, [sq, iq], tmp_path / "w1.log")
    second = None
    try:
        wait_for_consumer(iq, proc=first)
        sent = subprocess.run([MOONMIND, "rag", "overlay", "upsert", *paths, "--root", str(ws), "--run-id", run_id,
                               "--repo", "demo", "--tenant", "acme", "--execution", "queue", "--no-wait"],
                              env=env, capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        task_id = sent.stdout.strip()
        log = tmp_path / "w1.log"
        deadline = time.monotonic() + 60
        while task_id not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert task_id in log.read_text(), "the first worker never received the upsert"
        written = _store_bytes(home)
        while _store_bytes(home) == written:  # mid-upsert: the first overlay points reached the store
            assert time.monotonic() < deadline, "the first worker never wrote"
            time.sleep(0.01)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        results = redis(int(BACKEND.rsplit("/", 1)[1]))
        assert results.get(f"celery-task-meta-{task_id}") is None, "the upsert finished before the kill; grow the workspace"

        broker = redis(int(BROKER.rsplit("/", 1)[1]))
        deadline = time.monotonic() + 60
        while not broker.zrangebyscore("unacked_index", "-inf", time.time() - 2):  # the delivery is past the visibility timeout
            assert time.monotonic() < deadline, "the killed worker's delivery is not in the unacked index"
            time.sleep(0.05)
        second = start_worker_process(env, [sq, iq], tmp_path / "w2.log")
        deadline = time.monotonic() + 120
        meta = None
        while time.monotonic() < deadline:
            raw = results.get(f"celery-task-meta-{task_id}")
            if raw and json.loads(raw)["status"] in ("SUCCESS", "FAILURE"):
                meta = json.loads(raw)
                break
            time.sleep(0.2)
        assert meta is not None and meta["status"] == "SUCCESS", meta
    finally:
        stop(first)
        if second is not None:
            stop(second)
        purge(sq, iq)
    assert _overlay_ids(home, run_id) == expected  # nothing lost, nothing duplicated, same chunks


@pytest.fixture
def app_queues(env, monkeypatch):
    sq, iq = unique_queues()
    for k, v in queue_env({}, sq, iq).items():
        monkeypatch.setenv(k, v)
    yield configure_app(sq, iq), sq, iq
    purge(sq, iq)


def test_the_beat_sweep_removes_expired_overlays_only(indexed, app_queues, tmp_path):
    from celery.contrib.testing.worker import start_worker

    from moonmind_worker import runtime
    from moonmind_worker.indexing.overlay import upsert_overlay
    from moonmind_worker.settings import get_settings
    from moonmind_worker.store import Match, Where
    from tasks.celeryapp import SWEEP_SCHEDULE_NAME

    app, sq, iq = app_queues
    settings = get_settings()
    store, embedder = runtime.get_store(settings), runtime.get_embedder(settings)
    ws = write_tree(tmp_path / "ws", {"auth/tokens.py": "def check_bearer_token(h):\n    return h.startswith('Bearer ')\n"})
    expiry = {}
    for run_id, ttl in (("run-old", 0.01), ("run-live", 3600.0)):
        expiry[run_id] = upsert_overlay([ws / "auth/tokens.py"], root=ws, run_id=run_id, ttl_s=ttl, repo="demo",
                                        tenant="acme", settings=settings, embedder=embedder, store=store).expires_at
    canonical = store.count(Where(must=(Match("trust_class", "canonical"),)))
    live = store.count(Where(must=(Match("run_id", "run-live"),)))
    old = store.count(Where(must=(Match("run_id", "run-old"),)))
    assert old > 0 and live > 0
    stale_run = settings.artifacts_root / "run-long-gone"  # packs past the 30-day default retention
    stale_run.mkdir(parents=True)
    (stale_run / "breadcrumbs.jsonl").write_text("{}\n")
    month_ago = time.time() - 40 * 86400
    os.utime(stale_run / "breadcrumbs.jsonl", (month_ago, month_ago))
    deadline = time.monotonic() + 10
    while time.time() <= expiry["run-old"]:  # until the short-lived overlay is past its expiry
        assert time.monotonic() < deadline
        time.sleep(0.005)
    entry = app.conf.beat_schedule[SWEEP_SCHEDULE_NAME]
    with start_worker(app, pool="solo", perform_ping_check=False, queues=[iq], shutdown_timeout=10):
        result = app.send_task(entry["task"], **entry.get("options", {})).get(timeout=60)
    assert result == {"removed": old, "run_id": None, "expired": True, "artifacts_pruned": 1}
    assert not stale_run.exists()
    assert store.count(Where(must=(Match("run_id", "run-old"),))) == 0
    assert store.count(Where(must=(Match("run_id", "run-live"),))) == live
    assert store.count(Where(must=(Match("trust_class", "canonical"),))) == canonical
