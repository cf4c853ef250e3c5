"""`moonmind rag search|index --execution queue` against a real `celery worker` process on real Redis.

Store choice: the embedded store (Qdrant Edge) has one owning process. The sync reference
output is produced first by the CLI (which owns the store only while it runs), then the
same on-disk store is handed to the worker, which owns it from then on. Both modes thus
read the very same data, and no two processes ever hold the store at once.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import uuid

import pytest

from celery_helpers import purge, queue_env, redis, start_worker_process, stop, unique_queues, wait_for_consumer
from conftest import _SCRUB, FIXTURE_FILES, MOONMIND, write_tree

QUERY = ["rag", "search", "--query", "where are bearer tokens checked", "--filters", "repo=demo", "--top-k", "3"]


def run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([MOONMIND, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """An indexed home, the sync outputs, then a warm worker that owns the store."""
    base = tmp_path_factory.mktemp("queue")
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["MOONMIND_HOME"] = str(base / "home")
    sq, iq = unique_queues()
    env = queue_env(env, sq, iq)
    repo = write_tree(base / "repo", FIXTURE_FILES)
    assert run(env, "rag", "index", str(repo), "--repo", "demo", "--tenant", "acme").returncode == 0
    sync_text = run(env, *QUERY)
    sync_json = run(env, *QUERY, "--json")
    assert sync_text.returncode == 0 and sync_json.returncode == 0, sync_text.stderr
    proc = start_worker_process(env, [sq, iq], base / "worker.log")
    try:
        wait_for_consumer(sq, proc=proc)
        yield {"env": env, "base": base, "sq": sq, "iq": iq, "sync_text": sync_text, "sync_json": sync_json, "proc": proc}
    finally:
        stop(proc)
        purge(sq, iq)


#: Fields that differ between any two runs (ids, clocks); masked to compare the rest byte for byte.
VOLATILE = re.compile(r'("(?:telemetry_id|retrieved_at)": )"[^"]*"|("latency_ms": )[0-9.e+-]+')


def _masked(text: str) -> str:
    return VOLATILE.sub(lambda m: (m.group(1) or m.group(2)) + "<volatile>", text)


@pytest.mark.slow
def test_queue_search_prints_exactly_what_sync_prints(stack):
    r = run(stack["env"], *QUERY, "--execution", "queue")
    assert r.returncode == 0, r.stderr
    assert r.stdout == stack["sync_text"].stdout
    assert r.stderr == stack["sync_text"].stderr


@pytest.mark.slow
def test_queue_search_json_is_byte_identical_to_sync(stack, tmp_path):
    out = tmp_path / "pack.json"
    r = run(stack["env"], *QUERY, "--json", "--execution", "queue", "--output-file", str(out))
    assert r.returncode == 0, r.stderr
    sync = stack["sync_json"].stdout
    assert VOLATILE.search(sync), "the mask must match something"
    assert _masked(r.stdout) == _masked(sync)
    assert r.stderr == stack["sync_json"].stderr
    assert out.read_text(encoding="utf-8") == r.stdout
    queued = json.loads(r.stdout)
    assert queued["items"] and queued["items"][0]["source"] == "auth/tokens.py"


@pytest.mark.slow
def test_execution_mode_comes_from_the_environment(stack):
    r = run({**stack["env"], "MOONMIND_RAG_EXECUTION": "queue"}, *QUERY)
    assert r.returncode == 0 and r.stdout == stack["sync_text"].stdout


@pytest.mark.slow
def test_queue_mode_imports_no_pydantic_model_numpy_qdrant_or_celery(stack):
    r = run({**stack["env"], "PYTHONPROFILEIMPORTTIME": "1"}, *QUERY, "--execution", "queue")
    assert r.returncode == 0
    modules = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    imported = {m.split(".")[0] for m in modules}
    assert imported, "import profile missing"
    for heavy in ("pydantic", "pydantic_core", "numpy", "qdrant_client", "qdrant_edge", "tokenizers", "celery", "kombu",
                  "redis", "openai", "safetensors"):
        assert heavy not in imported, heavy
    assert "moonmind_worker.contracts" not in modules


@pytest.mark.slow
def test_queue_index_and_no_wait_return_a_task_id(stack):
    tree = write_tree(stack["base"] / f"tree-{uuid.uuid4().hex[:6]}", {"notes/cache.md": "# Cache\n\nEvictions use LRU order.\n"})
    r = run(stack["env"], "rag", "index", str(tree), "--repo", "notes", "--tenant", "acme", "--execution", "queue", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["files_indexed"] == 1 and report["chunks_written"] >= 1 and "line" not in report
    r = run(stack["env"], "rag", "index", str(tree), "--repo", "notes", "--execution", "queue", "--no-wait")
    assert r.returncode == 0
    assert str(uuid.UUID(r.stdout.strip())) == r.stdout.strip()


@pytest.mark.slow
def test_a_queued_index_waits_for_the_worker_not_for_the_search_timeout(stack):
    """Reported: a queued index of Django failed with task_timeout at 30 s while the worker finished at 52 s."""
    tree = write_tree(stack["base"] / f"tree-{uuid.uuid4().hex[:6]}", {"notes/pool.md": "# Pool\n\nConnections are reused.\n"})
    r = run({**stack["env"], "MOONMIND_QUEUE_TIMEOUT_S": "0.01"}, "rag", "index", str(tree), "--repo", "pool", "--tenant",
            "acme", "--execution", "queue", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files_indexed"] == 1


@pytest.mark.slow
def test_a_no_wait_task_is_read_back_with_task_status(stack):
    tree = write_tree(stack["base"] / f"tree-{uuid.uuid4().hex[:6]}", {"notes/ttl.md": "# TTL\n\nEntries expire.\n"})
    sent = run(stack["env"], "rag", "index", str(tree), "--repo", "ttl", "--tenant", "acme", "--execution", "queue",
               "--no-wait")
    assert sent.returncode == 0, sent.stderr
    task_id = sent.stdout.strip()
    deadline = time.monotonic() + 60
    status: dict = {}
    while time.monotonic() < deadline:
        st = run(stack["env"], "task", "status", task_id, "--json")
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        if status["state"] == "SUCCESS":
            break
        time.sleep(0.1)
    assert status["state"] == "SUCCESS" and status["result"]["files_indexed"] == 1
    text = run(stack["env"], "task", "status", task_id)
    assert text.returncode == 0 and text.stdout.startswith(f"{task_id}: success")


@pytest.mark.slow
def test_task_status_of_a_failed_task_exits_with_its_error(stack):
    sent = run(stack["env"], "rag", "index", str(stack["base"] / "no-such-dir"), "--repo", "x", "--execution", "queue",
               "--no-wait")
    assert sent.returncode == 0, sent.stderr
    task_id = sent.stdout.strip()
    deadline = time.monotonic() + 60
    st = run(stack["env"], "task", "status", task_id, "--json")
    while st.returncode == 0 and json.loads(st.stdout)["state"] == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.1)
        st = run(stack["env"], "task", "status", task_id, "--json")
    assert st.returncode == 2, st.stdout + st.stderr
    assert json.loads(st.stderr.strip().splitlines()[-1])["error"]["code"] == "invalid_argument"


@pytest.mark.slow
def test_no_worker_on_the_queue_is_named_and_nothing_is_sent(stack):
    nobody = f"test-nobody-{uuid.uuid4().hex[:8]}"
    # refused before any wait for a result: well inside a timeout a queued search would need
    r = run({**stack["env"], "MOONMIND_SEARCH_QUEUE": nobody}, *QUERY, "--execution", "queue", "--json", timeout=10)
    assert r.returncode == 4 and r.stdout == ""
    assert json.loads(r.stderr.strip().splitlines()[-1])["error"]["code"] == "worker_unavailable"
    assert redis().llen(nobody) == 0


@pytest.mark.slow
def test_no_result_within_the_timeout_is_a_timeout_error(stack):
    stale = f"test-stale-{uuid.uuid4().hex[:8]}"
    r = redis()
    r.zadd(f"moonmind:consumers:{stale}", {"gone@host": time.time()})  # a worker that died after its heartbeat
    try:
        res = run({**stack["env"], "MOONMIND_SEARCH_QUEUE": stale}, *QUERY, "--execution", "queue", "--timeout", "1",
                  timeout=30)
        assert res.returncode == 5 and res.stdout == ""
        assert "error[task_timeout]" in res.stderr and "within 1s" in res.stderr  # the --timeout it waited
        message = json.loads(r.lindex(stale, 0))
        assert message["headers"]["expires"], "a timed-out search must expire instead of running late"
    finally:
        purge(stale)


@pytest.mark.slow
def test_broker_down_is_named_within_the_timeout(stack):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run({**stack["env"], "CELERY_BROKER_URL": f"redis://127.0.0.1:{port}/4"}, *QUERY, "--execution", "queue", "--timeout", "2",
            timeout=30)
    assert r.returncode == 4 and r.stdout == ""
    assert "error[broker_unreachable]" in r.stderr and f"127.0.0.1:{port}" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad",
    [
        ["--query", ""],
        ["--query", "   "],
        ["--query", "tokens", "--top-k", "0"],
        ["--query", "tokens", "--filters", "colour=red"],
        ["--query", "tokens", "--score-threshold", "2"],
    ],
    ids=["empty", "blank", "top_k-0", "unknown-filter", "threshold"],
)
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_invalid_query_gives_the_error_sync_gives(stack, bad, as_json):
    """Validated once, on the worker, with the sync path's function: same code, message, action and exit code."""
    args = ["rag", "search", *bad, *(["--json"] if as_json else [])]
    sync = run(stack["env"], *args)
    queued = run(stack["env"], *args, "--execution", "queue")
    assert sync.returncode == 2 and "invalid_query" in sync.stderr
    assert (queued.returncode, queued.stdout, queued.stderr) == (sync.returncode, sync.stdout, sync.stderr)


def test_the_cli_key_checks_stay_within_the_contracts():
    """`expect_keys` is a cheap version check; its key lists must name real, required contract fields."""
    from moonmind_worker.cli.overlay import OVERLAY_CLEAN_KEYS, OVERLAY_REPORT_KEYS
    from moonmind_worker.cli.rag import INDEX_REPORT_KEYS, PACK_KEYS, expect_keys
    from moonmind_worker.contracts import ContextPack, IndexReport, OverlayCleanResult, OverlayReport
    from moonmind_worker.errors import MoonmindError

    for keys, model in ((PACK_KEYS, ContextPack), (INDEX_REPORT_KEYS, IndexReport), (OVERLAY_REPORT_KEYS, OverlayReport),
                        (OVERLAY_CLEAN_KEYS, OverlayCleanResult)):
        assert set(keys) <= set(model.model_fields), model.__name__
    pack = {"context_text": "", "items": [], "filters": {}, "retrieved_at": "t", "telemetry_id": "i", "notes": []}
    assert expect_keys(pack, PACK_KEYS, "a ContextPack") is pack
    for broken in ({k: v for k, v in pack.items() if k != "notes"}, ["not", "a", "dict"], None):
        with pytest.raises(MoonmindError) as info:
            expect_keys(broken, PACK_KEYS, "a ContextPack")
        assert info.value.code == "internal_error" and "same moonmind-worker version" in info.value.action


@pytest.mark.slow
def test_the_workers_info_log_holds_no_retrieved_text(stack):
    """Celery logs a task's return value at INFO by default: for a search, code from the pack."""
    r = run(stack["env"], *QUERY, "--execution", "queue", "--json")
    assert r.returncode == 0, r.stderr
    snippet = json.loads(r.stdout)["items"][0]["text"].strip().splitlines()[0]
    log = (stack["base"] / "worker.log").read_text()
    assert "succeeded in" in log
    assert snippet not in log and "context_text" not in log
