"""`moonmind mcp`: the retrieval loop as Model Context Protocol tools over stdio.

Why: coding agents (Claude Code, Claude Desktop, Cursor, ...) consume code search through
MCP; without a server they must shell out to the CLI and parse its output. Built on the
official `mcp` SDK's low-level server, so the tool results carry exactly what we decide:
the pack's markdown as text, the ContextPack JSON as structured content, and a failure as
a tool error carrying the `{"error": {"code", "message", "action"}}` envelope.

No second pipeline: `search` goes through `transports.search` (the gateway when
MOONMIND_RETRIEVAL_URL is set, else the box's warm owner or this process one-shot), and
`index`, `overlay_upsert` and `stats` through `owner.client.execute`, as the CLI's
commands do. A one-shot call releases the embedded store right after, so this long-lived
process never keeps the store locked from the user's own commands.

Every request gets an answer: stdin is read by `_read_frames`, in front of the SDK's own reader,
which drops a line it cannot parse unanswered (see "stdin guard" below).

Paths are the client's, not this process's: clients start servers in any directory (Claude Desktop
in `/`), so a relative `path`, `paths` or `root` is taken relative to the client's workspace root,
its MCP roots when it declares them, else MOONMIND_ROOT, and refused otherwise (see "workspace" below).

Imported only by `moonmind mcp` (the SDK costs ~0.5 s of imports no other command pays).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import warnings
from contextvars import ContextVar
from pathlib import Path
from typing import Any, BinaryIO, Callable, cast

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from .cli.main import version
from .contracts import FILTER_KEYS, TOP_K_MAX, TOP_K_MIN, ContextPack
from .errors import MoonmindError

#: Tool calls run one at a time: the process holds at most one one-shot store open, and releases it.
_CALLS = threading.Lock()

_FILTERS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Payload filters, the same keys as `moonmind rag search --filters`. Unset keys default to "
                   "MOONMIND_REPO / MOONMIND_TENANT / MOONMIND_RUN_ID when set.",
    "properties": {key: {"type": "string"} for key in FILTER_KEYS},
    "additionalProperties": False,
}

TOOLS: list[types.Tool] = [
    types.Tool(
        name="search",
        description="Retrieve a ready-to-paste context pack (code chunks with path#line citations) for a natural-"
                    "language or identifier query from the indexed repositories. Deterministic: embed, vector + "
                    "lexical search, no generative model.",
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what to look for"},
                "top_k": {"type": "integer", "minimum": TOP_K_MIN, "maximum": TOP_K_MAX,
                          "description": "number of items (default RAG_SIMILARITY_TOP_K=8)"},
                "filters": _FILTERS_SCHEMA,
                "score_threshold": {"type": "number", "minimum": 0, "maximum": 1, "description": "minimum score"},
                "budget": {
                    "type": "object", "description": "ceilings: tokens (pack size), latency_ms",
                    "properties": {"tokens": {"type": "integer", "minimum": 1}, "latency_ms": {"type": "integer", "minimum": 1}},
                    "additionalProperties": False,
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        # the ContextPack contract (spec 04): clients may validate the structured result against it
        output_schema=ContextPack.model_json_schema(mode="serialization"),
    ),
    types.Tool(
        name="index",
        description="Index (incrementally) a repository tree on this machine so `search` can find it.",
        input_schema={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "root of the tree (absolute, or relative to the workspace "
                                                         "root: the client's MCP roots, else MOONMIND_ROOT)"},
                "repo": {"type": "string", "description": "repository name stored with every chunk"},
                "tenant": {"type": "string", "description": "tenant (default MOONMIND_TENANT or 'default')"},
                "force": {"type": "boolean", "description": "index even `/` or the home directory (refused otherwise)"},
            },
            "required": ["path", "repo"],
            "additionalProperties": False,
        },
    ),
    types.Tool(
        name="overlay_upsert",
        description="Make this run's edited (or deleted) files searchable before they are committed: they shadow "
                    "the indexed copies for searches filtered on the run id.",
        input_schema={
            "type": "object",
            "properties": {
                "paths": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                          "description": "edited or deleted files (absolute, or relative to root when given, else to "
                                         "the workspace root: the client's MCP roots, else MOONMIND_ROOT); a missing "
                                         "file must be one the index holds (it is hidden for the run)"},
                "run_id": {"type": "string", "description": "run id (default MOONMIND_RUN_ID)"},
                "repo": {"type": "string", "description": "repository (default MOONMIND_REPO)"},
                "tenant": {"type": "string", "description": "tenant (default MOONMIND_TENANT or 'default')"},
                "root": {"type": "string", "description": "workspace root the stored paths are relative to (default: "
                                                         "the enclosing git work tree of the workspace root)"},
                "ttl": {"type": "string", "description": "lifetime, e.g. 30m, 2h (default 24h)"},
            },
            "required": ["paths"],
            "additionalProperties": False,
        },
    ),
    types.Tool(
        name="stats",
        description="What the index holds for a repository: files, chunks, languages.",
        input_schema={
            "type": "object",
            "properties": {
                "repo": {"type": "string", "description": "repository (default MOONMIND_REPO)"},
                "tenant": {"type": "string", "description": "tenant (default: any)"},
            },
            "additionalProperties": False,
        },
    ),
]


def offered_tools(settings: Any) -> list[types.Tool]:
    """The tools as offered to the agent: inside a job, without the arguments its scope fixes (`job_scope`).

    Why: an argument the agent may not use is an invitation (retrieved text can ask for it). One sent
    anyway is still accepted by `_check_args` and refused `forbidden` where the operation runs.
    """
    import copy

    from .job_scope import bounds

    fixed = bounds(settings)
    if not fixed:
        return TOOLS
    out = []
    for tool in TOOLS:
        schema = copy.deepcopy(tool.input_schema)
        for props in (schema["properties"], schema["properties"].get("filters", {}).get("properties", {})):
            for key in fixed:
                props.pop(key, None)
        out.append(tool.model_copy(update={"input_schema": schema}))
    return out


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
    from .cli.rag import search_request
    from .contracts import parse_query
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
                             score_threshold=args.get("score_threshold"), budgets=budgets)
    parse_query(request, fields="json")  # checked here too, so a bad argument's remedy names the argument, not a CLI flag
    pack = run_search(request, settings=settings, execution=settings.rag_execution)
    texts = [pack["context_text"]]
    if pack.get("notes"):
        texts.append("\n".join(f"note: {n}" for n in pack["notes"]))
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
    """`path` as an absolute path: as given when absolute (`~` expanded), else under the workspace root.

    Of several MCP roots, the first under which the path exists (else the first).
    """
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    bases = _workspace(settings)
    if not bases:
        raise _bad(
            f"{what} {path!r} is relative, and this server does not know the client's workspace "
            "(the client sent no MCP roots and MOONMIND_ROOT is not set).",
            "Pass an absolute path, or set MOONMIND_ROOT to the workspace directory in the server's "
            "environment (the `env` of the client's MCP server entry).",
        )
    return next((b / p for b in bases if (b / p).exists()), bases[0] / p)


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
    from .owner.client import execute

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
    request = {"path": str(root), "repo": repo, "tenant": _string(args, "tenant") or settings.scope_tenant}
    if force:
        request["force"] = True
    report = execute(settings, "index", request, progress=progress)
    return [report["line"]], {k: v for k, v in report.items() if k != "line"}


def _known_paths(settings: Any, repo: str, tenant: str, run_id: str) -> set[str]:
    """The paths a tombstone can hide: the repository's indexed files (in `tenant`) and this run's overlaid ones."""
    from .owner.client import execute

    known: set[str] = set()
    try:
        if execute(settings, "chunks", {"repo": repo, "tenant": tenant})["chunks"]:
            stats = execute(settings, "stats", {"repo": repo, "tenant": tenant, "root": None})["stats"]
            known.update(f["path"] for f in stats["files"])
        known.update(row["path"] for row in execute(settings, "overlay_list", {"run_id": run_id})
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
    from .text.files import excluded_reason, name_problem

    missing = [rel for rel, p in resolve_workspace_paths(paths, root)
               if not p.exists() and name_problem(rel) is None and excluded_reason(root, rel) is None]
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
    from .cli.overlay import default_root
    from .owner.client import execute

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
    request = {
        "paths": [str(Path(f).resolve()) for f in files], "root": str(root), "ttl": _string(args, "ttl") or "24h",
        "run_id": run_id, "repo": repo, "tenant": tenant,
    }
    report = execute(settings, "overlay_upsert", request)
    lines = [report["line"]]
    lines += [f"skipped {s['path']}: {s['reason']}" for s in report.get("skipped", [])]
    lines += [f"tombstoned {rel}: its indexed chunks are hidden for run {report['run_id']}" for rel in report.get("tombstones", [])]
    return ["\n".join(lines)], {k: v for k, v in report.items() if k != "line"}


def stats(args: dict[str, Any], progress: Any = None) -> tuple[list[str], dict[str, Any]]:
    """What the index holds for a repository (`moonmind rag stats`)."""
    from .owner.client import execute

    settings = _settings()
    repo = _string(args, "repo") or settings.repo
    if not repo:
        raise _bad("No repository given.", 'Pass {"repo": "myrepo"} or set MOONMIND_REPO in the server\'s environment.')
    out = execute(settings, "stats", {"repo": repo, "tenant": _string(args, "tenant") or settings.tenant, "root": None})
    return [out["text"]], out["stats"]


HANDLERS = {"search": search, "index": index, "overlay_upsert": overlay_upsert, "stats": stats}


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
    """The MCP server: four tools, handlers run in a worker thread (the pipeline is blocking)."""

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
                     "looking for and paste the returned context (it cites path#lines).",
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


# ------------------------------------------------------------ stdin guard ---
# Why our own reader in front of the SDK's: the SDK's stdio reader hands a line it cannot parse
# (not JSON, or a lone surrogate such as "\ud800", which its JSON parser rejects) to the server
# as an exception, which the server drops: the client never gets an answer and waits for good.
# Here every line that is not a message the SDK accepts is answered on the spot.

#: JSON-RPC's "Invalid Request": valid JSON that is not a JSON-RPC message.
INVALID_REQUEST = -32600


def _lone_surrogate(value: Any) -> bool:
    """True when a string anywhere in `value` (keys too) holds half of a surrogate pair."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= ch <= "\udfff" for ch in item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _error(request_id: Any, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message))


def frame(line: bytes) -> tuple[Any, Any]:
    """(message for the server, answer for the client) for one line of stdin; either or both may be None.

    Not JSON: a parse error (id null). Valid JSON with a lone surrogate: a `tools/call` gets a tool
    error (the envelope, like any bad argument), another request an invalid-params error, with its
    id; a notification gets nothing (JSON-RPC answers none). Valid JSON that is not a message:
    an invalid-request error. Everything else goes to the SDK as its own reader would send it.
    """
    text = line.decode("utf-8", errors="replace")  # invalid UTF-8 becomes U+FFFD, as in the SDK's reader
    if not text.strip():
        return None, None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        detail = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else "nested too deep"
        return None, _error(None, types.PARSE_ERROR, f"Parse error: the line is not valid JSON ({detail}).")
    request = obj if isinstance(obj, dict) else {}
    rid = request.get("id")
    if isinstance(rid, bool) or not isinstance(rid, (int, str)) or _lone_surrogate(rid):
        rid = None
    if "\\u" in text.lower() and _lone_surrogate(obj):  # only a \u escape can make a lone surrogate
        if "method" in request and "id" not in request:
            return None, None
        if request.get("method") == "tools/call" and rid is not None:
            return None, _surrogate_tool_error(rid)
        params = rid is not None and "method" in request
        return None, _error(rid, types.INVALID_PARAMS if params else INVALID_REQUEST,
                            f"Invalid {'params' if params else 'Request'}: a string holds a lone surrogate "
                            "(half of a UTF-16 pair), which is not valid Unicode text.")
    try:
        return types.jsonrpc_message_adapter.validate_json(text, by_name=False), None
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        return None, _error(rid, INVALID_REQUEST, f"Invalid Request: not a JSON-RPC 2.0 message ({str(exc).splitlines()[0]}).")


def _surrogate_tool_error(request_id: Any) -> types.JSONRPCResponse:
    """The tool error a bad argument gets (see `call`), for arguments that are not valid Unicode text."""
    envelope = _bad("An argument holds a lone surrogate (half of a UTF-16 pair), which is not valid Unicode text.",
                    "Pass arguments as valid Unicode strings (escape pairs whole, e.g. \\ud83d\\ude00).").envelope()
    result = types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(envelope))],
                                  structured_content=envelope, is_error=True)
    return types.JSONRPCResponse(jsonrpc="2.0", id=request_id,
                                 result=result.model_dump(by_alias=True, mode="json", exclude_none=True))


def _claim_stdin() -> tuple[BinaryIO, Callable[[], None]]:
    """A private duplicate of fd 0 to read frames from, with fd 0 pointed at the null device (as the SDK does),
    so a tool's child process reads EOF, never a frame; and the call that puts fd 0 back."""
    import fcntl
    import sys

    try:
        private = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        return sys.stdin.buffer, lambda: None
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except OSError:
        pass  # fd 0 still carries the wire: read it through the duplicate all the same

    def restore() -> None:
        with contextlib.suppress(OSError):
            os.dup2(private, 0)

    # closefd=False: the reading thread may still block on it when the server stops
    return os.fdopen(private, "rb", closefd=False), restore


class _NoInput:
    """The SDK's own stdin reader gets nothing: `_read_frames` feeds the server instead."""

    def __aiter__(self) -> _NoInput:
        return self

    async def __anext__(self) -> str:
        raise StopAsyncIteration


async def _read_frames(stdin: BinaryIO, messages: Any, replies: Any) -> None:
    """Feed the server what the SDK accepts from stdin, answer the rest (`frame`), close at EOF."""
    import sys

    async with messages:
        async for line in anyio.wrap_file(stdin):
            message, answer = frame(line)
            if message is not None:
                await messages.send(SessionMessage(message))
            elif answer is not None:
                try:
                    await replies.send(SessionMessage(answer))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return  # the server has stopped
            elif line.strip():
                sys.stderr.write("moonmind mcp: dropped a notification holding a lone surrogate\n")
