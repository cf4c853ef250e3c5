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

Imported only by `moonmind mcp` (the SDK costs ~0.5 s of imports no other command pays).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

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
                "path": {"type": "string", "description": "root of the tree (absolute, or relative to the server's directory)"},
                "repo": {"type": "string", "description": "repository name stored with every chunk"},
                "tenant": {"type": "string", "description": "tenant (default MOONMIND_TENANT or 'default')"},
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
                          "description": "edited files (absolute, or relative to root)"},
                "run_id": {"type": "string", "description": "run id (default MOONMIND_RUN_ID)"},
                "repo": {"type": "string", "description": "repository (default MOONMIND_REPO)"},
                "tenant": {"type": "string", "description": "tenant (default MOONMIND_TENANT or 'default')"},
                "root": {"type": "string", "description": "workspace root (default: the enclosing git work tree)"},
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


def _resolve(path: str, base: Path) -> str:
    p = Path(path).expanduser()
    return str((p if p.is_absolute() else base / p).resolve())


def index(args: dict[str, Any], progress: Any = None) -> tuple[list[str], dict[str, Any]]:
    """Index a tree on this box (the owner when one is alive, else this process): the IndexReport.

    `progress(done, total, chunks)` reaches the client as MCP progress notifications when it asked for them.
    """
    from .owner.client import execute

    settings = _settings()
    path, repo = _string(args, "path"), _string(args, "repo")
    if not path:
        raise _bad("path is required.", "Pass path: the root of the repository to index (an absolute path is safest).")
    root = Path(_resolve(path, Path.cwd()))
    if not root.is_dir():
        raise _bad(f"{path} is not a directory.", "Pass the root of the repository to index (an absolute path is safest).")
    request = {"path": str(root), "repo": repo, "tenant": _string(args, "tenant") or settings.scope_tenant}
    report = execute(settings, "index", request, progress=progress)
    return [report["line"]], {k: v for k, v in report.items() if k != "line"}


def overlay_upsert(args: dict[str, Any], progress: Any = None) -> tuple[list[str], dict[str, Any]]:
    """Upsert edited files into this run's overlay: the OverlayReport."""
    from .cli.overlay import default_root
    from .owner.client import execute

    settings = _settings()
    paths = args["paths"]
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise _bad("paths must be a list of file paths.", 'Pass e.g. {"paths": ["src/app.py"]}.')
    root_arg = _string(args, "root")
    root = Path(_resolve(root_arg, Path.cwd())) if root_arg else default_root()
    if not root.is_dir():
        raise _bad(f"Workspace root {root_arg} is not a directory.", "Pass root as the workspace directory.")
    run_id, repo = _string(args, "run_id") or settings.run_id, _string(args, "repo") or settings.repo
    for name, value, env in (("run_id", run_id, "MOONMIND_RUN_ID"), ("repo", repo, "MOONMIND_REPO")):
        if not (value or "").strip():  # named as arguments here: the overlay's own message names CLI flags
            raise _bad(f"No {name} given.", f"Pass {name}, or set {env} in the server's environment.")
    request = {
        "paths": [_resolve(p, root) for p in paths], "root": str(root), "ttl": _string(args, "ttl") or "24h",
        "run_id": run_id, "repo": repo, "tenant": _string(args, "tenant") or settings.scope_tenant,
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


def call(name: str, arguments: Any, progress: Any = None) -> types.CallToolResult:
    """Run one tool call to a result; every failure becomes a tool error with the envelope (never a crash)."""
    from .settings import get_settings

    try:
        handler = HANDLERS.get(name)
        if handler is None:
            raise _bad(f"Unknown tool {name!r}.", f"Use one of: {', '.join(HANDLERS)}.")
        with _CALLS:
            try:
                texts, structured = handler(_check_args(name, arguments), progress)
            finally:
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


def build_server() -> Server:
    """The MCP server: four tools, handlers run in a worker thread (the pipeline is blocking)."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await anyio.to_thread.run_sync(call, params.name, params.arguments, _progress_to(ctx))

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
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def serve() -> None:
    """Serve MCP on stdin/stdout until the client closes stdin."""
    anyio.run(_serve)
