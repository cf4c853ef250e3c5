"""The hosted-provider goal: 95% of whole queries under 2 s with a hosted embedding provider.

    python -m bench.hosted_latency [--corpus DIR] [--rounds 5] [--median-ms 150] [--sigma 0.7]

No hosted provider is reachable here, so the provider is a real OpenAI-compatible HTTP
server on loopback (tests/http_servers.EmbeddingsServer) whose every call waits a seeded
log-normal delay: median `--median-ms`, and with the default sigma a p99 near 0.8 s —
the shape of a hosted embeddings API seen from a worker. The corpus (default: the
fastapi package source, as in shared/eval/fastapi.json, fetched with `pip download` into the
gitignored bench/corpus/fastapi on first use, as `python -m bench` does) is indexed through it
without delay; then the eval file's queries (`--queries`, default MOONMIND_BENCH_EVAL, else
/work/shared/eval/fastapi.json; without one, the suite's ten queries) run (a) in-process through `retrieve_context_pack`
and (b) as whole `moonmind rag search` processes (start, `openai` import, provider call,
search, exit). Prints a JSON summary: p50/p95/p99 and the share under 2 s for each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from .measure import percentile  # noqa: E402
from http_servers import EmbeddingsServer  # noqa: E402 - tests/ is not a package

KEY = "sk-bench-hosted"


class Delays:
    """A seeded log-normal delay per provider call (thread-safe), switchable on and off."""

    def __init__(self, median_s: float, sigma: float, seed: int = 7) -> None:
        self.mu, self.sigma = math.log(median_s), sigma
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.on = False

    def wait(self) -> None:
        if self.on:
            with self.lock:
                d = self.rng.lognormvariate(self.mu, self.sigma)
            time.sleep(d)


def summary(ms: list[float]) -> dict:
    return {
        "n": len(ms), "p50_ms": round(percentile(ms, 50), 1), "p95_ms": round(percentile(ms, 95), 1),
        "p99_ms": round(percentile(ms, 99), 1), "share_under_2s": round(sum(x < 2000 for x in ms) / len(ms), 3),
    }


DEFAULT_CORPUS = ROOT / "bench" / "corpus" / "fastapi"


def ready_corpus(corpus: Path, package: str) -> Path:
    """The tree to index: the default one (bench/corpus/fastapi) is fetched on first use; any other must exist."""
    if corpus.is_dir():
        return corpus
    fetch = (f"`{sys.executable} -m pip download --no-deps --only-binary=:all: {package} -d /tmp/{package}-wheel` "
             f"then `unzip -o /tmp/{package}-wheel/*.whl -d {corpus}`")
    if corpus.resolve() != DEFAULT_CORPUS.resolve():
        raise SystemExit(f"bench.hosted_latency: --corpus {corpus} is not a directory. Pass a source tree to index "
                         f"(e.g. `--corpus path/to/checkout --repo NAME`), or leave --corpus out to use {DEFAULT_CORPUS}, "
                         "fetched on first use.")
    from .suite import fetch_wheel

    sys.stderr.write(f"[hosted_latency] {corpus} is not here: fetching {package} with pip download --no-deps\n")
    dl = Path(tempfile.mkdtemp(prefix="mm-hosted-dl-"))
    try:
        fetch_wheel(package, corpus, dl)
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", b"") or b""
        detail = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        raise SystemExit(f"bench.hosted_latency: could not fetch {package} into {corpus} ({err}; {detail.strip()[-500:]}).\n"
                         f"Fetch it yourself: {fetch}; or pass --corpus DIR.") from None
    finally:
        import shutil

        shutil.rmtree(dl, ignore_errors=True)
    return corpus


def load_query_texts(path: Path) -> list[str]:
    """The eval file's query texts, or the suite's ten queries when the file is not here (only latency is measured)."""
    if path.is_file():
        return [q["query"] for q in json.loads(path.read_text())["queries"]]
    from .suite import QUERIES

    sys.stderr.write(f"[hosted_latency] no query file at {path} (set MOONMIND_BENCH_EVAL or --queries FILE): "
                     f"using the suite's {len(QUERIES)} queries\n")
    return list(QUERIES)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=str(ROOT / "bench" / "corpus" / "fastapi"))
    ap.add_argument("--repo", default="fastapi")
    ap.add_argument("--queries", default=os.environ.get("MOONMIND_BENCH_EVAL", "/work/shared/eval/fastapi.json"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cli-runs", type=int, default=20)
    ap.add_argument("--median-ms", type=float, default=150)
    ap.add_argument("--sigma", type=float, default=0.7)
    a = ap.parse_args()

    corpus = ready_corpus(Path(a.corpus), "fastapi")
    queries = load_query_texts(Path(a.queries))
    delays = Delays(a.median_ms / 1000, a.sigma)
    from moonmind_worker.embedding import StaticEmbedder

    model = StaticEmbedder()

    def embed(texts: list[str]) -> list[list[float]]:
        delays.wait()
        return [[float(x) for x in v] for v in model.embed_documents(texts)]

    server = EmbeddingsServer(embed=embed, api_key=KEY)
    home = Path(tempfile.mkdtemp(prefix="mm-hosted-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOONMIND_", "QDRANT_", "OPENAI_", "CELERY_"))}
    # MOONMIND_OWNER=off: every `moonmind` process does the whole query itself (what (b) measures), and no
    # background owner holds the store this process opens for (a)
    env.update(server.provider_env(KEY), MOONMIND_HOME=str(home), MOONMIND_EMBEDDING_MODEL="bench-hosted-256",
               MOONMIND_OWNER="off")
    moonmind = str(Path(sys.executable).parent / "moonmind")
    done = subprocess.run([moonmind, "rag", "index", str(corpus), "--repo", a.repo], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        server.close()
        raise SystemExit(f"bench.hosted_latency: indexing {corpus} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")

    os.environ.update(env)
    from moonmind_worker import observe
    from moonmind_worker.contracts import parse_query
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.runtime import close_all, get_embedder, get_store
    from moonmind_worker.settings import Settings

    settings = Settings(_env_file=None)
    embedder, store = get_embedder(settings), get_store(settings)
    delays.on = True
    inproc = []
    with observe.no_artifacts():
        for _ in range(a.rounds):
            for q in queries:
                started = time.perf_counter()
                retrieve_context_pack(parse_query({"query": q, "filters": {"repo": a.repo}}), settings=settings,
                                      embedder=embedder, store=store)
                inproc.append((time.perf_counter() - started) * 1000)
    close_all()  # the CLI processes below open the embedded store themselves

    cli = []
    for i in range(a.cli_runs):
        started = time.perf_counter()
        r = subprocess.run([moonmind, "rag", "search", "--query", queries[i % len(queries)], "--filters",
                            f"repo={a.repo}"], env=env, capture_output=True, text=True)
        cli.append((time.perf_counter() - started) * 1000)
        if r.returncode != 0:
            raise SystemExit(f"search failed: {r.stderr}")
    server.close()
    import shutil

    shutil.rmtree(home, ignore_errors=True)
    print(json.dumps({
        "provider_delay": {"median_ms": a.median_ms, "sigma": a.sigma, "model": "log-normal, seeded"},
        "in_process_whole_query": summary(inproc),
        "cli_process_whole_query": summary(cli),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg": os.getloadavg(),
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
