"""What observability costs a search: sinks off vs. sinks down vs. sinks up, and vs. no instrumentation.

    python bench/obs_overhead.py [--rounds 12] [--per-round 25] [--cli-runs 8]

Indexes this repository into a temporary MOONMIND_HOME (embedded Qdrant Edge,
static embedder), then times warm in-process `retrieve_context_pack` calls under:

* off      — STATSD_HOST unset, no broker: metrics/events are no-ops (the baseline);
* down     — STATSD_HOST=10.255.255.1 (unroutable) and CELERY_BROKER_URL on a closed port;
* up       — a real UDP socket as StatsD and Redis DB 7 as the broker;
* bare     — the undecorated pipeline (`__wrapped__`): no metrics, events, breadcrumb or artifact.

Configurations are interleaved round by round so load from other processes on the
machine hits them alike; medians are reported. Then, optionally, whole CLI
processes (`moonmind rag search`) off vs. down, where a dead broker costs one
refused connect per process. Bounded: defaults finish in about a minute.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUERIES = [
    "where are queue events published",
    "statsd client resolve host",
    "dedupe by path and chunk hash",
    "embedding dimension mismatch guardrail",
    "latency budget exceeded",
]


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def configs(udp_port: int) -> dict[str, dict[str, str | None]]:
    dead = closed_port()
    return {
        "off": {"STATSD_HOST": None, "CELERY_BROKER_URL": None},
        "down": {"STATSD_HOST": "10.255.255.1", "STATSD_PORT": "8125", "CELERY_BROKER_URL": f"redis://127.0.0.1:{dead}/7"},
        "up": {"STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(udp_port), "CELERY_BROKER_URL": "redis://127.0.0.1:6379/7"},
        "bare": {"STATSD_HOST": None, "CELERY_BROKER_URL": None},
    }


def apply(env: dict[str, str | None]) -> None:
    from moonmind_worker.observe import events, metrics
    from moonmind_worker.settings import get_settings

    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    get_settings.cache_clear()
    metrics.reset()
    events.reset()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--cli-runs", type=int, default=8, help="CLI processes per configuration (0: skip)")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="mm-obs-bench-"))
    for var in ("QDRANT_URL", "MOONMIND_EMBEDDING_PROVIDER", "MOONMIND_RUN_ID", "MOONMIND_EVENTS_URL", "STATSD_PREFIX"):
        os.environ.pop(var, None)
    os.environ.update(MOONMIND_HOME=str(home), MOONMIND_RUN_ID="bench-obs", MOONMIND_JOB_ID="bench")
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    try:
        from moonmind_worker import runtime
        from moonmind_worker.contracts import parse_query
        from moonmind_worker.indexing.indexer import index_repository
        from moonmind_worker.retrieval import pipeline
        from moonmind_worker.settings import get_settings

        apply(configs(0)["off"])
        settings = get_settings()
        summary = index_repository(
            ROOT, repo="bench", tenant="bench", settings=settings,
            embedder=runtime.get_embedder(settings), store=runtime.get_store(settings),
        )
        print(f"indexed {summary.files_indexed} files, {summary.chunks_written} chunks", file=sys.stderr)
        queries = [parse_query({"query": q, "filters": {"repo": "bench"}}) for q in QUERIES]

        cfgs = configs(udp.getsockname()[1])
        samples: dict[str, list[float]] = {name: [] for name in cfgs}
        cpu: dict[str, list[float]] = {name: [] for name in cfgs}
        for r in range(args.rounds):
            order = list(cfgs) if r % 2 == 0 else list(reversed(cfgs))
            for name in order:
                apply(cfgs[name])
                s = get_settings()
                fn = pipeline.retrieve_context_pack.__wrapped__ if name == "bare" else pipeline.retrieve_context_pack
                emb, store = runtime.get_embedder(s), runtime.get_store(s)
                for q in queries[:2]:  # warm: first metric resolves, first event connects (or fails)
                    fn(q, settings=s, embedder=emb, store=store)
                for i in range(args.per_round):
                    q = queries[(r + i) % len(queries)]
                    c, t = time.process_time(), time.perf_counter()
                    fn(q, settings=s, embedder=emb, store=store)
                    samples[name].append((time.perf_counter() - t) * 1000)
                    cpu[name].append((time.process_time() - c) * 1000)
            while True:  # keep the StatsD socket drained
                try:
                    udp.recv(65535)
                except BlockingIOError:
                    break

        def p(xs: list[float], q: float) -> float:
            xs = sorted(xs)
            return xs[min(len(xs) - 1, int(len(xs) * q))]

        base = statistics.median(samples["off"])
        base_p25 = p(samples["off"], 0.25)
        base_cpu = statistics.median(cpu["off"])
        print(f"\nin-process warm search, {args.rounds} rounds x {args.per_round} searches per configuration")
        print(f"{'config':<6} {'wall p25':>9} {'vs off':>7} {'wall med':>9} {'vs off':>7} {'cpu med':>8} {'vs off':>7}")
        for name in samples:
            w25, wm, cm = p(samples[name], 0.25), statistics.median(samples[name]), statistics.median(cpu[name])
            print(f"{name:<6} {w25:>9.3f} {100 * (w25 - base_p25) / base_p25:>+6.1f}% {wm:>9.3f} "
                  f"{100 * (wm - base) / base:>+6.1f}% {cm:>8.3f} {100 * (cm - base_cpu) / base_cpu:>+6.1f}%")

        if args.cli_runs:
            runtime.close_all()
            exe = shutil.which("moonmind") or str(Path(sys.executable).parent / "moonmind")
            cli: dict[str, list[float]] = {"off": [], "down": []}
            for i in range(args.cli_runs * 2):
                name = ("off", "down")[i % 2]
                env = {k: v for k, v in os.environ.items() if k not in ("STATSD_HOST", "CELERY_BROKER_URL")}
                env.update({k: v for k, v in cfgs[name].items() if v is not None})
                t = time.perf_counter()
                p = subprocess.run([exe, "rag", "search", "--query", QUERIES[0], "--filters", "repo=bench"],
                                   env=env, capture_output=True, text=True, timeout=120)
                cli[name].append((time.perf_counter() - t) * 1000)
                if p.returncode != 0:
                    print(p.stderr, file=sys.stderr)
                    return 1
            cbase = statistics.median(cli["off"])
            print(f"\nCLI process (`moonmind rag search`), {args.cli_runs} runs per configuration, interleaved")
            cmin = min(cli["off"])
            for name, xs in cli.items():
                med = statistics.median(xs)
                print(f"{name:<6} median {med:>8.1f} ms {100 * (med - cbase) / cbase:>+6.1f}%   "
                      f"min {min(xs):>8.1f} ms {100 * (min(xs) - cmin) / cmin:>+6.1f}%")
        return 0
    finally:
        udp.close()
        try:
            from moonmind_worker import runtime

            runtime.close_all()
        finally:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
