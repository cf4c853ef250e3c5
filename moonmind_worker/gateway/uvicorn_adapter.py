"""Every use of uvicorn beyond its public `Config` and `Server`: one module, pinned to the versions it was checked on.

Why private hooks remain: ASGI sees a request only once its headers have arrived, so a connection
that never sends, or sends its headers a byte at a time, is invisible to middleware; only the
HTTP protocol can put a read deadline on it, count open connections (idle keep-alives included)
and answer bytes that are not HTTP in the error envelope. uvicorn's supervisor restarts every
worker on SIGHUP, where the gateway only re-reads its token file.

What this module relies on, and nothing else of uvicorn's internals, is checked by
tests/test_uvicorn_adapter.py against the installed version: raise `SUPPORTED` (and pyproject's
pin) only after that test passes on the new version.
"""

from __future__ import annotations

import os
import signal
from asyncio import TimerHandle, Transport
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.supervisors import Multiprocess

from .http import BAD_REQUEST, READ_TIMEOUT_S, request_timeout

#: The uvicorn versions this module was checked on, [low, high): the same range as pyproject.toml's pin.
SUPPORTED = ((0, 29), (0, 55))

#: This process's open HTTP connections, kept by the protocol itself (the balancer reads its size).
_open: set[GatewayHttpProtocol] = set()


def version() -> tuple[int, int]:
    major, minor = uvicorn.__version__.split(".")[:2]
    return int(major), int(minor)


def supported() -> bool:
    return SUPPORTED[0] <= version() < SUPPORTED[1]


def open_connections() -> int:
    """How many HTTP connections this process holds now, idle keep-alives included."""
    return len(_open)


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a per-request read deadline, enveloped parse errors and a connection count.

    Every request must arrive whole within `read_timeout_s` of the connection opening (or of the
    first byte of a kept-alive connection's next request); otherwise the client gets a 408 in the
    error envelope and the connection is closed, which uvicorn's own `connection_lost` turns into
    a disconnect for an app still reading the body.
    """

    read_timeout_s: float = READ_TIMEOUT_S

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        self._read_deadline: TimerHandle | None = None
        _open.add(self)
        super().connection_made(transport)
        self._arm_read_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        _open.discard(self)
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
        if self.cycle is None or not self.cycle.response_started:  # an answer already under way must not be cut into
            self.transport.write(request_timeout(self.read_timeout_s))
        self.transport.close()  # uvicorn's connection_lost then tells a reading app that the client is gone


class _TokenReloadingSupervisor(Multiprocess):
    def handle_hup(self) -> None:
        """Each worker re-reads the token file in place, instead of uvicorn's restart of every worker."""
        for process in self.processes:
            if process.pid is not None:
                try:
                    os.kill(process.pid, signal.SIGHUP)
                except ProcessLookupError:
                    pass


def run_workers(config: uvicorn.Config, sockets: list[Any]) -> None:
    """`config.workers` processes of the app on `sockets` until SIGINT/SIGTERM; SIGHUP reloads tokens in each."""
    _TokenReloadingSupervisor(config, sockets=sockets).run()
