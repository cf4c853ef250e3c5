"""The dense index's options on a real repository's vectors: build time, search latency, and recall against an exact scan.

`python -m bench.dense_graph [--source DIR | --home HOME] [--builds N] [--queries Q] [--variant NAME ...]`
indexes DIR once (default: the Django 5.1.4 source, `bench.owner.django_source`; or reads the embedded
store of an existing MOONMIND_HOME), takes every dense vector, and for each variant builds a fresh shard
of them N times, the way the store writes (segments capped at `edge.SEGMENT_KB`, each optimized when full,
the rest at the end). Each build then answers Q queries near stored chunks (a stored vector plus a little
seeded noise) and the static model's embeddings of `bench.owner.QUERIES`, as the store asks: beam
(`DENSE_SEARCH_BEAM`), dense limit (`CANDIDATE_POOL`), and no filter (the points hold the store's two keyed entries,
and a filter condition every point holds is left out of the request: store/edge_census.py).

Variants: `graph` (the store's from `edge_shard.GRAPH_FROM_SEGMENTS` segments on: m `HNSW_M`, `EF_CONSTRUCT`, the
engine's thread count), `graph:m=12,ef=48,threads=1` (any of the three), `plain` (no graph: every segment scanned,
the store's below that size), `plain-int8` and `graph-int8` (scalar int8 copies
searched, then rescored on the vectors, oversampling 2). Reported per variant: build wall and CPU, search p50 / p95,
and recall@limit against an exact cosine scan (a hit tied with the k-th nearest counts): mean, worst, and how many
queries fell below 0.5. Graph builds are not deterministic (several threads); a rare poorly linked point shows up only
over many builds.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

KEYS = ["tenant=bench", "repo=bench"]
#: Scores this close to a query's k-th nearest count as a tie with it (float32 cosine).
TIE = 1e-5


def vectors_of(home: Path) -> Any:
    """Every dense vector of the embedded store under `home`, as a float32 matrix."""
    import numpy as np
    from qdrant_edge import EdgeShard, ScrollRequest

    shard_dir = next(home.glob("qdrant-edge/*/shard"), None)
    if shard_dir is None:
        raise SystemExit(f"no embedded store under {home}: index a tree into it first, or pass --source")
    shard = EdgeShard.load(str(shard_dir))
    rows, offset = [], None
    while True:
        records, offset = shard.scroll(ScrollRequest(offset=offset, limit=4096, with_payload=False, with_vector=["dense"]))
        rows.extend(r.vector["dense"] for r in records)
        if offset is None:
            break
    shard.close()
    return np.asarray(rows, dtype=np.float32)


def index_once(source: Path, home: Path) -> None:
    from .owner import MOONMIND, env_for

    r = subprocess.run([MOONMIND, "rag", "index", str(source), "--repo", "bench"], env=env_for(home), capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"rag index failed ({r.returncode}): {r.stderr[-2000:]}")


def parse_variant(name: str) -> dict:
    """'graph', 'graph:m=12,ef=48', 'plain', 'plain-int8', 'graph-int8' -> the shard's settings."""
    from moonmind_worker.store.edge_shard import EF_CONSTRUCT, HNSW_M

    kind, _, opts = name.partition(":")
    if kind not in ("graph", "plain", "graph-int8", "plain-int8"):
        raise SystemExit(f"unknown variant {name!r}: graph[:m=M,ef=EF,threads=T], plain, graph-int8 or plain-int8")
    out = {"m": HNSW_M if kind.startswith("graph") else 0, "ef": EF_CONSTRUCT, "threads": 0, "int8": kind.endswith("int8")}
    for opt in filter(None, opts.split(",")):
        key, _, value = opt.partition("=")
        if key not in ("m", "ef", "threads") or not value.isdigit():
            raise SystemExit(f"bad option {opt!r} in {name!r}: m=N, ef=N or threads=N")
        out[key] = int(value)
    return out


def build(vectors: Any, path: Path, m: int, ef: int, threads: int, int8: bool) -> tuple[Any, float, float]:
    """A shard of `vectors` written as the store writes; (shard, build wall, build CPU) of its optimizes."""
    from qdrant_edge import (
        Distance,
        EdgeConfig,
        EdgeShard,
        EdgeVectorParams,
        HnswIndexConfig,
        KeywordIndexParams,
        Memory,
        Point,
        ScalarQuantizationConfig,
        ScalarType,
        UpdateOperation,
    )

    from moonmind_worker.store import edge
    from moonmind_worker.store.edge_shard import FULL_SCAN_KB

    quant = ScalarQuantizationConfig(type=ScalarType.Int8, quantile=0.99, memory=Memory.Cached) if int8 else None
    dense = EdgeVectorParams(size=vectors.shape[1], distance=Distance.Cosine, memory=Memory.Cold, quantization_config=quant)
    config = EdgeConfig(vectors={"dense": dense}, optimizers=edge._optimizers(), wal_enabled=False,
                        hnsw_config=HnswIndexConfig(m=m, ef_construct=ef, full_scan_threshold=FULL_SCAN_KB,
                                                    max_indexing_threads=threads, memory=Memory.Cached))
    shard = EdgeShard.create(str(path), config)
    shard.update(UpdateOperation.create_field_index("_keys", KeywordIndexParams(memory=Memory.Cached)))
    segment = edge.SEGMENT_KB * 1024 // (4 * vectors.shape[1])
    wall = cpu = 0.0
    unindexed = 0

    def optimize() -> None:
        nonlocal wall, cpu
        t, c = time.perf_counter(), time.process_time()
        shard.optimize()
        wall += time.perf_counter() - t
        cpu += time.process_time() - c

    for start in range(0, len(vectors), 1024):
        rows = range(start, min(start + 1024, len(vectors)))
        shard.update(UpdateOperation.upsert_points(
            [Point(id=i, vector={"dense": vectors[i].tolist()}, payload={"_keys": KEYS}) for i in rows]))
        unindexed += len(rows)
        if unindexed >= segment:  # as `EdgeStore.upsert`: a full segment is built before the next write
            optimize()
            unindexed = 0
    optimize()
    return shard, wall, cpu


def search(shard: Any, queries: Any, limit: int, int8: bool) -> tuple[list[list[int]], list[float]]:
    from qdrant_edge import QuantizationSearchParams, Query, QueryRequest, SearchParams

    from moonmind_worker.store.base import DENSE_SEARCH_BEAM

    params = SearchParams(hnsw_ef=DENSE_SEARCH_BEAM,
                          quantization=QuantizationSearchParams(rescore=True, oversampling=2.0) if int8 else None)
    found, walls = [], []
    for q in queries:
        t = time.perf_counter()
        hits = shard.query(QueryRequest(limit=limit, query=Query.Nearest(q.tolist(), using="dense"),
                                        params=params, with_payload=False, with_vector=False))
        walls.append((time.perf_counter() - t) * 1000)
        found.append([int(h.id) for h in hits])
    return found, walls


def queries_for(vectors: Any, count: int, seed: int) -> Any:
    """`count` stored vectors moved by a little noise (near chunks), then the model's embeddings of real questions."""
    import numpy as np

    from moonmind_worker.embedding.static import StaticEmbedder

    from .owner import QUERIES

    rng = np.random.default_rng(seed)
    near = vectors[rng.choice(len(vectors), size=min(count, len(vectors)), replace=False)]
    near = near + rng.normal(0, 0.02, size=near.shape).astype(np.float32)
    real = StaticEmbedder().embed_documents(list(QUERIES))
    return np.vstack([near, real]).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", help="tree to index once (default: the Django 5.1.4 source)")
    ap.add_argument("--home", help="a MOONMIND_HOME whose embedded store holds the vectors (no index run)")
    ap.add_argument("--builds", type=int, default=3, help="builds per variant (default 3)")
    ap.add_argument("--queries", type=int, default=300, help="queries near stored chunks per build (default 300)")
    ap.add_argument("--variant", action="append", help="graph[:m=M,ef=EF,threads=T], plain, graph-int8, plain-int8 (default: graph, plain)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    import numpy as np

    from moonmind_worker.retrieval.pipeline import CANDIDATE_POOL

    variants = args.variant or ["graph", "plain"]
    settings = {v: parse_variant(v) for v in variants}  # a bad name fails before the index run
    scratch = Path(tempfile.mkdtemp(prefix="moonmind-dense-graph-"))
    try:
        if args.home:
            home = Path(args.home)
        else:
            from .owner import django_source

            home = scratch / "home"
            index_once(Path(args.source) if args.source else django_source(), home)
        vectors = vectors_of(home)
        queries = queries_for(vectors, args.queries, args.seed)
        unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        scores = [unit @ (q / np.linalg.norm(q)) for q in queries]
        # the score of each query's k-th nearest vector: a hit scoring that much is one of the k, whichever of a
        # tie the scan would list (Django holds many near-identical chunks: translations, migrations)
        kth = [float(np.sort(s)[-min(CANDIDATE_POOL, len(s))]) for s in scores]
        near = min(args.queries, len(vectors))
        print(f"{len(vectors):,} vectors of {vectors.shape[1]} dims; {len(queries)} queries ({near} near stored "
              f"chunks, {len(queries) - near} questions) a build; top {CANDIDATE_POOL}; {args.builds} builds a variant")
        print("| variant | build wall (s) | build CPU (s) | search p50 / p95 (ms) | recall mean | worst | below 0.5 |")
        print("|---|---|---|---|---|---|---|")
        for name, cfg in settings.items():
            walls, cpus, lat, recall = [], [], [], []
            for b in range(args.builds):
                path = scratch / f"shard-{b}"
                shard, wall, cpu = build(vectors, path, cfg["m"], cfg["ef"], cfg["threads"], cfg["int8"])
                search(shard, queries[:8], CANDIDATE_POOL, cfg["int8"])  # page cache warm
                found, ms = search(shard, queries, CANDIDATE_POOL, cfg["int8"])
                shard.close()
                shutil.rmtree(path)
                walls.append(wall)
                cpus.append(cpu)
                lat += ms
                recall += [sum(1 for i in got if row[i] >= k - TIE) / min(CANDIDATE_POOL, len(row))
                           for row, k, got in zip(scores, kth, found)]
            lat.sort()
            print(f"| {name} | {statistics.median(walls):.2f} ({min(walls):.2f}–{max(walls):.2f}) | "
                  f"{statistics.median(cpus):.2f} | {lat[len(lat) // 2]:.2f} / {lat[int(len(lat) * 0.95)]:.2f} | "
                  f"{statistics.fmean(recall):.4f} | {min(recall):.3f} | {sum(r < 0.5 for r in recall)} |", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
