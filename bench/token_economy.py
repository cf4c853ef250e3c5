"""`python -m bench.token_economy`: how many tokens an agent reads before it reaches the right code.

For each query of the evaluation sets (`bench/eval-*.json`, `shared/eval/fastapi.json`; corpora
fetched and indexed as `bench.languages` does, relevance judged as `retrieval.evaluation` does: a
result is relevant when its file is one of the query's `relevant + secondary` files), an agent
reads an answer from the top, in order:

* `full pack`: `moonmind rag search` (top_k 10, default threshold), the context block as printed;
* `max-lines N`: the same search with `max_lines` N;
* `locations only`: the same search with `locations_only` (citations alone);
* `locations + read`: the locations list, then the cited lines of each hit in rank order (the
  full pack's chunk text), as an agent that opens what the list points at;
* `grep + read`: the baseline below.

Measured per query: tokens until the first relevant file has been read whole (never, when no
relevant file is in the answer), and recall at 500 / 1k / 2k / 4k tokens (the share of the
query's target files read whole within that many tokens). Tokens are characters / 4, rounded up,
the product's own `token_count` rule, for every mode and the baseline alike.

The grep + read baseline, as an agent without this tool works: the query's words (identifier
characters; stop words, the product's `lexical.STOPWORDS`, and words under 3 letters dropped),
each searched with `grep -rlIiF WORD .` over the same tree that is indexed; the files holding
every word that some file holds, and while there are none, the word found in the most files
(the least distinctive) is dropped, down to one word. The list, sorted by path (grep's own order
is the directory's, not stable), is read (its tokens count), then each file whole, in that
order. Only that final list is counted, not the searches that narrowed it: the baseline's
figures are a floor.

Corpora: all of `bench.languages`' sets by default, or the names given (`python -m
bench.token_economy chi express fastapi`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.languages import REFERENCE, Corpus, fetch, selected

BUDGETS = (500, 1000, 2000, 4000)
TOP_K = 10
MAX_LINES = 10
MODES = ("full pack", f"max-lines {MAX_LINES}", "locations only", "locations + read", "grep + read")


def say(msg: str) -> None:
    sys.stderr.write(f"[token_economy] {msg}\n")
    sys.stderr.flush()


def tokens(text: str) -> int:
    from moonmind_worker.text.chunking import estimate_tokens

    return estimate_tokens(text)


# ---- what an agent reads: (file, cumulative tokens once it is read whole), in reading order -------------


def pack_reads(pack) -> list[tuple[str, int]]:
    """Each item of a pack with the tokens of its context block read up to the end of that item."""
    from moonmind_worker.retrieval.context_pack import format_item

    text, at, out = pack.context_text, 0, []
    with_repo = len({i.payload.get("repo") for i in pack.items}) > 1
    for n, item in enumerate(pack.items, 1):
        block = format_item(n, item, with_repo)
        at = text.index(block, at) + len(block)
        out.append((item.source, tokens(text[:at])))
    return out


def located_reads(locations, full) -> list[tuple[str, int]]:
    """The whole locations list, then each cited chunk's text (the full pack's) in rank order."""
    spent, out = tokens(locations.context_text), []
    texts = {i.chunk_id: i.text for i in full.items}
    for item in locations.items:
        spent += tokens(texts.get(item.chunk_id, ""))
        out.append((item.source, spent))
    return out


def words(query: str) -> list[str]:
    """The query's distinctive words, longest first (see the module docstring)."""
    import re

    from moonmind_worker.text.lexical import STOPWORDS

    found = [w for w in re.findall(r"[A-Za-z0-9_]+", query) if len(w) >= 3 and w.lower() not in STOPWORDS]
    return sorted(dict.fromkeys(found), key=lambda w: (-len(w), w))


def grep_files(root: Path, query: str) -> list[str]:
    """The files `grep -rlIiF` finds holding every word of the query (see the module docstring for the widening)."""
    found: dict[str, set[str]] = {}
    for word in words(query):
        out = subprocess.run(["grep", "-rlIiF", "--", word, "."], cwd=root, capture_output=True, text=True).stdout
        found[word] = {line[2:] if line.startswith("./") else line for line in out.splitlines()}
    terms = [w for w in found if found[w]]  # a word no file holds is dropped first
    while terms:
        files = set.intersection(*(found[w] for w in terms))
        if files:
            return sorted(files)
        terms.remove(max(terms, key=lambda w: (len(found[w]), w)))  # the least distinctive word goes next
    return []


def grep_reads(root: Path, files: list[str]) -> list[tuple[str, int]]:
    """The file list, then each file whole, in order."""
    spent, out = tokens("".join(f"./{f}\n" for f in files)), []
    for f in files:
        spent += tokens((root / f).read_bytes().decode("utf-8", "replace"))
        out.append((f, spent))
    return out


def score(reads: list[tuple[str, int]], targets: set[str], whole: int) -> dict:
    """Tokens until the first target is read whole (None: never), recall within each budget, the whole answer's tokens."""
    first = next((spent for f, spent in reads if f in targets), None)
    recall = {b: len({f for f, spent in reads if spent <= b} & targets) / len(targets) for b in BUDGETS}
    return {"first": first, "recall": recall, "whole": whole}


# ---- the run ---------------------------------------------------------------------------------------------


def run(corpora: list[Corpus], home: Path) -> list[dict]:
    """Index each corpus (as bench.languages does), then read every query's answers in every mode."""
    os.environ["MOONMIND_HOME"] = str(home)
    os.environ["MOONMIND_TENANT"] = "bench"
    from moonmind_worker import runtime
    from moonmind_worker.contracts import parse_query
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.retrieval.evaluation import load_queries
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import get_settings

    get_settings.cache_clear()
    settings = get_settings()
    embedder, store = runtime.get_embedder(settings), runtime.get_store(settings)
    rows: list[dict] = []
    try:
        # every corpus first, then every query, as bench.languages does: BM25's IDF is the whole collection's
        roots = {c.repo: fetch(c) for c in corpora}
        for c in corpora:
            index_repository(roots[c.repo], repo=c.repo, tenant="bench", settings=settings, embedder=embedder, store=store)
        for c in corpora:
            root = roots[c.repo]

            def pack(q: str, repo: str = c.repo, **shape):
                request = {"query": q, "top_k": TOP_K, "filters": {"repo": repo}, **shape}
                return retrieve_context_pack(parse_query(request), settings=settings, embedder=embedder, store=store)

            for q in load_queries(c.queries):
                targets = set(q.targets)
                full, cut, bare = pack(q.query), pack(q.query, max_lines=MAX_LINES), pack(q.query, locations_only=True)
                reads = {
                    MODES[0]: pack_reads(full),
                    MODES[1]: pack_reads(cut),
                    MODES[2]: pack_reads(bare),
                    MODES[3]: located_reads(bare, full),
                    MODES[4]: grep_reads(root, grep_files(root, q.query)),
                }
                whole = {MODES[0]: tokens(full.context_text), MODES[1]: tokens(cut.context_text),
                         MODES[2]: tokens(bare.context_text)}
                rows.append({"repo": c.repo, "query": q.query, "category": q.category,
                             "modes": {m: score(r, targets, whole.get(m, r[-1][1] if r else 0)) for m, r in reads.items()}})
            say(f"{c.repo}: {sum(r['repo'] == c.repo for r in rows)} queries")
    finally:
        runtime.close_all()
        get_settings.cache_clear()
    return rows


def median_first(values: list[int | None]) -> float | None:
    """The median with a query that never reached a relevant file counted as infinitely many tokens."""
    ordered = sorted(float("inf") if v is None else v for v in values)
    m = statistics.median(ordered)
    return None if m == float("inf") else m


def table(rows: list[dict]) -> str:
    out = ["| mode | reached a relevant file | median tokens to the first relevant file | mean (where reached) | "
           + " | ".join(f"recall@{b}" for b in BUDGETS) + " | median tokens of the whole answer |",
           "|---|---|---|---|" + "---|" * (len(BUDGETS) + 1)]
    for mode in MODES:
        scores = [r["modes"][mode] for r in rows]
        firsts = [s["first"] for s in scores]
        reached = [f for f in firsts if f is not None]
        med = median_first(firsts)
        recalls = " | ".join(f"{statistics.fmean(s['recall'][b] for s in scores):.2f}" for b in BUDGETS)
        mean = f"{statistics.fmean(reached):,.0f}" if reached else "—"
        whole = statistics.median(s["whole"] for s in scores)
        out.append(f"| {mode} | {len(reached)}/{len(scores)} | {'never' if med is None else f'{med:,.0f}'} | {mean} | {recalls} "
                   f"| {whole:,.0f} |")
    return "\n".join(out)


def by_kind(rows: list[dict]) -> str:
    """Median tokens to the first relevant file, per query kind (never reached: infinitely many)."""
    kinds = sorted({r["category"] for r in rows})
    out = ["| mode | " + " | ".join(f"{k} ({sum(r['category'] == k for r in rows)})" for k in kinds) + " |",
           "|---|" + "---|" * len(kinds)]
    for mode in MODES:
        cells = []
        for k in kinds:
            med = median_first([r["modes"][mode]["first"] for r in rows if r["category"] == k])
            cells.append("never" if med is None else f"{med:,.0f}")
        out.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.token_economy", description=__doc__.splitlines()[0])
    ap.add_argument("only", nargs="*", help="repos or languages to run (default: every set, fastapi included)")
    ap.add_argument("--json", default=None, help="write the per-query rows here")
    ap.add_argument("--home", default=None, help="MOONMIND_HOME to index into (default: a fresh temporary one)")
    args = ap.parse_args(argv)
    corpora = selected(args.only, reference=True)
    if not corpora:
        names = ", ".join(c.repo for c in selected([], reference=True)) or "none (no query file found)"
        sys.stderr.write(f"error: no evaluation set matches {args.only}; known: {names}\n")
        return 2
    say("corpora: " + ", ".join(c.repo for c in corpora) + (" (fastapi's set is absent)" if not REFERENCE[-1].queries.is_file() else ""))
    with tempfile.TemporaryDirectory(prefix="moonmind-tokens-") as tmp:
        rows = run(corpora, Path(args.home) if args.home else Path(tmp))
    print(f"{len(rows)} queries on {len(corpora)} corpora: {', '.join(c.repo for c in corpora)}\n")
    print(table(rows))
    print()
    print(by_kind(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
