"""`python -m bench.languages`: retrieval quality (file-level NDCG@10) per language, on pinned corpora.

Why: a ranking change is only an improvement if it helps code in every language
we index, not just the Python set it was tried on. Each corpus is one real
project at an exact version from a registry reachable here (npm, PyPI, Debian),
fetched into the gitignored `bench/corpus/`, indexed into its own repo under a
private MOONMIND_HOME, and scored with the held-out query set committed beside
this file (`bench/eval-<language>-<project>.json`, written from the code's
structure before any search result was seen). Reference sets on Python packages
(click, requests, and `shared/eval/fastapi.json` when present) run the same way.

The sets are split: `dev` (the first project of each language, click, requests) is what a change
is tuned on; `test` (the second project of each language, fastapi) is looked at once per change.
`--model OLD --model NEW` scores models side by side in one run (`git:REV` names the shipped
model at a commit), by set, split and query kind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS_DIR = ROOT / "bench" / "corpus" / "languages"  # gitignored: fetched, never committed
SHARED_FASTAPI = Path(os.environ.get("MOONMIND_BENCH_EVAL", "/work/shared/eval/fastapi.json"))


@dataclass(frozen=True)
class Corpus:
    """One pinned project: where it comes from, which folder of the package is the repository."""

    repo: str
    language: str
    registry: str  # npm | pypi-sdist | pypi-wheel | deb | local (root is a folder on disk)
    spec: str  # exact version: name@1.2.3, name==1.2.3, or a Debian package=version
    root: str  # folder inside the unpacked package that is indexed ("" = all of it)
    queries: Path
    drop: tuple[str, ...] = ()  # sub-folders of the root left out (compiled bundles)


def _eval(name: str) -> Path:
    return ROOT / "bench" / f"eval-{name}.json"


LANGUAGES: tuple[Corpus, ...] = (
    Corpus("express", "JavaScript", "npm", "express@4.21.2", "package", _eval("javascript-express")),
    Corpus("rxjs", "TypeScript", "npm", "rxjs@7.8.2", "package", _eval("typescript-rxjs"),
           drop=("dist", "ajax", "fetch", "operators", "testing", "webSocket")),  # compiled output and re-export stubs
    Corpus("attrs", "Python", "pypi-sdist", "attrs==24.2.0", "attrs-24.2.0", _eval("python-attrs")),
    Corpus("cobra", "Go", "deb", "golang-github-spf13-cobra-dev=1.6.1-1",
           "usr/share/gocode/src/github.com/spf13/cobra", _eval("go-cobra")),
    Corpus("serde_json", "Rust", "deb", "librust-serde-json-dev=1.0.87-1",
           "usr/share/cargo/registry/serde_json-1.0.87", _eval("rust-serde_json")),
    Corpus("rack", "Ruby", "deb", "ruby-rack=2.2.22-0+deb12u2",
           "usr/share/rubygems-integration/all/gems/rack-2.2.22", _eval("ruby-rack")),
    Corpus("monolog", "PHP", "deb", "php-monolog=2.9.1-1", "usr/share/php/Monolog", _eval("php-monolog")),
    Corpus("nlohmann_json", "C++", "deb", "nlohmann-json3-dev=3.11.2-2", "usr/include/nlohmann",
           _eval("cpp-nlohmann_json")),
    # second project per language: more evidence before tuning, queries written from
    # each project's layout and docs before any search result was seen
    Corpus("axios", "JavaScript", "npm", "axios@1.7.9", "package/lib", _eval("javascript-axios")),
    Corpus("immer", "TypeScript", "npm", "immer@10.1.1", "package", _eval("typescript-immer"), drop=("dist",)),
    Corpus("httpx", "Python", "pypi-sdist", "httpx==0.27.2", "httpx-0.27.2/httpx", _eval("python-httpx")),
    Corpus("chi", "Go", "deb", "golang-github-go-chi-chi-dev=5.0.7-1",
           "usr/share/gocode/src/github.com/go-chi/chi", _eval("go-chi")),
    Corpus("toml", "Rust", "deb", "librust-toml-dev=0.5.11-1", "usr/share/cargo/registry/toml-0.5.11",
           _eval("rust-toml")),
    Corpus("faraday", "Ruby", "deb", "ruby-faraday=1.1.0-7",
           "usr/share/rubygems-integration/all/gems/faraday-1.1.0", _eval("ruby-faraday")),
    Corpus("psr7", "PHP", "deb", "php-guzzlehttp-psr7=2.4.5-1+deb12u1", "usr/share/php/GuzzleHttp/Psr7",
           _eval("php-psr7")),
    Corpus("spdlog", "C++", "deb", "libspdlog-dev=1:1.10.0+ds-0.4", "usr/include/spdlog", _eval("cpp-spdlog")),
)
#: Python reference sets (the first baseline figures were measured on these).
REFERENCE: tuple[Corpus, ...] = (
    Corpus("click", "Python (click)", "pypi-wheel", "click==8.5.1", "", _eval("click")),
    Corpus("requests", "Python (requests)", "pypi-wheel", "requests==2.32.3", "", _eval("requests")),
    Corpus("fastapi", "Python (fastapi)", "pypi-wheel", "fastapi==0.165.0", "", SHARED_FASTAPI),
)


def say(msg: str) -> None:
    sys.stderr.write(f"[languages] {msg}\n")
    sys.stderr.flush()


def fetch(c: Corpus, base: Path = CORPUS_DIR) -> Path:
    """The corpus root under `base`/<repo> (bench/corpus/languages), downloading and unpacking it once."""
    if c.registry == "local":
        return Path(c.root)
    dest = base / c.repo
    marker = dest / ".moonmind-spec"
    if marker.is_file() and marker.read_text() == c.spec:
        return dest / "src"
    shutil.rmtree(dest, ignore_errors=True)
    unpacked = dest / "unpacked"
    unpacked.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="moonmind-corpus-") as tmp:
        say(f"fetching {c.spec} ({c.registry})")
        if c.registry == "npm":
            subprocess.run(["npm", "pack", c.spec, "--silent"], cwd=tmp, check=True, capture_output=True)
            with tarfile.open(next(Path(tmp).glob("*.tgz"))) as t:
                t.extractall(unpacked, filter="data")
        elif c.registry in ("pypi-sdist", "pypi-wheel"):
            kind = ["--no-binary", ":all:"] if c.registry == "pypi-sdist" else ["--only-binary", ":all:"]
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *kind, c.spec, "-d", tmp],
                           check=True, capture_output=True)
            archive = next(p for p in Path(tmp).iterdir() if p.suffix in (".gz", ".whl", ".zip"))
            if archive.suffix == ".whl":
                with zipfile.ZipFile(archive) as z:
                    z.extractall(unpacked)
                for info in unpacked.glob("*.dist-info"):
                    shutil.rmtree(info)
            else:
                with tarfile.open(archive) as t:
                    t.extractall(unpacked, filter="data")
        elif c.registry == "deb":
            subprocess.run(["apt-get", "download", c.spec], cwd=tmp, check=True, capture_output=True)
            subprocess.run(["dpkg-deb", "-x", str(next(Path(tmp).glob("*.deb"))), str(unpacked)],
                           check=True, capture_output=True)
        else:
            raise ValueError(f"unknown registry {c.registry!r}")
    src = unpacked / c.root if c.root else unpacked
    for sub in c.drop:
        shutil.rmtree(src / sub, ignore_errors=True)
    src.rename(dest / "src")
    shutil.rmtree(unpacked, ignore_errors=True)
    marker.write_text(c.spec)
    return dest / "src"


#: The test split: the second project of each language and fastapi. Tune on the dev split only;
#: look at the test split once per change (a rule tuned on the sets it is measured on did not transfer).
TEST_REPOS = frozenset({"axios", "immer", "httpx", "chi", "toml", "faraday", "psr7", "spdlog", "fastapi"})
KINDS = ("symbol", "semantic", "architecture")


def split_of(c: Corpus) -> str:
    return "test" if c.repo in TEST_REPOS else "dev"


def model_dir(spec: str, tmp: Path) -> Path:
    """A static model directory: a path, or `git:REV` for the shipped model as of a commit (old vs new in one run)."""
    if not spec.startswith("git:"):
        return Path(spec)
    rev = spec[4:]
    shipped = "moonmind_worker/models"
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", "-r", rev, shipped],
                           check=True, capture_output=True, text=True).stdout.split()
    out = tmp / f"model-{rev}"
    for name in names:
        target = out / Path(name).name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{name}"], check=True,
                                          capture_output=True).stdout)
    return out


def evaluate(corpora: list[Corpus], home: Path, model: Path | None = None) -> list[dict]:
    """Index every corpus into its own repo under `home`, then score its query set through the real pipeline."""
    os.environ["MOONMIND_HOME"] = str(home)
    os.environ["MOONMIND_TENANT"] = "bench"
    from moonmind_worker import runtime
    from moonmind_worker.contracts import parse_query
    from moonmind_worker.embedding.static import StaticEmbedder
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.retrieval.evaluation import load_queries, run_eval
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import get_settings

    get_settings.cache_clear()
    settings = get_settings()
    embedder = runtime.get_embedder(settings) if model is None else StaticEmbedder(model, name=settings.model_name)
    store = runtime.get_store(settings)
    rows = []
    try:
        # every corpus first, then every query: a set is scored against the same collection whatever ran before it
        summaries = {c.repo: index_repository(fetch(c), repo=c.repo, tenant="bench", settings=settings,
                                              embedder=embedder, store=store) for c in corpora}
        for c in corpora:
            summary = summaries[c.repo]
            queries = load_queries(c.queries)

            def search(q, repo=c.repo) -> list[str]:
                pack = retrieve_context_pack(parse_query({"query": q.query, "top_k": 10, "filters": {"repo": repo}}),
                                             settings=settings, embedder=embedder, store=store)
                return [i.source for i in pack.items]

            report = run_eval(queries, search, k=10, top_k=10)
            rows.append({
                "language": c.language, "repo": c.repo, "spec": c.spec, "split": split_of(c),
                "queries": report.queries, "files": getattr(summary, "files_seen", None), "ndcg": report.ndcg,
                "mrr": report.mrr, "hit_at_3": report.hit_at_3,
                "categories": {k: v.ndcg for k, v in report.categories.items()},
                "per_query": [{"query": r.query, "category": r.category, "ndcg": round(r.ndcg, 4), "files": r.files[:5]}
                              for r in report.results],
            })
            say(f"{c.language:<18} {c.spec:<42} NDCG@10 {report.ndcg:.3f}")
    finally:
        runtime.close_all()
        get_settings.cache_clear()
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: one row per language, then the mean over the eight-language sets."""
    out = ["| language | project (pinned) | split | queries | NDCG@10 | MRR | hit@3 | architecture | semantic | symbol |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cats = r["categories"]
        out.append(f"| {r['language']} | {r['spec']} | {r.get('split', '')} | {r['queries']} | {r['ndcg']:.3f} | "
                   f"{r['mrr']:.3f} | {r['hit_at_3']:.2f} | " + " | ".join(
                       f"{cats[k]:.3f}" if k in cats else "" for k in ("architecture", "semantic", "symbol")) + " |")
    langs = [r["ndcg"] for r in rows if r["repo"] in {c.repo for c in LANGUAGES}]
    if langs:
        out.append(f"| **mean of {len(langs)} languages** | | | | **{statistics.fmean(langs):.3f}** | | | | | |")
    return "\n".join(out)


def summary(rows: list[dict]) -> dict[str, float]:
    """Mean NDCG@10 over the sets, and per query kind over the queries of that kind."""
    out = {"mean": statistics.fmean(r["ndcg"] for r in rows)} if rows else {}
    for kind in KINDS:
        scores = [q["ndcg"] for r in rows for q in r["per_query"] if q.get("category") == kind]
        if scores:
            out[kind] = statistics.fmean(scores)
    return out


def compare(results: dict[str, list[dict]]) -> str:
    """Models side by side: per set, then per split the mean and each query kind."""
    names = list(results)
    first = results[names[0]]
    out = ["| language | project | split | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for i, r in enumerate(first):
        out.append(f"| {r['language']} | {r['repo']} | {r['split']} | " +
                   " | ".join(f"{results[n][i]['ndcg']:.3f}" for n in names) + " |")
    for split in ("dev", "test"):
        sums = {n: summary([r for r in results[n] if r["split"] == split]) for n in names}
        for key in ("mean", *KINDS):
            if key in sums[names[0]]:
                out.append(f"| **{split}: {key}** | | | " + " | ".join(f"**{sums[n][key]:.3f}**" for n in names) + " |")
    return "\n".join(out)


def selected(names: list[str], reference: bool, split: str = "all") -> list[Corpus]:
    pool = list(LANGUAGES) + (list(REFERENCE) if reference else [])
    pool = [c for c in pool if c.queries.is_file()]
    if names:
        pool = [c for c in pool if c.repo in names or c.language.lower() in names]
    if split != "all":
        pool = [c for c in pool if split_of(c) == split]
    return pool


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.languages", description=__doc__.splitlines()[0])
    ap.add_argument("only", nargs="*", help="repos or languages to run (default: all)")
    ap.add_argument("--reference", action="store_true", help="also run the Python reference sets (click, requests, fastapi)")
    ap.add_argument("--split", choices=("dev", "test", "all"), default="all",
                    help="dev (tune on it), test (look once per change) or both (default)")
    ap.add_argument("--model", action="append", default=[],
                    help="static model directory, or git:REV for the shipped one at a commit; repeat to compare "
                         "side by side (default: the configured embedder)")
    ap.add_argument("--json", default=None, help="write the rows (with per-query results) here")
    ap.add_argument("--home", default=None, help="MOONMIND_HOME to index into (default: a fresh temporary one)")
    args = ap.parse_args(argv)
    corpora = selected(args.only, args.reference, args.split)
    with tempfile.TemporaryDirectory(prefix="moonmind-lang-") as tmp:
        if not args.model:
            rows = evaluate(corpora, Path(args.home) if args.home else Path(tmp))
            print(table(rows))
            print()
            print(compare({"configured": rows}))
            result: object = rows
        else:
            results = {}
            for i, spec in enumerate(args.model):
                home = Path(args.home) / f"model-{i}" if args.home else Path(tmp) / f"home-{i}"
                say(f"model {spec}")
                results[spec] = evaluate(corpora, home, model_dir(spec, Path(tmp)))
            print(compare(results))
            result = results
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
