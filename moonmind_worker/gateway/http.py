"""The gateway's HTTP connections: uvicorn's httptools protocol with a read deadline and JSON errors.

Why a protocol of our own:
* uvicorn closes a keep-alive connection idle *after* a response, but a connection that never
  sends a request, or sends its headers or body a byte at a time, is held forever: an
  adversarial run kept ~18,600 such connections open (18,406 fds of a 20,000 limit). Every
  request must now arrive whole within `read_timeout_s` of the connection opening (or of the
  previous response); otherwise the client gets a 408 in the error envelope and the connection
  is closed;
* a request uvicorn cannot parse got a plain-text "Invalid HTTP request received.", the one
  answer outside the `{"error": {code, message, action}}` envelope every other answer uses.
"""

from __future__ import annotations

import json
from asyncio import TimerHandle, Transport

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a per-request read deadline and enveloped parse errors."""

    read_timeout_s: float = READ_TIMEOUT_S

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        self._read_deadline: TimerHandle | None = None
        super().connection_made(transport)
        self._arm_read_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_read_deadline()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._read_deadline is None:  # the next request on a kept-alive connection
            self._arm_read_deadline()

    def on_message_complete(self) -> None:
        self._disarm_read_deadline()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        self._disarm_read_deadline()
        self.transport.write(BAD_REQUEST)
        self.transport.close()

    def _arm_read_deadline(self) -> None:
        self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(request_timeout(self.read_timeout_s))
        if self.cycle is not None:
            self.cycle.disconnected = True  # the app's receive() sees the client gone, not a stalled body
            self.cycle.message_event.set()
        self.transport.close()
