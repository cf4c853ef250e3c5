"""Where a cold `rag index` of a large real repository spends its time, stage by stage.

`python -m bench.index_profile` indexes the Django 5.1.4 source (fetched once into the gitignored
bench/corpus/ by `bench.owner.django_source`) into a scratch MOONMIND_HOME, in this process and
without index worker processes (MOONMIND_INDEX_WORKERS=0: the stages' own cost, not their overlap),
with wall-clock timers around each stage of the real indexer (no profiler: cProfile's per-call
overhead inflates Python-heavy stages several-fold and misleads). A store write that fills a
segment builds it there (`EdgeStore.upsert`): that build counts as optimize, not as the write. The
run's last optimize is held back, to measure what it buys: search latency with the last segment
still plain (searched whole) against the optimized shard.

Stages: walk, read, chunk (tree-sitter + line splitter), embed (tokenizer + mean pooling),
BM25 vectors, payloads and points (the pydantic payload, point objects), store writes (upsert
and stale deletes), optimize (segment merge + HNSW build).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

QUERIES = [
    "how are query strings parsed", "QuerySet filter chaining", "csrf token validation middleware",
    "template engine loaders", "database connection pooling", "migration autodetector renames",
    "password hashers", "ModelAdmin list_display",
]

_spent: dict[str, float] = defaultdict(float)


@contextmanager
def _timed(stage: str):
    t = time.perf_counter()
    try:
        yield
    finally:
        _spent[stage] += time.perf_counter() - t


def _wrap(module, name: str, stage: str) -> None:
    real = getattr(module, name)

    def timed(*args, **kwargs):
        with _timed(stage):
            return real(*args, **kwargs)

    setattr(module, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=None, help="tree to index (default: the Django 5.1.4 source)")
    args = ap.parse_args()
    from .owner import django_source

    source = Path(args.source) if args.source else django_source()
    home = Path(tempfile.mkdtemp(prefix="moonmind-index-profile-"))
    os.environ["MOONMIND_HOME"] = str(home)
    os.environ["MOONMIND_OWNER"] = "off"
    os.environ["MOONMIND_INDEX_WORKERS"] = "0"  # every stage in this process, where the timers are
    try:
        _profile(source)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _profile(source: Path) -> None:
    from moonmind_worker.contracts import parse_query
    from moonmind_worker.indexing import indexer
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.runtime import get_embedder, get_store
    from moonmind_worker.settings import get_settings
    from moonmind_worker.text import chunking, files, lexical

    settings = get_settings()
    embedder, store = get_embedder(settings), get_store(settings)
    real_walk = indexer.walk
    indexer.walk = lambda *a, **k: _call(lambda: list(real_walk(*a, **k)), "walk")  # a generator: time its whole run
    _wrap(files.TreeReader, "read_text", "read")  # every file the indexer reads goes through its tree reader
    _wrap(chunking, "chunk_text", "chunk")  # called through indexing/workers.py, which looks it up per job
    _wrap(lexical, "document_vector", "BM25 vectors")
    real_embed = embedder.embed_documents
    embedder.embed_documents = lambda texts: _call(real_embed, "embed", texts)  # type: ignore[method-assign]
    writing = []  # non-empty inside a store write: an optimize there is a segment the write filled (edge.upsert)
    for op in ("upsert", "delete_ids"):
        real = getattr(store, op)
        setattr(store, op, (lambda r: lambda *a, **k: _call(_writing(writing, r), "store writes", *a, **k))(real))
    real_optimize = store.optimize

    builds: list[float] = []  # segments a write filled, built then (the next segment starts after them)

    def optimize() -> None:
        if writing:
            t = time.perf_counter()
            real_optimize()
            builds.append(time.perf_counter() - t)
        # else the run's last optimize: measured on its own below, with searches before and after

    store.optimize = optimize
    started = time.perf_counter()
    summary = indexer.index_repository(source, repo="bench", tenant="default", settings=settings,
                                       embedder=embedder, store=store)
    total = time.perf_counter() - started
    _spent["store writes"] -= sum(builds)
    build = _spent["walk"] + _spent["read"] + _spent["chunk"] + _spent["embed"] + _spent["BM25 vectors"] + _spent["store writes"]
    before = _searches(settings, embedder, store, parse_query, retrieve_context_pack)
    t = time.perf_counter()
    real_optimize()
    last = time.perf_counter() - t
    optimize = last + sum(builds)
    after = _searches(settings, embedder, store, parse_query, retrieve_context_pack)
    store.close()
    n = summary.chunks_written
    rows = [(k, _spent[k]) for k in ("walk", "read", "chunk", "embed", "BM25 vectors", "store writes")]
    rows.append(("payloads, points, rest", total - build - sum(builds)))
    rows.append(("optimize (merge + HNSW)", optimize))
    whole = total + last
    print(f"{summary.files_indexed} files, {n} chunks; cold index {whole:.1f} s = {n / whole:.0f} chunks/s "
          f"({total:.1f} s before the last optimize = {n / total:.0f} chunks/s)")
    print("| stage | seconds | share |\n|---|---|---|")
    for name, sec in rows:
        print(f"| {name} | {sec:.1f} | {sec / whole:.0%} |")
    print(f"{len(builds)} segment(s) built as the run wrote, the rest by the last optimize")
    print(f"search p50 on plain segments {statistics.median(before):.1f} ms, after optimize {statistics.median(after):.1f} ms")


def _call(fn, stage: str, *args, **kwargs):
    with _timed(stage):
        return fn(*args, **kwargs)


def _writing(flag: list, fn):
    def call(*args, **kwargs):
        flag.append(True)
        try:
            return fn(*args, **kwargs)
        finally:
            flag.pop()
    return call


def _searches(settings, embedder, store, parse_query, retrieve) -> list[float]:
    times = []
    for i in range(3 * len(QUERIES)):
        q = parse_query({"query": QUERIES[i % len(QUERIES)], "filters": {"repo": "bench"}})
        t = time.perf_counter()
        retrieve(q, settings=settings, embedder=embedder, store=store)
        times.append((time.perf_counter() - t) * 1000)
    return times[len(QUERIES):]  # the first round warms caches


if __name__ == "__main__":
    main()
