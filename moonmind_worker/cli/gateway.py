"""`moonmind gateway serve` and `moonmind gateway add-token`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(groups: dict) -> None:
    gw = groups["gateway"]

    p = gw.add_parser("serve", help="run the RetrievalGateway HTTP service (uvicorn)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8088, help="TCP port (default 8088; 0 picks a free one)")
    p.add_argument("--tokens-file", default=None, help="bearer-token file (default MOONMIND_GATEWAY_TOKENS_FILE)")
    p.add_argument("--access-log", action="store_true", help="log every request (off by default: throughput)")
    p.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help="retrievals run at once (default: 1 with the static embedder, 16 with a hosted one)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes serving requests, one per core for throughput (default 1); with the "
                        "embedded store each searches its own copy of the collection")
    p.set_defaults(_handler=cmd_serve)

    p = gw.add_parser("add-token", help="create a worker token; prints it once, stores only its hash")
    p.add_argument("--name", required=True, help="a label for the token (unique in the file)")
    p.add_argument("--repo", action="append", required=True, help="a repository the token may read (repeatable)")
    p.add_argument("--tenant", action="append", default=None,
                   help="a tenant the token may read (repeatable; default: MOONMIND_TENANT or 'default', as for rag index)")
    p.add_argument("--max-top-k", type=int, default=None, help="largest top_k the token may ask for")
    p.add_argument("--tokens-file", default=None, help="bearer-token file (default MOONMIND_GATEWAY_TOKENS_FILE)")
    p.set_defaults(_handler=cmd_add_token)


def _settings(args: argparse.Namespace):
    from ..settings import get_settings

    settings = get_settings()
    if args.tokens_file:
        settings = settings.model_copy(update={"gateway_tokens_file": Path(args.tokens_file).expanduser()})
    return settings


def cmd_serve(args: argparse.Namespace) -> int:
    from ..errors import MoonmindError
    from ..gateway.serve import MAX_WORKERS, serve

    if args.concurrency is not None and not 1 <= args.concurrency <= 256:
        raise MoonmindError("invalid_argument", f"--concurrency {args.concurrency} is outside 1-256.",
                            "Pass a small positive number, e.g. --concurrency 4.")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise MoonmindError("invalid_argument", f"--workers {args.workers} is outside 1-{MAX_WORKERS}.",
                            "Pass the number of cores to use, e.g. --workers $(nproc).")
    serve(args.host, args.port, _settings(args), access_log=args.access_log, concurrency=args.concurrency,
          workers=args.workers)
    return 0


def cmd_add_token(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from ..contracts import TokenGrant
    from ..errors import MoonmindError
    from ..gateway.auth import add_token, hash_token, new_token

    settings = _settings(args)
    token = new_token()
    try:
        grant = TokenGrant(
            name=args.name, hash=hash_token(token), repos=args.repo, tenants=args.tenant or [settings.scope_tenant],
            max_top_k=args.max_top_k,
        )
    except ValidationError as exc:
        e = exc.errors()[0]
        raise MoonmindError(
            "invalid_argument", f"Invalid token grant: {'.'.join(map(str, e['loc']))}: {e['msg']}.", "Fix the flag and retry."
        ) from None
    add_token(settings.tokens_file, grant)
    sys.stderr.write(f"note: token {args.name!r} added to {settings.tokens_file}; it is shown once, store it now\n")
    sys.stdout.write(token + "\n")
    return 0
