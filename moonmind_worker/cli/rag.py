"""`moonmind rag index` and `moonmind rag search`.

Queue mode (`--execution queue`) imports no pydantic (nor numpy, qdrant or celery): the
process is a thin sender in front of a warm worker, and pydantic + the contract models
would cost more than the search itself. So the CLI sends the request fields as the flags
give them (`query_request`) and the worker validates them with the same contract function
the sync path uses (`contracts.parse_query`); an invalid request comes back as the same
`MoonmindError` (code, message, action, exit code) sync prints. The result is not
re-validated here either: the worker produced it from the contract model, and validating
the same data twice buys nothing (no duplicated validation on the data path). What a
version mismatch between CLI and worker could break is caught by `expect_keys`, a cheap
check of the keys printing needs. Every mode and transport prints a pack from its JSON
dict through one function, `print_pack`, so sync and queue output are identical by
construction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..entry import JOB_CEILING, expect_keys, refuse_widening, search_request  # noqa: F401 - re-exported
from ..errors import MoonmindError
from ..text.terminal import printable
from ..transports.queue import PACK_KEYS  # noqa: F401 - ContextPack keys the CLI relies on (tests keep them within the contract)

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

#: IndexReport keys the CLI relies on.
INDEX_REPORT_KEYS = ("repo", "tenant", "files_seen", "files_indexed", "chunks_written", "line")


def register(groups: dict) -> None:
    rag = groups["rag"]

    p = rag.add_parser("index", help="index a repository tree (incremental)")
    p.add_argument("path", help="root of the tree to index")
    p.add_argument("--repo", required=True, help="repository name stored with every chunk")
    p.add_argument("--tenant", default=None, help="tenant (default: MOONMIND_TENANT or 'default')")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--force", action="store_true", help="index PATH even when it is / or your home directory (refused otherwise)")
    p.add_argument("--dry-run", action="store_true",
                   help="say what would be indexed (files, skips, chunks, bytes), how long it would take and what a hosted "
                        "model would cost; writes nothing")
    add_execution_arguments(p, write=True)
    p.set_defaults(_handler=cmd_index)

    p = rag.add_parser("search", help="retrieve a context pack for a query")
    add_search_arguments(p)
    add_execution_arguments(p, write=False)
    add_transport_arguments(p)
    p.set_defaults(_handler=cmd_search)


def add_execution_arguments(p: argparse.ArgumentParser, *, write: bool) -> None:
    """--execution sync|queue (+ --timeout, and --no-wait for writes): run here or on a warm Celery worker."""
    p.add_argument(
        "--execution", choices=["sync", "queue"], default=None,
        help="sync: run in this process; queue: send to a Celery worker and wait (default MOONMIND_RAG_EXECUTION or sync)",
    )
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="queue mode: how long to wait for the worker (default: a search's latency budget, else "
                        "MOONMIND_QUEUE_TIMEOUT_S=30; an index waits until it is done)")
    if write:
        p.add_argument("--no-wait", action="store_true", help="queue mode: print the task id and return at once")


def execution_mode(args: argparse.Namespace) -> str:
    from ..settings import get_settings

    return args.execution or get_settings().rag_execution


def queue_timeout(args: argparse.Namespace, latency_ms: int | None = None) -> float:
    from ..settings import get_settings

    if args.timeout is not None:
        if args.timeout <= 0:
            raise MoonmindError("invalid_argument", f"--timeout {args.timeout} must be positive.", "Pass seconds, e.g. --timeout 10.")
        return args.timeout
    if latency_ms:
        return latency_ms / 1000
    return get_settings().queue_timeout_s


def run_queued(task: str, kwargs: dict, *, queue: str, timeout_s: float | None, wait: bool = True, progress=None):
    """Send a task to the configured broker: through the box's warm owner when one is up, else from here."""
    from ..transports.queue import enqueue

    return enqueue(task, kwargs, queue=queue, timeout_s=timeout_s, wait=wait, progress=progress)


def print_task_id(task_id: str, args: argparse.Namespace) -> int:
    import json

    sys.stdout.write(json.dumps({"task_id": task_id}) + "\n" if args.json else task_id + "\n")
    return 0


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("query_text", nargs="?", default=None, metavar="QUERY", help="what to look for (natural language or identifiers)")
    p.add_argument("--query", "-q", default=None, help="the query, as a flag (same as QUERY)")
    p.add_argument("--top-k", type=int, default=None, help="number of items, 1-50 (default RAG_SIMILARITY_TOP_K=8)")
    p.add_argument("--filters", nargs="+", default=[], metavar="KEY=VALUE",
                   help="payload filters: repo, tenant, run_id, path, language, resource_type (code, docs, config)")
    p.add_argument("--repo", default=None, help="same as --filters repo=NAME (the flag `rag index` takes)")
    p.add_argument("--score-threshold", type=float, default=None, help="minimum score in [0, 1]")
    p.add_argument("--overlay", choices=["include", "skip"], default="include", help="merge this run's workspace overlay")
    p.add_argument("--budget", nargs="+", default=[], metavar="KEY=VALUE", help="tokens=N latency_ms=M")
    p.add_argument("--max-lines", type=int, default=None, metavar="N",
                   help="cut each hit to the N lines that hold the most query terms (its first N when none)")
    p.add_argument("--locations-only", action="store_true",
                   help="citations only (path#lines, score, symbol), no text: the smallest answer")
    p.add_argument("--cursor", default=None, metavar="CURSOR",
                   help="the next page of the same search: the previous pack's next_cursor (same query and filters)")
    p.add_argument("--json", action="store_true", help="print the full ContextPack JSON on stdout")
    p.add_argument("--output-file", default=None, help="also write the ContextPack JSON to this file")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--short", dest="view", action="store_const", const="short",
                      help="citations (path#lines, score) with the first lines of each hit: the default on a terminal")
    view.add_argument("--full", dest="view", action="store_const", const="full",
                      help="the whole context block an agent pastes: the default when stdout is piped or redirected")


def add_transport_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--transport",
        choices=["direct", "gateway", "auto"],
        default="auto",
        help="direct (Qdrant), gateway (MOONMIND_RETRIEVAL_URL), auto (gateway when MOONMIND_RETRIEVAL_URL is set)",
    )
    p.add_argument(
        "--fallback",
        choices=["direct", "none"],
        default=None,
        help="when the gateway fails or exceeds the latency budget: retry direct (default MOONMIND_RETRIEVAL_FALLBACK=direct)",
    )
    p.add_argument("--no-fallback", dest="fallback", action="store_const", const="none", help="never fall back to direct")


def parse_pairs(pairs: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise MoonmindError(
                "invalid_query",
                f"Malformed {what} {pair!r}: expected KEY=VALUE.",
                f"Write each {what} as key=value, e.g. repo=myrepo"
                + ('; the query goes before --filters: rag search "text" --filters repo=myrepo.' if what == "filter" else "."),
            )
        out[key.strip()] = value.strip()
    return out


def query_request(args: argparse.Namespace) -> dict[str, Any]:
    """The RetrievalQuery fields the flags describe, not yet validated; scope defaults come from the job's environment."""
    budgets = parse_pairs(args.budget, "budget")
    for key, value in budgets.items():
        if not value.isdigit():
            raise MoonmindError(
                "invalid_query", f"Budget {key}={value!r} is not a positive integer.", "Use e.g. --budget tokens=1200 latency_ms=800."
            )
    filters = parse_pairs(args.filters, "filter")  # first: a query written after --filters lands there, and this says so
    if args.repo is not None:
        if filters.get("repo", args.repo) != args.repo:
            raise MoonmindError(
                "invalid_query", f"--repo {args.repo!r} and --filters repo={filters['repo']!r} disagree.",
                "Name the repository once: --repo NAME or --filters repo=NAME.",
            )
        filters["repo"] = args.repo
    return search_request(
        query_text(args), top_k=args.top_k, filters=filters, overlay=args.overlay,
        score_threshold=args.score_threshold, budgets={k: int(v) for k, v in budgets.items()},
        max_lines=getattr(args, "max_lines", None), locations_only=getattr(args, "locations_only", False),
        cursor=getattr(args, "cursor", None),
    )


def query_text(args: argparse.Namespace) -> str:
    """The query, given positionally (`rag search "text"`) or as --query, not both."""
    positional, flag = getattr(args, "query_text", None), args.query
    if positional is not None and flag is not None:
        raise MoonmindError(
            "invalid_argument", "The query was given twice: as an argument and with --query.",
            'Pass it once: moonmind rag search "what you are looking for".',
        )
    if positional is None and flag is None:
        raise MoonmindError(
            "invalid_argument", "No query given.", 'Pass it: moonmind rag search "what you are looking for" (or --query TEXT).',
        )
    return positional if positional is not None else flag


def print_pack(pack: dict[str, Any], args: argparse.Namespace) -> int:
    """Print a finished pack from its JSON-mode dict: the one rendering for every transport and execution mode."""
    import json

    from .main import note, write_atomic

    for msg in pack["notes"]:
        note(msg)
    body = json.dumps(pack, indent=2, ensure_ascii=False) if args.json or args.output_file else ""
    if args.output_file:
        write_atomic(args.output_file, body + "\n")
    if args.json:
        sys.stdout.write(body + "\n")
    elif getattr(args, "view", None) == "short" or (getattr(args, "view", None) is None and sys.stdout.isatty()):
        from .main import _terminal_columns
        from .view import colour_wanted, short_view

        sys.stdout.write(short_view(pack, colour=colour_wanted(sys.stdout), width=_terminal_columns()))
    else:  # piped or redirected (what an agent pastes), or --full
        sys.stdout.write(pack["context_text"])
    sys.stdout.flush()
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    """One search over the transport the flags and settings choose (`transports.search`), printed once."""
    from ..settings import get_settings
    from ..transports import search

    settings = get_settings()
    request = query_request(args)
    execution = execution_mode(args)
    timeout_s = None
    if execution == "queue" or args.timeout is not None:
        timeout_s = queue_timeout(args, (request.get("budgets") or {}).get("latency_ms"))
    pack = search(
        request, settings=settings, transport=getattr(args, "transport", "direct"), execution=execution,
        fallback=args.fallback, timeout_s=timeout_s,
    )
    return print_pack(pack, args)


def too_broad(root: Path) -> str | None:
    """Why indexing `root` needs --force: the root of the file system, the user's home, or a directory holding it.

    Why refuse: such a tree is every project, cache and credential file of the box in one
    repository, hours of indexing that no search wants; it is nearly always a wrong directory.
    """
    import os

    resolved = root.resolve()
    if resolved == Path(resolved.anchor):
        return "the root of the file system"
    home = Path(os.path.expanduser("~")).resolve()
    if resolved == home:
        return "your home directory"
    if resolved in home.parents:
        return f"a directory holding your home directory ({home})"
    return None


def refuse_broad_root(root: Path, force: bool) -> None:
    why = None if force else too_broad(root)
    if why is not None:
        resolved = root.resolve()
        raise MoonmindError(
            "invalid_argument",
            f"Refusing to index {resolved}: it is {why}, whose every project, cache and dotfile would become one repository.",
            f"Pass the root of one repository (e.g. `moonmind rag index ~/src/myproject --repo myproject`), "
            f"or add --force to index {resolved} anyway.",
        )


def index_progress(settings: Any):
    """An index run's progress: kept going from the start (the tree is read, the model loads) until `close()`,
    after the optimize that follows the last file, so it ends right before the summary."""
    from .progress import reporter

    return reporter(interval_s=settings.progress_interval_s, until_closed=True,
                    starting="starting: reading the tree and what the index holds",
                    working="embedding and writing chunks",
                    finishing="finishing: removing deleted files' chunks, building the search index")


def warn_if_nothing_indexed(report: Mapping[str, Any], path: str) -> None:
    """A tree with no indexable file is no error (exit 0: a repository may be empty), but it is said on stderr, with why."""
    if report.get("files_indexed", 0) or report.get("files_unchanged", 0):
        return
    seen = report.get("files_seen", 0)
    if seen:
        reasons = ", ".join(f"{n} {reason}" for reason, n in (report.get("skipped_by_reason") or {}).items())
        what = f"no indexable file in {path}: {seen} files seen, all skipped ({reasons})."
    else:
        what = (f"no file to index in {path}: it is empty, or every file in it is ignored (.gitignore, or directories "
                f"never indexed such as .git/, node_modules/ and build/).")
    dirs = report.get("dirs_skipped", 0)
    if dirs:
        what += f" {dirs} {'directory was' if dirs == 1 else 'directories were'} not read."
    if report.get("files_deleted"):
        what += f" The {report['files_deleted']} files repo={report.get('repo')} held in the index before were removed."
    sys.stderr.write(printable(f"warning: {what} Check the path (the root of a repository); --json lists each skipped "
                               f"file and its reason.\n"))


def print_index_report(report: Mapping[str, Any], args: argparse.Namespace) -> int:
    """One rendering of an index run (IndexReport's JSON dict), for sync and queue alike."""
    import json

    warn_if_nothing_indexed(report, args.path)
    if args.json:
        sys.stdout.write(json.dumps({k: v for k, v in report.items() if k != "line"}, indent=2) + "\n")
    else:
        sys.stdout.write(printable(report["line"]) + "\n")
    return 0


def cmd_index_dry_run(args: argparse.Namespace, settings: Any, tenant: str) -> int:
    """`rag index --dry-run`: in this process (it reads the tree here), no store, no owner, nothing written."""
    import json

    from ..indexing.dry_run import dry_run, summary_lines

    if args.execution == "queue" or args.no_wait:
        raise MoonmindError("invalid_argument", "--dry-run reads the tree in this process; it does not go to a worker.",
                            "Drop --execution queue and --no-wait.")
    root = Path(args.path)
    if not root.is_dir():
        raise MoonmindError("invalid_argument", f"{args.path} is not a directory.", "Pass the root of the repository to index.")
    report = dry_run(root, settings, repo=args.repo, tenant=tenant)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write("".join(printable(line) + "\n" for line in summary_lines(report)))
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from ..settings import get_settings

    settings = get_settings()
    tenant = args.tenant or settings.scope_tenant
    refuse_broad_root(Path(args.path), args.force)
    if getattr(args, "dry_run", False):
        return cmd_index_dry_run(args, settings, tenant)
    if execution_mode(args) == "queue":
        from ..transports.queue_client import INDEX

        # an IndexRequest, validated by the task on the worker
        request = {"path": str(Path(args.path).resolve()), "repo": args.repo, "tenant": tenant}
        wait = not args.no_wait
        # an index takes as long as the tree: wait for it (with the worker's progress) unless --timeout says otherwise
        timeout = queue_timeout(args) if args.timeout is not None else None
        progress = index_progress(settings) if wait else None
        try:
            out = run_queued(INDEX, {"request": request}, queue=settings.index_queue, timeout_s=timeout, wait=wait,
                             progress=progress)
        except BaseException:
            if progress is not None:
                progress.close(final=False)
            raise
        if progress is not None:
            progress.close()  # the progress ends right before the summary
        if not wait:
            return print_task_id(out, args)
        return print_index_report(expect_keys(out, INDEX_REPORT_KEYS, "an IndexReport"), args)
    if args.no_wait:
        raise MoonmindError("invalid_argument", "--no-wait only applies to --execution queue.", "Add --execution queue or drop --no-wait.")

    from .. import operations

    root = Path(args.path)
    if not root.is_dir():
        raise MoonmindError("invalid_argument", f"{args.path} is not a directory.", "Pass the root of the repository to index.")
    progress = index_progress(settings)
    try:
        report = operations.index(settings, {"path": str(root.resolve()), "repo": args.repo, "tenant": tenant},
                                  progress=progress)
    except BaseException:
        progress.close(final=False)
        raise
    progress.close()  # the progress ends right before the summary
    return print_index_report(report, args)
