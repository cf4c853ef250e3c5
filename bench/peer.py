"""Our cold index against the leading peer's index build, interleaved on one tree in one run (issue 36).

`python -m bench.peer` times, for N rounds (default 2), one after the other on the same tree:

* ours: `moonmind rag index DIR --repo django` in a subprocess, a fresh MOONMIND_HOME, `MOONMIND_OWNER=off`
  (cold: nothing stored, the store created, every file chunked, embedded, written, optimized);
* the peer: semble 0.7.0 `SembleIndex.from_path(DIR, model_path=...)` in a subprocess with a fresh, empty
  `SEMBLE_CACHE_LOCATION` (cold cache), on the same static model: ours, converted to model2vec's layout in
  a temporary directory at bench time (`model.safetensors` with the key `embeddings`, `tokenizer.json`,
  `config.json`), so both embed with the same table and neither downloads anything.

Each: wall, CPU (user + system of the whole process tree), chunks, chunks/s and the peak of the process
tree's summed RSS (`measure.run_tree_measured`), the load average beside the round, and per round the ratio
peer wall / our wall (>= 1.0: ours no slower); the CPU ratio after the table.
Only the ratio within one run means anything on a shared box: absolute walls drift 1.5-2x between runs.

Then query latency on those indexes, same queries: in-process (ours: embedder and store opened once in a
process, the retrieval pipeline timed; the peer: `SembleIndex.search` after its build), ours served (a
warm `moonmind serve` owner answers `rag search` processes), ours one-shot (`MOONMIND_OWNER=off`), and
the peer's CLI (`semble search QUERY DIR`, its model named by `SEMBLE_MODEL_NAME`: the converted local
directory, so it needs no hub access; its index cache warmed by a first call).

The peer's `from_path` chunks in this process unless `SEMBLE_INDEX_WORKERS` is set (its CLI sets 4);
`--peer-workers` sets it (default 4: the peer as its own CLI runs it; 0 to time the library default).
`--same-files`: the rounds again on a copy of the tree holding only the files of the types the peer indexes by
default (its `from_path` default content: code; `peer_file_types`), at the same paths. Why: on Django, by default, we
index code, docs and templates (3,451 files, ~26 MB) and the peer code only (~19 MB of .py, .js, .css), so the
default rounds time different work; this step times the same work. The default rounds stay the goal's.
`--catalogs`: ours indexes gettext catalogs too (`MOONMIND_INDEX_CATALOGS=on`: 1,272 more files, 8.8 MB, the
default before 40a31a2), the work its rounds timed until then.
`--quick`: a small tree (this package's text/ directory), one round, few queries: the smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .measure import run_tree_measured
from .owner import QUERIES, django_source, env_for, start_owner

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MOONMIND = str(BIN / "moonmind")
SEMBLE = str(BIN / "semble")
MODEL_DIR = ROOT / "moonmind_worker" / "models" / "static-code-256"

# The peer's build, in its own process (its workers re-import __main__: this guard keeps them from re-running it).
_PEER_BUILD = r"""
import json, sys, time
if __name__ == "__main__":
    from semble import SembleIndex
    source, model, queries = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    t = time.perf_counter()
    index = SembleIndex.from_path(source, model_path=model)
    build = time.perf_counter() - t
    walls = []
    for i in range(3 * len(queries)):
        t = time.perf_counter()
        index.search(queries[i % len(queries)], top_k=10)
        walls.append((time.perf_counter() - t) * 1000)
    files = len({c.file_path for c in index.chunks})
    print(json.dumps({"chunks": len(index.chunks), "files": files, "build_s": build, "search_ms": walls[len(queries):]}))
"""

# Our in-process search: the embedder and store opened once, the retrieval pipeline timed per query.
_OURS_IN_PROCESS = r"""
import json, sys, time
from moonmind_worker.contracts import parse_query
from moonmind_worker.retrieval.pipeline import retrieve_context_pack
from moonmind_worker.runtime import get_embedder, get_store
from moonmind_worker.settings import get_settings
repo, queries = sys.argv[1], json.loads(sys.argv[2])
settings = get_settings()
embedder, store = get_embedder(settings), get_store(settings)
walls = []
for i in range(3 * len(queries)):
    q = parse_query({"query": queries[i % len(queries)], "filters": {"repo": repo}})
    t = time.perf_counter()
    retrieve_context_pack(q, settings=settings, embedder=embedder, store=store)
    walls.append((time.perf_counter() - t) * 1000)
store.close()
print(json.dumps(walls[len(queries):]))
"""


def convert_model(dest: Path, dtype: str = "float32") -> Path:
    """The shipped static model in model2vec's local layout (what `StaticModel.from_pretrained(dir)` reads).

    Its table in `dtype`: float32 by default, as model2vec ships its models (issue 55: handed our float16 table
    as is, the peer ran ~15% slower than with the same table in float32, a handicap that is not its own).
    """
    import numpy as np
    from safetensors.numpy import load_file, save_file

    dest.mkdir(parents=True, exist_ok=True)
    # model2vec reads `model.safetensors`, tensor "embeddings" (ours is stored under that key already)
    tensors = load_file(str(MODEL_DIR / "embeddings.safetensors"))
    save_file({k: v.astype(np.dtype(dtype)) if k == "embeddings" else v for k, v in tensors.items()},
              str(dest / "model.safetensors"))
    shutil.copyfile(MODEL_DIR / "tokenizer.json", dest / "tokenizer.json")
    ours = json.loads((MODEL_DIR / "config.json").read_text())
    config = {"model_type": "model2vec", "architectures": ["StaticModel"], "tokenizer_name": ours["source_model"],
              "apply_pca": ours["dimensions"], "hidden_dim": ours["dimensions"], "normalize": ours["normalize"],
              "seq_length": 1000000}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def peer_env(cache: Path, model: Path, workers: int) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SEMBLE_", "MOONMIND_"))}
    e["SEMBLE_CACHE_LOCATION"] = str(cache)
    e["SEMBLE_MODEL_NAME"] = str(model)  # the CLI's model: the converted local directory, never the hub
    e["HF_HUB_OFFLINE"] = "1"
    if workers:
        e["SEMBLE_INDEX_WORKERS"] = str(workers)
    return e


def ours_once(source: Path, home: Path, catalogs: bool = False) -> dict:
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    before = load()
    env = {**env_for(home), **({"MOONMIND_INDEX_CATALOGS": "on"} if catalogs else {})}
    r = run_tree_measured([MOONMIND, "rag", "index", str(source), "--repo", "django"], env)
    if r.code != 0:
        raise RuntimeError(f"rag index failed ({r.code}): {r.stderr[-1500:]}")
    m = re.search(r"(\d+) indexed \+.*?(\d+) chunks written", r.stdout + r.stderr)
    files, chunks = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    return {"wall_s": r.wall_s, "cpu_s": r.cpu_s, "chunks": chunks, "files": files, "rss_mib": r.tree_peak_mib,
            "load": before}


def peer_once(source: Path, model: Path, cache: Path, workers: int, queries: list[str]) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    before = load()
    r = run_tree_measured([sys.executable, "-c", _PEER_BUILD, str(source), str(model), json.dumps(queries)],
                          peer_env(cache, model, workers))
    if r.code != 0:
        raise RuntimeError(f"semble build failed ({r.code}): {r.stderr[-1500:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"wall_s": r.wall_s, "cpu_s": r.cpu_s, "chunks": out["chunks"], "files": out["files"],
            "rss_mib": r.tree_peak_mib, "load": before, "build_s": out["build_s"], "search_ms": out["search_ms"]}


def cli_walls(cmd_for, env: dict[str, str], queries: list[str], rounds: int) -> list[float]:
    walls = []
    for _ in range(rounds):
        for q in queries:
            t = time.perf_counter()
            p = subprocess.run(cmd_for(q), env=env, capture_output=True, text=True, timeout=300)
            walls.append((time.perf_counter() - t) * 1000)
            if p.returncode != 0:
                raise RuntimeError(f"{cmd_for(q)[:3]} failed ({p.returncode}): {p.stderr[-800:]}")
    return walls


def latencies(source: Path, home: Path, model: Path, cache: Path, workers: int, queries: list[str],
              rounds: int) -> dict[str, list[float]]:
    off = env_for(home)
    p = subprocess.run([sys.executable, "-c", _OURS_IN_PROCESS, "django", json.dumps(queries)], env=off,
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"in-process search failed: {p.stderr[-800:]}")
    out = {"ours in-process": json.loads(p.stdout.strip().splitlines()[-1])}

    def ours(q: str) -> list[str]:
        return [MOONMIND, "rag", "search", "--query", q, "--filters", "repo=django"]

    cli_walls(ours, off, queries[:2], 1)  # page cache warm
    out["ours one-shot (MOONMIND_OWNER=off)"] = cli_walls(ours, off, queries, rounds)
    served = dict(off, MOONMIND_OWNER="auto")
    owner = start_owner(off, home)
    try:
        cli_walls(ours, served, queries[:2], 1)
        out["ours served (warm `moonmind serve`)"] = cli_walls(ours, served, queries, rounds)
    finally:
        owner.terminate()
        owner.wait(30)
    penv = peer_env(cache, model, workers)

    def peer(q: str) -> list[str]:
        return [SEMBLE, "search", q, str(source), "-k", "10"]

    cli_walls(peer, penv, queries[:1], 1)  # builds and caches its index (`semble search` reuses it after)
    out["semble CLI (`semble search`, cached index)"] = cli_walls(peer, penv, queries, rounds)
    return out


def peer_file_types() -> frozenset[str]:
    """The file suffixes the peer's `SembleIndex.from_path` indexes by default (its default `content`)."""
    import inspect

    from semble import SembleIndex
    from semble.index.files import ContentType, get_extensions

    content = inspect.signature(SembleIndex.from_path).parameters["content"].default
    return frozenset(get_extensions([content] if isinstance(content, ContentType) else list(content)))


def same_files_tree(source: Path, dest: Path, suffixes: frozenset[str]) -> tuple[int, int]:
    """Copy the files of `source` whose suffix is one of `suffixes` (as the peer matches them: lower-cased) to `dest`,
    at the same relative paths; (files, bytes) copied. Symbolic links are left out, as both walkers leave them."""
    files = size = 0
    for root, dirs, names in os.walk(source):
        dirs.sort()
        for name in sorted(names):
            src = Path(root, name)
            if src.is_symlink() or not src.is_file() or src.suffix.lower() not in suffixes:
                continue
            dst = dest / src.relative_to(source)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            files += 1
            size += src.stat().st_size
    return files, size


def build_rounds(source: Path, model: Path, home: Path, cache: Path, workers: list[int], rounds: int,
                 queries: list[str], catalogs: bool = False) -> list[float]:
    """`rounds` interleaved builds (ours, then the peer's with each of `workers`' SEMBLE_INDEX_WORKERS) on `source`,
    one table row each, then each setting's ratios; the peer's in-process search walls (after the builds of its first
    setting). `catalogs`: ours indexes gettext catalogs too."""
    print("| round | peer workers | load before (1/5/15 min) | ours wall | ours CPU | ours chunks | ours chunks/s "
          "| ours peak RSS | peer wall | peer CPU | peer chunks | peer chunks/s | peer peak RSS | load before peer "
          "| peer/ours |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios: dict[int, list[float]] = {w: [] for w in workers}
    cpu_ratios: dict[int, list[float]] = {w: [] for w in workers}
    peer_search: list[float] = []
    o: dict = {}
    p: dict = {}
    for n in range(1, rounds + 1):
        o = ours_once(source, home, catalogs)
        for w in workers:
            p = peer_once(source, model, cache, w, queries)
            if w == workers[0]:
                peer_search += p["search_ms"]
            ratios[w].append(p["wall_s"] / o["wall_s"])
            cpu_ratios[w].append(p["cpu_s"] / o["cpu_s"])
            print(f"| {n} | {w or 'in-process (library default)'} | {o['load']} | {o['wall_s']:.1f} s | {o['cpu_s']:.1f} s "
                  f"| {o['chunks']} | {o['chunks'] / o['wall_s']:.0f} | {o['rss_mib']:.0f} MiB | {p['wall_s']:.1f} s "
                  f"| {p['cpu_s']:.1f} s | {p['chunks']} | {p['chunks'] / p['wall_s']:.0f} | {p['rss_mib']:.0f} MiB "
                  f"| {p['load']} | **{ratios[w][-1]:.2f}** |", flush=True)
    print(f"\nours: {o['files']} files indexed; peer: {p['files']} files with chunks.", flush=True)
    for w in workers:
        print(f"peer SEMBLE_INDEX_WORKERS={w}: peer/ours wall ratio median {statistics.median(ratios[w]):.2f}, "
              f"min {min(ratios[w]):.2f} (>= 1.0: ours no slower); CPU (user + system, whole process tree) ratio "
              f"median {statistics.median(cpu_ratios[w]):.2f}", flush=True)
    return peer_search


def quick_tree(dest: Path) -> Path:
    shutil.copytree(ROOT / "moonmind_worker" / "text", dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (ours, peer) (default 2)")
    ap.add_argument("--source", default=None, help="tree to index (default: the Django 5.1.4 source)")
    ap.add_argument("--peer-workers", type=int, nargs="+", default=[4, 0],
                    help="SEMBLE_INDEX_WORKERS for the peer's builds, each timed every round (default: 4, as its CLI "
                         "runs, and 0, its library's default: in its process)")
    ap.add_argument("--peer-dtype", choices=("float32", "float16"), default="float32",
                    help="the table handed to the peer (default float32, as model2vec ships models; float16: ours as is)")
    ap.add_argument("--query-rounds", type=int, default=2, help="passes over the queries per CLI arm (default 2)")
    ap.add_argument("--no-queries", action="store_true", help="index builds only")
    ap.add_argument("--same-files", action="store_true",
                    help="the rounds again on a copy holding only the file types the peer indexes by default")
    ap.add_argument("--catalogs", action="store_true",
                    help="ours indexes gettext catalogs too (MOONMIND_INDEX_CATALOGS=on; skipped by default since 40a31a2)")
    ap.add_argument("--quick", action="store_true", help="a small tree, one round, few queries (smoke test)")
    args = ap.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="moonmind-peer-"))
    try:
        if args.quick:
            source, rounds, queries, qrounds = quick_tree(scratch / "tree"), 1, QUERIES[:2], 1
        else:
            source = Path(args.source) if args.source else django_source()
            rounds, queries, qrounds = args.rounds, QUERIES, args.query_rounds
        model = convert_model(scratch / "model2vec", args.peer_dtype)
        home, cache = scratch / "home", scratch / "semble-cache"
        print(f"tree {source}; {os.cpu_count()} CPUs; peer SEMBLE_INDEX_WORKERS in {args.peer_workers}, "
              f"its table {args.peer_dtype}"
              f"{'; ours with gettext catalogs' if args.catalogs else ''}", flush=True)
        peer_search = build_rounds(source, model, home, cache, args.peer_workers, rounds, queries, args.catalogs)
        if args.same_files:
            same = scratch / "same-files"
            files, size = same_files_tree(source, same, peer_file_types())
            print(f"\nthe same files: the {files} files of the types the peer indexes by default "
                  f"({size / 1e6:.1f} MB), at their paths", flush=True)
            # homes of their own: the query step below searches the whole tree's indexes
            build_rounds(same, model, scratch / "same-home", scratch / "same-cache", args.peer_workers, rounds, queries)
        if not args.no_queries:
            lat = latencies(source, home, model, cache, args.peer_workers[0], queries, qrounds)
            lat = {**dict(list(lat.items())[:1]), "semble in-process (`SembleIndex.search`)": peer_search,
                   **dict(list(lat.items())[1:])}
            print(f"\nquery latency, {len(queries)} queries (load {load()}):\n")
            print("| path | n | p50 | p95 |\n|---|---|---|---|")
            for name, walls in lat.items():
                s = sorted(walls)
                print(f"| {name} | {len(s)} | {statistics.median(s):.1f} ms | {s[min(len(s) - 1, int(0.95 * len(s)))]:.1f} ms |")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
