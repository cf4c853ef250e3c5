"""The owner socket: where it lives and how messages are framed (standard library only).

Framing: one JSON object per line, UTF-8. A client sends one request
``{"v": 1, "op", "args", "scope", "progress"}`` and reads lines until a final one:

* ``{"progress": [done, total]}`` — a long operation's progress (asked with ``progress``);
* ``{"alive": 1}`` — a heartbeat every `HEARTBEAT_S` while an operation runs, so a client
  can bound every wait without bounding how long an index may take;
* ``{"result": …}`` or ``{"error": {"code", "message", "action"}, "details": {…}}`` — final.

Why next to the lock: the socket belongs to whoever holds ``owner.lock`` in the same
directory, so the two can never describe different stores.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    import _socket
    from typing import Any, Callable, TypeVar

    T = TypeVar("T")

VERSION = 1
SOCKET_NAME = "owner.sock"
#: Seconds between heartbeats while an operation runs.
HEARTBEAT_S = 2.0
#: A client gives up when the owner has said nothing (no heartbeat) for this long.
SILENCE_S = 15.0
#: Largest request line the owner reads (a request is a query or a list of paths).
MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: AF_UNIX paths are limited to 108 bytes; longer ones are reached through /proc/self/fd.
_MAX_PATH = 100



def socket_path(data_dir: Path, collection: str) -> Path:
    """The owner socket of `collection` in the embedded store at `data_dir` (beside its owner.lock)."""
    return Path(data_dir) / collection / SOCKET_NAME


def at_short_path(path: Path, fn: Callable[[str], T]) -> T:
    """Call `fn` with an address for `path` that fits AF_UNIX (a long one via its directory's fd)."""
    text = str(path)
    if len(text.encode()) <= _MAX_PATH:
        return fn(text)
    fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        return fn(f"/proc/self/fd/{fd}/{path.name}")
    finally:
        os.close(fd)


def encode(message: dict[str, Any]) -> bytes:
    """One JSON line. A lone surrogate (argv bytes that are not UTF-8) travels as a \\u escape, so the
    owner validates it and answers `invalid_query` exactly as a one-shot command would."""
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), default=str)
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"


class LineReader:
    """Reads JSON lines from a socket; `read` raises EOFError when the peer closed mid-message."""

    def __init__(self, sock: _socket.socket, limit: int = 1 << 62) -> None:
        self._sock = sock
        self._buf = b""
        self._limit = limit

    def read(self, deadline: float | None = None) -> dict[str, Any]:
        """The next message; with `deadline` (a `time.monotonic()` instant), TimeoutError once it passes first.

        Why a deadline and not only a socket timeout: a timeout bounds each recv, so a peer that
        trickles a byte at a time would otherwise never run out of time.
        """
        while b"\n" not in self._buf:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no whole message before the deadline")
                self._sock.settimeout(left)
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise EOFError("the peer closed the connection")
            self._buf += chunk
            if len(self._buf) > self._limit:
                raise ValueError("message too large")
        line, _, self._buf = self._buf.partition(b"\n")
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data
