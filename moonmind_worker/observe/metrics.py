"""StatsD metrics: fire-and-forget UDP, so observability can never slow or break retrieval.

Configured by STATSD_HOST / STATSD_PORT / STATSD_PREFIX; with no host every call
is a no-op. The host is resolved once per process (in a daemon thread, waited on
for at most RESOLVE_WAIT_S), never per send, and the socket is non-blocking, so
an unreachable or unresolvable host costs nothing measurable. Sends swallow
every error. Metric names are fixed and low-cardinality (docs/operations.md "Metrics"):
identifiers such as job or run ids belong in queue events, never in a name.
"""

from __future__ import annotations

import re
import threading
from typing import Any

#: How long the first metric waits for the StatsD host name to resolve.
RESOLVE_WAIT_S = 0.25

_SAFE = re.compile(r"[^a-z0-9_]+")
_lock = threading.Lock()
#: (host, port, prefix) -> a StatsClient, or None while resolving / when unresolvable
_clients: dict[tuple[str, int, str], Any] = {}  # statsd clients (the package has no types)


def _config() -> tuple[str, int, str] | None:
    from ..settings import get_settings

    try:
        s = get_settings()
    except Exception:  # noqa: BLE001 - broken settings are reported by the command, not by metrics
        return None
    if not s.statsd_host:
        return None
    return (s.statsd_host, s.statsd_port, s.statsd_prefix.strip(".") or "")


def _build(key: tuple[str, int, str]) -> None:
    """Resolve the host once and install a non-blocking client for it (runs in a daemon thread)."""
    import socket  # here, not at import: a process with metrics off (every one-shot search by default) never loads it

    import statsd

    host, port, prefix = key
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM)[0]
        client = statsd.StatsClient(addr[0], port, prefix=prefix or None, ipv6=family == socket.AF_INET6)
        client._sock.setblocking(False)  # a full send buffer drops the metric instead of waiting
    except Exception:  # noqa: BLE001 - unresolvable host: metrics stay off for this process
        return
    with _lock:
        _clients[key] = client


def client():
    """The process's StatsClient for the current settings, or None (metrics off or host not resolved)."""
    key = _config()
    if key is None:
        return None
    try:
        return _clients[key]
    except KeyError:
        pass
    with _lock:
        starting = key not in _clients
        if starting:
            _clients[key] = None
    if starting:
        t = threading.Thread(target=_build, args=(key,), name="moonmind-statsd-resolve", daemon=True)
        t.start()
        t.join(RESOLVE_WAIT_S)
    return _clients.get(key)


def name_part(value: object) -> str:
    """A value made safe and bounded for use as the last segment of a metric name."""
    return (_SAFE.sub("_", str(value).lower()).strip("_") or "unknown")[:40]


def timing(name: str, ms: float) -> None:
    """A timer in milliseconds (`name:ms|ms`)."""
    c = client()
    if c is not None:
        try:
            c.timing(name, ms)
        except Exception:  # noqa: BLE001 - metrics never raise
            pass


def incr(name: str, count: int = 1) -> None:
    """A counter (`name:count|c`)."""
    c = client()
    if c is not None:
        try:
            c.incr(name, count)
        except Exception:  # noqa: BLE001 - metrics never raise
            pass


def reset() -> None:
    """Forget resolved clients (settings changed, or a test wants a fresh process state)."""
    with _lock:
        for c in _clients.values():
            try:
                if c is not None:
                    c.close()
            except Exception:  # noqa: BLE001
                pass
        _clients.clear()
