"""The MCP tools `moonmind mcp` offers: names, descriptions and JSON schemas, and their job-scoped form."""

from __future__ import annotations

from typing import Any

import mcp_types as types

from .contracts import FILTER_KEYS, TOP_K_MAX, TOP_K_MIN, ContextPack, SymbolsResult

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
                "cursor": {"type": "string", "description": "the next page of the same search: the previous result's "
                                                            "next_cursor, with the same query and filters"},
                "max_lines": {"type": "integer", "minimum": 1,
                              "description": "cut each hit to the N lines holding the most query terms (its first N when none)"},
                "locations_only": {"type": "boolean",
                                   "description": "citations only (path#lines, score, symbol), no text: the smallest answer"},
                "budget": {
                    "type": "object", "description": "ceilings: tokens (pack size), latency_ms",
                    "properties": {"tokens": {"type": "integer", "minimum": 1}, "latency_ms": {"type": "integer", "minimum": 1}},
                    "additionalProperties": False,
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        # the ContextPack contract: clients may validate the structured result against it
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
    types.Tool(
        name="related",
        description="Code most similar to a location: the chunks like PATH#Lx-Ly (or a chunk id from a search "
                    "result), the location itself left out, as a context pack with path#line citations.",
        input_schema={
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "auth/tokens.py#L10-L40, auth/tokens.py#L12, a chunk "
                                                             "id (auth/tokens.py#3) or a file, as search cites it"},
                "top_k": {"type": "integer", "minimum": TOP_K_MIN, "maximum": TOP_K_MAX,
                          "description": "number of items (default RAG_SIMILARITY_TOP_K=8)"},
                "filters": _FILTERS_SCHEMA,
            },
            "required": ["location"],
            "additionalProperties": False,
        },
        output_schema=ContextPack.model_json_schema(mode="serialization"),
    ),
    types.Tool(
        name="symbols",
        description="Where a name is defined: kind, path, lines and signature of each definition (exact name first, "
                    "then qualified or partial matches), then the places that mention it.",
        input_schema={
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "a function, class, method or type: verify_token, "
                                                         "Router.handle, Router::new"},
                "top_k": {"type": "integer", "minimum": TOP_K_MIN, "maximum": TOP_K_MAX,
                          "description": "number of places (default RAG_SIMILARITY_TOP_K=8)"},
                "filters": _FILTERS_SCHEMA,
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        output_schema=SymbolsResult.model_json_schema(mode="serialization"),
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
