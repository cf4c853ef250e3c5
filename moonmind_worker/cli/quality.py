"""`moonmind rag eval` (retrieval quality on a query file), `moonmind rag stats` (what the index holds for a
repository) and `moonmind rag repos` (which repositories it holds)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import MoonmindError
from ..text.terminal import printable


def register(groups: dict) -> None:
    rag = groups["rag"]

    p = rag.add_parser("eval", help="score retrieval on a query file (NDCG@k, recall, MRR, latency)")
    p.add_argument("--queries", required=True, help="JSON query file (format of shared/eval/fastapi.json)")
    p.add_argument("--repo", default=None, help="repo filter for queries that do not name their own `repo`")
    p.add_argument("--k", type=int, default=10, help="cut-off for NDCG and recall (default 10)")
    p.add_argument("--top-k", type=int, default=None, help="items requested per query (default: k)")
    p.add_argument("--score-threshold", type=float, default=None, help="override the default threshold")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(_handler=cmd_eval)

    p = rag.add_parser("stats", help="per-file chunk counts and files no chunk represents")
    p.add_argument("--repo", required=True, help="repository to inspect")
    p.add_argument("--tenant", default=None, help="tenant (default: MOONMIND_TENANT or any)")
    p.add_argument("--root", default=None, help="the indexed tree: also list files on disk with no chunk")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(_handler=cmd_stats)

    p = rag.add_parser("repos", help="the indexed repositories: tenant, files, chunks, model, last indexed")
    p.add_argument("--tenant", default=None, help="only this tenant (default: MOONMIND_TENANT, else every tenant)")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(_handler=cmd_repos)


def cmd_eval(args: argparse.Namespace) -> int:
    from .. import operations
    from ..contracts import TOP_K_MAX, TOP_K_MIN
    from ..retrieval.evaluation import format_report, load_queries, run_eval
    from ..settings import get_settings

    if args.k < 1:
        raise MoonmindError("invalid_argument", f"--k must be >= 1, got {args.k}.", "Pass e.g. --k 10.")
    top_k = args.top_k or min(max(args.k, TOP_K_MIN), TOP_K_MAX)
    queries = load_queries(args.queries)
    settings = get_settings()

    def search(q) -> list[str]:
        filters = {}
        repo = q.repo or args.repo or settings.repo
        if repo:
            filters["repo"] = repo
        if settings.tenant:
            filters["tenant"] = settings.tenant
        # through the box's owner when one is alive (its latency is what agents get), else in this process;
        # `record=False`: evaluation queries are not context an agent used
        pack = operations.search(settings, {"query": q.query, "top_k": top_k, "filters": filters,
                                            "score_threshold": args.score_threshold}, record=False)
        return [item["source"] for item in pack["items"]]

    report = run_eval(queries, search, k=args.k, top_k=top_k)
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(printable(format_report(report)))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from .. import operations
    from ..settings import get_settings

    settings = get_settings()
    root = Path(args.root) if args.root else None
    if root is not None and not root.is_dir():
        raise MoonmindError("invalid_argument", f"{args.root} is not a directory.", "Pass the indexed tree's root.")
    out = operations.stats(settings, repo=args.repo, tenant=args.tenant or settings.tenant,
                           root=str(root.resolve()) if root else None)
    if args.json:
        sys.stdout.write(json.dumps(out["stats"], indent=2) + "\n")
    else:
        sys.stdout.write(printable(out["text"]))
    return 0


def cmd_repos(args: argparse.Namespace) -> int:
    from .. import operations
    from ..settings import get_settings

    settings = get_settings()
    out = operations.repos(settings, tenant=args.tenant or settings.tenant)
    if args.json:
        sys.stdout.write(json.dumps(out["repos"], indent=2) + "\n")
    else:
        sys.stdout.write(printable(format_repos(out["repos"], out["collection"])))
    return 0


def format_repos(repos: list[dict], collection: str) -> str:
    """`rag repos` as a table: repository, tenant, files, chunks, model, last indexed."""
    if not repos:
        return f"No repository is indexed in collection {collection} yet: run `moonmind rag index PATH --repo NAME`.\n"
    from ..indexing.source import summary

    head = ("repository", "tenant", "files", "chunks", "model", "last indexed", "source")
    rows = [head] + [
        (printable(r["repo"], single_line=True), printable(r["tenant"], single_line=True), str(r["files"]), str(r["chunks"]),
         printable(r["model"] or "-", single_line=True), r["last_indexed"] or "-",
         printable(summary(r.get("source")), single_line=True))
        for r in repos
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    right = {2, 3}  # the counts
    lines = ["  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
             for row in rows]
    return "\n".join(lines) + "\n"
