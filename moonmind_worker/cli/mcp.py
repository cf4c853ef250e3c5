"""`moonmind mcp`: serve the retrieval tools to an agent over the Model Context Protocol (stdio)."""

from __future__ import annotations

import argparse


def register(groups: dict) -> None:
    p = groups["root"].add_parser(
        "mcp", help="serve search/index/overlay_upsert/stats as MCP tools over stdio (for coding agents)",
        description="Speak the Model Context Protocol on stdin/stdout: an agent client (Claude Code, Claude "
                    "Desktop, Cursor, ...) starts this command and calls its tools. Logs and notes go to stderr.",
    )
    p.set_defaults(_handler=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    # the SDK is imported here only: no other command pays for it
    from ..mcp_server import serve

    serve()
    return 0
