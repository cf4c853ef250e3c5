"""`python -m bench.catalogs`: what indexing gettext catalogs (MOONMIND_INDEX_CATALOGS) does to search.

Why: a catalog holds every locale's copy of the messages a program shows, so a search for such a
message (a line from a log or a screen: "where is this said?") may find the catalogs before the
code that says it. The queries are made from the code, not chosen: every message of at least 20
characters a project's Python source passes to a gettext call (`_`, `__`, `gettext`, ...) as one
literal, in a seeded random order; the relevant files are the source files holding that literal.
Each project is indexed twice from the same tree (catalogs off, on), each query searched in both.

Split as every evaluation set here: Django is the dev set (the default was decided on it), Sphinx
the test set (looked at once). Reports per project and setting: hit@1 and hit@5 of a defining file,
MRR@10, and how many of the top 10 are catalogs; also the catalog share of the bench's natural
queries (bench.owner.QUERIES, Django's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
from pathlib import Path

from moonmind_worker.text.files import CATALOG_SUFFIXES

from .languages import Corpus, fetch
from .owner import QUERIES, django_source

#: A gettext call with one literal argument of 20-90 characters (no format fields: those differ from what a log shows).
MESSAGE = re.compile(r"""\b(?:_|__|gettext|gettext_lazy|ngettext|pgettext_lazy)\(\s*(["'])([^"'\\%{}\n]{20,90})\1""")
SPHINX = Corpus("sphinx", "Python", "pypi-sdist", "sphinx==8.1.3", "sphinx-8.1.3", Path("-"))


def say(msg: str) -> None:
    sys.stderr.write(f"[catalogs] {msg}\n")
    sys.stderr.flush()


def messages(root: Path, limit: int, seed: int = 0) -> dict[str, set[str]]:
    """Up to `limit` messages of the Python source under `root` (seeded order), each with the files that hold it."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for m in MESSAGE.finditer(path.read_text(encoding="utf-8", errors="replace")):
            if " " in m.group(2):
                found.setdefault(m.group(2), set()).add(rel)
    keys = sorted(found)
    random.Random(seed).shuffle(keys)
    return {k: found[k] for k in keys[:limit]}


def score(wanted: dict[str, set[str]], files) -> dict[str, float]:
    """hit@1, hit@5, MRR@10 of a defining file, and catalogs in a top 10, over `wanted` (`files`: a query's result files)."""
    hit1 = hit5 = rr = catalogs = 0.0
    for message, defined in wanted.items():
        got = files(message)
        catalogs += sum(f.endswith(CATALOG_SUFFIXES) for f in got)
        rank = next((n for n, f in enumerate(got) if f in defined), None)
        if rank is not None:
            hit1, hit5, rr = hit1 + (rank == 0), hit5 + (rank < 5), rr + 1 / (rank + 1)
    n = len(wanted) or 1
    return {"hit_at_1": round(hit1 / n, 3), "hit_at_5": round(hit5 / n, 3), "mrr": round(rr / n, 3),
            "catalogs_in_top_10": round(catalogs / n, 2)}


def measure(projects: list[tuple[str, str, Path]], limit: int) -> list[dict]:
    """Each project indexed with its catalogs and without, each in a home of its own (as a user's index of it alone:
    one store holding several would take the HNSW graph sooner, edge_shard.GRAPH_FROM_SEGMENTS), then scored."""
    from moonmind_worker import runtime
    from moonmind_worker.contracts import parse_query
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import get_settings

    rows = []
    for name, split, root in projects:
        wanted = messages(root, limit)
        for setting in ("off", "on"):
            with tempfile.TemporaryDirectory(prefix="moonmind-catalogs-") as home:
                os.environ.update(MOONMIND_HOME=home, MOONMIND_TENANT="bench", MOONMIND_INDEX_CATALOGS=setting)
                get_settings.cache_clear()
                settings = get_settings()
                embedder, store = runtime.get_embedder(settings), runtime.get_store(settings)
                try:
                    summary = index_repository(root, repo=name, tenant="bench", settings=settings, embedder=embedder,
                                               store=store)

                    def files(query: str) -> list[str]:
                        query_in = parse_query({"query": query, "top_k": 10, "filters": {"repo": name}})
                        pack = retrieve_context_pack(query_in, settings=settings, embedder=embedder, store=store)
                        return [i.source for i in pack.items]

                    row = {"project": name, "split": split, "catalogs": setting, "files": summary.files_seen,
                           "chunks": summary.chunks_written, "messages": len(wanted), **score(wanted, files)}
                    if name == "django":
                        row["natural_catalogs_in_top_10"] = round(
                            sum(sum(f.endswith(CATALOG_SUFFIXES) for f in files(q)) for q in QUERIES) / len(QUERIES), 2)
                finally:
                    runtime.close_all()
                    get_settings.cache_clear()
            rows.append(row)
            say(json.dumps(row))
    return rows


def table(rows: list[dict]) -> str:
    out = ["| project (split) | catalogs | files | chunks | messages | hit@1 | hit@5 | MRR@10 | catalogs in top 10 |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['project']} ({r['split']}) | {r['catalogs']} | {r['files']} | {r['chunks']} | {r['messages']} | "
                   f"{r['hit_at_1']:.3f} | {r['hit_at_5']:.3f} | {r['mrr']:.3f} | {r['catalogs_in_top_10']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.catalogs", description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=80, help="messages sampled per project (default 80)")
    ap.add_argument("--split", choices=("dev", "test", "all"), default="all")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    projects = []
    if args.split in ("dev", "all"):
        projects.append(("django", "dev", django_source()))
    if args.split in ("test", "all"):
        projects.append(("sphinx", "test", fetch(SPHINX)))
    rows = measure(projects, args.messages)
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    for r in rows:
        if "natural_catalogs_in_top_10" in r:
            print(f"bench.owner.QUERIES on {r['project']}, catalogs {r['catalogs']}: "
                  f"{r['natural_catalogs_in_top_10']:.2f} catalogs in a top 10", file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
