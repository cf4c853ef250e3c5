"""`moonmind rag sync-embedding`: re-embed a collection with the configured model, switch atomically."""

from __future__ import annotations

import argparse
import json
import sys


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
    from ..runtime import get_embedder, get_store
    from ..settings import get_settings
    from ..indexer import tty_progress
    from ..sync import sync_embedding

    settings = get_settings()
    embedder = get_embedder(settings)
    store = get_store(settings, args.collection)
    result = sync_embedding(
        store, embedder, batch_size=settings.embedding_batch_size, dry_run=args.dry_run, progress=tty_progress(unit="chunks re-embedded")
    )
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write((result.plan.line() if args.dry_run else result.line()) + "\n")
    return 0
