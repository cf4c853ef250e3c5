"""One warm owner per box: every command works beside the process that holds the embedded store.

Everything is real: `moonmind serve` (or a Celery worker) owns the store in its own process,
the CLI runs as a subprocess and talks to it over the Unix socket beside the store.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from celery_helpers import (
    CELERY,
    ROOT,
    purge,
    queue_env,
    redis,
    socket_of,
    solo_worker,
    stop,
    unique_queues,
    wait_for_consumer,
    wait_for_socket,
)
from conftest import MOONMIND, write_tree

QUERY = ("rag", "search", "--query", "where is the bearer token checked", "--filters", "repo=demo", "tenant=acme")


def start_owner(env: dict[str, str], home: Path, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([MOONMIND, "serve", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    wait_for_socket(home, proc)
    return proc


@pytest.fixture
def owner(indexed, env, home):
    proc = start_owner(env, home)
    yield proc
    stop(proc)


def comparable(pack: dict) -> dict:
    """A pack without what differs between two runs of the same search (its id, time and latency)."""
    out = dict(pack)
    out.pop("telemetry_id")
    out.pop("retrieved_at")
    out["usage"] = {k: v for k, v in pack["usage"].items() if k != "latency_ms"}
    return out


# ------------------------------------------------------------------ search ---


@pytest.mark.slow
def test_search_beside_an_owner_is_answered_by_it_with_the_one_shot_pack(indexed, cli, env, home):
    one_shot = cli(*QUERY, "--json")
    assert one_shot.code == 0, one_shot.stderr
    proc = start_owner(env, home)
    try:
        served = cli(*QUERY, "--json")
        assert served.code == 0, served.stderr
        lock_holder = (socket_of(home).parent / "owner.lock").read_text().strip()
        assert lock_holder == str(proc.pid)  # the owner held the store throughout: the answer was its own
    finally:
        stop(proc)
    assert json.dumps(comparable(served.json()), sort_keys=True) == json.dumps(comparable(one_shot.json()), sort_keys=True)
    assert served.json()["items"][0]["source"] == "auth/tokens.py"


@pytest.mark.slow
def test_the_markdown_output_through_the_owner_is_the_one_shot_output(indexed, cli, env, home):
    one_shot = cli(*QUERY)
    proc = start_owner(env, home)
    try:
        served = cli(*QUERY)
    finally:
        stop(proc)
    assert served.code == 0 and served.stdout and served.stderr == one_shot.stderr == ""
    strip = lambda text: "\n".join(line for line in text.splitlines() if "id=" not in line)  # noqa: E731 - the fence id
    assert strip(served.stdout) == strip(one_shot.stdout)


@pytest.mark.slow
def test_the_thin_client_imports_no_numpy_pydantic_qdrant_celery_or_fastapi(owner, cli):
    r = cli(*QUERY, extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert r.code == 0, r.stderr
    modules = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    imported = {m.split(".")[0] for m in modules}
    assert "moonmind_worker" in imported, "import profile missing"
    for heavy in ("numpy", "pydantic", "pydantic_core", "qdrant_client", "qdrant_edge", "tokenizers", "celery", "kombu",
                  "fastapi", "starlette", "redis", "openai"):
        assert heavy not in imported, heavy


@pytest.mark.slow
def test_a_search_error_comes_back_in_the_same_envelope_and_exit_code(owner, cli):
    r = cli("rag", "search", "--query", "   ", "--json")
    assert r.code == 2 and r.stdout == ""
    assert r.error()["code"] == "invalid_query" and "Traceback" not in r.stderr


@pytest.mark.slow
def test_the_clients_own_top_k_and_threshold_settings_hold_through_the_owner(owner, cli):
    r = cli(*QUERY, "--json", extra_env={"RAG_SIMILARITY_TOP_K": "2", "RAG_SCORE_THRESHOLD": "0"})
    assert r.code == 0, r.stderr
    pack = r.json()
    assert (pack["top_k"], pack["score_threshold"], len(pack["items"])) == (2, 0.0, 2)


@pytest.mark.slow
def test_a_search_carries_the_clients_job_scope_into_its_cached_pack(owner, cli, home):
    r = cli(*QUERY, "--json", extra_env={"MOONMIND_RUN_ID": "run-scope", "MOONMIND_JOB_ID": "job-scope"})
    assert r.code == 0, r.stderr
    crumb = json.loads((home / "artifacts" / "run-scope" / "breadcrumbs.jsonl").read_text().splitlines()[-1])
    assert crumb["job_id"] == "job-scope" and crumb["context_pack_id"] == r.json()["telemetry_id"]
    listed = cli("rag", "packs", "--run-id", "run-scope", "--json")
    assert [p["telemetry_id"] for p in listed.json()] == [r.json()["telemetry_id"]]


# ---------------------------------------------------------- every command ---


@pytest.mark.slow
def test_index_beside_an_owner_is_run_by_it_and_reports_as_before(owner, cli, indexed):
    (indexed / "auth" / "tokens.py").write_text("def rotate_bearer_tokens():\n    return 'rotated'\n")
    r = cli("rag", "index", str(indexed), "--repo", "demo", "--tenant", "acme", "--json")
    assert r.code == 0, r.stderr
    report = r.json()
    assert report["files_indexed"] == 1 and report["files_unchanged"] == 3 and report["chunks_written"] == 1
    hit = cli("rag", "search", "--query", "rotate_bearer_tokens", "--top-k", "1", "--json").json()["items"][0]
    assert hit["source"] == "auth/tokens.py" and "rotate_bearer_tokens" in hit["text"]


@pytest.mark.slow
def test_index_of_a_missing_directory_is_refused_before_anything_is_sent(owner, cli, tmp_path):
    r = cli("rag", "index", str(tmp_path / "nowhere"), "--repo", "demo")
    assert r.code == 2 and "is not a directory" in r.stderr and r.stdout == ""


@pytest.mark.slow
def test_overlay_upsert_list_and_clean_beside_an_owner(owner, cli, tmp_path):
    ws = write_tree(tmp_path / "ws", {"auth/tokens.py": "def check_bearer_token(header):\n    return header == 'ok'\n"})
    (ws / ".git").mkdir()
    scope = {"MOONMIND_RUN_ID": "run-o", "MOONMIND_REPO": "demo", "MOONMIND_TENANT": "acme"}
    r = cli("rag", "overlay", "upsert", "auth/tokens.py", "--json", cwd=ws, extra_env=scope)
    assert r.code == 0, r.stderr
    assert r.json()["chunks_written"] == 1 and r.json()["run_id"] == "run-o"
    top = cli(*QUERY, "--json", extra_env=scope).json()["items"][0]
    assert top["trust_class"] == "overlay" and "header == 'ok'" in top["text"]
    rows = cli("rag", "overlay", "list", "--json", extra_env=scope).json()
    assert [(row["path"], row["chunks"]) for row in rows] == [("auth/tokens.py", 1)]
    r = cli("rag", "overlay", "clean", "--json", extra_env=scope)
    assert r.code == 0 and r.json() == {"removed": 1, "run_id": "run-o", "expired": False}


@pytest.mark.slow
def test_stats_and_eval_beside_an_owner(owner, cli, indexed, tmp_path):
    r = cli("rag", "stats", "--repo", "demo", "--root", str(indexed), "--json")
    assert r.code == 0, r.stderr
    assert r.json()["chunks"] > 0 and r.json()["orphans"] == [] and r.json()["root_checked"] is True
    queries = tmp_path / "q.json"
    queries.write_text(json.dumps([{"query": "connection pool", "relevant": ["db/pool.py"]}]))
    r = cli("rag", "eval", "--queries", str(queries), "--repo", "demo", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["ndcg"] == 1.0


@pytest.mark.slow
def test_sync_embedding_beside_an_owner_is_planned_by_it(owner, cli):
    r = cli("rag", "sync-embedding", "--collection", "moonmind__repo", "--dry-run", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["plan"]["up_to_date"] is True


@pytest.mark.slow
def test_doctor_beside_an_owner_reports_retrieval_usable_through_it(owner, cli):
    r = cli("worker", "doctor", "--json")
    assert r.code == 0, r.stdout
    checks = {c["name"]: c for c in r.json()["checks"]}
    assert checks["owner"]["ok"] and f"PID {owner.pid}" in checks["owner"]["detail"]
    assert checks["query"]["ok"] and checks["collection"]["ok"]


@pytest.mark.slow
def test_job_start_and_finish_beside_an_owner(owner, cli, tmp_path, home):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"job_id": "job-o", "run_id": "run-o", "repo": "demo", "tenant": "acme", "requires": ["rag"]}))
    r = cli("job", "start", "--manifest", str(path))
    assert r.code == 0, r.stderr
    rag = json.loads(path.read_text())["rag"]
    assert rag["available"] is True and rag["capability"] == "direct-qdrant" and not rag["blocked"]
    ws = write_tree(tmp_path / "ws", {"notes.py": "def rotate():\n    pass\n"})
    assert cli("rag", "overlay", "upsert", str(ws / "notes.py"), "--root", str(ws), "--run-id", "run-o", "--repo", "demo",
               "--tenant", "acme").code == 0
    r = cli("job", "finish", "--manifest", str(path))
    assert r.code == 0 and r.stdout == "removed 1 overlay points of run run-o\n", r.stderr


# ------------------------------------------------------- finding the owner ---


@pytest.mark.slow
def test_an_owner_killed_mid_request_leaves_the_command_to_finish_one_shot(cli, env, home, tmp_path):
    """The owner is killed with SIGKILL while it indexes for a client; the client finishes the index itself.

    The embedder is a local OpenAI-compatible server that answers each batch after 0.3 s, so the
    index certainly still runs when the kill lands (a warm static model could finish first).
    """
    from http_servers import EmbeddingsServer

    server = EmbeddingsServer(repeat=2)
    hosted = {**env, "MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-kill",
              "OPENAI_BASE_URL": server.base_url, "MOONMIND_EMBEDDING_MODEL": "local-embed-512"}
    big = write_tree(tmp_path / "big", {f"pkg/mod_{i}.py": f"def handler_{i}(request):\n    return {i}\n" * 40
                                        for i in range(300)})
    try:
        proc = start_owner(hosted, home)
        server.delay_s = 0.3
        client = subprocess.Popen([MOONMIND, "rag", "index", str(big), "--repo", "big", "--json"], env=hosted,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while len(server.requests) < 2:  # the owner is embedding for the client, one slow batch at a time
            assert client.poll() is None and time.monotonic() < deadline, "the owner never started indexing"
            time.sleep(0.02)
        assert client.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        out, err = client.communicate(timeout=300)
        assert client.returncode == 0, err
        assert f"owner (PID {proc.pid}) went away during index; running it in this process instead" in err
        assert json.loads(out)["files_seen"] == 300
        server.delay_s = 0.0
        r = cli("rag", "search", "--query", "handler_7", "--filters", "repo=big", "--json", extra_env=hosted)
        assert r.code == 0, r.stderr  # the next call needs nothing: the socket went with its owner
        assert r.json()["items"][0]["source"] == "pkg/mod_7.py"
        assert not socket_of(home).exists()
    finally:
        server.close()


@pytest.mark.slow
def test_a_stale_socket_file_is_removed_and_the_command_runs_one_shot(indexed, cli, home):
    path = socket_of(home)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # a socket file nobody listens on: its owner died
    dead.close()
    r = cli(*QUERY, "--json")
    assert r.code == 0, r.stderr
    assert not path.exists()


@pytest.mark.slow
def test_the_socket_is_private_to_the_owners_user(owner, home):
    assert socket_of(home).stat().st_mode & 0o777 == 0o600


def test_the_owner_refuses_a_client_of_another_user(env):
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another user")
    import shutil
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="mm-uid-"))  # a home other users can traverse (pytest's tmp is 0700)
    shared.chmod(0o755)
    proc = start_owner({**env, "MOONMIND_HOME": str(shared)}, shared)
    try:
        path = socket_of(shared)
        for d in (path.parent, path.parent.parent):
            d.chmod(0o755)
        os.chmod(path, 0o666)  # even past the file mode, the owner checks the peer's uid
        probe = textwrap.dedent(f"""
            import os, socket
            os.setgid(65534); os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.connect({str(path)!r})
            try:  # the owner may refuse (and close) before the request is written: its answer is still there to read
                s.sendall(b'{{"v": 1, "op": "search", "args": {{"query": {{"query": "x"}}}}, "scope": {{}}}}\\n')
            except BrokenPipeError:
                pass
            print(s.makefile().readline())
        """)
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    finally:
        stop(proc)
        shutil.rmtree(shared, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "forbidden"


@pytest.mark.slow
def test_owner_off_never_uses_the_owner(owner, cli):
    r = cli(*QUERY, extra_env={"MOONMIND_OWNER": "off", "MOONMIND_STORE_WAIT_S": "0.2"})
    assert r.code == 3 and "store_busy" in r.stderr and f"PID {owner.pid}" in r.stderr


@pytest.mark.slow
def test_owner_auto_starts_a_background_owner_that_answers_then_exits_when_idle(indexed, cli, home):
    auto = {"MOONMIND_OWNER": "auto", "MOONMIND_OWNER_IDLE_S": "3"}
    first = cli(*QUERY, "--json", extra_env=auto)
    assert first.code == 0, first.stderr
    assert socket_of(home).exists()
    pid = int((socket_of(home).parent / "owner.lock").read_text())
    second = cli(*QUERY, "--json", extra_env=auto)
    assert second.code == 0 and comparable(second.json()) == comparable(first.json())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and socket_of(home).exists():
        time.sleep(0.2)
    assert not socket_of(home).exists(), "the idle owner did not exit"
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_a_background_owner_embeds_on_one_blas_thread_like_the_command_that_started_it(prebuilt, cli, home):
    """The same vectors whichever process embeds a file (cli.main.one_thread_blas)."""
    r = cli(*QUERY, extra_env={"MOONMIND_OWNER": "auto", "MOONMIND_OWNER_IDLE_S": "2"})
    assert r.code == 0, r.stderr
    pid = int((socket_of(home).parent / "owner.lock").read_text())
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"OPENBLAS_NUM_THREADS=1" in environ


@pytest.mark.slow
def test_an_owner_that_stops_answering_gives_a_bounded_error(owner, cli):
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        r = cli(*QUERY, timeout=30)  # the client's own deadline ends the wait; a hang would raise TimeoutExpired here
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    assert r.code == 4 and "owner_unresponsive" in r.stderr and f"PID {owner.pid}" in r.stderr


# ----------------------------------------------------------------- Celery ---

JOB_APP = '''
import json
import subprocess

from moonmind_worker.celery import app
from moonmind_worker.celery.job_signals import JobTask


@app.task(name="test.owner.job", base=JobTask, bind=True)
def run_job(self, manifest, workspace):
    """A job body as agents write them: shell out to the CLI the banner advertised."""
    def moonmind(*args):
        p = subprocess.run(["moonmind", *args], capture_output=True, text=True, timeout=60)
        return {"code": p.returncode, "stdout": p.stdout, "stderr": p.stderr}

    before = moonmind("rag", "search", "--query", "where is the bearer token checked", "--json")
    upsert = moonmind("rag", "overlay", "upsert", workspace + "/auth/tokens.py", "--root", workspace)
    after = moonmind("rag", "search", "--query", "where is the bearer token checked", "--json")
    return {"rag": manifest["rag"]["capability"], "before": before, "upsert": upsert, "after": after}
'''


@pytest.fixture
def job_worker(indexed, env, home, tmp_path):
    app_dir = tmp_path / "jobapp"
    app_dir.mkdir()
    (app_dir / "jobapp.py").write_text(JOB_APP)
    with solo_worker("jobapp", app_dir, env, home, tmp_path, "owner") as worker:
        yield worker


@pytest.mark.slow
def test_a_job_task_in_a_solo_worker_calls_the_cli_and_gets_its_answers(job_worker, tmp_path):
    from celery import Celery

    proc, sq, iq, log = job_worker
    ws = write_tree(tmp_path / "ws", {"auth/tokens.py": "def check_bearer_token(header):\n    return header == 'job edit'\n"})
    app = Celery(broker="redis://127.0.0.1:6379/4", backend="redis://127.0.0.1:6379/5")
    manifest = {"job_id": "job-cli", "run_id": "run-cli", "repo": "demo", "tenant": "acme", "requires": ["rag"]}
    try:
        out = app.send_task("test.owner.job", kwargs={"manifest": manifest, "workspace": str(ws)}, queue=sq).get(timeout=120)
    finally:
        app.close()
    assert out["rag"] == "direct-qdrant"
    for step in ("before", "upsert", "after"):
        assert out[step]["code"] == 0, (step, out[step]["stderr"], log.read_text()[-3000:])
    before, after = json.loads(out["before"]["stdout"]), json.loads(out["after"]["stdout"])
    assert before["items"][0]["source"] == "auth/tokens.py" and before["items"][0]["trust_class"] == "canonical"
    assert after["items"][0]["trust_class"] == "overlay" and "job edit" in after["items"][0]["text"]
    assert after["filters"] == {"repo": "demo", "tenant": "acme", "run_id": "run-cli"}  # the job's scope, exported by the hook


@pytest.mark.slow
def test_a_plain_celery_worker_with_no_queue_flag_consumes_every_moonmind_queue(indexed, env, tmp_path):
    sq, iq = unique_queues()
    e = queue_env(env, sq, iq)
    proc = subprocess.Popen(
        [CELERY, "-A", "tasks", "worker", "--pool", "solo", "--without-gossip", "--without-mingle", "-n", f"plain-{sq}@%h"],
        env=e, cwd=ROOT, stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        wait_for_consumer(sq, proc=proc)
        wait_for_consumer(iq, proc=proc)
        r = subprocess.run([MOONMIND, *QUERY, "--execution", "queue", "--json"], env=e, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["items"][0]["source"] == "auth/tokens.py"
    finally:
        stop(proc)
        purge(sq, iq)
        redis().delete(f"moonmind:consumers:{sq}", f"moonmind:consumers:{iq}")


# ---------------------------------------------------------------- gateway ---


@pytest.mark.slow
def test_a_running_gateway_serves_the_boxs_commands_too(indexed, cli, env, home, tmp_path):
    from gateway_helpers import add_token, start_gateway

    add_token(env, "box", ["demo"], ["acme"])
    gw = start_gateway(home, env, tmp_path)
    try:
        wait_for_socket(home, gw.proc)
        r = cli(*QUERY, "--json")
        assert r.code == 0, r.stderr
        assert r.json()["items"][0]["source"] == "auth/tokens.py"
        (indexed / "db" / "pool.py").write_text("def drain_pool():\n    pass\n")
        r = cli("rag", "index", str(indexed), "--repo", "demo", "--tenant", "acme", "--json")
        assert r.code == 0 and r.json()["files_indexed"] == 1, r.stderr
        assert (socket_of(home).parent / "owner.lock").read_text().strip() == str(gw.proc.pid)
    finally:
        gw.stop()
    assert not socket_of(home).exists()  # a gateway that stops takes its socket with it


def test_the_command_table_names_the_module_that_registers_each_command():
    """`cli.COMMANDS` lets a command build only its own parser; it must match what the modules register."""
    import argparse

    from moonmind_worker.cli.main import COMMANDS, build_parser

    registered = set()
    root = build_parser()
    for action in root._subparsers._group_actions:
        for group, sub in action.choices.items():
            inner = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
            if not inner:
                registered.add((group, ""))
            for a in inner:
                registered.update((group, name) for name in a.choices)
    assert registered == set(COMMANDS)


def test_a_command_with_its_own_parser_only_parses_like_the_full_one():
    from moonmind_worker.cli.main import build_parser

    argv = ["rag", "search", "--query", "x", "--top-k", "3", "--filters", "repo=a"]
    full, own = build_parser().parse_args(argv), build_parser(argv).parse_args(argv)
    assert vars(full) == {**vars(own), "_group_parser": vars(full)["_group_parser"]}


@pytest.mark.slow
def test_sync_embedding_through_an_owner_switches_the_collection_it_keeps_serving(cli, prebuilt, env, home):
    """The owner re-embeds with the client's (new) model, keeps its hold through the sync, and serves the result."""
    from http_servers import EmbeddingsServer

    server = EmbeddingsServer(repeat=2)
    hosted = {"MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-sync", "OPENAI_BASE_URL": server.base_url,
              "MOONMIND_EMBEDDING_MODEL": "local-embed-512"}
    proc = start_owner(env, home)
    try:
        assert cli("rag", "search", "--query", "bearer token", extra_env=hosted).code == 3  # the client's model drifted
        r = cli("rag", "sync-embedding", "--collection", "moonmind__repo", extra_env=hosted)
        assert r.code == 0, r.stderr
        assert r.stdout.startswith("synced moonmind__repo:") and "local-embed-512" in r.stdout
        r = cli("rag", "search", "--query", "where are bearer tokens checked", "--json", extra_env=hosted)
        assert r.code == 0, r.stderr
        assert r.json()["items"][0]["source"] == "auth/tokens.py"
        assert r.json()["items"][0]["model_version"] == "local-embed-512"
        assert (socket_of(home).parent / "owner.lock").read_text().strip() == str(proc.pid)  # held throughout
    finally:
        stop(proc)
        server.close()
