"""Observability (issue 7; spec 01 US2-1, US2-3, FR-004, SC-004; spec 02 breadcrumbs / "Context used").

Real parts only: a UDP socket bound on loopback plays the StatsD server, a kombu
consumer on Redis (DB 7, a unique queue bound to the events exchange) receives
the queue events, and a local HTTP server (tests/http_servers.py) speaks the
OpenAI embeddings protocol.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime

import pytest

from http_servers import EmbeddingsServer, closed_port

BROKER = "redis://127.0.0.1:6379/7"
EMBED_KEY = "sk-test-not-a-secret"
SCOPE = {"MOONMIND_JOB_ID": "job-obs", "MOONMIND_RUN_ID": "run-obs", "MOONMIND_REPO": "demo", "MOONMIND_TENANT": "acme"}


# --- the CLI in-process (same code path as the console script, minus process start-up) ---


@pytest.fixture
def mm(env, monkeypatch, capsys):
    """Run `moonmind ARGS` in this process with extra env; module state is reset like a fresh process."""
    from moonmind_worker import runtime
    from moonmind_worker.cli import main as cli
    from moonmind_worker.observe import events, metrics
    from moonmind_worker.settings import get_settings

    from conftest import Result

    def fresh() -> None:
        get_settings.cache_clear()
        metrics.reset()
        events.reset()
        runtime.close_all()

    def run(*args: str, extra_env: dict[str, str] | None = None) -> Result:
        capsys.readouterr()
        with monkeypatch.context() as m:
            for k, v in (extra_env or {}).items():
                m.setenv(k, v)
            fresh()
            try:
                code = cli.main(list(args))
            finally:
                fresh()
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


@pytest.fixture
def mm_indexed(mm, repo):
    r = mm("rag", "index", str(repo), "--repo", "demo", "--tenant", "acme")
    assert r.code == 0, r.stderr
    return repo


# --- a StatsD server: a real UDP socket -------------------------------------


class StatsdServer:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.env = {"STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(self.port)}

    def lines(self, wait_s: float = 0.3) -> list[tuple[str, float, str]]:
        """Every `name:value|type` received so far (datagrams may hold several lines)."""
        out = []
        self.sock.settimeout(wait_s)
        while True:
            try:
                data = self.sock.recv(65535)
            except socket.timeout:
                return out
            for line in data.decode("ascii").splitlines():
                name, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                out.append((name, float(value), kind))

    @staticmethod
    def only(lines, name: str) -> list[tuple[float, str]]:
        return [(v, k) for n, v, k in lines if n == name]


@pytest.fixture
def statsd_server():
    s = StatsdServer()
    yield s
    s.sock.close()


# --- a queue-event consumer on Redis ----------------------------------------


class EventConsumer:
    def __init__(self) -> None:
        from kombu import Connection, Exchange, Queue

        from moonmind_worker.observe import events

        self.conn = Connection(BROKER)
        q = Queue(f"test-obs-{uuid.uuid4().hex}", Exchange(events.EXCHANGE, type="topic", durable=True), routing_key="rag.#")
        self.bound = q(self.conn.default_channel)
        self.bound.declare()
        self.env = {"CELERY_BROKER_URL": BROKER}

    def drain(self, wait_s: float = 1.0, until: str | None = None) -> list[dict]:
        """Events received within wait_s (returns early once an `until` event arrived)."""
        out: list[dict] = []
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            m = self.bound.get(no_ack=True)
            if m is None:
                time.sleep(0.02)
                continue
            out.append(m.payload)
            if until and m.payload["event"] == until:
                deadline = min(deadline, time.monotonic() + 0.2)
        return out

    def close(self) -> None:
        try:
            self.bound.delete()
        finally:
            self.conn.release()


@pytest.fixture
def consumer():
    c = EventConsumer()
    yield c
    c.close()


def _one(evts: list[dict], name: str) -> dict:
    found = [e for e in evts if e["event"] == name]
    assert len(found) == 1, f"expected one {name}, got {[e['event'] for e in evts]}"
    return found[0]


def _assert_scope(evt: dict) -> None:
    assert (evt["job_id"], evt["run_id"], evt["repo"], evt["tenant"]) == ("job-obs", "run-obs", "demo", "acme")


# --- an OpenAI-compatible embeddings server ----------------------------------


@pytest.fixture
def embed_server():
    s = EmbeddingsServer()
    yield s
    s.close()


# --- StatsD -----------------------------------------------------------------


@pytest.mark.slow
def test_search_sends_latency_timer_and_hit_counter(mm, mm_indexed, statsd_server):
    r = mm("rag", "search", "--query", "bearer token", "--filters", "repo=demo", "--json", extra_env=statsd_server.env)
    assert r.code == 0, r.stderr
    hits = len(r.json()["items"])
    lines = statsd_server.lines()
    (latency, kind), = statsd_server.only(lines, "moonmind.rag.search.latency_ms")
    assert kind == "ms" and 0 < latency < 10_000
    assert statsd_server.only(lines, "moonmind.rag.search.hits") == [(hits, "c")]
    assert hits > 0
    assert statsd_server.only(lines, "moonmind.rag.embed.count") == [(1.0, "c")]  # the query
    (embed_ms, kind), = statsd_server.only(lines, "moonmind.rag.embed.latency_ms")
    assert kind == "ms" and 0 < embed_ms <= latency
    assert not statsd_server.only(lines, "moonmind.rag.search.errors")


@pytest.mark.slow
def test_index_counts_chunks_written(mm, repo, statsd_server):
    r = mm("rag", "index", str(repo), "--repo", "demo", "--tenant", "acme", "--json", extra_env=statsd_server.env)
    assert r.code == 0, r.stderr
    written = r.json()["chunks_written"]
    lines = statsd_server.lines()
    assert statsd_server.only(lines, "moonmind.rag.index.chunks") == [(written, "c")]
    assert sum(v for v, _ in statsd_server.only(lines, "moonmind.rag.embed.count")) == written
    assert [k for _, k in statsd_server.only(lines, "moonmind.rag.index.latency_ms")] == ["ms"]


@pytest.mark.slow
def test_statsd_prefix_is_configurable(mm, mm_indexed, statsd_server):
    env = {**statsd_server.env, "STATSD_PREFIX": "mm.ci"}
    assert mm("rag", "search", "--query", "pool", "--filters", "repo=demo", extra_env=env).code == 0
    names = {n for n, _, _ in statsd_server.lines()}
    assert "mm.ci.rag.search.latency_ms" in names
    assert not any(n.startswith("moonmind.") for n in names)


def test_metrics_are_off_without_statsd_host(env):
    from moonmind_worker.observe import metrics

    metrics.reset()
    assert metrics.client() is None
    metrics.incr("rag.search.hits", 3)  # a no-op, not an error


def test_unresolvable_statsd_host_never_blocks_a_send(env, monkeypatch):
    from moonmind_worker.observe import metrics
    from moonmind_worker.settings import get_settings

    monkeypatch.setenv("STATSD_HOST", "statsd.moonmind.invalid")
    get_settings.cache_clear()
    metrics.reset()
    resolvers: list[threading.Thread] = []  # held, so no two of them can share an identity

    def count_resolver(frame, event, arg) -> None:  # threading.settrace runs this on each call in every new thread
        thread = threading.current_thread()
        if thread.name == "moonmind-statsd-resolve" and not any(t is thread for t in resolvers):
            resolvers.append(thread)

    threading.settrace(count_resolver)
    try:
        metrics.incr("rag.search.hits")  # first use waits at most RESOLVE_WAIT_S for the name, in a thread of its own
        assert list(metrics._clients.values()) == [None]  # not resolved: remembered as off for this process
        for _ in range(1000):
            metrics.timing("rag.search.latency_ms", 1.0)
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
        metrics.reset()
    assert len(resolvers) == 1  # one lookup thread for the process, none per send


# --- failure paths: the event goes out before the command exits non-zero ---------


@pytest.mark.slow
def test_embedding_connectivity_failure_emits_embedding_aborted_before_exit(
    mm, repo, embed_server, statsd_server, consumer
):
    """Spec 01 US2-1: connectivity failure → error, `embedding_aborted`, non-zero exit, no partial output."""
    base = {**embed_server.provider_env(EMBED_KEY), **SCOPE}
    assert mm("rag", "index", str(repo), "--repo", "demo", "--tenant", "acme", extra_env=base).code == 0
    env = {**base, **statsd_server.env, **consumer.env, "OPENAI_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1"}
    r = mm("rag", "search", "--query", "bearer token", "--json", extra_env=env)
    assert r.code == 4 and r.stdout == ""
    assert r.error()["code"] == "embedding_provider_error"
    # main() has returned (the process would exit now): the event is already on the queue
    aborted = _one(consumer.drain(until="embedding_aborted"), "embedding_aborted")
    assert aborted["reason"] == "embedding_provider_error"
    assert aborted["attempts"] == 4 and aborted["stage"] == "embed"
    assert aborted["provider"] == "openai" and aborted["model"] == "text-embedding-3-small"
    _assert_scope(aborted)
    lines = statsd_server.lines()
    assert statsd_server.only(lines, "moonmind.rag.embed.errors") == [(1.0, "c")]
    assert statsd_server.only(lines, "moonmind.rag.search.errors") == [(1.0, "c")]
    assert not statsd_server.only(lines, "moonmind.rag.search.latency_ms")


@pytest.mark.slow
def test_unreachable_qdrant_emits_embedding_aborted_before_exit(mm, consumer, statsd_server):
    """Spec 01 US2-1, the Qdrant half: the store cannot be reached."""
    env = {**SCOPE, **consumer.env, **statsd_server.env, "QDRANT_URL": f"http://127.0.0.1:{closed_port()}"}
    r = mm("rag", "search", "--query", "bearer token", "--json", extra_env=env)
    assert r.code == 4 and r.stdout == ""
    assert r.error()["code"] == "qdrant_unreachable"
    aborted = _one(consumer.drain(until="embedding_aborted"), "embedding_aborted")
    assert aborted["reason"] == "qdrant_unreachable" and aborted["stage"] == "search"
    assert aborted["attempts"] >= 1
    _assert_scope(aborted)
    assert statsd_server.only(statsd_server.lines(), "moonmind.rag.search.errors") == [(1.0, "c")]


@pytest.mark.slow
def test_embedding_server_error_reports_every_attempt(env, monkeypatch, embed_server, consumer, tmp_path):
    from moonmind_worker.embedding import make_embedder
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.observe import events, metrics
    from moonmind_worker.settings import get_settings

    for k, v in {**embed_server.provider_env(EMBED_KEY), **SCOPE, **consumer.env, "MOONMIND_EMBEDDING_DIMENSIONS": "16"}.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    events.reset()
    metrics.reset()
    embed_server.always_status = 503
    embedder = make_embedder(get_settings())
    with pytest.raises(MoonmindError) as exc:
        embedder.embed_documents(["a", "b", "c"])
    aborted = _one(consumer.drain(until="embedding_aborted"), "embedding_aborted")
    assert aborted["attempts"] == embed_server.calls == exc.value.details["attempts"] == 4
    assert aborted["reason"] == "embedding_provider_error" and aborted["texts"] == 3
    _assert_scope(aborted)


def test_missing_collection_aborts_with_its_reason(mm, consumer):
    r = mm("rag", "search", "--query", "anything", extra_env={**SCOPE, **consumer.env})
    assert r.code == 3
    aborted = _one(consumer.drain(until="embedding_aborted"), "embedding_aborted")
    assert aborted["reason"] == "collection_missing" and aborted["stage"] == "search"
    _assert_scope(aborted)


@pytest.mark.slow
def test_token_budget_truncation_is_reported(mm, mm_indexed, statsd_server, consumer):
    # a budget that keeps the best item and drops the rest (budgets.py: a budget below one full-size
    # chunk is refused with 413 instead, so the configured chunk size is lowered for the pre-check)
    full = mm("rag", "search", "--query", "bearer token", "--score-threshold", "0", "--json", extra_env=SCOPE).json()
    assert len(full["items"]) > 1
    first = full["items"][0]["token_count"]
    env = {**SCOPE, **statsd_server.env, **consumer.env, "MOONMIND_CHUNK_CHARS": "200"}
    r = mm("rag", "search", "--query", "bearer token", "--score-threshold", "0", "--budget", f"tokens={first}",
           "--json", extra_env=env)
    assert r.code == 0, r.stderr
    assert r.json()["truncated"] is True
    budget = _one(consumer.drain(until="budget_exceeded"), "budget_exceeded")
    assert (budget["budget_type"], budget["budget_limit"], budget["budget_spent"]) == ("tokens", first, first)
    assert budget["outcome"] == "truncated"
    _assert_scope(budget)
    assert statsd_server.only(statsd_server.lines(), "moonmind.rag.budget.exceeded.tokens") == [(1.0, "c")]


@pytest.mark.slow
def test_latency_budget_abort_is_reported(mm, repo, embed_server, statsd_server, consumer):
    base = {**embed_server.provider_env(EMBED_KEY), **SCOPE}
    assert mm("rag", "index", str(repo), "--repo", "demo", "--tenant", "acme", extra_env=base).code == 0
    # a slow provider: every request hangs 50 ms, so a 1 ms budget is exceeded while embedding
    # (the remaining budget is the embedding call's timeout, so the call is cut short, not waited out)
    env = {**base, **statsd_server.env, **consumer.env}
    embed_server.delay_s = 0.05
    r = mm("rag", "search", "--query", "bearer token", "--budget", "latency_ms=1", "--json", extra_env=env)
    assert r.code == 5 and r.stdout == ""
    budget = _one(consumer.drain(until="budget_exceeded"), "budget_exceeded")
    assert budget["budget_type"] == "latency_ms" and budget["budget_limit"] == 1
    assert budget["budget_spent"] > budget["budget_limit"] and budget["outcome"] == "aborted"
    _assert_scope(budget)
    lines = statsd_server.lines()
    assert statsd_server.only(lines, "moonmind.rag.budget.exceeded.latency_ms") == [(1.0, "c")]
    assert statsd_server.only(lines, "moonmind.rag.search.errors") == [(1.0, "c")]


# --- queue events for a search --------------------------------------------------


@pytest.mark.slow
def test_search_emits_query_completed_and_pack_created_with_job_tags(mm, mm_indexed, consumer):
    r = mm("rag", "search", "--query", "connection pool", "--json", extra_env={**SCOPE, **consumer.env})
    assert r.code == 0, r.stderr
    pack = r.json()
    evts = consumer.drain(until="context_pack_created")
    done = _one(evts, "qdrant_query_completed")
    created = _one(evts, "context_pack_created")
    for e in (done, created):
        _assert_scope(e)
        assert e["telemetry_id"] == pack["telemetry_id"]
        assert e["event_id"].startswith("evt_")
    assert done["hits"] == len(pack["items"]) > 0
    assert done["overlay_hits"] == 0 and done["transport"] == "direct"
    assert 0 < done["latency_ms"] < 10_000
    assert created["sources"] == [i["source"] for i in pack["items"]]


# --- breadcrumbs and cached packs ----------------------------------------------


@pytest.mark.slow
def test_successful_search_caches_the_pack_and_logs_a_breadcrumb(mm, mm_indexed, home):
    r = mm("rag", "search", "--query", "bearer token", "--json", extra_env=SCOPE)
    assert r.code == 0, r.stderr
    pack = r.json()
    run_dir = home / "artifacts" / "run-obs"
    cached = json.loads((run_dir / "context-packs" / f"{pack['telemetry_id']}.json").read_text())
    assert cached == pack
    (line,) = (run_dir / "breadcrumbs.jsonl").read_text().splitlines()
    crumb = json.loads(line)
    assert crumb["context_pack_id"] == pack["telemetry_id"]
    assert crumb["job_id"] == "job-obs" and crumb["run_id"] == "run-obs"
    assert [s["source"] for s in crumb["sources"]] == [i["source"] for i in pack["items"]]
    assert crumb["sources"][0]["lines"] == f"L{pack['items'][0]['line_start']}-L{pack['items'][0]['line_end']}"
    assert "ctx_" not in r.stderr  # the breadcrumb never lands in the agent's output streams


@pytest.mark.slow
def test_artifacts_dir_is_configurable_and_run_ids_cannot_escape_it(mm, mm_indexed, tmp_path):
    art = tmp_path / "arts"
    env = {**SCOPE, "MOONMIND_ARTIFACTS_DIR": str(art), "MOONMIND_RUN_ID": "../../etc"}
    assert mm("rag", "search", "--query", "pool", "--json", extra_env=env).code == 0
    (cached,) = list(art.rglob("ctx_*.json"))
    assert cached.parent.parent.parent == art
    assert cached.parent.parent.name.startswith("etc-")  # made safe, and told apart from a run really named "etc"


@pytest.mark.slow
@pytest.mark.parametrize("plant", ["a shared artifacts directory", "a link for the run's directory",
                                   "a link for the breadcrumb file"])
def test_a_planted_link_or_a_shared_artifacts_directory_is_refused_before_anything_is_written_there(
        mm, mm_indexed, tmp_path, plant):
    """Issue 52: links planted in an artifacts directory another user could write made root append to its files."""
    art = tmp_path / "arts"
    art.mkdir(mode=0o700)
    victim_dir = tmp_path / "root-only"
    victim_dir.mkdir(mode=0o700)
    victim = victim_dir / "secret.txt"
    victim.write_text("root only\n")
    if plant == "a shared artifacts directory":
        art.chmod(0o777)  # anyone may plant what they like in it
    elif plant == "a link for the run's directory":
        (art / "run-planted").symlink_to(victim_dir, target_is_directory=True)
    else:
        (art / "run-planted").mkdir(mode=0o700)
        (art / "run-planted" / "breadcrumbs.jsonl").symlink_to(victim)
    env = {**SCOPE, "MOONMIND_ARTIFACTS_DIR": str(art), "MOONMIND_RUN_ID": "run-planted"}
    said: list[logging.LogRecord] = []
    catch = logging.Handler(logging.WARNING)
    catch.emit = said.append  # type: ignore[method-assign]  # on the logger itself: whatever the root's set-up is
    logger = logging.getLogger("moonmind_worker.artifacts")
    level = logger.level
    logger.addHandler(catch)
    logger.setLevel(logging.WARNING)  # an in-process Celery worker of an earlier test may have raised the root's level
    try:
        r = mm("rag", "search", "--query", "pool", "--json", extra_env=env)
    finally:
        logger.removeHandler(catch)
        logger.setLevel(level)
    assert r.code == 0, r.stderr  # the search answers; only its cache is refused
    assert r.json()["items"]
    assert victim.read_text() == "root only\n"
    assert [p.name for p in victim_dir.iterdir()] == ["secret.txt"]
    (warning,) = [rec.getMessage() for rec in said]
    assert "context pack not cached" in warning and "moonmind refuses to use" in warning


@pytest.mark.slow
def test_rag_packs_lists_the_packs_of_a_run_in_order(mm, mm_indexed):
    env = {**SCOPE, "MOONMIND_RUN_ID": "run-a"}
    ids = [mm("rag", "search", "--query", q, "--json", extra_env=env).json()["telemetry_id"] for q in ("bearer token", "connection pool")]
    mm("rag", "search", "--query", "router", "--json", extra_env={**SCOPE, "MOONMIND_RUN_ID": "run-b"})
    r = mm("rag", "packs", "--run-id", "run-a", "--json")
    assert r.code == 0, r.stderr
    listed = r.json()
    assert [p["telemetry_id"] for p in listed] == ids
    assert listed[0]["query"] == "bearer token" and listed[0]["sources"][0].startswith("auth/tokens.py#L")
    text = mm("rag", "packs", extra_env=env)
    assert text.code == 0 and ids[0] in text.stdout and ids[1] in text.stdout


@pytest.mark.slow
def test_packs_of_runs_idle_past_retention_are_pruned_whole_and_others_kept(mm, mm_indexed, tmp_path):
    art = tmp_path / "arts"
    base = {**SCOPE, "MOONMIND_ARTIFACTS_DIR": str(art), "MOONMIND_ARTIFACTS_RETENTION_DAYS": "7"}
    for run in ("old-run", "fresh-run"):
        assert mm("rag", "search", "--query", "pool", "--json", extra_env={**base, "MOONMIND_RUN_ID": run}).code == 0
    stranger = art / "not-a-run"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("kept: not a run directory")
    ten_days_ago = time.time() - 10 * 86400
    for p in [art / "old-run", *(art / "old-run").rglob("*"), stranger, stranger / "notes.txt"]:
        os.utime(p, (ten_days_ago, ten_days_ago))
    r = mm("rag", "packs", "--prune", "--json", extra_env=base)
    assert r.code == 0 and r.json() == {"runs_pruned": 1, "retention_days": 7.0}
    assert not (art / "old-run").exists() and (stranger / "notes.txt").exists()
    assert mm("rag", "packs", "--json", extra_env={**base, "MOONMIND_RUN_ID": "fresh-run"}).json()  # still listed
    off = mm("rag", "packs", "--prune", extra_env={**base, "MOONMIND_ARTIFACTS_RETENTION_DAYS": "0"})
    assert off.code == 0 and "nothing pruned" in off.stdout and (art / "fresh-run").exists()


def test_rag_packs_for_an_unknown_run_is_empty_not_an_error(mm):
    r = mm("rag", "packs", "--run-id", "never-ran", "--json")
    assert r.code == 0 and r.json() == []
    r = mm("rag", "packs", "--run-id", "never-ran")
    assert r.code == 0 and r.stdout == "" and "no context packs cached for run never-ran" in r.stderr


@pytest.mark.slow
def test_doctor_probe_query_is_not_cached_as_context_used(mm, mm_indexed, home, statsd_server):
    r = mm("worker", "doctor", "--json", extra_env={**SCOPE, **statsd_server.env})
    assert "query" in r.stdout, r.stderr
    assert statsd_server.only(statsd_server.lines(), "moonmind.rag.search.hits")  # the probe did search
    assert not list(home.rglob("ctx_*.json"))


# --- workspace overlay -----------------------------------------------------------


def _edit(repo) -> None:
    (repo / "auth" / "tokens.py").write_text(
        '"""Bearer token checks."""\n\n\ndef check_bearer_token(header, expected):\n'
        '    """Validate a bearer header with a rotating signing key."""\n    return header == "Bearer " + expected\n'
    )


@pytest.mark.slow
def test_overlay_upsert_reports_latency_chunks_and_event(mm, mm_indexed, statsd_server, consumer):
    _edit(mm_indexed)
    env = {**SCOPE, **statsd_server.env, **consumer.env}
    r = mm("rag", "overlay", "upsert", str(mm_indexed / "auth/tokens.py"), "--root", str(mm_indexed), "--json", extra_env=env)
    assert r.code == 0, r.stderr
    written = r.json()["chunks_written"]
    assert written > 0
    lines = statsd_server.lines()
    (latency, kind), = statsd_server.only(lines, "moonmind.rag.overlay.upsert.latency_ms")
    assert kind == "ms" and 0 < latency < 10_000
    assert statsd_server.only(lines, "moonmind.rag.overlay.chunks") == [(written, "c")]
    assert sum(v for v, _ in statsd_server.only(lines, "moonmind.rag.embed.count")) == written
    upserted = _one(consumer.drain(until="overlay_upserted"), "overlay_upserted")
    _assert_scope(upserted)
    assert upserted["chunks_written"] == written and upserted["files"] == 1


@pytest.mark.slow
def test_search_reports_overlay_hits(mm, mm_indexed, consumer):
    _edit(mm_indexed)
    assert mm("rag", "overlay", "upsert", str(mm_indexed / "auth/tokens.py"), "--root", str(mm_indexed), extra_env=SCOPE).code == 0
    r = mm("rag", "search", "--query", "bearer rotating signing key", "--json", extra_env={**SCOPE, **consumer.env})
    assert r.code == 0, r.stderr
    overlay_items = [i for i in r.json()["items"] if i["trust_class"] == "overlay"]
    done = _one(consumer.drain(until="context_pack_created"), "qdrant_query_completed")
    assert done["overlay_hits"] == len(overlay_items) > 0


@pytest.mark.slow
def test_ttl_sweep_reports_points_swept(mm, mm_indexed, statsd_server, consumer):
    _edit(mm_indexed)
    up = mm("rag", "overlay", "upsert", str(mm_indexed / "auth/tokens.py"), "--root", str(mm_indexed), "--ttl", "1s", "--json",
            extra_env=SCOPE)
    assert up.code == 0, up.stderr
    expires = datetime.fromisoformat(up.json()["expires_at"].replace("Z", "+00:00")).timestamp()
    deadline = time.monotonic() + 60
    while time.time() <= expires + 1:  # until the overlay is past its expiry (printed to the second)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    r = mm("rag", "overlay", "clean", "--expired", "--json", extra_env={**SCOPE, **statsd_server.env, **consumer.env})
    assert r.code == 0, r.stderr
    removed = r.json()["removed"]
    assert removed == up.json()["chunks_written"] > 0
    assert statsd_server.only(statsd_server.lines(), "moonmind.rag.overlay.swept") == [(removed, "c")]
    swept = _one(consumer.drain(until="overlay_swept"), "overlay_swept")
    assert swept["removed"] == removed
    _assert_scope(swept)


@pytest.mark.slow
def test_run_clean_reports_overlay_cleaned(mm, mm_indexed, statsd_server, consumer):
    _edit(mm_indexed)
    assert mm("rag", "overlay", "upsert", str(mm_indexed / "auth/tokens.py"), "--root", str(mm_indexed), extra_env=SCOPE).code == 0
    r = mm("rag", "overlay", "clean", "--json", extra_env={**SCOPE, **statsd_server.env, **consumer.env})
    assert r.code == 0, r.stderr
    removed = r.json()["removed"]
    assert removed > 0
    assert statsd_server.only(statsd_server.lines(), "moonmind.rag.overlay.cleaned") == [(removed, "c")]
    cleaned = _one(consumer.drain(until="overlay_cleaned"), "overlay_cleaned")
    assert cleaned["removed"] == removed and cleaned["run_id"] == "run-obs"
    _assert_scope(cleaned)


# --- sinks down: the search itself is unaffected ----------------------------------


@pytest.mark.slow
def test_search_succeeds_with_statsd_unreachable_and_broker_down(cli, mm, mm_indexed):
    args = ("rag", "search", "--query", "bearer token", "--filters", "repo=demo", "--json")
    baseline = mm(*args).json()
    down = {
        "STATSD_HOST": "10.255.255.1",  # unroutable
        "CELERY_BROKER_URL": f"redis://127.0.0.1:{closed_port()}/7",
        **SCOPE,
    }
    r = cli(*args, extra_env=down)
    assert r.code == 0, r.stderr
    assert r.json()["items"] == baseline["items"]
    assert r.json()["context_text"] == baseline["context_text"]


@pytest.mark.slow
def test_gateway_counts_requests_per_http_status(statsd_server, tmp_path):
    """rag.gateway.requests.<status>: a real `moonmind gateway serve` reports to a real UDP socket."""
    from conftest import FIXTURE_FILES, write_tree
    from gateway_helpers import add_token, clean_env, index_in_process, start_gateway

    home = tmp_path / "gw-home"
    home.mkdir()
    index_in_process(home, write_tree(tmp_path / "gw-repo", FIXTURE_FILES), [("demo", "acme")])
    env = clean_env(home, **statsd_server.env)
    token = add_token(env, "obs", ["demo"], ["acme"])
    gw = start_gateway(home, env, tmp_path)
    try:
        statsd_server.lines(wait_s=0.5)  # drop what start-up sent (health probes)
        with gw.client(token) as c:
            assert c.post("/retrieval/context", json={"query": "bearer token"}).status_code == 200
            assert c.post("/retrieval/context", json={"query": "bearer token"}).status_code == 200
            assert c.post("/retrieval/context", json={"query": " "}).status_code == 400
        with gw.client(None) as c:
            assert c.post("/retrieval/context", json={"query": "bearer token"}).status_code == 401
        lines = statsd_server.lines(wait_s=1.0)
    finally:
        gw.stop()
    counts = {
        status: sum(v for v, kind in StatsdServer.only(lines, f"moonmind.rag.gateway.requests.{status}") if kind == "c")
        for status in (200, 400, 401)
    }
    assert counts == {200: 2, 400: 1, 401: 1}


def test_run_ids_that_differ_only_in_unsafe_or_invisible_characters_get_their_own_artifacts_directory():
    from moonmind_worker.observe import ADHOC_RUN, run_dir_name

    ids = ["run-1", "run\u200b-1", "run-1\u200b", "a*b", "a?b", "a/b", "../x", "..", "./", "日本"]
    names = [run_dir_name(i) for i in ids]
    assert len(set(names)) == len(ids), names
    assert run_dir_name("run-1") == "run-1" and run_dir_name("job-42.attempt_2") == "job-42.attempt_2"
    assert run_dir_name(None) == run_dir_name("") == ADHOC_RUN
    for name in names:
        assert "/" not in name and not name.startswith(".") and len(name) <= 128
