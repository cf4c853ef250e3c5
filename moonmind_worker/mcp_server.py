"""`moonmind mcp`: the retrieval loop as Model Context Protocol tools over stdio.

Why: coding agents (Claude Code, Claude Desktop, Cursor, ...) consume code search through
MCP; without a server they must shell out to the CLI and parse its output. Built on the
official `mcp` SDK's low-level server, so the tool results carry exactly what we decide:
the pack's markdown as text, the ContextPack JSON as structured content, and a failure as
a tool error carrying the `{"error": {"code", "message", "action"}}` envelope.

No second pipeline: `search` goes through `transports.search` (the gateway when
MOONMIND_RETRIEVAL_URL is set, else the box's warm owner or this process one-shot), and
`index`, `overlay_upsert` and `stats` through `operations`, as the CLI's commands do.
A one-shot call releases the embedded store right after, so this long-lived
process never keeps the store locked from the user's own commands.

Every request gets an answer: stdin is read by `_read_frames`, in front of the SDK's own reader,
which drops a line it cannot parse unanswered (see "stdin guard" below).

Paths are the client's, not this process's: clients start servers in any directory (Claude Desktop
in `/`), so a relative `path`, `paths` or `root` is taken relative to the client's workspace root,
its MCP roots when it declares them, else MOONMIND_ROOT, and refused otherwise (see "workspace" below).

Imported only by `moonmind mcp` (the SDK is a heavy import no other command should pay).
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from contextvars import ContextVar
from pathlib import Path
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from .entry import version
from .errors import MoonmindError
from .mcp_stdin import _claim_stdin, _NoInput, _read_frames
from .mcp_tools import TOOLS, offered_tools

#: Tool calls run one at a time: the process holds at most one one-shot store open, and releases it.
_CALLS = threading.Lock()

def _bad(message: str, action: str) -> MoonmindError:
    return MoonmindError("invalid_argument", message, action)


def _check_args(name: str, args: Any) -> dict[str, Any]:
    """The arguments as an object with only the tool's known keys (the SDK does not check them)."""
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise _bad(f"The {name} tool's arguments must be an object.", "Pass the arguments as a JSON object.")
    tool = next(t for t in TOOLS if t.name == name)
    known = tool.input_schema["properties"]
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise _bad(f"Unknown argument(s) for {name}: {', '.join(unknown)}.", f"Use only: {', '.join(known)}.")
    # an empty path or list is missing too (an empty `path` would index the server's directory); an empty
    # query is left to the contract, which says "the query must not be empty"
    missing = [k for k in tool.input_schema.get("required", [])
               if args.get(k) is None or (k != "query" and isinstance(args[k], (str, list)) and not args[k])]
    if missing:
        raise _bad(f"Missing argument(s) for {name}: {', '.join(missing)}.", f"Pass {', '.join(missing)}.")
    return args


def _string(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key)
    if value is not None and not isinstance(value, str):
        raise _bad(f"{key} must be a string.", f"Pass {key} as a JSON string.")
    return value


def _object(args: dict[str, Any], key: str) -> dict[str, Any]:
    value = args.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{key} must be an object.", f'Pass {key} as a JSON object, e.g. {{"repo": "myrepo"}}.')
    return value


def _settings():
    from .settings import get_settings

    return get_settings()


def search(args: dict[str, Any], progress: Any = None) -> tuple[list[str], dict[str, Any]]:
    """The context pack for the arguments: (texts, ContextPack JSON) over the CLI's transports."""
    from .contracts import parse_query
    from .entry import search_request
    from .transports import search as run_search

    filters = _object(args, "filters")
    for key, value in filters.items():
        if not isinstance(value, str):
            raise MoonmindError("invalid_query", f"Filter {key} must be a string.", 'Pass filters as strings, e.g. {"repo": "myrepo"}.')
    budgets = _object(args, "budget")
    unknown = sorted(set(budgets) - {"tokens", "latency_ms"})
    if unknown or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in budgets.values()):
        raise MoonmindError("invalid_query", "budget takes positive integers tokens and latency_ms.",
                            'Pass e.g. {"tokens": 1200, "latency_ms": 800}.')
    settings = _settings()
    request = search_request(args["query"], top_k=args.get("top_k"), filters=filters,
                             score_threshold=args.get("score_threshold"), budgets=budgets,
                             max_lines=args.get("max_lines"), locations_only=args.get("locations_only", False),
                             cursor=args.get("cursor"))
    parse_query(request, fields="json")  # checked here too, so a bad argument's remedy names the argument, not a CLI flag
    pack = run_search(request, settings=settings, execution=settings.rag_execution)
    texts = [pack["context_text"]]
    notes = [f"note: {n}" for n in pack["notes"]]
    if pack.get("next_cursor"):  # said in text too: an agent that reads only the text can still page on
        notes.append(f"note: {pack['total_results']} results in all; the next page: the same search with "
                     f"\"cursor\": \"{pack['next_cursor']}\"")
    if notes:
        texts.append("\n".join(notes))
    return texts, pack


# ------------------------------------------------------------- workspace ---
# A relative path means the client's workspace, never this process's directory: a client started
# the server wherever it runs (`/` for Claude Desktop), and `auth/tokens.py` read against `/` is a
# missing file, which an overlay upsert turns into a tombstone hiding the real one.

#: The client's MCP roots for the call being run (set by `call`; empty when the client gave none).
_ROOTS: ContextVar[tuple[Path, ...]] = ContextVar("moonmind_mcp_roots", default=())

#: The key under which a 2026-07-28 client is asked for its roots (in an InputRequiredResult).
ROOTS_REQUEST = "moonmind/roots"
#: Seconds a client of an older protocol has to answer `roots/list` before the call goes on without roots.
ROOTS_TIMEOUT_S = 5.0
#: The tools whose arguments hold paths.
PATH_TOOLS = ("index", "overlay_upsert")


def _workspace(settings: Any) -> tuple[Path, ...]:
    """Where relative paths live: the client's MCP roots, else MOONMIND_ROOT, else nowhere (they are refused)."""
    roots = _ROOTS.get()
    if roots:
        return roots
    root = settings.workspace_root  # absolute (the setting's rule)
    return (root,) if root else ()


def _absolute(path: str, what: str, settings: Any) -> Path:
    """`path` as an absolute path: as given when absolute (`~` expanded), else under the workspace root;
    inside the workspace once its links are followed, when the server knows one (`_confined`).

    Of several MCP roots, the first under which the path exists (else the first).
    """
    p = Path(path).expanduser()
    bases = _workspace(settings)
    if p.is_absolute():
        return _confined(p, path, what, bases)
    if not bases:
        raise _bad(
            f"{what} {path!r} is relative, and this server does not know the client's workspace "
            "(the client sent no MCP roots and MOONMIND_ROOT is not set).",
            "Pass an absolute path, or set MOONMIND_ROOT to the workspace directory in the server's "
            "environment (the `env` of the client's MCP server entry).",
        )
    return _confined(next((b / p for b in bases if (b / p).exists()), bases[0] / p), path, what, bases)


def _confined(p: Path, given: str, what: str, bases: tuple[Path, ...]) -> Path:
    """`p`, when it lies inside one of the workspace's directories once every link on its way is followed.

    Why: the client's roots (or MOONMIND_ROOT) say which files its agent may have read into the index; an
    absolute path (`/etc`) or a link inside a root that leads out of it would index what the user never
    offered. A server that knows no workspace takes absolute paths as given (the user's own configuration).
    """
    if not bases:
        return p
    real = p.resolve()
    if any(real == b.resolve() or b.resolve() in real.parents for b in bases):
        return p
    where = ", ".join(str(b) for b in bases)
    how = " once its links are followed" if real != p.absolute() else ""
    raise _bad(f"{what} {given!r} is outside this client's workspace ({where}){how}.",
               "Pass a path inside the workspace: the client's MCP roots, or MOONMIND_ROOT when it declares none.")


def _resolve(path: str, what: str, settings: Any) -> str:
    return str(_absolute(path, what, settings).resolve())


def _too_wide(root: Path) -> str | None:
    """Why indexing `root` is refused without `force`: `/` and the home directory are not a repository."""
    if root == Path(root.anchor):
        return "the file-system root"
    try:
        home = Path.home().resolve()
    except (RuntimeError, KeyError, OSError):  # no HOME and no passwd entry
        return None
    return "the home directory" if root == home else None


def index(args: dict[str, Any], progress: Any = None) -> tuple[list[str], dict[str, Any]]:
    """Index a tree on this box (the owner when one is alive, else this process): the IndexReport.

    `progress(done, total, chunks)` reaches the client as MCP progress notifications when it asked for them.
    """
    from . import operations

    settings = _settings()
    path, repo = _string(args, "path"), _string(args, "repo")
    if not path:
        raise _bad("path is required.", "Pass path: the root of the repository to index (an absolute path is safest).")
    force = args.get("force", False)
    if not isinstance(force, bool):
        raise _bad("force must be true or false.", 'Pass e.g. {"force": true}.')
    root = Path(_resolve(path, "path", settings))
    if not root.is_dir():
        raise _bad(f"{path} is not a directory.", "Pass the root of the repository to index (an absolute path is safest).")
    wide = None if force else _too_wide(root)
    if wide:
        raise _bad(f"Refusing to index {root}: it is {wide}, not a repository.",
                   "Pass the root of one repository (absolute, or relative to the workspace root), "
                   "or force: true to index it all the same.")
    report = operations.index(settings, {"path": str(root), "repo": repo, "tenant": _string(args, "tenant") or settings.scope_tenant},
                              progress=progress)
    return [report["line"]], {k: v for k, v in report.items() if k != "line"}


def _known_paths(settings: Any, repo: str, tenant: str, run_id: str) -> set[str]:
    """The paths a tombstone can hide: the repository's indexed files (in `tenant`) and this run's overlaid ones."""
    from . import operations

    known: set[str] = set()
    try:
        if operations.chunk_count(settings, repo=repo, tenant=tenant):
            stats = operations.stats(settings, repo=repo, tenant=tenant)["stats"]
            known.update(f["path"] for f in stats["files"])
        known.update(row["path"] for row in operations.overlay_list(settings, run_id=run_id)
                     if row.get("repo") == repo and row.get("tenant") == tenant and not row.get("expired"))
    except MoonmindError as err:
        if err.code != "collection_missing":  # nothing indexed yet: nothing to hide
            raise
    return known


def _check_missing(paths: list[str], root: Path, settings: Any, repo: str, tenant: str, run_id: str) -> None:
    """A path that is not on disk must be a file the index (or this run's overlay) holds: else it is an error.

    Why: the overlay turns a missing file into a tombstone hiding its indexed copy. A path that names
    nothing indexed (a typo, a path read against the wrong directory) hides nothing, and says so here.
    """
    from .indexing.overlay import resolve_workspace_paths
    from .text.files import WalkRules, excluded_reason, name_problem

    missing = [rel for rel, p in resolve_workspace_paths(paths, root)
               if not p.exists() and name_problem(rel) is None
               and excluded_reason(root, rel, rules=WalkRules.of(settings)) is None]
    if not missing:
        return
    known = _known_paths(settings, repo, tenant, run_id)
    unknown = [rel for rel in missing if rel not in known]
    if unknown:
        listed = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise _bad(
            f"Not in {root} and not indexed in repository {repo!r} (tenant {tenant!r}): {listed}. "
            "There is nothing for a tombstone to hide.",
            f"Pass files you edited or deleted in the workspace: absolute, or relative to {root}.",
        )


def overlay_upsert(args: dict[str, Any], progress: Any = None) -> tuple[list[str], dict[str, Any]]:
    """Upsert edited files into this run's overlay: the OverlayReport."""
    from . import operations
    from .entry import default_root

    settings = _settings()
    paths = args["paths"]
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise _bad("paths must be a list of file paths.", 'Pass e.g. {"paths": ["src/app.py"]}.')
    root_arg = _string(args, "root")
    root = Path(_resolve(root_arg, "root", settings)) if root_arg else None
    if root is not None and not root.is_dir():
        raise _bad(f"Workspace root {root_arg} is not a directory.", "Pass root as the workspace directory.")
    # relative paths: under the root when one is given, else under the client's workspace
    files = [str(root / p) if root is not None and not os.path.isabs(os.path.expanduser(p))
             else str(_absolute(p, "path", settings)) for p in paths]
    if root is None:  # the git work tree around the workspace root holding the first file (as the CLI's cwd)
        first = Path(files[0])
        bases = [b for b in _workspace(settings) if b == first or b in first.parents]
        root = default_root(bases[0] if bases else first.parent)
    run_id, repo = _string(args, "run_id") or settings.run_id, _string(args, "repo") or settings.repo
    for name, value, env in (("run_id", run_id, "MOONMIND_RUN_ID"), ("repo", repo, "MOONMIND_REPO")):
        if not (value or "").strip():  # named as arguments here: the overlay's own message names CLI flags
            raise _bad(f"No {name} given.", f"Pass {name}, or set {env} in the server's environment.")
    tenant = _string(args, "tenant") or settings.scope_tenant
    _check_missing(files, root, settings, cast(str, repo), tenant, cast(str, run_id))
    report = operations.overlay_upsert(settings, {
        "paths": [str(Path(f).resolve()) for f in files], "root": str(root), "ttl": _string(args, "ttl") or "24h",
        "run_id": run_id, "repo": repo, "tenant": tenant,
    })
    lines = [report["line"]]
    lines += [f"skipped {s['path']}: {s['reason']}" for s in report.get("skipped", [])]
    lines += [f"tombstoned {rel}: its indexed chunks are hidden for run {report['run_id']}" for rel in report.get("tombstones", [])]
    return ["\n".join(lines)], {k: v for k, v in report.items() if k != "line"}


def stats(args: dict[str, Any], progress: Any = None) -> tuple[list[str], dict[str, Any]]:
    """What the index holds for a repository (`moonmind rag stats`)."""
    from . import operations

    settings = _settings()
    repo = _string(args, "repo") or settings.repo
    if not repo:
        raise _bad("No repository given.", 'Pass {"repo": "myrepo"} or set MOONMIND_REPO in the server\'s environment.')
    out = operations.stats(settings, repo=repo, tenant=_string(args, "tenant") or settings.tenant)
    return [out["text"]], out["stats"]


def _navigate(op: str, text: Any, args: dict[str, Any]) -> dict[str, Any]:
    """`related` / `symbols` over the CLI's transports, scoped as a search is (`search_request`)."""
    from .contracts import parse_query
    from .entry import search_request
    from .transports import navigate

    filters = _object(args, "filters")
    if any(not isinstance(v, str) for v in filters.values()):
        raise MoonmindError("invalid_query", "Filters must be strings.", 'Pass filters as strings, e.g. {"repo": "myrepo"}.')
    request = search_request(text, top_k=args.get("top_k"), filters=filters)
    parse_query(request, fields="json")  # a bad argument's remedy names the argument, not a CLI flag
    return navigate(op, request, settings=_settings())


def related(args: dict[str, Any], progress: Any = None) -> tuple[list[str], dict[str, Any]]:
    """The chunks most similar to a location: the pack's markdown, the ContextPack."""
    pack = _navigate("related", _string(args, "location"), args)
    return [pack["context_text"], "\n".join(f"note: {n}" for n in pack["notes"])], pack


def symbols(args: dict[str, Any], progress: Any = None) -> tuple[list[str], dict[str, Any]]:
    """Where a name is defined, then mentioned: one line per place, and the SymbolsResult."""
    from .entry import symbol_line

    result = _navigate("symbols", _string(args, "name"), args)
    texts = ["\n".join(symbol_line(s) for s in result["symbols"])]
    if result.get("notes"):
        texts.append("\n".join(f"note: {n}" for n in result["notes"]))
    return texts, result


HANDLERS = {"search": search, "index": index, "overlay_upsert": overlay_upsert, "stats": stats,
            "related": related, "symbols": symbols}


def call(name: str, arguments: Any, progress: Any = None, roots: tuple[Path, ...] = ()) -> types.CallToolResult:
    """Run one tool call to a result; every failure becomes a tool error with the envelope (never a crash).

    `roots`: the client's MCP roots (its workspace), against which relative paths are read.
    """
    from .settings import get_settings

    try:
        handler = HANDLERS.get(name)
        if handler is None:
            raise _bad(f"Unknown tool {name!r}.", f"Use one of: {', '.join(HANDLERS)}.")
        with _CALLS:
            token = _ROOTS.set(tuple(roots))
            try:
                texts, structured = handler(_check_args(name, arguments), progress)
            finally:
                _ROOTS.reset(token)
                _release()
        return types.CallToolResult(content=[types.TextContent(type="text", text=t) for t in texts],
                                    structured_content=structured)
    except MoonmindError as err:
        failure = err
    except Exception as exc:  # noqa: BLE001 - a tool call never takes the server down
        if os.environ.get("MOONMIND_DEBUG"):
            import traceback

            traceback.print_exc()
        failure = MoonmindError("internal_error", f"Unexpected {type(exc).__name__}.",
                                "Re-run the server with MOONMIND_DEBUG=1 for the traceback (on its stderr) and report it.")
    try:
        secrets = get_settings().secrets()
    except Exception:  # noqa: BLE001 - settings themselves may be what is broken
        secrets = []
    envelope = failure.envelope(secrets)
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(envelope))],
                                structured_content=envelope, is_error=True)


def _release() -> None:
    """Close the stores a one-shot call opened: the embedded store's lock goes back to the user's commands.
    The embedder stays loaded: the next call would otherwise load the model again."""
    import sys

    runtime = sys.modules.get("moonmind_worker.runtime")
    if runtime is not None:
        runtime.close_all(keep_embedders=True)


#: Seconds between two progress notifications (the last one always goes).
PROGRESS_EVERY_S = 0.5


def _progress_to(ctx: Any) -> Any:
    """A `(done, total, chunks)` callback, run in the tool's worker thread, that sends MCP progress notifications.

    A no-op on the wire when the client sent no progress token (the SDK checks).
    """
    import time

    last = [0.0]

    def report(done: int, total: int, chunks: int | None = None) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = now
        message = f"{done}/{total} files" + ("" if chunks is None else f", {chunks} chunks")
        try:
            anyio.from_thread.run(ctx.session.report_progress, float(done), float(total), message)
        except Exception:  # noqa: BLE001 - progress never fails the work
            pass

    return report


def _root_dirs(result: Any) -> tuple[Path, ...]:
    """The local directories among a `roots/list` answer's `file://` URIs."""
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    out = []
    for root in getattr(result, "roots", None) or []:
        uri = urlparse(str(root.uri))
        if uri.scheme != "file" or uri.netloc not in ("", "localhost"):
            continue
        path = Path(url2pathname(uri.path))  # percent-decoded
        if path.is_absolute() and path.is_dir():
            out.append(path)
    return tuple(out)


async def _client_roots(ctx: Any, params: Any) -> tuple[Path, ...] | types.InputRequiredResult:
    """The client's MCP roots, when it declares the capability: () when it has none (or does not answer).

    Protocol 2026-07-28 has no server-to-client request mid-call: the call answers an InputRequiredResult
    asking for them, and the client calls again with its answer. Older protocols ask with `roots/list`.
    """
    session = getattr(ctx, "session", None)
    capabilities = getattr(session, "client_capabilities", None)
    if session is None or capabilities is None or capabilities.roots is None:
        return ()
    try:
        if session.can_send_request:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # roots are deprecated as of 2026-07-28, still what clients send
                with anyio.fail_after(ROOTS_TIMEOUT_S):
                    return _root_dirs(await session.list_roots())
        answers = params.input_responses
        if answers is None and params.request_state is None:  # asked once; a retry without the answer goes on
            return types.InputRequiredResult(input_requests={ROOTS_REQUEST: types.ListRootsRequest()},
                                             request_state=ROOTS_REQUEST)
        return _root_dirs((answers or {}).get(ROOTS_REQUEST))
    except Exception:  # noqa: BLE001 - a client that cannot say has no roots: MOONMIND_ROOT, else absolute paths
        return ()


def build_server() -> Server:
    """The MCP server: the TOOLS, handlers run in a worker thread (the pipeline is blocking)."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        try:
            settings = _settings()
        except MoonmindError:  # every call reports the broken settings; the listing itself never fails
            return types.ListToolsResult(tools=TOOLS)
        return types.ListToolsResult(tools=offered_tools(settings))

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult | types.InputRequiredResult:
        roots: tuple[Path, ...] = ()
        if params.name in PATH_TOOLS:
            asked = await _client_roots(ctx, params)
            if isinstance(asked, types.InputRequiredResult):
                return asked
            roots = asked
        return await anyio.to_thread.run_sync(call, params.name, params.arguments, _progress_to(ctx), roots)

    return Server(
        "moonmind", version=version(),
        instructions="Deterministic code retrieval over indexed repositories: call `search` with what you are "
                     "looking for and paste the returned context (it cites path#lines); `symbols` finds where a name is "
                     "defined, `related` the code like a path#lines.",
        on_list_tools=list_tools, on_call_tool=call_tool,
    )


async def _serve() -> None:
    import sys

    server = build_server()
    # stdout is the protocol; one line on stderr (which clients keep in their MCP logs) says what serves
    sys.stderr.write(f"moonmind mcp {version()}: serving {', '.join(HANDLERS)} on stdio\n")
    sys.stderr.flush()
    stdin, restore_stdin = _claim_stdin()
    try:
        # the SDK writes stdout (fd 1 diverted meanwhile); `_read_frames` reads stdin in its place
        async with stdio_server(stdin=cast(Any, _NoInput())) as (unused, write_stream):
            await unused.aclose()
            messages, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_read_frames, stdin, messages, write_stream)
                await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        restore_stdin()


def serve() -> None:
    """Serve MCP on stdin/stdout until the client closes stdin."""
    anyio.run(_serve)
