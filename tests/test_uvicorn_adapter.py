"""The canary for gateway/uvicorn_adapter.py, the one module that uses uvicorn's internals.

It fails, naming what moved, when the installed uvicorn no longer has the private surface the
adapter relies on or no longer behaves as the adapter expects: run it first when raising the
pin. The behaviour is checked on a real uvicorn server on loopback, in a thread of this process.
"""

from __future__ import annotations

import inspect
import re
import socket
import threading
import time
import tomllib
from pathlib import Path

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.supervisors import Multiprocess

from moonmind_worker.gateway import uvicorn_adapter
from moonmind_worker.gateway.http import BAD_REQUEST

from http_servers import raw_exchange

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 0.25


def test_the_installed_uvicorn_is_in_the_range_the_adapter_was_checked_on_and_pyproject_pins_that_range():
    assert uvicorn_adapter.supported(), f"uvicorn {uvicorn.__version__} is outside {uvicorn_adapter.SUPPORTED}"
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if re.match(r"uvicorn\b", d)]
    (low, high) = uvicorn_adapter.SUPPORTED
    assert pin.replace(" ", "") == f"uvicorn>={low[0]}.{low[1]},<{high[0]}.{high[1]}"


def test_uvicorn_still_has_every_private_name_the_adapter_overrides_or_reads():
    for hook in ("connection_made", "connection_lost", "on_message_begin", "on_message_complete", "send_400_response"):
        assert callable(getattr(HttpToolsProtocol, hook, None)), f"HttpToolsProtocol.{hook} is gone"
    assert list(inspect.signature(HttpToolsProtocol.__init__).parameters)[1:4] == ["config", "server_state", "app_state"]
    assert list(inspect.signature(HttpToolsProtocol.send_400_response).parameters) == ["self", "msg"]
    protocol_init = inspect.getsource(HttpToolsProtocol.__init__)
    for attribute in ("self.transport", "self.cycle", "self.loop"):
        assert attribute in protocol_init, f"HttpToolsProtocol no longer sets {attribute}"
    assert "self.response_started" in inspect.getsource(RequestResponseCycle.__init__)
    # the supervisor dispatches a signal to handle_<name> and keeps its workers in .processes
    assert callable(getattr(Multiprocess, "handle_hup", None))
    assert "handle_{" in inspect.getsource(Multiprocess.handle_signals)
    assert "self.processes" in inspect.getsource(Multiprocess.__init__)
    assert list(inspect.signature(Multiprocess.__init__).parameters)[1:3] == ["config", "sockets"]


class _QuickDeadline(uvicorn_adapter.GatewayHttpProtocol):
    read_timeout_s = DEADLINE_S


def until(condition, timeout_s: float = 10.0) -> None:
    """Wait for `condition()` to hold, polling; fail if it has not within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def server():
    """A real uvicorn server with the adapter's protocol; its app records what it received."""
    seen: list[dict] = []

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/read":  # reads the whole body before answering, as the gateway's routes do
            while (message := await receive())["type"] == "http.request" and message.get("more_body"):
                pass
            seen.append(message)
            if message["type"] == "http.disconnect":
                return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app, host="127.0.0.1", port=0, http=_QuickDeadline, lifespan="off", log_level="error",
                            loop="asyncio", timeout_keep_alive=60)
    sock = config.bind_socket()
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    until(lambda: srv.started)
    yield sock.getsockname()[1], seen
    srv.should_exit = True
    thread.join(timeout=10)
    sock.close()


def test_bytes_that_are_not_http_get_the_envelope_through_send_400_response(server):
    port, _ = server
    assert raw_exchange(port, b"GARBAGE\r\n\r\n") == BAD_REQUEST


def test_a_silent_connection_is_counted_then_answered_408_and_closed_at_the_deadline(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        until(lambda: uvicorn_adapter.open_connections() == 1)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in data
    until(lambda: uvicorn_adapter.open_connections() == 0)


def test_a_trickling_body_is_cut_off_and_the_reading_app_sees_the_client_gone(server):
    port, seen = server
    seen.clear()
    data = raw_exchange(port, b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"query\"")
    assert data.startswith(b"HTTP/1.1 408")
    until(lambda: seen == [{"type": "http.disconnect"}])


def test_an_answer_already_started_is_not_cut_into_by_the_deadline(server):
    port, _ = server
    data = raw_exchange(port, b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"query\"")
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\nok") and b"408" not in data


def test_each_request_on_a_kept_alive_connection_gets_its_own_deadline(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for _ in range(2):
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while not got.endswith(b"\r\n\r\nok"):  # the head and the body may come in separate segments
                got += s.recv(65536)
            assert got.startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /half")  # the third never completes: the deadline armed at its first byte closes it
        rest = b""
        while chunk := s.recv(65536):  # closed well before uvicorn's keep-alive timeout would, or recv times out
            rest += chunk
    assert b"200" not in rest


def test_no_other_module_reaches_into_uvicorn():
    outside = [str(path.relative_to(ROOT)) for path in (ROOT / "moonmind_worker").rglob("*.py")
               if path.name != "uvicorn_adapter.py"
               and re.search(r"from uvicorn\.|import uvicorn\.|server_state|self\.cycle\b", path.read_text())]
    assert outside == []
