"""Store-only growth curve: search latency and memory of the embedded store at N synthetic chunks.

Run in its own process per size (`python -m bench.growth --points N --dir D`)
so peak RSS belongs to that size alone. Vectors are synthetic (random unit
256-d dense, 24-term sparse from a 50k vocabulary, payload with the indexed
filter fields and a 300-character text): this measures the engine and our
store layer, not retrieval quality. Bounded: the build stops at --budget-s or
--max-rss-mib and reports how far it got.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

import numpy as np

DIM = 256
VOCAB = 50_000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--budget-s", type=float, default=600)
    ap.add_argument("--max-rss-mib", type=float, default=8192)
    ap.add_argument("--backend", choices=["edge", "local"], default="edge")
    ap.add_argument("--optimize", action=argparse.BooleanOptionalAction, default=True,
                    help="optimize after the build, as the indexer does (--no-optimize: the last, partial segment stays raw; "
                         "full segments are optimized during the write)")
    args = ap.parse_args(argv)

    from moonmind_worker.store import EdgeStore, Match, PointIn, SearchSpec, SparseVec, Where

    from .measure import percentile, self_peak_mib

    if args.backend == "edge":
        store = EdgeStore(args.dir, "growth")
    else:  # qdrant-client's local mode (in memory)
        import os

        from moonmind_worker.settings import get_settings
        from moonmind_worker.store import open_store

        os.environ["QDRANT_URL"] = ":memory:"  # its fastest form; a path adds an sqlite write per upsert
        os.environ["MOONMIND_HOME"] = args.dir
        store = open_store(get_settings(), "growth")
    store.create(DIM, "synthetic-256", 1)
    rng = np.random.default_rng(7)
    started = time.perf_counter()
    written, batch, stopped = 0, 2000, ""
    text = "x" * 300
    while written < args.points:
        n = min(batch, args.points - written)
        vecs = rng.standard_normal((n, DIM), dtype=np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        points = []
        for k in range(n):
            i = written + k
            idx = np.unique(rng.integers(0, VOCAB, 24)).astype(np.uint32)
            points.append(
                PointIn(
                    id=str(uuid.UUID(int=i + 1)),
                    dense=vecs[k],
                    sparse=SparseVec(idx.tolist(), rng.random(len(idx), dtype=np.float32).tolist()),
                    payload={"tenant": "t", "repo": f"r{i % 8}", "trust_class": "canonical",
                             "path": f"pkg/m{i // 50}.py", "chunk_hash": f"h{i}", "offset_start": 0, "text": text},
                )
            )
        store.upsert(points)
        written += n
        if time.perf_counter() - started > args.budget_s:
            stopped = f"time budget {args.budget_s:.0f}s reached"
            break
        if self_peak_mib() > args.max_rss_mib:
            stopped = f"memory cap {args.max_rss_mib:.0f} MiB reached"
            break
    store.flush()
    build_s = time.perf_counter() - started
    optimize_s = 0.0
    if args.optimize:  # as the indexer leaves the store: segments merged, HNSW built
        t0 = time.perf_counter()
        store.optimize()
        store.flush()
        optimize_s = time.perf_counter() - t0
    rss_after_build = self_peak_mib()

    where = Where(must=(Match("trust_class", "canonical"), Match("repo", "r3")))
    lat_dense, lat_batch = [], []
    for _ in range(args.queries):
        q = rng.standard_normal(DIM, dtype=np.float32)
        q /= np.linalg.norm(q)
        idx = np.unique(rng.integers(0, VOCAB, 6)).astype(np.uint32)
        t0 = time.perf_counter()
        store.search([SearchSpec(where=where, limit=40, dense=q)])
        t1 = time.perf_counter()
        store.search([
            SearchSpec(where=where, limit=40, dense=q),
            SearchSpec(where=where, limit=40, sparse=SparseVec(idx.tolist(), [1.0] * len(idx)), cosine_to=q),
        ])
        t2 = time.perf_counter()
        lat_dense.append((t1 - t0) * 1000)
        lat_batch.append((t2 - t1) * 1000)
    store.close()
    out = {
        "backend": args.backend,
        "points_requested": args.points,
        "points": written,
        "stopped": stopped,
        "build_s": round(build_s, 2),
        "points_per_s": round(written / build_s, 1) if build_s else 0,
        "optimize_s": round(optimize_s, 2),
        "dense_ms": [round(percentile(lat_dense, q), 3) for q in (50, 95, 99)],
        "batch_ms": [round(percentile(lat_batch, q), 3) for q in (50, 95, 99)],
        "rss_after_build_mib": round(rss_after_build, 1),
        "peak_rss_mib": round(self_peak_mib(), 1),
    }
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
