"""`moonmind mcp`'s own stdin reader, in front of the SDK's: every line gets an answer."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, BinaryIO, Callable

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage

from .errors import MoonmindError

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
    if "id" in request and rid is None:
        # the SDK reads a request whose id is not a string or an integer as a notification, which nobody answers
        return None, _error(None, INVALID_REQUEST, "Invalid Request: the id must be a string or an integer "
                            f"(got {type(request['id']).__name__ if request['id'] is not None else 'null'}).")
    try:
        return types.jsonrpc_message_adapter.validate_json(text, by_name=False), None
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        return None, _error(rid, INVALID_REQUEST, f"Invalid Request: not a JSON-RPC 2.0 message ({str(exc).splitlines()[0]}).")


def _surrogate_tool_error(request_id: Any) -> types.JSONRPCResponse:
    """The tool error a bad argument gets (see `call`), for arguments that are not valid Unicode text."""
    envelope = MoonmindError(
        "invalid_argument", "An argument holds a lone surrogate (half of a UTF-16 pair), which is not valid Unicode text.",
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
