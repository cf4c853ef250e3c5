"""Benchmark the retrieval loop on a real corpus: indexing rate, no-change re-index, search latency.

    python -m bench.retrieval_loop [--workdir /tmp/moonmind-bench] [--searches 15] [--max-seconds 1200]

Fetches the sources of a few PyPI packages with `pip download --no-deps` (wheels,
unpacked into WORKDIR/corpus; nothing is committed), indexes them with the
installed `moonmind` (the default offline embedder, the embedded store), then reports:

- chunks/s for a full index (process wall time and CPU time),
- the no-change re-index time (process wall),
- `moonmind rag search` process wall time, start to exit (median and p95 of N),
- the search stage (store calls only) and whole-pipeline latency in-process (p50/p95).

Bounded: every subprocess has a timeout and the run stops at --max-seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

PACKAGES = [
    "django==5.1.4", "sqlalchemy==2.0.36", "celery==5.4.0", "rich==13.9.4", "fastapi==0.115.6",
    "starlette==0.41.3", "httpx==0.28.1", "click==8.1.7", "flask==3.1.0", "requests==2.32.3",
]

QUERIES = [
    "where is the CSRF token checked",
    "database connection pool recycle",
    "render a template with context",
    "parse multipart form data upload",
    "retry a task with exponential backoff",
    "OAuth2 password bearer dependency",
    "print a table with colored columns",
    "follow redirects and keep cookies",
    "migration autodetector renamed field",
    "session middleware cookie signing",
    "websocket accept and receive text",
    "command line option with default value from environment",
    "QuerySet.select_related",
    "how are SQL joins compiled",
    "timezone aware datetime conversion",
]

MOONMIND = shutil.which("moonmind") or str(Path(sys.executable).parent / "moonmind")


def fetch_corpus(workdir: Path, packages: list[str]) -> Path:
    """Download wheels once and unpack each into corpus/<name>; reused across runs."""
    dl, corpus = workdir / "dl", workdir / "corpus"
    dl.mkdir(parents=True, exist_ok=True)
    if not any(dl.glob("*.whl")):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(dl), *packages],
            check=True, timeout=600,
        )
    if not corpus.exists():
        for whl in sorted(dl.glob("*.whl")):
            zipfile.ZipFile(whl).extractall(corpus / whl.name.split("-")[0].lower())
    return corpus


def run(args: list[str], env: dict, timeout: float) -> tuple[subprocess.CompletedProcess, float, float]:
    """(result, wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args[:4])} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p, wall, cpu


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def search_stage(home: Path, rounds: int) -> dict:
    """In-process: time the store calls the pipeline makes (the search stage) and the whole pipeline."""
    os.environ["MOONMIND_HOME"] = str(home)
    from moonmind_worker.contracts import parse_query
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.runtime import close_all, get_embedder, get_store
    from moonmind_worker.settings import get_settings

    settings = get_settings()
    store, embedder = get_store(settings), get_embedder(settings)
    spent: list[float] = []

    class Timed:
        """The real store, with its query calls timed."""

        def __getattr__(self, name):
            attr = getattr(store, name)
            if name not in ("search", "retrieve"):
                return attr

            def timed(*a, **kw):
                t = time.perf_counter()
                try:
                    return attr(*a, **kw)
                finally:
                    spent[-1] += time.perf_counter() - t

            return timed

    timed_store = Timed()
    first_ms = None
    stage, pipeline = [], []
    for r in range(rounds):
        for q in QUERIES:
            spent.append(0.0)
            t = time.perf_counter()
            retrieve_context_pack(parse_query({"query": q, "filters": {"repo": "bench"}}), settings=settings,
                                  embedder=embedder, store=timed_store)
            total = time.perf_counter() - t
            if first_ms is None:
                first_ms = spent[-1] * 1000
            else:
                stage.append(spent[-1] * 1000)
                pipeline.append(total * 1000)
    close_all()
    return {
        "first_query_store_ms": round(first_ms, 2),
        "stage_p50_ms": round(pct(stage, 0.5), 2), "stage_p95_ms": round(pct(stage, 0.95), 2),
        "pipeline_p50_ms": round(pct(pipeline, 0.5), 2), "pipeline_p95_ms": round(pct(pipeline, 0.95), 2),
        "queries": len(stage),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.retrieval_loop", description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default="/tmp/moonmind-bench", help="downloads, corpus and index live here")
    ap.add_argument("--searches", type=int, default=15, help="`rag search` processes to time (>= 10)")
    ap.add_argument("--rounds", type=int, default=20, help="in-process rounds over the query set")
    ap.add_argument("--max-seconds", type=float, default=1500, help="stop the run after this long")
    ap.add_argument("--keep-index", action="store_true", help="reuse an existing index instead of rebuilding")
    ns = ap.parse_args(argv)
    deadline = time.monotonic() + ns.max_seconds

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SystemExit("benchmark stopped at --max-seconds")
        return remaining

    workdir = Path(ns.workdir)
    corpus = fetch_corpus(workdir, PACKAGES)
    home = workdir / "home"
    if not ns.keep_index and home.exists():
        shutil.rmtree(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QDRANT_", "MOONMIND_", "RAG_"))}
    env["MOONMIND_HOME"] = str(home)
    report: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
        f"{platform.python_implementation()} {platform.python_version()}",
        "load_avg_start": os.getloadavg(),
        "packages": PACKAGES,
    }

    index_cmd = [MOONMIND, "rag", "index", str(corpus), "--repo", "bench", "--json"]
    p, wall, cpu = run(index_cmd, env, left())
    s = json.loads(p.stdout)
    report["index"] = {
        "files_seen": s["files_seen"], "files_indexed": s["files_indexed"], "chunks": s["chunks_written"],
        "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
        "chunks_per_s_wall": round(s["chunks_written"] / wall, 1) if s["chunks_written"] else None,
        "chunks_per_cpu_s": round(s["chunks_written"] / cpu, 1) if s["chunks_written"] else None,
    }
    p, wall, cpu = run(index_cmd, env, left())
    s2 = json.loads(p.stdout)
    assert s2["chunks_written"] == 0 and s2["files_indexed"] == 0, s2
    report["reindex_no_change"] = {
        "files_seen": s2["files_seen"], "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "stage_s": round(s2["seconds"], 2)
    }

    walls, cpus = [], []
    run([MOONMIND, "rag", "search", "--query", QUERIES[0], "--filters", "repo=bench"], env, left())  # warm the page cache
    for i in range(max(ns.searches, 10)):
        q = QUERIES[i % len(QUERIES)]
        _, wall, cpu = run([MOONMIND, "rag", "search", "--query", q, "--filters", "repo=bench"], env, left())
        walls.append(wall * 1000)
        cpus.append(cpu * 1000)
    report["search_process"] = {
        "runs": len(walls), "wall_median_ms": round(statistics.median(walls)), "wall_p95_ms": round(pct(walls, 0.95)),
        "wall_min_ms": round(min(walls)), "cpu_median_ms": round(statistics.median(cpus)),
    }
    left()
    report["search_stage"] = search_stage(home, ns.rounds)
    report["load_avg_end"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
