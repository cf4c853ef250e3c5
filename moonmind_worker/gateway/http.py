"""The answers the gateway's HTTP protocol writes itself (uvicorn_adapter.py), in the error envelope.

Why: uvicorn holds a connection that never sends a request, or trickles its headers or body,
forever, and answers bytes it cannot parse in plain text, the one answer outside the
`{"error": {code, message, action}}` envelope every other answer uses.
"""

from __future__ import annotations

import json

#: Default for `MOONMIND_GATEWAY_READ_TIMEOUT_S`; `serve`/`worker_app` set the configured value.
READ_TIMEOUT_S = 10.0


def _envelope_response(status: int, reason: str, code: str, message: str, action: str) -> bytes:
    body = json.dumps({"error": {"code": code, "message": message, "action": action}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


BAD_REQUEST = _envelope_response(
    400, "Bad Request", "invalid_query", "The request is not valid HTTP/1.1.",
    "Send POST /retrieval/context with a JSON body (see /docs).",
)


def request_timeout(seconds: float) -> bytes:
    return _envelope_response(
        408, "Request Timeout", "request_timeout",
        f"The request did not arrive whole within {seconds:g}s of the connection opening or of the previous response.",
        "Send the whole request at once; reconnect for the next one if you pause longer than that.",
    )
