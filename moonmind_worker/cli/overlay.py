"""`moonmind rag overlay upsert|clean|list`: the run's workspace overlay (rules in `moonmind_worker.indexing.overlay`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..entry import default_root
from ..errors import MoonmindError
from ..text.terminal import printable
from .rag import add_execution_arguments, execution_mode, expect_keys, print_task_id, queue_timeout, run_queued

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

#: OverlayReport keys the CLI prints from (see `commands.rag.expect_keys`).
OVERLAY_REPORT_KEYS = ("run_id", "skipped", "tombstones", "line")
#: OverlayCleanResult keys.
OVERLAY_CLEAN_KEYS = ("removed", "run_id", "expired")


def register(groups: dict) -> None:
    rag = groups["rag"]
    p = rag.add_parser("overlay", help="this run's workspace overlay: upsert edited files, clean, list")
    p.set_defaults(_group_parser=p)
    sub = p.add_subparsers(dest="overlay_command", metavar="COMMAND", parser_class=type(p))

    u = sub.add_parser("upsert", help="chunk, embed and upsert edited files for this run (a missing file is a tombstone)")
    u.add_argument("paths", nargs="+", metavar="PATH", help="edited (or deleted) files inside the workspace")
    u.add_argument("--run-id", default=None, help="run id (default: MOONMIND_RUN_ID)")
    u.add_argument("--ttl", default="24h", metavar="DURATION", help="lifetime, e.g. 900s, 30m, 2h, 1d (default 24h)")
    u.add_argument("--repo", default=None, help="repository name (default: MOONMIND_REPO)")
    u.add_argument("--tenant", default=None, help="tenant (default: MOONMIND_TENANT or 'default')")
    u.add_argument("--root", default=None, help="workspace root (default: the enclosing git work tree, else the current directory)")
    u.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_execution_arguments(u, write=True)
    u.set_defaults(_handler=cmd_upsert)

    c = sub.add_parser("clean", help="remove a run's overlay, or every expired overlay point")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--run-id", default=None, help="run whose overlay to remove (default: MOONMIND_RUN_ID)")
    which.add_argument("--expired", action="store_true", help="the TTL sweep: remove every expired overlay point")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    add_execution_arguments(c, write=True)
    c.set_defaults(_handler=cmd_clean)

    ls = sub.add_parser("list", help="what is overlaid, with expiry")
    ls.add_argument("--run-id", default=None, help="only this run (default: MOONMIND_RUN_ID, else every run)")
    ls.add_argument("--json", action="store_true", help="print the rows as JSON")
    ls.set_defaults(_handler=cmd_list)


def cmd_upsert(args: argparse.Namespace) -> int:
    from ..settings import get_settings

    settings = get_settings()
    root = Path(args.root) if args.root else default_root()
    if not root.is_dir():
        raise MoonmindError("invalid_argument", f"Workspace root {args.root} is not a directory.", "Pass --root DIR.")
    # shell paths are relative to the current directory, as for any command
    paths = [p if os.path.isabs(p) else os.path.abspath(p) for p in args.paths]
    if execution_mode(args) == "queue":
        return upsert_queued(args, settings, root, paths)
    if args.no_wait:
        raise MoonmindError("invalid_argument", "--no-wait only applies to --execution queue.", "Add --execution queue or drop --no-wait.")

    from .. import operations

    # validated where it runs (owner or here, `owner.ops.overlay_upsert`), before anything is written
    report = operations.overlay_upsert(settings, {
        "paths": paths, "root": str(root.resolve()), "ttl": args.ttl, "run_id": args.run_id or settings.run_id,
        "repo": args.repo or settings.repo, "tenant": args.tenant or settings.scope_tenant,
    })
    return print_overlay_report(report, args)


def print_overlay_report(report: Mapping[str, Any], args: argparse.Namespace) -> int:
    """One rendering of an upsert, for sync and queue alike (`report` is OverlayReport's JSON)."""
    from .main import note

    for s in report["skipped"]:
        note(f"skipped {s['path']}: {s['reason']}")
    for rel in report["tombstones"]:
        note(f"tombstoned {rel}: missing or empty, its canonical chunks are hidden for run {report['run_id']}")
    if args.json:
        sys.stdout.write(json.dumps({k: v for k, v in report.items() if k != "line"}, indent=2) + "\n")
    else:
        sys.stdout.write(printable(report["line"]) + "\n")
    return 0


def _scope(value: str | None, what: str, flag: str, env: str) -> str:
    if value is None or not value.strip():
        raise MoonmindError("invalid_argument", f"No {what} given.", f"Pass {flag} or export {env}.")
    return value.strip()


def upsert_queued(args: argparse.Namespace, settings, root: Path, paths: list[str]) -> int:
    """Send the upsert to a warm worker (paths are absolute: the worker must see the same workspace).

    The request is an OverlayUpsertRequest's fields, validated by the task on the worker; the
    report is printed as the worker made it (no pydantic in the CLI: see `commands.rag`).
    """
    from ..transports.queue_client import OVERLAY_UPSERT

    request = {
        "paths": paths, "root": str(root.resolve()), "ttl": args.ttl,
        "run_id": _scope(args.run_id or settings.run_id, "run id", "--run-id", "MOONMIND_RUN_ID"),
        "repo": _scope(args.repo or settings.repo, "repo", "--repo", "MOONMIND_REPO"),
        "tenant": args.tenant or settings.scope_tenant,
    }
    wait = not args.no_wait
    out = run_queued(OVERLAY_UPSERT, {"request": request}, queue=settings.index_queue,
                     timeout_s=queue_timeout(args), wait=wait)
    if not wait:
        return print_task_id(out, args)
    return print_overlay_report(expect_keys(out, OVERLAY_REPORT_KEYS, "an OverlayReport"), args)


def cmd_clean(args: argparse.Namespace) -> int:
    from ..settings import get_settings

    settings = get_settings()
    run_id = None if args.expired else (args.run_id or settings.run_id)
    if execution_mode(args) == "queue":
        from ..transports.queue_client import OVERLAY_CLEAN

        if run_id is None and not args.expired:
            raise MoonmindError(
                "invalid_argument", "Nothing to clean: no run id and --expired not given.",
                "Pass --run-id ID (or export MOONMIND_RUN_ID) to drop a run's overlay, or --expired for the TTL sweep.",
            )
        wait = not args.no_wait
        out = run_queued(OVERLAY_CLEAN, {"request": {"run_id": run_id, "expired": args.expired}},
                         queue=settings.index_queue, timeout_s=queue_timeout(args), wait=wait)
        if not wait:
            return print_task_id(out, args)
        removed = int(expect_keys(out, OVERLAY_CLEAN_KEYS, "an OverlayCleanResult")["removed"])
    else:
        if args.no_wait:
            raise MoonmindError("invalid_argument", "--no-wait only applies to --execution queue.",
                                "Add --execution queue or drop --no-wait.")
        from .. import operations

        removed = int(operations.overlay_clean(settings, run_id=run_id, expired=args.expired)["removed"])
    what = "expired overlay points" if args.expired else f"overlay points of run {run_id}"
    if args.json:
        sys.stdout.write(json.dumps({"removed": removed, "run_id": run_id, "expired": args.expired}) + "\n")
    else:
        sys.stdout.write(printable(f"removed {removed} {what}", single_line=True) + "\n")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from .. import operations
    from ..settings import get_settings
    from .main import note

    settings = get_settings()
    rows = operations.overlay_list(settings, run_id=args.run_id or settings.run_id)
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    if not rows:
        note("no workspace overlay entries")
        return 0
    for r in rows:
        state = "expired" if r["expired"] else f"expires {r['expires_at']}"
        kind = "tombstone" if r["tombstone"] else f"{r['chunks']} chunks"
        cells = (r["run_id"], f"{r['tenant']}/{r['repo']}", r["path"], kind, state)
        sys.stdout.write("\t".join(printable(str(c), single_line=True).replace("\t", "\\t") for c in cells) + "\n")
    return 0
