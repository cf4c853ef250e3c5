"""Wall time of `moonmind rag search` per process, sync one-shot vs --execution queue against a warm worker.

    python -m bench.queue_search [--chunks 10000] [--runs 20] [--home DIR] [--broker URL] [--backend URL]

Builds (or reuses, with --home) an embedded index of at least --chunks synthetic code chunks,
times `--runs` sync one-shot searches (`MOONMIND_OWNER=off`: each process loads the model and
opens the store), then starts a real `celery -A tasks worker --pool solo` that owns the store and
times `--runs` queue-mode searches sent through the worker's owner socket (the default), and
`--runs` sent by the CLI process itself (`MOONMIND_OWNER=off`: it loads Celery), interleaved.
Prints medians and p90s. `--broker amqp://guest:guest@127.0.0.1:5672//` measures RabbitMQ.
Bounded: gives up after --max-s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
QUERIES = ["where are bearer tokens validated", "connection pool acquire release", "render template context",
           "cache eviction policy ttl", "retry with exponential backoff"]


def synth_repo(root: Path, files: int) -> None:
    words = ["token", "cache", "pool", "render", "retry", "session", "queue", "index", "search", "config"]
    for i in range(files):
        w = words[i % len(words)]
        body = []
        for j in range(6):
            body.append(
                f"def {w}_{i}_{j}(request, limit={j}):\n"
                f"    \"\"\"Handle {w} step {j} for module {i}: validate the input, consult the {words[(i + j) % 10]} layer.\"\"\"\n"
                + "".join(f"    value_{k} = request.get('{w}_{k}', {k}) * limit  # {words[(k + j) % 10]} bookkeeping\n" for k in range(14))
                + f"    return {{'module': {i}, 'step': {j}}}\n"
            )
        p = root / f"pkg{i % 50}" / f"{w}_{i}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("\n\n".join(body))


def timed(cmd: list[str], env: dict, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        started = time.perf_counter()
        p = subprocess.run(cmd[:3] + ["--query", QUERIES[i % len(QUERIES)]] + cmd[3:], env=env, capture_output=True, text=True)
        out.append((time.perf_counter() - started) * 1000)
        if p.returncode != 0:
            raise SystemExit(f"search failed: {p.stderr}")
    return out


def summary(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    return f"{name}: median {statistics.median(ms):.0f} ms, p90 {ms[int(0.9 * (len(ms) - 1))]:.0f} ms, min {ms[0]:.0f} ms (n={len(ms)})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--home", default=None)
    ap.add_argument("--broker", default="redis://127.0.0.1:6379/4")
    ap.add_argument("--backend", default="redis://127.0.0.1:6379/5", help="the result backend (default Redis db 5)")
    ap.add_argument("--max-s", type=float, default=900)
    a = ap.parse_args()
    deadline = time.monotonic() + a.max_s
    work = Path(tempfile.mkdtemp(prefix="mm-bench-"))
    home = Path(a.home) if a.home else work / "home"
    tag = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOONMIND_", "QDRANT_", "CELERY_"))}
    env.update(MOONMIND_HOME=str(home), CELERY_BROKER_URL=a.broker, CELERY_RESULT_BACKEND=a.backend,
               MOONMIND_OWNER="off", MOONMIND_SEARCH_QUEUE=f"bench-search-{tag}",
               MOONMIND_INDEX_QUEUE=f"bench-index-{tag}", PATH=f"{BIN}:{env.get('PATH', '')}")
    mm = str(BIN / "moonmind")
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store

    def points() -> int:
        try:
            s = open_store(Settings(MOONMIND_HOME=str(home)))
            try:
                info = s.info()
                return info.points if info else 0
            finally:
                s.close()
        except Exception:  # noqa: BLE001
            return 0

    n = points()
    if n < a.chunks:
        repo = work / "repo"
        synth_repo(repo, files=max(a.chunks // 5, 10))
        started = time.perf_counter()
        p = subprocess.run([mm, "rag", "index", str(repo), "--repo", "bench"], env=env, capture_output=True, text=True,
                           timeout=max(deadline - time.monotonic(), 1))
        if p.returncode != 0:
            raise SystemExit(p.stderr)
        print(p.stdout.strip(), f"({time.perf_counter() - started:.1f}s)")
        n = points()
    print(f"index: {n} points")
    search = [mm, "rag", "search", "--filters", "repo=bench", "--top-k", "8"]
    sync = timed(search, env, a.runs)
    print(summary("sync one-shot          ", sync))
    served = {k: v for k, v in env.items() if k != "MOONMIND_OWNER"}  # the default: the box's owner sends the task
    log = open(work / "worker.log", "w")
    worker = subprocess.Popen([str(BIN / "celery"), "-A", "tasks", "worker", "--pool", "solo", "-Q",
                               f"{env['MOONMIND_SEARCH_QUEUE']},{env['MOONMIND_INDEX_QUEUE']}", "-l", "WARNING"],
                              env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while time.monotonic() < deadline:
            p = subprocess.run(search[:3] + ["--query", "warm up"] + search[3:] + ["--execution", "queue", "--timeout", "5"],
                               env=env, capture_output=True, text=True)
            if p.returncode == 0:
                break
            time.sleep(0.5)
        through_owner, cold = [], []
        for _ in range(a.runs):  # interleaved: the box's drift hits both arms alike
            through_owner += timed(search + ["--execution", "queue"], served, 1)
            cold += timed(search + ["--execution", "queue"], env, 1)
        print(summary("queue through the owner", through_owner))
        print(summary("queue from the CLI     ", cold))
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(20)
        _forget_queues(a.broker, env["MOONMIND_SEARCH_QUEUE"], env["MOONMIND_INDEX_QUEUE"])
        if not a.home:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _forget_queues(broker: str, *queues: str) -> None:
    """Leave the broker as it was: the run's queues (and on Redis, worker heartbeats and kombu bindings)."""
    if not broker.startswith("redis"):
        from kombu import Connection

        with Connection(broker) as conn:
            for q in queues:
                try:
                    conn.channel().queue_delete(q)
                except conn.channel_errors:
                    pass
        return
    import redis

    try:
        r = redis.Redis.from_url(broker)
        r.delete(*(k for q in queues for k in queue_keys(q)))
    except redis.RedisError:
        pass


def queue_keys(queue: str) -> tuple[str, ...]:
    """Every Redis key a bench queue leaves: its messages, worker heartbeats and kombu's bindings."""
    from moonmind_worker.transports.queue_client import CONSUMERS_KEY

    return (queue, CONSUMERS_KEY.format(queue=queue), f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")


if __name__ == "__main__":
    sys.exit(main())

