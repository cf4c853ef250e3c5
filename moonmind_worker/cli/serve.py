"""`moonmind serve`: own the embedded store in the foreground and serve it to the box (compose, systemd)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from ..errors import MoonmindError


def register(groups: dict) -> None:
    p = groups["root"].add_parser(
        "serve", help="own the embedded store and serve it to every moonmind command on this box",
        description="Hold the embedded store, keep the model and the shard warm, and answer every other "
                    "moonmind command on this box over a Unix socket beside the store (mode 0600).",
    )
    p.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                   help="exit after this many seconds without a request (what MOONMIND_OWNER=auto starts)")
    p.set_defaults(_handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from .. import runtime
    from ..owner.server import serve_store
    from ..settings import get_settings

    settings = get_settings()
    if not logging.getLogger().handlers:  # the owner's log (owner.log for an auto owner) says when and why it stops
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if args.idle_exit is not None:  # each client's breadcrumbs are in its run's artifacts; not every pack here too
            logging.getLogger("moonmind_worker.breadcrumbs").setLevel(logging.WARNING)
    if args.idle_exit is not None and args.idle_exit <= 0:
        raise MoonmindError("invalid_argument", f"--idle-exit {args.idle_exit:g} must be positive.", "Pass seconds, e.g. --idle-exit 600.")
    if not settings.embedded_store:
        raise MoonmindError(
            "invalid_argument", "QDRANT_URL is set: a Qdrant server serves every process itself, there is no store to own here.",
            "Unset QDRANT_URL to serve the embedded store, or run nothing: commands talk to the server directly.",
        )
    embedder = runtime.get_embedder(settings)
    server = serve_store(settings, role="serve", idle_exit_s=args.idle_exit)
    assert server is not None
    store = runtime.get_store(settings)
    try:
        info = store.info()  # open the shard now, not on the first request
    except MoonmindError:
        info = None
    what = f"{info.points} chunks" if info else "no collection yet: the first `moonmind rag index` creates it"
    sys.stderr.write(
        f"moonmind: serving {settings.data_dir / settings.collection} ({what}; {embedder.name}) to this box on "
        f"{server.path}, PID {os.getpid()}. Ctrl-C to stop.\n"
    )
    sys.stderr.flush()

    def stop(signum, frame) -> None:
        server.stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.wait()
    finally:
        server.stop()
        runtime.close_all()
    if server.handing_over:
        sys.stderr.write(f"moonmind: handed the store over to PID {server.handed_to}, which serves this box now\n")
    else:
        sys.stderr.write("moonmind: stopped serving\n")
    return 0
