"""Growth on real code: one embedded store filled with several large PyPI sdists, measured after each.

`python -m bench.growth_real` fetches the sources once into bench/corpus/ (`pip download --no-deps
--no-binary :all:`, never committed), then indexes them one after another into one scratch
MOONMIND_HOME with `moonmind rag index` (each package its own repo) and, after each package, measures:

* chunks in the store and its size on disk (the shard directory: segments + WAL);
* opening the shard: `EdgeShard.load` wall and CPU in a fresh process (median of 7), plus the
  whole `EdgeStore` open our code does on top (metadata, lock);
* one-shot `rag search` p50/p95 (whole processes, as `bench.owner` times them) and the same
  searches served by `moonmind serve`;
* the index run itself: its wall and the peak RSS of its process tree, summed (as the suite's
  large-repository row), and the shard's segments after it.

`--one-run` copies the sources into one tree and indexes it as one repo in a single run instead
(one row): what a single very large repository costs, where the optimize's segment cap matters.

Unlike `bench.growth` (synthetic vectors, the engine alone) this is the real pipeline, so the
figures include the chunker's payloads, BM25 vectors and the indexer's optimize.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .measure import fmt, percentile, run_tree_measured, stop_group
from .owner import CORPUS_DIR, MOONMIND, django_source, env_for, searches, start_owner

#: Added in this order; together ~100k chunks with Django.
PACKAGES = ["sympy==1.13.3", "sqlalchemy==2.0.36", "twisted==24.11.0", "networkx==3.4.2"]

_OPEN = """
import json, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
from qdrant_edge import EdgeShard
from moonmind_worker.settings import get_settings
from moonmind_worker.store import open_store
shard = sys.argv[1]
t, c = time.perf_counter(), cpu(); s = EdgeShard.load(shard); engine = ((time.perf_counter() - t) * 1000, (cpu() - c) * 1000)
s.close()
t = time.perf_counter(); store = open_store(get_settings()); store.info(); ours = (time.perf_counter() - t) * 1000
print(json.dumps({"engine_ms": engine[0], "engine_cpu_ms": engine[1], "store_open_ms": ours}))
"""


def sdist(spec: str) -> Path:
    """`spec`'s source tree, unpacked once under bench/corpus/."""
    name = spec.replace("==", "-")
    dest = CORPUS_DIR / f"{name}-src"
    if not dest.is_dir():
        with tempfile.TemporaryDirectory() as dl:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", spec, "-d", dl],
                           check=True, capture_output=True)
            with tarfile.open(next(Path(dl).glob("*.tar.gz"))) as tar:
                tar.extractall(dl, filter="data")
            top = next(p for p in Path(dl).iterdir() if p.is_dir())
            dest.parent.mkdir(parents=True, exist_ok=True)
            top.rename(dest)
    return dest


def disk_mib(path: Path) -> float:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file()) / 2**20


def open_times(env: dict[str, str], shard: Path, runs: int = 7) -> dict[str, float]:
    rows = []
    for _ in range(runs):
        p = subprocess.run([sys.executable, "-c", _OPEN, str(shard)], env=env, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-600:])
        rows.append(json.loads(p.stdout))
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def measure(home: Path, rounds: int) -> dict:
    env = env_for(home)
    env["MOONMIND_OWNER"] = "off"
    shard = home / "qdrant-edge" / "moonmind__repo" / "shard"
    out = {"disk_mib": disk_mib(shard), "segments": sum(1 for _ in (shard / "segments").iterdir()), **open_times(env, shard)}
    searches(env, 1, None)  # page cache warm
    walls, _ = searches(env, rounds, None)
    out |= {"one_shot_p50_ms": percentile(walls, 50), "one_shot_p95_ms": percentile(walls, 95)}
    env.pop("MOONMIND_OWNER")
    owner = start_owner(env, home)
    try:
        searches(env, 1, None)
        served, _ = searches(env, rounds, None)
    finally:
        stop_group(owner)
    out |= {"served_p50_ms": percentile(served, 50), "served_p95_ms": percentile(served, 95)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.growth_real", description=__doc__.splitlines()[0])
    ap.add_argument("--home", default=None, help="scratch MOONMIND_HOME (default: a temporary directory)")
    ap.add_argument("--rounds", type=int, default=3, help="passes over the 10 queries per search figure (default 3)")
    ap.add_argument("--packages", nargs="*", default=PACKAGES, help="sdists added after Django, in order")
    ap.add_argument("--one-run", action="store_true", help="index every source as one repo, in one run")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="moonmind-growth-real-") as tmp:
        home = Path(args.home) if args.home else Path(tmp) / "home"
        sources = [("django==5.1.4", django_source()), *((p, sdist(p)) for p in args.packages)]
        if args.one_run:
            tree = Path(tmp) / "tree"
            for spec, src in sources:
                shutil.copytree(src, tree / src.name)  # copies: the walker does not follow symlinks
            sources = [("+".join(spec.split("==")[0] for spec, _ in sources), tree)]
        rows, chunks = [], 0
        for spec, src in sources:
            repo = spec.split("==")[0]
            env = env_for(home)
            env["MOONMIND_OWNER"] = "off"
            r = run_tree_measured([MOONMIND, "rag", "index", str(src), "--repo", repo, "--json"], env, timeout=7200)
            if r.code != 0:
                raise RuntimeError(r.stderr[-800:])
            report = json.loads(r.stdout)
            chunks += report["chunks_written"]
            row = {"added": spec, "chunks": chunks, "index_s": r.wall_s, "index_peak_mib": r.tree_peak_mib, **measure(home, args.rounds)}
            rows.append(row)
            sys.stderr.write(json.dumps(row) + "\n")
    print("| chunks (after adding) | index run: wall, peak RSS summed | on disk (segments) | shard open (engine) wall / CPU "
          "| whole store open (engine + ours) | one-shot `rag search` p50 / p95 | served p50 / p95 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['chunks']:,} ({r['added']}) | {fmt(r['index_s'])} s, {fmt(r['index_peak_mib'])} MiB "
              f"| {fmt(r['disk_mib'])} MiB ({r['segments']}) | {fmt(r['engine_ms'])} / {fmt(r['engine_cpu_ms'])} ms "
              f"| {fmt(r['store_open_ms'])} ms | {fmt(r['one_shot_p50_ms'])} / {fmt(r['one_shot_p95_ms'])} ms "
              f"| {fmt(r['served_p50_ms'])} / {fmt(r['served_p95_ms'])} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
