"""docs/examples/ runs as documented: the job manifest, the job task module, the overlay recipe and
the queue-events consumer, each against real Redis, a real `celery` worker and the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from celery_helpers import BACKEND, BROKER, ROOT, solo_worker
from conftest import FIXTURE_FILES, MOONMIND, write_tree

EXAMPLES = ROOT / "docs" / "examples"
QUESTION = "where is the bearer token checked"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def git_workspace(path: Path) -> Path:
    """The fixture repository as a git work tree with one commit."""
    ws = write_tree(path, {**FIXTURE_FILES, "old/legacy.py": "def legacy_bearer_check():\n    return False\n"})
    git(ws, "init", "-q")
    git(ws, "config", "user.email", "examples@example.invalid")
    git(ws, "config", "user.name", "examples")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "initial")
    return ws


def edit(ws: Path) -> None:
    """What a job leaves behind: a modified file, a new untracked file, a `git rm` and a plain `rm`."""
    (ws / "auth" / "tokens.py").write_text("def check_bearer_token(header):\n    return header == 'job edit'\n")
    (ws / "auth" / "new scopes.py").write_text("def token_scopes(token):\n    return ['read']\n")
    git(ws, "rm", "-q", "old/legacy.py")
    (ws / "db" / "pool.py").unlink()


def test_the_example_manifest_has_the_hooks_fields():
    from moonmind_worker.jobs.hook import ENV_FIELDS, job_of, requires_rag

    job = job_of(json.loads((EXAMPLES / "job.json").read_text()))
    assert set(ENV_FIELDS) <= set(job) and all(isinstance(job[k], str) and job[k] for k in ENV_FIELDS)
    assert isinstance(job["capabilities"], dict) and "rag" not in job["capabilities"]  # the hook fills it in
    assert requires_rag(job)


@pytest.mark.slow
def test_the_overlay_recipe_overlays_modified_untracked_and_deleted_files(cli, env, tmp_path):
    ws = git_workspace(tmp_path / "ws")
    assert cli("rag", "index", str(ws), "--repo", "myrepo").code == 0
    edit(ws)
    assert git(ws, "diff", "--name-only").split() == ["auth/tokens.py", "db/pool.py"]  # what the old recipe saw
    scope = {"MOONMIND_RUN_ID": "run-recipe", "MOONMIND_REPO": "myrepo", "MOONMIND": MOONMIND}
    r = subprocess.run(["bash", str(EXAMPLES / "overlay.sh"), "--json"], cwd=ws / "auth", env={**env, **scope},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert sorted(report["files"]) == ["auth/new scopes.py", "auth/tokens.py"]
    assert sorted(report["tombstones"]) == ["db/pool.py", "old/legacy.py"]

    rows = cli("rag", "overlay", "list", "--json", extra_env=scope).json()
    held = {row["path"]: row["tombstone"] for row in rows}
    assert held == {"auth/tokens.py": False, "auth/new scopes.py": False, "db/pool.py": True, "old/legacy.py": True}
    pack = cli("rag", "search", "legacy bearer check", "--json", extra_env=scope).json()
    assert "old/legacy.py" not in [i["source"] for i in pack["items"]]  # the staged deletion hides it for the run

    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "edits")
    r = subprocess.run(["bash", str(EXAMPLES / "overlay.sh")], cwd=ws, env={**env, **scope}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "nothing to upsert" in r.stderr  # a clean tree is not an error


@pytest.fixture
def example_worker(env, home, tmp_path):
    """`celery -A rag_job worker --pool solo` with docs/examples on PYTHONPATH, as the module's docstring says."""
    with solo_worker("rag_job", EXAMPLES, env, home, tmp_path, "examples") as (_, sq, _, log):
        yield sq, log


def test_the_example_send_snippet_names_a_queue_the_documented_worker_reads():
    """Issue 57: the snippet sent the job to Celery's default `celery` queue, which the worker never reads."""
    import ast
    import textwrap

    from moonmind_worker.settings import Settings

    doc = ast.get_docstring(ast.parse((EXAMPLES / "rag_job.py").read_text()))
    snippet = textwrap.dedent(doc[doc.index("    from celery import Celery"):doc.index("`base=JobTask`")])
    (call,) = [n for n in ast.walk(ast.parse(snippet)) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "send_task"]
    queue = {k.arg: k.value for k in call.keywords}.get("queue")
    defaults = Settings(_env_file=None, _environ=False)
    assert isinstance(queue, ast.Constant) and queue.value in (defaults.index_queue, defaults.search_queue)


@pytest.mark.slow
def test_the_example_job_task_runs_the_example_manifest_in_a_real_worker(cli, env, tmp_path, request):
    from celery import Celery

    ws = git_workspace(tmp_path / "ws")
    manifest = json.loads((EXAMPLES / "job.json").read_text())
    r = cli("rag", "index", str(ws), "--repo", manifest["repo"], "--tenant", manifest["tenant"])
    assert r.code == 0, r.stderr
    edit(ws)
    sq, log = request.getfixturevalue("example_worker")  # after the index: the worker takes the store over
    app = Celery(broker=BROKER, backend=BACKEND)
    try:
        out = app.send_task("examples.rag_job", kwargs={"manifest": manifest, "workspace": str(ws), "question": QUESTION},
                            queue=sq).get(timeout=180)
    finally:
        app.close()
    assert out["errors"] == [], (out["errors"], log.read_text()[-3000:])
    assert out["rag"] == "direct-qdrant"
    before, overlay, after = out["before"], out["overlay"], out["after"]
    assert before["items"][0]["source"] == "auth/tokens.py" and before["items"][0]["trust_class"] == "canonical"
    assert overlay["run_id"] == manifest["run_id"] and overlay["repo"] == manifest["repo"]
    assert sorted(overlay["files"]) == ["auth/new scopes.py", "auth/tokens.py"]
    assert sorted(overlay["tombstones"]) == ["db/pool.py", "old/legacy.py"]
    assert after["items"][0]["trust_class"] == "overlay" and "job edit" in after["items"][0]["text"]
    assert not {"db/pool.py", "old/legacy.py"} & {i["source"] for i in after["items"]}
    assert after["filters"] == {"repo": "myrepo", "tenant": "default", "run_id": manifest["run_id"]}


@pytest.mark.slow
def test_the_events_consumer_prints_the_events_a_search_publishes(prebuilt, cli, env):
    consumer = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "events_consumer.py"), "--timeout", "60"],
        env={**env, "CELERY_BROKER_URL": BROKER}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        assert consumer.stderr is not None and consumer.stdout is not None
        ready = consumer.stderr.readline()
        assert ready.startswith("listening:") and "moonmind.events" in ready and "rag.#" in ready, ready
        r = cli("rag", "search", QUESTION, "--filters", "repo=demo", "--json", extra_env={"CELERY_BROKER_URL": BROKER})
        assert r.code == 0, r.stderr
        telemetry = r.json()["telemetry_id"]
        mine = []
        for line in consumer.stdout:  # other tests may publish on the same broker: keep this search's events
            event = json.loads(line)
            assert event["schema"] == 1 and event["event_id"].startswith("evt_")
            if event.get("telemetry_id") == telemetry:
                mine.append(event["event"])
            if "qdrant_query_completed" in mine:
                break
        assert "qdrant_query_completed" in mine
    finally:
        if consumer.poll() is None:
            os.killpg(consumer.pid, signal.SIGINT)  # Ctrl-C: the consumer deletes its private queue and exits 0
        assert consumer.wait(15) == 0
