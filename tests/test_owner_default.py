"""The warm owner by default, handed over safely: every command on a box is served warm.

Everything is real: the default settings start a detached `moonmind serve --idle-exit` owner,
Celery workers and the gateway are real processes, the CLI runs as a subprocess. Who served a
command is read from the store's lock (the owner's PID), never from timing: a command run with
`MOONMIND_STORE_WAIT_S=0` while another process holds the store can only succeed through it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from moonmind_worker import process

from celery_helpers import purge, queue_env, redis, start_worker_process, stop, unique_queues, wait_for_consumer
from conftest import MOONMIND
from test_owner import QUERY, comparable, socket_of, start_owner

#: A command that fails at once unless an owner answers it: the store is locked by that owner.
SERVED_ONLY = {"MOONMIND_STORE_WAIT_S": "0"}


def lock_pid(home: Path) -> int | None:
    try:
        return int((socket_of(home).parent / "owner.lock").read_text().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    if not process.alive(pid):
        return False
    try:  # a zombie child of this test is gone too
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def until(condition, timeout: float = 60.0, what: str = "the condition") -> None:
    """Poll a state change made by another process (its end, its lock) within a generous bound."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g}s")
        time.sleep(0.05)


def run(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([MOONMIND, *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture
def default_env(env, home):
    """The settings a user has: MOONMIND_OWNER unset. The background owner is stopped after the test."""
    e = {k: v for k, v in env.items() if k != "MOONMIND_OWNER"}
    yield e
    pid = lock_pid(home)
    if pid and alive(pid) and "--idle-exit" in cmdline(pid):
        os.kill(pid, signal.SIGTERM)
        until(lambda: not alive(pid), 15, "the background owner's exit")


class SearchLoop:
    """`moonmind rag search` in a loop on a thread, each result kept: what a user's agent does during a hand-over."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.results: list[subprocess.CompletedProcess] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.results.append(run(*QUERY, "--json", env=self.env))

    def __enter__(self) -> SearchLoop:
        self._thread.start()
        return self

    def more(self, n: int) -> None:
        """Wait until `n` more searches than now have finished."""
        target = len(self.results) + n
        until(lambda: len(self.results) >= target, 120, f"{n} more searches")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def failures(self) -> list[str]:
        return [r.stderr for r in self.results if r.returncode != 0]


# ---------------------------------------------------------------- default ---


@pytest.mark.slow
def test_with_default_settings_the_first_search_starts_an_owner_that_serves_every_later_one(prebuilt, default_env, home):
    first = run(*QUERY, "--json", env=default_env)
    assert first.returncode == 0, first.stderr
    pid = lock_pid(home)
    assert pid and alive(pid) and "serve --idle-exit" in cmdline(pid)
    for _ in range(3):
        later = run(*QUERY, "--json", env={**default_env, **SERVED_ONLY})
        assert later.returncode == 0, later.stderr
        assert comparable(json.loads(later.stdout)) == comparable(json.loads(first.stdout))
    assert lock_pid(home) == pid  # one owner answered them all


@pytest.mark.slow
def test_owner_off_runs_every_command_in_its_own_process(prebuilt, default_env, home):
    r = run(*QUERY, "--json", env={**default_env, "MOONMIND_OWNER": "off"})
    assert r.returncode == 0, r.stderr
    pid = lock_pid(home)
    assert not socket_of(home).exists() and (pid is None or not alive(pid))


# -------------------------------------------------------------- hand-over ---


@pytest.fixture
def queues():
    sq, iq = unique_queues()
    yield sq, iq
    purge(sq, iq)
    redis().delete(f"moonmind:consumers:{sq}", f"moonmind:consumers:{iq}")


@pytest.mark.slow
def test_a_celery_worker_takes_the_store_over_from_the_auto_owner_while_searches_never_fail(
    prebuilt, default_env, home, tmp_path, queues,
):
    assert run(*QUERY, env=default_env).returncode == 0
    auto = lock_pid(home)
    assert auto and "--idle-exit" in cmdline(auto)
    worker_env = queue_env(default_env, *queues)
    with SearchLoop(default_env) as loop:
        loop.more(2)
        worker = start_worker_process(worker_env, list(queues), tmp_path / "worker.log")
        try:
            until(lambda: lock_pid(home) == worker.pid and socket_of(home).exists(), 90, "the worker's take-over")
            loop.more(3)
        except BaseException:
            stop(worker)
            raise
    try:
        assert loop.failures() == []
        until(lambda: not alive(auto), 30, "the auto owner's exit")
        served = run(*QUERY, "--json", env={**default_env, **SERVED_ONLY})
        assert served.returncode == 0, served.stderr
        assert lock_pid(home) == worker.pid
    finally:
        stop(worker)
    after = run(*QUERY, "--json", env=default_env)  # the worker is gone: a new auto owner serves again
    assert after.returncode == 0, after.stderr
    fresh = lock_pid(home)
    assert fresh not in (auto, worker.pid) and alive(fresh) and "--idle-exit" in cmdline(fresh)


@pytest.mark.slow
def test_the_wedge_cannot_occur_auto_owner_then_worker_then_owner_exits_then_a_queued_task(
    prebuilt, default_env, home, tmp_path, queues,
):
    """The reported sequence: every command failed with store_busy until the worker was restarted."""
    assert run(*QUERY, env=default_env).returncode == 0
    auto = lock_pid(home)
    worker_env = queue_env(default_env, *queues)
    worker = start_worker_process(worker_env, list(queues), tmp_path / "worker.log")
    try:
        wait_for_consumer(queues[0], proc=worker)
        until(lambda: not alive(auto), 60, "the auto owner's exit")
        queued = run(*QUERY, "--execution", "queue", "--json", env=worker_env)
        assert queued.returncode == 0, queued.stderr
        for args in (QUERY, ("worker", "doctor"), ("rag", "stats", "--repo", "demo", "--tenant", "acme")):
            r = run(*args, env={**default_env, **SERVED_ONLY})
            assert r.returncode == 0, (args, r.stdout, r.stderr)
            assert "store_busy" not in r.stderr
        assert lock_pid(home) == worker.pid
    finally:
        stop(worker)


@pytest.mark.slow
def test_a_second_worker_becomes_the_owner_when_the_first_stops_instead_of_holding_the_store_silently(
    prebuilt, default_env, home, tmp_path,
):
    first_q, second_q = unique_queues(), unique_queues()
    first = start_worker_process(queue_env(default_env, *first_q), list(first_q), tmp_path / "first.log")
    second = None
    try:
        until(lambda: lock_pid(home) == first.pid and socket_of(home).exists(), 90, "the first worker's hold")
        second_env = queue_env(default_env, *second_q)
        second = start_worker_process(second_env, list(second_q), tmp_path / "second.log")
        wait_for_consumer(second_q[0], proc=second)
        assert lock_pid(home) == first.pid  # a worker keeps the store from another worker
        via_first = run(*QUERY, "--execution", "queue", "--json", env=second_env)  # the second's task runs on the first
        assert via_first.returncode == 0, via_first.stderr
        stop(first)
        queued = run(*QUERY, "--execution", "queue", "--json", env=second_env)
        assert queued.returncode == 0, queued.stderr
        assert lock_pid(home) == second.pid and socket_of(home).exists()
        served = run(*QUERY, "--json", env={**default_env, **SERVED_ONLY})
        assert served.returncode == 0, served.stderr
    finally:
        stop(first)
        if second is not None:
            stop(second)
        for q in (*first_q, *second_q):
            purge(q)
            redis().delete(f"moonmind:consumers:{q}")


@pytest.mark.slow
def test_a_gateway_started_beside_a_worker_owner_answers_through_it(prebuilt, env, home, tmp_path, queues):
    from gateway_helpers import add_token, start_gateway

    token = add_token(env, "box", ["demo"], ["acme"])
    other = add_token(env, "other", ["elsewhere"], ["acme"])
    worker = start_worker_process(queue_env(env, *queues), list(queues), tmp_path / "worker.log")
    try:
        until(lambda: lock_pid(home) == worker.pid and socket_of(home).exists(), 90, "the worker's hold")
        gw = start_gateway(home, env, tmp_path)
        try:
            with gw.client(token) as c:
                health = c.get("/retrieval/health")
                r = c.post("/retrieval/context", json={"query": "where is the bearer token checked", "filters": {"repo": "demo"}})
            assert health.status_code == 200, health.text
            assert r.status_code == 200, (r.text, gw.logs()[-2000:])
            pack = r.json()
            assert pack["transport"] == "gateway" and pack["items"][0]["source"] == "auth/tokens.py"
            with gw.client(other) as c:  # the token's scope still holds through the owner
                scoped = c.post("/retrieval/context", json={"query": "where is the bearer token checked"})
            assert scoped.status_code == 200 and scoped.json()["items"] == []
            assert lock_pid(home) == worker.pid
        finally:
            gw.stop()
    finally:
        stop(worker)


# --------------------------------------------------- the caller's settings ---


@pytest.mark.slow
def test_a_clients_chunk_size_reaches_the_owner_that_indexes_for_it(repo, env, home, tmp_path, cli):
    owner = start_owner(env, home)
    try:
        small = cli("rag", "index", str(repo), "--repo", "small", "--json", extra_env={"MOONMIND_CHUNK_CHARS": "200"})
        usual = cli("rag", "index", str(repo), "--repo", "usual", "--json")
        assert small.code == 0, small.stderr
        assert usual.code == 0, usual.stderr
    finally:
        stop(owner)
    one_shot = cli("rag", "index", str(repo), "--repo", "small", "--json",
                   extra_env={"MOONMIND_CHUNK_CHARS": "200", "MOONMIND_OWNER": "off", "MOONMIND_HOME": str(tmp_path / "h2")})
    assert one_shot.code == 0, one_shot.stderr
    assert small.json()["chunks_written"] == one_shot.json()["chunks_written"] > usual.json()["chunks_written"]


@pytest.mark.slow
def test_each_jobs_context_packs_land_in_its_own_artifacts_directory_through_one_owner(prebuilt, env, home, tmp_path, cli):
    owner = start_owner(env, home)
    try:
        packs = {}
        for job in ("a", "b"):
            job_env = {"MOONMIND_ARTIFACTS_DIR": str(tmp_path / f"artifacts-{job}"), "MOONMIND_RUN_ID": f"run-{job}",
                       "MOONMIND_JOB_ID": f"job-{job}"}
            r = cli(*QUERY, "--json", extra_env=job_env)
            assert r.code == 0, r.stderr
            listed = cli("rag", "packs", "--json", extra_env=job_env)
            assert listed.code == 0, listed.stderr
            packs[job] = (r.json()["telemetry_id"], [p["telemetry_id"] for p in listed.json()])
    finally:
        stop(owner)
    for job, (telemetry_id, listed_ids) in packs.items():
        assert listed_ids == [telemetry_id]
        assert (tmp_path / f"artifacts-{job}" / f"run-{job}" / "context-packs" / f"{telemetry_id}.json").is_file()
    assert not (home / "artifacts").exists()  # nothing in the owner's own directory


def test_the_owner_runs_a_request_with_the_clients_settings_not_its_own():
    from moonmind_worker.settings import Settings

    client = Settings(_env_file=None, moonmind_home="/srv/mm", chunk_chars=400, artifacts_dir="rel/art", run_id="r1")
    served = Settings.from_wire(json.loads(json.dumps(client.wire())))
    assert (served.chunk_chars, served.run_id) == (400, "r1")
    assert served.artifacts_dir == Path("rel/art").absolute()  # the client's working directory, not the owner's
    assert served.top_k == Settings(_env_file=None, _environ=False).top_k  # a default, not the owner's environment


def test_settings_the_owner_does_not_know_are_refused_with_a_clear_error():
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.settings import Settings

    with pytest.raises(MoonmindError) as exc:
        Settings.from_wire({"no_such_setting": 1})
    assert exc.value.code == "invalid_argument" and "same moonmind-worker version" in exc.value.action


@pytest.mark.slow
def test_searches_racing_the_first_index_of_an_empty_home_are_served_not_refused_as_busy(default_env, repo):
    """Issue 52: 0-7 of 10 searches racing the first `rag index` failed store_busy while the auto owner already served."""
    index = subprocess.Popen([MOONMIND, "rag", "index", str(repo), "--repo", "demo"], env=default_env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    searches = [subprocess.Popen([MOONMIND, "rag", "search", "--query", "bearer token", "--filters", "repo=demo"],
                                 env=default_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(6)]
    outcomes = [(p.wait(timeout=120), p.stderr.read()) for p in searches]
    assert index.wait(timeout=120) == 0, index.stderr.read()
    # before the index made the collection a search may find none (a true answer); never "the store is busy"
    assert not [err for code, err in outcomes if code != 0 and "collection_missing" not in err], outcomes
