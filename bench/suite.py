"""`python -m bench [--quick]`: every figure, median and spread over repeated runs, beside its goal.

Order matters because the embedded store has one owning process: CLI indexing
(fresh MOONMIND_HOME per repeat) → in-process stages (search stage, BM25 and
eval, overlay, TTL sweep) → CLI `rag search` sync → a warm Celery worker and
`--execution queue` → gateway (if present) → store-only growth curves in child
processes. Results go into BENCHMARKS.md between this suite's own markers;
other sections of the file are left as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from .measure import Figure, fmt, percentile, run_measured, stop_group, vm_hwm_mib

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MOONMIND = str(BIN / "moonmind")
CELERY = str(BIN / "celery")
CORPUS_DIR = ROOT / "bench" / "corpus"  # gitignored: fetched, never committed
EVAL_FILE = Path(os.environ.get("MOONMIND_BENCH_EVAL", "/work/shared/eval/fastapi.json"))
PACKAGES = ["fastapi", "starlette", "pydantic", "httpx", "rich", "click", "django"]
REDIS_DB = int(os.environ.get("MOONMIND_BENCH_REDIS_DB", "9"))
BEGIN, END = "<!-- bench:suite:begin -->", "<!-- bench:suite:end -->"
QUERIES = [
    "where are bearer tokens checked", "dependency injection resolution", "validate request body",
    "websocket connection handling", "render a table in the terminal", "parse command line options",
    "http client timeout configuration", "database migration", "middleware order", "json schema generation",
]


def fetch_wheel(pkg: str, dest: Path, dl: Path) -> Path:
    """`pip download --no-deps` the package's wheel into `dl` and unpack its sources into `dest` (no dist-info)."""
    import zipfile

    dl.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    pkg, "-d", str(dl)], check=True, capture_output=True)
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in dl.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest)
    for info in dest.glob("*.dist-info"):
        shutil.rmtree(info)
    return dest


class Suite:
    def __init__(self, quick: bool, repeats: int, work: Path, log=sys.stderr) -> None:
        self.quick = quick
        self.repeats = repeats
        self.work = work
        self.log = log
        self.figures: list[Figure] = []
        self.tables: dict[str, list[str]] = {}
        self.notes: list[str] = []
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith(("MOONMIND_", "QDRANT_", "CELERY_"))}
        self.base_env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode cached; measure that
        # each figure names the path it measures: one-shot unless it says owner (no background owner in between)
        self.base_env["MOONMIND_OWNER"] = "off"
        self.home = work / "home"

    # -- helpers -------------------------------------------------------------
    def say(self, msg: str) -> None:
        self.log.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}\n")
        self.log.flush()

    def env(self, home: Path | None = None, **extra: str) -> dict[str, str]:
        e = dict(self.base_env)
        e["MOONMIND_HOME"] = str(home or self.home)
        e.update(extra)
        return e

    def add(self, name: str, unit: str, values: list[float], goal: str = "", met: bool | None = None, note: str = "") -> Figure:
        f = Figure(name, unit, values, goal, met, note)
        self.figures.append(f)
        self.say(f"{name}: {fmt(f.median)} {unit} (spread {f.spread}, n={len(values)})")
        return f

    def moonmind(self, *args: str, env: dict[str, str], timeout: float = 900):
        r = run_measured([MOONMIND, *args], env, timeout=timeout)
        if r.code != 0:
            raise RuntimeError(f"moonmind {' '.join(args[:3])} failed ({r.code}): {r.stderr[-800:]}")
        return r

    # -- corpus --------------------------------------------------------------
    def corpus(self) -> dict[str, Path]:
        """{repo name: root to index}. Quick: this checkout's own sources. Full: PyPI packages' sources."""
        if self.quick:
            root = self.work / "tiny" / "moonmind_worker"
            shutil.copytree(ROOT / "moonmind_worker", root, ignore=shutil.ignore_patterns("models", "__pycache__"))
            return {"tiny": root.parent}
        out = {}
        for pkg in PACKAGES:
            dest = CORPUS_DIR / pkg
            if not (dest / pkg).is_dir():
                self.say(f"fetching {pkg} with pip download --no-deps")
                fetch_wheel(pkg, dest, self.work / "dl" / pkg)
            out[pkg] = dest
        return out

    # -- 1. indexing ---------------------------------------------------------
    def bench_index(self, corpus: dict[str, Path]) -> None:
        chunks_s, files_s, totals = [], [], {}
        for n in range(self.repeats):
            home = self.work / f"index-{n}"
            chunks = files = 0
            seconds = 0.0
            peak = 0.0
            for repo, root in corpus.items():
                r = self.moonmind("rag", "index", str(root), "--repo", repo, "--tenant", "bench", "--json", env=self.env(home))
                s = json.loads(r.stdout)
                chunks += s["chunks_written"]
                files += s["files_seen"]
                seconds += s["seconds"]
                peak = max(peak, r.maxrss_mib)
            chunks_s.append(chunks / seconds)
            files_s.append(files / seconds)
            totals = {"chunks": chunks, "files": files, "peak": peak}
            if n < self.repeats - 1:
                shutil.rmtree(home)
            else:
                if self.home.exists():
                    shutil.rmtree(self.home)
                home.rename(self.home)
        self.corpus_size = totals
        self.add("index throughput", "chunks/s", chunks_s, "≥ 300 chunks/s", min(chunks_s) >= 300 if chunks_s else None,
                 f"{totals['chunks']:,} chunks from {totals['files']:,} files")
        self.add("index throughput (files)", "files/s", files_s)
        self.add("peak memory, CLI `rag index`", "MiB", [totals["peak"]])
        again = []
        for _ in range(self.repeats):
            seconds = 0.0
            for repo, root in corpus.items():
                r = self.moonmind("rag", "index", str(root), "--repo", repo, "--tenant", "bench", "--json", env=self.env())
                s = json.loads(r.stdout)
                assert s["chunks_written"] == 0, "no-change re-index wrote chunks"
                seconds += s["seconds"]
            again.append(seconds * 1000)
        self.add("no-change re-index", "ms", again, note="whole corpus, every file unchanged")

    # -- 2. in-process stages -------------------------------------------------
    def bench_in_process(self, corpus: dict[str, Path]) -> None:
        os.environ["MOONMIND_HOME"] = str(self.home)
        os.environ["MOONMIND_TENANT"] = "bench"
        from moonmind_worker import runtime
        from moonmind_worker.contracts import parse_query
        from moonmind_worker.retrieval.pipeline import retrieve_context_pack
        from moonmind_worker.settings import get_settings

        get_settings.cache_clear()
        settings = get_settings()
        embedder, store = runtime.get_embedder(settings), runtime.get_store(settings)
        stage_ms: list[float] = []
        real_search = store.search

        def timed_search(specs):
            t0 = time.perf_counter()
            try:
                return real_search(specs)
            finally:
                stage_ms.append((time.perf_counter() - t0) * 1000)

        store.search = timed_search  # the one batched store request of the pipeline
        rounds = 2 if self.quick else 20
        whole: list[float] = []
        for _ in range(rounds):
            for q in QUERIES:
                t0 = time.perf_counter()
                retrieve_context_pack(parse_query({"query": q}), settings=settings, embedder=embedder, store=store)
                whole.append((time.perf_counter() - t0) * 1000)
        stage_ms = stage_ms[len(QUERIES):]  # first round warms caches
        whole = whole[len(QUERIES):]
        p = [percentile(stage_ms, q) for q in (50, 95, 99)]
        self.add("search stage p50 (store request)", "ms", [p[0]], "≤ 5 ms", p[0] <= 5,
                 f"p95 {fmt(p[1])} ms, p99 {fmt(p[2])} ms over {len(stage_ms)} queries, whole corpus")
        self.add("search stage p99", "ms", [p[2]])
        pw = [percentile(whole, q) for q in (50, 95, 99)]
        self.add("in-process retrieve_context_pack p50", "ms", [pw[0]], note=f"p95 {fmt(pw[1])}, p99 {fmt(pw[2])} ms")
        store.search = real_search

        self.bench_quality(settings, embedder, store)
        self.bench_overlay(settings, embedder, store, corpus)
        runtime.close_all()
        get_settings.cache_clear()

    def bench_quality(self, settings, embedder, store) -> None:
        """Ours vs BM25 alone (bm25s) on the same chunks: latency and, with the eval file, NDCG@10."""
        from moonmind_worker.contracts import parse_query
        from moonmind_worker.retrieval.evaluation import load_queries, run_eval
        from moonmind_worker.retrieval.pipeline import retrieve_context_pack
        from moonmind_worker.store import Match, Where

        repo = "tiny" if self.quick else "fastapi"
        try:
            import bm25s
        except ImportError:
            self.notes.append("BM25 baseline skipped: install the bench extra (`pip install -e .[bench]`).")
            return
        hits = list(store.scroll(Where(must=(Match("repo", repo), Match("trust_class", "canonical"))), ["path", "text"]))
        texts = [h.payload["text"] for h in hits]
        paths = [h.payload["path"] for h in hits]
        t0 = time.perf_counter()
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize([f"{p}\n{t}" for p, t in zip(paths, texts)], show_progress=False), show_progress=False)
        build_ms = (time.perf_counter() - t0) * 1000
        k = min(10, len(texts))

        def bm25_files(query: str) -> list[str]:
            docs, _ = retriever.retrieve(bm25s.tokenize([query], show_progress=False), k=k, show_progress=False)
            return [paths[i] for i in docs[0]]

        def ours_files(query: str) -> list[str]:
            q = parse_query({"query": query, "top_k": 10, "filters": {"repo": repo}})
            return [i.source for i in retrieve_context_pack(q, settings=settings, embedder=embedder, store=store).items]

        lat = {"bm25": [], "ours": []}
        for name, fn in (("bm25", bm25_files), ("ours", ours_files)):
            fn(QUERIES[0])
            for _ in range(1 if self.quick else 5):
                for q in QUERIES:
                    t = time.perf_counter()
                    fn(q)
                    lat[name].append((time.perf_counter() - t) * 1000)
        rows = [f"| retrieval on repo={repo} ({len(texts):,} chunks) | query p50 | query p95 | NDCG@10 | hit@3 | MRR |",
                "|---|---|---|---|---|---|"]
        quality = {}
        if EVAL_FILE.is_file() and not self.quick:
            queries = load_queries(EVAL_FILE)
            for name, fn in (("bm25", bm25_files), ("ours", ours_files)):
                rep = run_eval(queries, lambda q, fn=fn: fn(q.query), k=10, top_k=10)
                quality[name] = rep
        labels = (("ours", "moonmind (dense + BM25 sparse, fused)"),
                  ("bm25", f"BM25 alone (bm25s, index built in {fmt(build_ms)} ms)"))
        for name, label in labels:
            rep = quality.get(name)
            q = f"{rep.ndcg:.3f} | {rep.hit_at_3:.2f} | {rep.mrr:.3f}" if rep else "n/a (quick) | n/a | n/a"
            rows.append(f"| {label} | {fmt(percentile(lat[name], 50))} ms | {fmt(percentile(lat[name], 95))} ms | {q} |")
        self.tables["Baseline: BM25 alone vs ours (same chunks)"] = rows
        if quality:
            self.add("NDCG@10 on shared/eval/fastapi.json (ours)", "", [quality["ours"].ndcg],
                     note=f"BM25 alone: {quality['bm25'].ndcg:.3f}")

    def bench_languages(self, corpus: dict[str, Path]) -> None:
        """File-level NDCG@10 per language (`bench.languages`). Quick: a smoke set on this checkout, no download."""
        from . import languages

        if self.quick:
            corpora = [languages.Corpus("tiny", "Python (this checkout)", "local", "moonmind_worker (this checkout)",
                                        str(corpus["tiny"]), ROOT / "bench" / "eval-python-moonmind.json")]
        else:
            corpora = languages.selected([], reference=True)
        rows = languages.evaluate(corpora, self.work / "languages-home")
        if self.quick:  # a full run's per-set figures: BENCHMARKS.md "Retrieval quality" (same command, dev and test)
            self.tables["Retrieval quality per language (file-level NDCG@10, `python -m bench.languages --reference`)"] = \
                languages.table(rows).splitlines()
        eight = [r["ndcg"] for r in rows if r["repo"] in {c.repo for c in languages.LANGUAGES}]
        if eight:
            self.add(f"NDCG@10, mean of {len(eight)} languages", "", [sum(eight) / len(eight)],
                     "≥ 0.90 (issue 17)", sum(eight) / len(eight) >= 0.90)

    def bench_overlay(self, settings, embedder, store, corpus) -> None:
        from moonmind_worker.indexing.overlay import clean_overlay, upsert_overlay

        root = next(iter(corpus.values()))
        target = sorted(p for p in root.rglob("*.py") if p.stat().st_size > 2000)[0]
        rel = target.relative_to(root)
        times = []
        for n in range(2 if self.quick else 5):
            t0 = time.perf_counter()
            upsert_overlay([str(target)], root=root, run_id="bench-run", ttl_s=3600, repo=next(iter(corpus)),
                           tenant="bench", settings=settings, embedder=embedder, store=store)
            times.append((time.perf_counter() - t0) * 1000)
        clean_overlay(run_id="bench-run", settings=settings, store=store)
        self.add("overlay upsert of one file", "ms", times, note=f"{rel} ({target.stat().st_size:,} bytes)")

    def bench_ttl_sweep(self) -> None:
        """N expired overlay points in their own store; time `clean_overlay(expired=True)`."""
        import numpy as np

        from moonmind_worker.contracts import WORKSPACE_OVERLAY
        from moonmind_worker.indexing.overlay import clean_overlay
        from moonmind_worker.settings import get_settings
        from moonmind_worker.store import EdgeStore, PointIn, SparseVec

        n_points = 1_000 if self.quick else 100_000
        try:  # the overlay engineer's sweep bench (beside live overlay and canonical points): reuse it when present
            from .overlay import Budget, bench_sweep
        except ImportError:
            bench_sweep = None
        if self.quick:  # it also loads 20k live/canonical points: too slow for --quick
            bench_sweep = None
        if bench_sweep is not None:
            r = bench_sweep("edge", self.work, n_points, Budget(1800))
            assert r["expired_after"] == 0 and r["live_intact"] and r["canonical_intact"], r
            self.add(f"TTL sweep of {n_points:,} expired overlay points", "ms", [r["sweep_s"] * 1000],
                     note=f"bench/overlay.py bench_sweep: beside 10k live overlay + 10k canonical points; "
                          f"loading them took {fmt(r['load_s'])} s")
            return
        times, build = [], []
        rng = np.random.default_rng(1)
        for rep in range(1):
            store = EdgeStore(self.work / f"sweep-{rep}", "sweep")
            store.create(256, "synthetic-256", 1)
            t0 = time.perf_counter()
            past = time.time() - 60
            for start in range(0, n_points, 2000):
                vec = rng.standard_normal((min(2000, n_points - start), 256), dtype=np.float32)
                store.upsert([
                    PointIn(id=str(uuid.UUID(int=start + i + 1)), dense=v, sparse=SparseVec([1], [1.0]),
                            payload={"tenant": "t", "repo": "r", "trust_class": WORKSPACE_OVERLAY,
                                     "run_id": f"run-{(start + i) % 50}", "path": f"f{(start + i) // 10}.py",
                                     "expires_at": past})
                    for i, v in enumerate(vec)
                ])
            build.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            removed = clean_overlay(expired=True, settings=get_settings(), store=store)
            times.append((time.perf_counter() - t0) * 1000)
            assert removed == n_points and store.count() == 0, (removed, store.count())
            store.close()
            shutil.rmtree(self.work / f"sweep-{rep}")
        self.add(f"TTL sweep of {n_points:,} expired overlay points", "ms", times,
                 note=f"writing them took {fmt(build[0])} s; {len(times)} run(s)")

    # -- 3. CLI wall time -------------------------------------------------------
    def bench_cli_sync(self) -> None:
        walls, rss = [], []
        q = ["rag", "search", "--query", "where is the request body validated", "--filters", "tenant=bench"]
        self.moonmind(*q, env=self.env())  # page cache warm
        for _ in range(2 if self.quick else 10):
            r = self.moonmind(*q, "--execution", "sync", env=self.env())
            walls.append(r.wall_s * 1000)
            rss.append(r.maxrss_mib)
        self.add("`rag search --execution sync` wall (embedded store)", "ms", walls, "≤ 500 ms", percentile(walls, 50) <= 500)
        self.add("peak memory, CLI `rag search` sync", "MiB", rss)

    def bench_owner(self) -> None:
        """CLI `rag search` with the default settings (the auto owner) vs one-shot on the same index (bench/owner.py)."""
        from .owner import measure

        f = measure(self.home, rounds=1 if self.quick else 2, tenant="bench", clients=2 if self.quick else 8,
                    per_client=2 if self.quick else 5)
        self.add("`rag search` served by the box's owner (default settings)", "ms", [f["owner_p50_ms"]],
                 "p50 ≤ 80 ms, ≤ ×0.20 of one-shot", f["owner_p50_ms"] <= 80 and f["ratio"] <= 0.2,
                 f"one-shot on the same index: p50 {fmt(f['one_shot_p50_ms'])} ms (×{f['ratio']:.2f})")
        self.add("peak memory, CLI `rag search` through the owner", "MiB", [f["client_rss_mib"]], "≤ 40 MiB",
                 f["client_rss_mib"] <= 40)
        self.add(f"{f['concurrent_clients']} CLI clients at once against one owner, p95", "ms", [f["concurrent_p95_ms"]],
                 "no error", f["concurrent_errors"] == 0,
                 f"{f['concurrent_searches']} searches, {f['concurrent_errors']} errors, p50 {fmt(f['concurrent_p50_ms'])} ms")

    def bench_large_repo(self) -> None:
        """One large real repository, end to end: the Django 5.1.4 source from PyPI, not committed.

        Cold `rag index` (whole process: rate, and the peak RSS of it and its index workers summed),
        a no-change re-index, then one-shot and owner-served `rag search` on that index (bench/owner.py).
        """
        from .measure import run_tree_measured
        from .owner import django_source, env_for, measure

        source = django_source()
        home = self.work / "django-home"
        env = {**env_for(home), "MOONMIND_OWNER": "off"}
        cmd = [MOONMIND, "rag", "index", str(source), "--repo", "django", "--json"]
        rates, peaks, again = [], [], []
        for n in range(self.repeats):
            shutil.rmtree(home, ignore_errors=True)
            r = run_tree_measured(cmd, env)
            if r.code != 0:
                raise RuntimeError(f"rag index failed: {r.stderr[-800:]}")
            report = json.loads(r.stdout)
            rates.append(report["chunks_written"] / r.wall_s)
            peaks.append(r.tree_peak_mib)
            self.say(f"django cold index {n + 1}: {report['chunks_written']:,} chunks in {r.wall_s:.1f} s, "
                     f"peak {r.tree_peak_mib:.0f} MiB")
        chunks = report["chunks_written"]
        for _ in range(self.repeats):
            r = run_tree_measured(cmd, env)
            assert json.loads(r.stdout)["chunks_written"] == 0, "no-change re-index wrote chunks"
            again.append(r.wall_s)
        label = f"Django 5.1.4 ({chunks:,} chunks)"
        self.add(f"cold `rag index`, {label}", "chunks/s", rates, "≥ 2,000 chunks/s", min(rates) >= 2000,
                 "whole process, wall")
        self.add(f"peak RSS, cold `rag index` and its workers, {label}", "MiB", peaks, "≤ 500 MiB", max(peaks) <= 500,
                 "RSS of every process of the run summed, sampled every 50 ms")
        self.add(f"no-change re-index, {label}", "s", again, "≤ 2 s", max(again) <= 2, "whole process, wall")
        f = measure(home, rounds=2, clients=2, per_client=2)
        self.add(f"`rag search` one-shot, {label}", "ms", [f["one_shot_p50_ms"]], "≤ 300 ms", f["one_shot_p50_ms"] <= 300,
                 f"p95 {fmt(f['one_shot_p95_ms'])} ms")
        self.add(f"`rag search` served by the owner, {label}", "ms", [f["owner_p50_ms"]], "p50 ≤ 80 ms", f["owner_p50_ms"] <= 80,
                 f"p95 {fmt(f['owner_p95_ms'])} ms")

    def bench_cli_queue(self) -> None:
        tag = uuid.uuid4().hex[:8]
        sq, iq = f"bench-search-{tag}", f"bench-index-{tag}"
        broker = f"redis://127.0.0.1:6379/{REDIS_DB}"
        env = self.env(CELERY_BROKER_URL=broker, CELERY_RESULT_BACKEND=broker, MOONMIND_SEARCH_QUEUE=sq,
                       MOONMIND_INDEX_QUEUE=iq)
        log = open(self.work / "worker.log", "w")
        worker = subprocess.Popen(
            [CELERY, "-A", "tasks", "worker", "-Q", f"{sq},{iq}", "--pool", "solo", "-l", "WARNING",
             "--without-gossip", "--without-mingle", "-n", f"bench-{tag}@%h"],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            import redis

            r = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
            deadline = time.monotonic() + 120
            while r.zcount(f"moonmind:consumers:{sq}", time.time() - 20, "+inf") == 0:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker did not start: {(self.work / 'worker.log').read_text()[-800:]}")
                time.sleep(0.1)
            q = ["rag", "search", "--query", "where is the request body validated", "--filters", "tenant=bench",
                 "--execution", "queue", "--timeout", "60"]
            self.moonmind(*q, env=env)  # worker warm: embedder, store, page cache
            walls, rss = [], []
            for _ in range(2 if self.quick else 10):
                res = self.moonmind(*q, env=env)
                walls.append(res.wall_s * 1000)
                rss.append(res.maxrss_mib)
            self.add("`rag search --execution queue` wall (warm worker)", "ms", walls, "≤ 150 ms",
                     percentile(walls, 50) <= 150)
            self.add("peak memory, CLI `rag search` queue", "MiB", rss)
            self.add("peak memory, Celery worker (solo, warm)", "MiB", [vm_hwm_mib(worker.pid)])
        finally:
            stop_group(worker, 20)
            try:
                from .queue_search import queue_keys

                r.delete(*queue_keys(sq), *queue_keys(iq))
            except Exception:
                pass

    def bench_gateway(self, corpus: dict[str, Path]) -> None:
        """`rag search --transport gateway` wall, then wrk at concurrency 1/8/32 (parse_wrk from bench/gateway_bench.py)."""
        try:
            import moonmind_worker.gateway.app  # noqa: F401
        except ImportError:
            for name, goal in (("`rag search --transport gateway` wall", "—"),
                               ("gateway req/s at concurrency 1/8/32", "≥ 200 req/s, p99 ≤ 100 ms")):
                self.add(name, "", [], goal, None, "not available: the RetrievalGateway is not on main")
            return
        repos = list(corpus)
        tokens = self.work / "gateway-tokens.json"
        env = self.env(MOONMIND_GATEWAY_TOKENS_FILE=str(tokens))
        args = ["gateway", "add-token", "--name", "bench"]
        for repo in repos:
            args += ["--repo", repo]
        token = self.moonmind(*args, "--tenant", "bench", env=env).stdout.strip()
        cpus = os.cpu_count() or 1
        for workers in sorted({1, cpus}):
            self._gateway_load(env, repos, token, workers, wall=workers == 1)

    def _gateway_load(self, env: dict, repos: list[str], token: str, workers: int, wall: bool) -> None:
        """One `gateway serve --workers N`: the CLI's wall (once), then wrk at concurrency 1/8/32."""
        import socket
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([MOONMIND, "gateway", "serve", "--port", str(port), "--workers", str(workers)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=open(self.work / "gateway.log", "w"), start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(url + "/retrieval/health", timeout=2).read()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"gateway did not start: {(self.work / 'gateway.log').read_text()[-800:]}")
                    time.sleep(0.2)
            if wall:
                cenv = self.env(MOONMIND_RETRIEVAL_URL=url, MOONMIND_RETRIEVAL_TOKEN=token)
                q = ["rag", "search", "--query", "where is the request body validated", "--filters", "tenant=bench",
                     f"repo={repos[0]}", "--transport", "gateway"]
                self.moonmind(*q, env=cenv)
                walls = [self.moonmind(*q, env=cenv).wall_s * 1000 for _ in range(2 if self.quick else 10)]
                self.add("`rag search --transport gateway` wall", "ms", walls, "—", None, "gateway on loopback, warm")
            if not shutil.which("wrk"):
                self.add(f"gateway req/s at concurrency 1/8/32, {workers} worker{'s' if workers > 1 else ''}", "", [],
                         "≥ 200 req/s, p99 ≤ 100 ms", None, "wrk not installed")
                return
            from .gateway_bench import parse_wrk

            script = self.work / "post.lua"
            lua = (
                "local queries = {QUERIES}\n"
                "local n = 0\n"
                "request = function()\n"
                "  n = n + 1\n"
                "  local body = '{\"query\": \"' .. queries[(n % #queries) + 1] .. '\", "
                "\"filters\": {\"tenant\": \"bench\"}}'\n"
                "  return wrk.format(\"POST\", \"/retrieval/context\", {[\"Content-Type\"] = \"application/json\", "
                "[\"Authorization\"] = \"Bearer TOKEN\"}, body)\n"
                "end\n"
            )
            # no repo filter: every request searches the whole collection (the token's repos), >= 10k chunks
            script.write_text(lua.replace("QUERIES", ", ".join(json.dumps(x) for x in QUERIES)).replace("TOKEN", token))
            subprocess.run(["wrk", "-t1", "-c2", "-d2s", "-s", str(script), url], capture_output=True)  # warm every worker
            duration = 3 if self.quick else 15
            for level in (1, 8, 32):
                out = subprocess.run(["wrk", f"-t{min(level, 2)}", f"-c{level}", f"-d{duration}s", "--timeout", "10s",
                                      "--latency", "-s", str(script), url], capture_output=True, text=True, check=True).stdout
                w = parse_wrk(out)
                ok = w["rps"] >= 200 and w["p99_ms"] <= 100
                self.add(f"gateway req/s at concurrency {level}, {workers} worker{'s' if workers > 1 else ''}", "req/s",
                         [w["rps"]], "≥ 200 req/s, p99 ≤ 100 ms", ok,
                         f"p50 {fmt(w['p50_ms'])}, p99 {fmt(w['p99_ms'])} ms, {w['non_2xx']} non-2xx, {duration} s of wrk "
                         "over every repository")
        finally:
            stop_group(server)

    # -- 4. growth --------------------------------------------------------------
    def growth(self, backend: str, points: int, budget_s: float, optimize: bool = True) -> dict:
        d = self.work / f"growth-{backend}-{points}"
        r = run_measured([sys.executable, "-m", "bench.growth", "--points", str(points), "--dir", str(d),
                          "--backend", backend, "--budget-s", str(budget_s), "--queries", "50" if self.quick else "200",
                          "--optimize" if optimize else "--no-optimize"],
                         self.env(), timeout=budget_s * 3 + 600, cwd=str(ROOT))
        shutil.rmtree(d, ignore_errors=True)
        if r.code != 0:
            raise RuntimeError(f"growth {backend} {points} failed: {r.stderr[-800:]}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        out["maxrss_mib"] = r.maxrss_mib
        self.say(f"growth {backend} {points}: {out}")
        return out

    def bench_growth(self) -> None:
        sizes = [1_000] if self.quick else [10_000, 100_000, 1_000_000]
        budget = 60 if self.quick else float(os.environ.get("MOONMIND_BENCH_GROWTH_BUDGET_S", "420"))
        rows = ["| chunks requested | written | write rate (full segments built as it goes) | final optimize "
                "| dense search p50 / p95 / p99 | dense+sparse batch p50 / p95 / p99 | peak RSS |",
                "|---|---|---|---|---|---|---|"]
        for n in sizes:
            # as the indexer leaves a store: every segment past the cap (edge.SEGMENT_KB) was optimized
            # during the write, the final optimize builds the last, partial one
            g = self.growth("edge", n, budget)
            stop = f" ({g['stopped']})" if g["stopped"] else ""
            rows.append(f"| {n:,} | {g['points']:,}{stop} | {fmt(g['points_per_s'])}/s | {fmt(g['optimize_s'])} s | "
                        f"{' / '.join(fmt(x) for x in g['dense_ms'])} ms | {' / '.join(fmt(x) for x in g['batch_ms'])} ms | "
                        f"{fmt(g['maxrss_mib'])} MiB |")
        self.tables["Growth: embedded store (Qdrant Edge), synthetic vectors"] = rows
        rows = ["| chunks | Qdrant Edge batch p50 / p99 | qdrant-client local mode batch p50 / p99 | Edge RSS | local RSS |",
                "|---|---|---|---|---|"]
        for n in ([300] if self.quick else [1_000, 3_000]):  # local mode is brute force: bounded
            e, loc = self.growth("edge", n, budget), self.growth("local", n, budget)
            rows.append(f"| {n:,} | {fmt(e['batch_ms'][0])} / {fmt(e['batch_ms'][2])} ms | "
                        f"{fmt(loc['batch_ms'][0])} / {fmt(loc['batch_ms'][2])} ms | {fmt(e['maxrss_mib'])} MiB | "
                        f"{fmt(loc['maxrss_mib'])} MiB |")
        self.tables["Baseline: Qdrant Edge vs qdrant-client local mode (latency vs index size, synthetic vectors)"] = rows

    # -- report -----------------------------------------------------------------
    def markdown(self, started: float) -> str:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        versions = ", ".join(
            f"{p} {_version(p)}" for p in ("moonmind-worker", "qdrant-edge-py", "qdrant-client", "numpy", "celery", "bm25s")
        )
        load = os.getloadavg()
        lines = [
            BEGIN,
            f"## Benchmark suite (`python -m bench{' --quick' if self.quick else ''}`)",
            "",
            f"Run {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on {os.cpu_count()} cores, "
            f"{mem_gib:.0f} GiB RAM ({platform.machine()}, Python {platform.python_version()}); "
            f"load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (the machine is shared, so "
            f"figures are pessimistic); took {time.time() - started:.0f} s. Versions: {versions}.",
            "",
        ]
        if getattr(self, "corpus_size", None):
            what = "this checkout's moonmind_worker sources (quick mode)" if self.quick else \
                f"wheels of {', '.join(PACKAGES)} fetched with `pip download --no-deps` into bench/corpus/ (not committed)"
            lines += [f"Corpus: {what}: {self.corpus_size['files']:,} files, {self.corpus_size['chunks']:,} chunks. "
                      f"Each figure is the median over the runs shown (n); spread is min–max.", ""]
        lines += ["| figure | median | spread | n | goal | met | notes |", "|---|---|---|---|---|---|---|"]
        for f in self.figures:
            met = "—" if f.met is None else ("yes" if f.met else "**no**")
            median = f"{fmt(f.median)} {f.unit}".strip() if f.values else "not available"
            lines.append(f"| {f.name} | {median} | {f.spread} | {len(f.values)} | {f.goal or '—'} | {met} | {f.note} |")
        for title, rows in self.tables.items():
            lines += ["", f"### {title}", "", *rows]
        if self.notes:
            lines += ["", *[f"- {n}" for n in self.notes]]
        lines += ["", ANALYSIS, END]
        return "\n".join(lines) + "\n"


ANALYSIS = """### Where one machine stops being enough

Memory grows linearly with chunks (the growth table's peak RSS column), and one process holding the GIL through each
query (Qdrant Edge's binding does) caps a store's throughput at one core: around a million chunks is the point to move
to a Qdrant server (`QDRANT_URL`). The deployments past one machine, and why: docs/operations.md, "Where one machine
stops being enough". Random synthetic vectors are the worst case for the segment builds inside the write rate; real
embeddings of 10,580 chunks optimized in about 2 s here.
"""


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


FULL_TITLE = "## Benchmark suite (`python -m bench`)"


def write_section(path: Path, section: str) -> Path:
    """Replace this suite's section of BENCHMARKS.md (or append it); other sections stay as they are.

    A quick run never replaces a full run's figures: its section goes to `<name>.quick.md`
    beside the file instead (a smoke test of the suite, not a measurement). Returns where it went.
    """
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if FULL_TITLE not in section and FULL_TITLE in text:
        path = path.with_name(path.stem + ".quick.md")
        text = "# Benchmarks (quick run: a smoke test, not a measurement)\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny corpus, few repeats: under a minute (used by the test)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per figure (default 3, quick 2)")
    ap.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"), help="markdown file to update")
    ap.add_argument("--json", default=None, help="also write the raw figures as JSON here")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["index", "inprocess", "sweep", "sync", "owner", "large", "queue", "gateway", "growth", "languages"])
    args = ap.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="moonmind-bench-") as tmp:
        suite = Suite(args.quick, args.repeats or (2 if args.quick else 3), Path(tmp))
        corpus = suite.corpus()
        steps = [
            ("index", lambda: suite.bench_index(corpus)),
            ("inprocess", lambda: suite.bench_in_process(corpus)),
            ("sweep", suite.bench_ttl_sweep),
            ("sync", suite.bench_cli_sync),
            ("owner", suite.bench_owner),
            ("large", lambda: None if suite.quick else suite.bench_large_repo()),  # minutes: not in --quick
            ("queue", suite.bench_cli_queue),
            ("gateway", lambda: suite.bench_gateway(corpus)),
            ("growth", suite.bench_growth),
            ("languages", lambda: suite.bench_languages(corpus)),
        ]
        for name, step in steps:
            if name not in args.skip:
                step()
        section = suite.markdown(started)
    written = write_section(Path(args.output), section)
    if args.json:
        Path(args.json).write_text(json.dumps([f.__dict__ | {"median": f.median} for f in suite.figures], indent=2, default=str))
    kept = f" (a quick run: the full run's figures in {args.output} are kept)" if written != Path(args.output) else ""
    sys.stderr.write(f"[bench] wrote {written}{kept}\n")
    return 0
