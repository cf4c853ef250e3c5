"""`moonmind rag related PATH#Lx-Ly` and `moonmind rag symbols NAME`: navigation beside search.

Both send RetrievalQuery fields (the location or the name as `query`, the filters as a search's,
scoped the same way by `rag.search_request`) over the same transports: the gateway when
MOONMIND_RETRIEVAL_URL is set, else the box's warm owner or this process (`transports.navigate`).
`related` prints a ContextPack exactly as `rag search` does (`rag.print_pack`).
"""

from __future__ import annotations

import argparse
import sys

from ..entry import symbol_line
from ..text.terminal import printable

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any


def register(groups: dict) -> None:
    from .rag import add_transport_arguments

    rag = groups["rag"]
    p = rag.add_parser("related", help="the chunks most similar to a location (PATH#Lx-Ly) or chunk id, as a context pack")
    p.add_argument("location", metavar="LOCATION",
                   help="PATH#Lx-Ly, PATH#Lx, a chunk id (PATH#N) or PATH, relative to the repository root as search cites it")
    _add_filters(p)
    p.add_argument("--score-threshold", type=float, default=None, help="minimum cosine similarity in [0, 1] (default 0)")
    p.add_argument("--budget", nargs="+", default=[], metavar="KEY=VALUE", help="tokens=N latency_ms=M")
    p.add_argument("--output-file", default=None, help="also write the ContextPack JSON to this file")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--short", dest="view", action="store_const", const="short", help="citations and first lines")
    view.add_argument("--full", dest="view", action="store_const", const="full", help="the whole context block")
    add_transport_arguments(p)
    p.set_defaults(_handler=cmd_related)

    p = rag.add_parser("symbols", help="where a name is defined (kind, path, lines, signature), then where it is mentioned")
    p.add_argument("name", metavar="NAME", help="a function, class, method or type name: handle, Router.handle, Router::new")
    _add_filters(p)
    add_transport_arguments(p)
    p.set_defaults(_handler=cmd_symbols)


def _add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--top-k", type=int, default=None, help="number of results, 1-50 (default RAG_SIMILARITY_TOP_K=8)")
    p.add_argument("--filters", nargs="+", default=[], metavar="KEY=VALUE",
                   help="payload filters, as rag search takes them: repo, tenant, path, language")
    p.add_argument("--repo", default=None, help="same as --filters repo=NAME")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _request(text: str, args: argparse.Namespace) -> dict[str, Any]:
    from ..errors import MoonmindError
    from .rag import parse_pairs, search_request

    filters = parse_pairs(args.filters, "filter")
    if args.repo is not None:
        if filters.get("repo", args.repo) != args.repo:
            raise MoonmindError("invalid_query", f"--repo {args.repo!r} and --filters repo={filters['repo']!r} disagree.",
                                "Name the repository once: --repo NAME or --filters repo=NAME.")
        filters["repo"] = args.repo
    budgets = parse_pairs(getattr(args, "budget", []), "budget")
    for key, value in budgets.items():
        if not value.isdigit():
            raise MoonmindError("invalid_query", f"Budget {key}={value!r} is not a positive integer.",
                                "Use e.g. --budget tokens=1200 latency_ms=800.")
    return search_request(text, top_k=args.top_k, filters=filters, score_threshold=getattr(args, "score_threshold", None),
                          budgets={k: int(v) for k, v in budgets.items()})


def cmd_related(args: argparse.Namespace) -> int:
    from ..settings import get_settings
    from ..transports import navigate
    from .rag import print_pack

    settings = get_settings()
    pack = navigate("related", _request(args.location, args), settings=settings, transport=args.transport,
                    fallback=args.fallback)
    return print_pack(pack, args)


def cmd_symbols(args: argparse.Namespace) -> int:
    import json

    from ..settings import get_settings
    from ..transports import navigate
    from .main import note

    settings = get_settings()
    result = navigate("symbols", _request(args.name, args), settings=settings, transport=args.transport,
                      fallback=args.fallback)
    for msg in result.get("notes", []):
        note(msg)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write("".join(printable(symbol_line(s)) + "\n" for s in result["symbols"]))
    return 0

