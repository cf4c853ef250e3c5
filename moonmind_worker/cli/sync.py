"""`moonmind rag sync-embedding`: re-embed a collection with the configured model, switch atomically."""

from __future__ import annotations

import argparse
import json
import sys

from ..text.terminal import printable


def register(groups: dict) -> None:
    rag = groups["rag"]
    p = rag.add_parser(
        "sync-embedding",
        help="re-embed every stored chunk with the configured model into a new collection, then switch to it",
    )
    p.add_argument("--collection", required=True, help="the collection to migrate (e.g. moonmind__repo)")
    p.add_argument("--dry-run", action="store_true", help="report what would change; write nothing")
    p.add_argument("--json", action="store_true", help="print the plan / result as JSON")
    p.set_defaults(_handler=cmd_sync_embedding)


def cmd_sync_embedding(args: argparse.Namespace) -> int:
    from .. import operations
    from ..settings import get_settings
    from .progress import reporter

    settings = get_settings()
    out = operations.sync_embedding(
        settings, collection=args.collection, dry_run=args.dry_run,
        progress=reporter(unit="chunks re-embedded", interval_s=settings.progress_interval_s),
    )
    if args.json:
        sys.stdout.write(json.dumps(out["result"], indent=2) + "\n")
    else:
        sys.stdout.write(printable(out["line"]) + "\n")
    return 0
