"""Benchmark workspace overlays: upsert of a ~500-line file end to end, and the TTL sweep.

    python -m bench.overlay [--workdir /tmp/moonmind-bench-overlay] [--repeats 15] [--parts upsert,cli,sweep]
                            [--sweep-points 100000] [--sweep-points-local 20000] [--max-seconds 900]

Per engine (Qdrant Edge on disk, qdrant-client local mode):

1. the canonical index is this package's own source tree; the overlaid file is the
   first 500 lines of the standard library's argparse.py (real code, ~20 KB);
2. `upsert_overlay` of that file, in-process: the first upsert and N re-upserts
   after an edit (each replaces the previous chunks), p50/p95;
3. `moonmind rag overlay upsert FILE` as a subprocess, start to exit (Edge only: the
   CLI's default store), median of 5;
4. search latency in-process with the run's overlay merged vs `overlay_policy=skip`;
5. the sweep: N synthetic expired overlay points (random unit vectors, full
   ChunkPayload) beside 10k live overlay points and 10k canonical points, then
   `clean_overlay(expired=True)` timed, counts checked before/after, and a second
   (idempotent) sweep timed.

Bounded: subprocesses have timeouts and the run stops at --max-seconds.
"""

from __future__ import annotations

import argparse
import argparse as _argparse_module
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MOONMIND = shutil.which("moonmind") or str(Path(sys.executable).parent / "moonmind")
QUERIES = ["parse command line arguments", "add a mutually exclusive group", "format the help message",
           "batched search request to the store", "upsert points with payload"]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def check(self, stage: str) -> None:
        if time.monotonic() > self.end:
            raise SystemExit(f"bench: time budget exhausted before {stage}")


def make_world(kind: str, home: Path):
    from moonmind_worker.runtime import get_embedder
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store

    s = Settings(MOONMIND_HOME=str(home), QDRANT_URL=":memory:" if kind == "local" else None,
                 MOONMIND_COLLECTION="bench", MOONMIND_EMBEDDING_PROVIDER="static")
    return s, get_embedder(s), open_store(s)


def bench_upsert(kind: str, work: Path, repeats: int, budget: Budget) -> dict:
    from moonmind_worker.contracts import parse_query
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.indexing.overlay import upsert_overlay
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack

    home = work / f"home-{kind}"
    shutil.rmtree(home, ignore_errors=True)
    ws = work / f"ws-{kind}"
    shutil.rmtree(ws, ignore_errors=True)
    shutil.copytree(ROOT / "moonmind_worker", ws / "moonmind_worker", ignore=shutil.ignore_patterns("models", "__pycache__"))
    src = Path(_argparse_module.__file__).read_text().splitlines(keepends=True)[:500]
    target = ws / "moonmind_worker" / "cliparse.py"
    target.write_text("".join(src))
    settings, embedder, store = make_world(kind, home)
    t = time.perf_counter()
    idx = index_repository(ws, repo="bench", tenant="t", settings=settings, embedder=embedder, store=store)
    index_s = time.perf_counter() - t

    cpu: list[float] = []

    def upsert(run: str):
        t0, c0 = time.perf_counter(), time.process_time()
        s = upsert_overlay(["moonmind_worker/cliparse.py"], root=ws, run_id=run, ttl_s=3600, repo="bench",
                           tenant="t", settings=settings, embedder=embedder, store=store)
        cpu.append((time.process_time() - c0) * 1000)
        return (time.perf_counter() - t0) * 1000, s

    first_ms, first = upsert("run-1")
    times = []
    for n in range(repeats):
        budget.check("re-upserts")
        lines = src[:]
        lines[10 + n] = f"# edit {n}: a worker changed this line\n"
        target.write_text("".join(lines))
        ms, s = upsert("run-1")
        times.append(ms)

    def search(policy: str) -> tuple[list[float], list[float]]:
        wall, cpu_ms = [], []
        for q in QUERIES * 3:
            query = parse_query({"query": q, "filters": {"repo": "bench", "tenant": "t", "run_id": "run-1"},
                                 "overlay_policy": policy})
            t0, c0 = time.perf_counter(), time.process_time()
            retrieve_context_pack(query, settings=settings, embedder=embedder, store=store)
            wall.append((time.perf_counter() - t0) * 1000)
            cpu_ms.append((time.process_time() - c0) * 1000)
        return wall, cpu_ms

    search("include")  # warm
    (inc, inc_cpu), (skip, skip_cpu) = search("include"), search("skip")
    store.close()
    return {
        "engine": kind,
        "canonical_chunks": idx.chunks_written,
        "canonical_index_s": round(index_s, 2),
        "file_lines": 500,
        "file_bytes": len("".join(src).encode()),
        "overlay_chunks": first.chunks_written,
        "first_upsert_ms": round(first_ms, 1),
        "reupsert_ms_p50": round(statistics.median(times), 1),
        "reupsert_ms_p95": round(pct(times, 0.95), 1),
        "reupsert_cpu_ms_p50": round(statistics.median(cpu[1:]), 1),
        "search_ms_p50_overlay_include": round(statistics.median(inc), 2),
        "search_ms_p50_overlay_skip": round(statistics.median(skip), 2),
        "search_cpu_ms_p50_overlay_include": round(statistics.median(inc_cpu), 2),
        "search_cpu_ms_p50_overlay_skip": round(statistics.median(skip_cpu), 2),
    }


def bench_cli(work: Path, budget: Budget) -> dict:
    """`moonmind rag overlay upsert` start to exit, against the Edge store indexed by bench_upsert."""
    ws = work / "ws-edge"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QDRANT_", "MOONMIND_"))}
    env.update(MOONMIND_HOME=str(work / "home-edge"), MOONMIND_COLLECTION="bench", MOONMIND_RUN_ID="run-cli",
               MOONMIND_REPO="bench", MOONMIND_TENANT="t")
    walls, cpus = [], []
    for _ in range(5):
        budget.check("CLI upserts")
        t0 = time.perf_counter()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([MOONMIND, "rag", "overlay", "upsert", "moonmind_worker/cliparse.py", "--root", str(ws)],
                           cwd=ws, env=env, capture_output=True, text=True, timeout=120)
        walls.append((time.perf_counter() - t0) * 1000)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * 1000)
        if p.returncode != 0:
            raise SystemExit(f"CLI upsert failed: {p.stderr}")
    return {"cli_upsert_wall_ms_median": round(statistics.median(walls), 1), "cli_upsert_wall_ms_max": round(max(walls), 1),
            "cli_upsert_cpu_ms_median": round(statistics.median(cpus), 1)}


def synthetic_points(n: int, dims: int, *, trust: str, run: str, expires_at: float | None, start: int, rng):
    from moonmind_worker.contracts import ChunkPayload
    from moonmind_worker.store import PointIn, SparseVec
    from moonmind_worker.text.chunking import sha256_text

    vecs = rng.standard_normal((n, dims)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    out = []
    for i in range(n):
        k = start + i
        path = f"src/mod_{k // 8}.py"
        text = f"def f_{k}(x):\n    return x * {k}\n"
        payload = ChunkPayload(
            path=path, repo="bench", tenant=f"t{k % 3}", language="python", chunk_id=f"{path}#{k % 8}",
            chunk_hash=sha256_text(text), content_hash=sha256_text(path), offset_start=0, offset_end=len(text),
            line_start=1, line_end=2, section_title=f"f_{k}", chunk_sequence=k % 8, total_chunks=8, text=text,
            token_count=8, model_version="bench", indexed_at="2026-01-01T00:00:00Z", trust_class=trust,
            run_id=run if trust != "canonical" else "", expires_at=expires_at,
        )
        out.append(PointIn(id=str(uuid.UUID(int=k + 1)), dense=vecs[i], sparse=SparseVec([k % 1000], [1.0]),
                           payload=payload.model_dump()))
    return out


def bench_sweep(kind: str, work: Path, n_expired: int, budget: Budget) -> dict:
    from moonmind_worker.contracts import WORKSPACE_OVERLAY
    from moonmind_worker.indexing.overlay import clean_overlay
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import Match, Range, Where, open_store

    home = work / f"sweep-{kind}"
    shutil.rmtree(home, ignore_errors=True)
    settings = Settings(MOONMIND_HOME=str(home), QDRANT_URL=":memory:" if kind == "local" else None,
                        MOONMIND_COLLECTION="sweep")
    store = open_store(settings)
    dims = 256
    store.create(dims, "bench", 1)
    rng = np.random.default_rng(7)
    now = time.time()
    t0 = time.perf_counter()
    made = 0
    groups = [("workspace_overlay", "expired", now - 60, n_expired), ("workspace_overlay", "live", now + 3600, 10_000),
              ("canonical", "", None, 10_000)]
    for trust, run, exp, count in groups:
        for i in range(0, count, 5000):
            budget.check("loading sweep points")
            store.upsert(synthetic_points(min(5000, count - i), dims, trust=trust, run=f"{run}-{i % 7}",
                                          expires_at=exp, start=made, rng=rng))
            made += min(5000, count - i)
    store.flush()
    load_s = time.perf_counter() - t0
    overlay = Match("trust_class", WORKSPACE_OVERLAY)
    expired_before = store.count(Where(must=(overlay, Range("expires_at", lte=now))))
    live_before = store.count(Where(must=(overlay, Range("expires_at", gt=now))))
    canonical_before = store.count(Where(must=(Match("trust_class", "canonical"),)))
    t0 = time.perf_counter()
    removed = clean_overlay(expired=True, settings=settings, store=store, now=now)
    sweep_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = clean_overlay(expired=True, settings=settings, store=store, now=now)
    again_s = time.perf_counter() - t0
    result = {
        "engine": kind,
        "expired_points": n_expired,
        "load_s": round(load_s, 1),
        "removed": removed,
        "sweep_s": round(sweep_s, 3),
        "points_per_s": round(removed / sweep_s) if sweep_s else None,
        "expired_after": store.count(Where(must=(overlay, Range("expires_at", lte=now)))),
        "live_intact": store.count(Where(must=(overlay, Range("expires_at", gt=now)))) == live_before,
        "canonical_intact": store.count(Where(must=(Match("trust_class", "canonical"),))) == canonical_before,
        "second_sweep_removed": again,
        "second_sweep_s": round(again_s, 3),
    }
    assert removed == expired_before, (removed, expired_before)
    store.close()
    shutil.rmtree(home, ignore_errors=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/moonmind-bench-overlay")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sweep-points", type=int, default=100_000)
    ap.add_argument("--sweep-points-local", type=int, default=20_000)
    ap.add_argument("--max-seconds", type=float, default=900)
    ap.add_argument("--parts", default="upsert,cli,sweep", help="comma-separated subset of upsert,cli,sweep")
    args = ap.parse_args()
    budget = Budget(args.max_seconds)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        "load_avg_at_start": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "upsert": [], "sweep": [],
    }
    parts = set(args.parts.split(","))
    if parts & {"upsert", "cli"}:
        for kind in ("edge", "local"):
            report["upsert"].append(bench_upsert(kind, work, args.repeats, budget))
            print(json.dumps(report["upsert"][-1]), file=sys.stderr)
    if "cli" in parts:
        report["cli"] = bench_cli(work, budget)
        print(json.dumps(report["cli"]), file=sys.stderr)
    if "sweep" in parts:
        for kind, n in (("edge", args.sweep_points), ("local", args.sweep_points_local)):
            report["sweep"].append(bench_sweep(kind, work, n, budget))
            print(json.dumps(report["sweep"][-1]), file=sys.stderr)
    report["load_avg_at_end"] = os.getloadavg()[0]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
