"""The Celery tasks, run by a real in-process worker (`celery.contrib.testing.worker`) on real Redis."""

from __future__ import annotations

import subprocess
import sys

import pytest
from celery.contrib.testing.worker import start_worker

from celery_helpers import BROKER, CELERY, ROOT, configure_app, purge, queue_env, start_worker_process, stop, unique_queues
from conftest import FIXTURE_FILES, write_tree


@pytest.fixture
def queues(env, monkeypatch):
    sq, iq = unique_queues()
    for k, v in queue_env({}, sq, iq).items():
        monkeypatch.setenv(k, v)
    yield sq, iq
    purge(sq, iq)


@pytest.fixture
def app(queues):
    return configure_app(*queues)


def _comparable(pack: dict) -> dict:
    out = dict(pack)
    for volatile in ("telemetry_id", "retrieved_at", "usage"):
        out.pop(volatile)
    # whether the tree changed since it was indexed is the operation's word (owner/freshness.py), not the pipeline's
    out.pop("freshness", None)
    out.pop("stale_paths", None)
    return out


@pytest.mark.slow
def test_search_task_returns_the_same_pack_as_the_pipeline(indexed, app, queues):
    from moonmind_worker import runtime
    from moonmind_worker.contracts import ContextPack, parse_query
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import get_settings

    query = {"query": "where are bearer tokens checked", "filters": {"repo": "demo"}, "top_k": 3}
    settings = get_settings()
    direct = retrieve_context_pack(
        parse_query(query), settings=settings, embedder=runtime.get_embedder(settings), store=runtime.get_store(settings)
    )
    with start_worker(app, pool="solo", perform_ping_check=False, queues=[queues[0]], shutdown_timeout=10):
        result = app.send_task("moonmind.rag.search", kwargs={"query": query}).get(timeout=30)
    pack = ContextPack.model_validate(result)
    assert pack.items and pack.items[0].source == "auth/tokens.py"
    assert _comparable(pack.model_dump(mode="json")) == _comparable(direct.model_dump(mode="json"))


def test_search_is_routed_to_the_search_queue_and_index_to_the_bulk_queue(app, queues):
    router = app.amqp.router
    assert router.route({}, "moonmind.rag.search")["queue"].name == queues[0]
    for name in ("moonmind.rag.index", "moonmind.rag.overlay_upsert", "moonmind.rag.overlay_clean",
                 "moonmind.rag.sweep_expired_overlays"):
        assert router.route({}, name)["queue"].name == queues[1], name


@pytest.mark.slow
def test_index_task_indexes_a_tree_and_a_rerun_writes_nothing(env, app, queues, tmp_path):
    from moonmind_worker.contracts import IndexReport

    tree = write_tree(tmp_path / "tree", FIXTURE_FILES)
    request = {"path": str(tree), "repo": "demo", "tenant": "acme"}
    with start_worker(app, pool="solo", perform_ping_check=False, queues=[queues[1]], shutdown_timeout=10):
        first = IndexReport.model_validate(app.send_task("moonmind.rag.index", kwargs={"request": request}).get(timeout=60))
        second = IndexReport.model_validate(app.send_task("moonmind.rag.index", kwargs={"request": request}).get(timeout=60))
    assert first.files_indexed == len(FIXTURE_FILES) and first.chunks_written > 0
    assert second.files_unchanged == len(FIXTURE_FILES) and second.chunks_written == 0
    assert second.line.startswith("indexed repo=demo tenant=acme")


@pytest.mark.slow
def test_a_failing_task_carries_the_error_code_message_and_action(indexed, app, queues):
    with start_worker(app, pool="solo", perform_ping_check=False, queues=[queues[0]], shutdown_timeout=10):
        res = app.send_task("moonmind.rag.search", kwargs={"query": {"query": "x", "filters": {"colour": "red"}}})
        res.get(timeout=30, propagate=False)
    assert res.state == "FAILURE"
    code, message, action = res.result.args
    assert code == "invalid_query" and "colour" in message and "--filters" in action


def test_write_tasks_survive_a_lost_worker_and_searches_do_not_retry(app):
    for name in ("moonmind.rag.index",):
        t = app.tasks[name]
        assert t.acks_late and t.reject_on_worker_lost and t.max_retries > 0, name
        assert t.soft_time_limit < t.time_limit
    s = app.tasks["moonmind.rag.search"]
    assert not s.acks_late and s.soft_time_limit < s.time_limit


def test_beat_schedule_runs_the_sweep_on_the_configured_interval(env, monkeypatch):
    from moonmind_worker.settings import get_settings
    from tasks.celeryapp import SWEEP_SCHEDULE_NAME, make_app

    monkeypatch.setenv("MOONMIND_OVERLAY_SWEEP_INTERVAL_S", "42")
    get_settings.cache_clear()
    entry = make_app(get_settings()).conf.beat_schedule[SWEEP_SCHEDULE_NAME]
    assert entry["task"] == "moonmind.rag.sweep_expired_overlays"
    assert entry["schedule"] == 42.0


@pytest.mark.slow
def test_beat_keeps_its_schedule_file_in_moonmind_home_not_in_the_checkout_it_started_from(env, home, tmp_path):
    """Issue 52: `celery -B` wrote celerybeat-schedule.* into the checkout, and the owner's watcher indexed it."""
    import time

    sq, iq = unique_queues()
    before = set(ROOT.glob("celerybeat-schedule*"))
    e = {**queue_env(env, sq, iq), "MOONMIND_OVERLAY_SWEEP_INTERVAL_S": "1"}
    log = tmp_path / "worker.log"
    proc = start_worker_process(e, [sq, iq], log, "-B")  # no --schedule: the default file (the worker runs in ROOT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not list(home.glob("celerybeat-schedule*")):
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.1)  # polling for the file, not a synchronization
    finally:
        stop(proc)
        purge(sq, iq)
    assert list(home.glob("celerybeat-schedule*")), log.read_text()[-3000:]
    assert set(ROOT.glob("celerybeat-schedule*")) == before


@pytest.mark.slow
def test_prefork_with_many_processes_on_the_embedded_store_is_refused_at_start(env):
    e = queue_env(env, *unique_queues())
    # refused at start: a worker that went on to serve would raise TimeoutExpired here
    p = subprocess.run([CELERY, "-A", "tasks", "worker", "--pool", "prefork", "-c", "2", "-Q", e["MOONMIND_SEARCH_QUEUE"]],
                       env=e, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert p.returncode == 3
    assert "one owning process" in p.stderr and "--pool solo" in p.stderr and "QDRANT_URL" in p.stderr


@pytest.mark.slow  # a real prefork worker, and an index run that starts worker processes from it
def test_an_index_task_on_a_plain_prefork_worker_runs_its_index_workers(env, tmp_path):
    """`celery -A tasks worker` runs tasks in its prefork pool's process, which is daemonic, and
    multiprocessing refuses children to a daemonic process: every index task large enough to start
    its index workers failed there (AssertionError), though the same run worked from the CLI."""
    import json

    from celery_helpers import start_worker_process, stop, wait_for_consumer
    from conftest import MOONMIND

    sq, iq = unique_queues()
    e = queue_env(env, sq, iq)
    e.update(MOONMIND_INDEX_WORKERS="2", MOONMIND_OWNER="off")  # workers from the first file on
    files = {f"pkg/m{i}.py": "".join(f"def f{i}_{j}(x):\n    return x + {j}\n\n\n" for j in range(40)) for i in range(30)}
    tree = write_tree(tmp_path / "tree", files)
    proc = start_worker_process(e, [sq, iq], tmp_path / "worker.log", "--pool", "prefork")  # the default pool
    try:
        wait_for_consumer(iq, proc=proc)
        r = subprocess.run([MOONMIND, "rag", "index", str(tree), "--repo", "pre", "--execution", "queue", "--json",
                            "--timeout", "120"], env=e, capture_output=True, text=True, timeout=180)
    finally:
        stop(proc)
        purge(sq, iq)
    log = (tmp_path / "worker.log").read_text()
    assert "concurrency: 1 (prefork)" in log, log[-2000:]
    assert r.returncode == 0, (r.stderr, log[-3000:])
    report = json.loads(r.stdout)
    assert report["files_indexed"] == 30 and report["chunks_written"] > 0
    assert report["worker_died"] is False  # the index workers ran: none was lost and none failed to start


def test_many_processes_are_allowed_on_a_qdrant_server(env, monkeypatch):
    from moonmind_worker.settings import get_settings
    from tasks.celeryapp import embedded_store_refusal

    assert embedded_store_refusal("prefork", 4, get_settings()) is not None
    assert embedded_store_refusal("solo", 1, get_settings()) is None
    assert embedded_store_refusal("threads", 4, get_settings()) is None
    monkeypatch.setenv("QDRANT_URL", "http://qdrant:6333")
    get_settings.cache_clear()
    assert embedded_store_refusal("prefork", 4, get_settings()) is None
    assert BROKER.endswith("/4")


@pytest.mark.slow
def test_the_library_never_imports_the_top_level_entry_packages(tmp_path):
    """No import cycle: `tasks` and `bootstrap` import the library, never the other way round."""
    code = (
        "import pkgutil, importlib, sys, moonmind_worker\n"
        "for m in pkgutil.walk_packages(moonmind_worker.__path__, 'moonmind_worker.'):\n"
        "    if m.name != 'moonmind_worker.__main__':\n"
        "        importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('tasks', 'bootstrap'))\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_users_own_tasks_module_cannot_shadow_the_canonical_app(tmp_path):
    (tmp_path / "tasks.py").write_text("raise SystemExit('the user tasks.py was imported')\n")
    code = "import moonmind_worker.celery as c; print(sorted(t for t in c.app.tasks if t.startswith('moonmind.rag.')))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "moonmind.rag.search" in r.stdout and "moonmind.rag.index" in r.stdout


def test_only_the_namespaced_package_is_installed_and_the_checkout_aliases_are_the_same_app(tmp_path):
    import tomllib

    import moonmind_worker.celery
    import tasks

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["packages"]["find"]["include"] == ["moonmind_worker*"]
    # outside the checkout, a `tasks` or `bootstrap` import finds nothing of ours to collide with
    code = "import importlib.util as u; print([u.find_spec(n) for n in ('tasks', 'bootstrap')])"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[None, None]", (r.stdout, r.stderr)
    assert tasks.app is moonmind_worker.celery.app  # from the checkout, `celery -A tasks` is the same app
