"""`moonmind rag index` and `moonmind rag search`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import MoonmindError


def register(groups: dict) -> None:
    rag = groups["rag"]

    p = rag.add_parser("index", help="index a repository tree (incremental)")
    p.add_argument("path", help="root of the tree to index")
    p.add_argument("--repo", required=True, help="repository name stored with every chunk")
    p.add_argument("--tenant", default=None, help="tenant (default: MOONMIND_TENANT or 'default')")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(_handler=cmd_index)

    p = rag.add_parser("search", help="retrieve a context pack for a query")
    add_search_arguments(p)
    p.set_defaults(_handler=cmd_search)


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--query", "-q", required=True, help="what to look for (natural language or identifiers)")
    p.add_argument("--top-k", type=int, default=None, help="number of items, 1-50 (default RAG_SIMILARITY_TOP_K=8)")
    p.add_argument("--filters", nargs="+", default=[], metavar="KEY=VALUE", help="payload filters: repo, tenant, run_id, path, language")
    p.add_argument("--score-threshold", type=float, default=None, help="minimum score in [0, 1]")
    p.add_argument("--overlay", choices=["include", "skip"], default="include", help="merge this run's workspace overlay")
    p.add_argument("--budget", nargs="+", default=[], metavar="KEY=VALUE", help="tokens=N latency_ms=M")
    p.add_argument("--json", action="store_true", help="print the full ContextPack JSON on stdout")
    p.add_argument("--output-file", default=None, help="also write the ContextPack JSON to this file")


def parse_pairs(pairs: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise MoonmindError(
                "invalid_query",
                f"Malformed {what} {pair!r}: expected KEY=VALUE.",
                f"Write each {what} as key=value, e.g. repo=myrepo.",
            )
        out[key.strip()] = value.strip()
    return out


def query_from_args(args: argparse.Namespace):
    """The RetrievalQuery the flags describe; scope defaults come from the job's environment."""
    from ..contracts import parse_query
    from ..settings import get_settings

    settings = get_settings()
    filters: dict[str, str] = {}
    for key, value in (("repo", settings.repo), ("tenant", settings.tenant), ("run_id", settings.run_id)):
        if value:
            filters[key] = value
    filters.update(parse_pairs(args.filters, "filter"))
    budgets = parse_pairs(args.budget, "budget")
    for key, value in budgets.items():
        if not value.isdigit():
            raise MoonmindError(
                "invalid_query", f"Budget {key}={value!r} is not a positive integer.", "Use e.g. --budget tokens=1200 latency_ms=800."
            )
    data = {
        "query": args.query,
        "top_k": args.top_k,
        "filters": filters,
        "overlay_policy": args.overlay,
        "score_threshold": args.score_threshold,
    }
    if budgets:
        data["budgets"] = {k: int(v) for k, v in budgets.items()}
    return parse_query(data)


def print_pack(pack, args: argparse.Namespace) -> int:
    """Print exactly one rendering of a finished pack (the same for every transport and execution mode)."""
    from ..cli import note, write_atomic

    for msg in pack.notes:
        note(msg)
    body = pack.model_dump_json(indent=2)
    if args.output_file:
        write_atomic(args.output_file, body + "\n")
    sys.stdout.write(body + "\n" if args.json else pack.context_text)
    sys.stdout.flush()
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from ..pipeline import retrieve_context_pack
    from ..runtime import get_embedder, get_store
    from ..settings import get_settings

    query = query_from_args(args)
    settings = get_settings()
    pack = retrieve_context_pack(query, settings=settings, embedder=get_embedder(settings), store=get_store(settings))
    return print_pack(pack, args)


def cmd_index(args: argparse.Namespace) -> int:
    import json

    from ..indexer import index_repository, tty_progress
    from ..runtime import get_embedder, get_store
    from ..settings import get_settings

    root = Path(args.path)
    if not root.is_dir():
        raise MoonmindError("invalid_argument", f"{args.path} is not a directory.", "Pass the root of the repository to index.")
    settings = get_settings()
    tenant = args.tenant or settings.tenant or "default"
    store = get_store(settings)
    summary = index_repository(
        root,
        repo=args.repo,
        tenant=tenant,
        settings=settings,
        embedder=get_embedder(settings),
        store=store,
        progress=tty_progress(),
    )
    if args.json:
        out = {k: v for k, v in summary.__dict__.items() if k != "skipped"}
        out["skipped"] = [{"path": s.path, "reason": s.reason} for s in summary.skipped]
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        sys.stdout.write(summary.line() + "\n")
    return 0
