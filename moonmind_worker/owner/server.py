"""The owner's socket server: a background thread in whichever process holds the embedded store.

Why a thread of its own: the owner is often busy with something else — a Celery worker
running a job task (whose body calls `moonmind rag search` and waits for it), the
gateway serving HTTP. Each client connection gets its own thread, so a job task blocked
on its CLI call never blocks the answer. The engine calls themselves are short and
serialized by the store; writes run one at a time (`ops.run`).

Security: the socket is created mode 0600 in the store's directory (only the owner's
user can connect), and each connection's peer uid (SO_PEERCRED) must be the owner's own;
requests are operations on this user's store with this user's rights, nothing more.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, cast

from ..errors import MoonmindError
from . import protocol

if TYPE_CHECKING:
    from ..store import EmbeddedStore

log = logging.getLogger("moonmind.owner")

#: Connections served at once; more wait in the listen backlog (bounded by the client's connect timeout).
MAX_CONNECTIONS = 32
#: A connected client must send its request within this many seconds.
REQUEST_S = 10.0
#: How often the accept loop wakes to check for stop / idle exit.
_TICK_S = 0.25

_current: dict[str, OwnerServer | None] = {"server": None}


def current_server() -> OwnerServer | None:
    return _current["server"]


class OwnerServer:
    """Serve `ops` for `settings`' collection on its owner socket until `stop()` (or `idle_exit_s` of quiet)."""

    def __init__(self, settings: Any, *, role: str, read_only: str | None = None, idle_exit_s: float | None = None) -> None:
        self.settings = settings
        self.role = role
        #: why writes are refused, or None (a gateway serving frozen copies refuses them)
        self.read_only = read_only
        self.idle_exit_s = idle_exit_s
        self.path = protocol.socket_path(settings.data_dir, settings.collection)
        self.stopped = threading.Event()
        self._listener: socket.socket | None = None
        self._inode: int | None = None
        self._thread: threading.Thread | None = None
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._active = 0
        self._active_lock = threading.Lock()
        self._last = time.monotonic()
        self._uid = os.geteuid()

    # -- life cycle ---------------------------------------------------------
    def start(self) -> OwnerServer:
        """Listen (the socket appears under its final name only once it accepts) and serve in a thread."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        protocol.at_short_path(tmp, sock.bind)
        os.chmod(tmp, 0o600)
        sock.listen(64)
        sock.settimeout(_TICK_S)
        os.replace(tmp, self.path)
        self._inode = self.path.stat().st_ino
        self._listener = sock
        _current["server"] = self
        self._thread = threading.Thread(target=self._accept_loop, name="moonmind-owner", daemon=True)
        self._thread.start()
        log.info("serving the embedded store to local clients on %s (%s, PID %d)", self.path, self.role, os.getpid())
        return self

    def stop(self) -> None:
        self.stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self._close_listener()
        if _current["server"] is self:
            _current["server"] = None

    def _close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
            self._listener = None
        try:  # only our own socket: a new owner may have taken the name since
            if self._inode is not None and self.path.stat().st_ino == self._inode:
                self.path.unlink()
        except OSError:
            pass

    def wait(self) -> None:
        """Block until stopped (a foreground `moonmind serve`)."""
        while not self.stopped.wait(1.0):
            pass

    # -- serving ------------------------------------------------------------
    def _accept_loop(self) -> None:
        listener = self._listener
        while not self.stopped.is_set() and listener is not None:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                if self._idle():
                    log.info("no request for %.0f s: the owner exits", self.idle_exit_s)
                    self.stopped.set()
                continue
            except OSError:
                if self.stopped.is_set():
                    break
                time.sleep(_TICK_S)
                continue
            if not self._slots.acquire(timeout=protocol.SILENCE_S / 2):
                conn.close()
                continue
            with self._active_lock:
                self._active += 1
                self._last = time.monotonic()
            threading.Thread(target=self._serve, args=(conn,), name="moonmind-owner-conn", daemon=True).start()
        self._close_listener()

    def _idle(self) -> bool:
        if self.idle_exit_s is None:
            return False
        with self._active_lock:
            return self._active == 0 and time.monotonic() - self._last >= self.idle_exit_s

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except Exception:  # noqa: BLE001 - one client's failure never stops the server
            log.exception("owner connection failed")
        finally:
            try:
                conn.close()
            except OSError:
                pass
            with self._active_lock:
                self._active -= 1
                self._last = time.monotonic()
            self._slots.release()

    def _peer_uid(self, conn: socket.socket) -> int | None:
        opt = getattr(socket, "SO_PEERCRED", None)
        if opt is None:  # not Linux: the socket's mode 0600 is the check
            return None
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))
        return uid

    def _handle(self, conn: socket.socket) -> None:
        channel = _Channel(conn)
        uid = self._peer_uid(conn)
        if uid is not None and uid != self._uid:
            log.warning("refused a client with uid %d (the owner runs as %d)", uid, self._uid)
            channel.error(MoonmindError(
                "forbidden", "This store's owner serves only its own user.",
                "Run moonmind as the user that owns MOONMIND_HOME.",
            ))
            return
        conn.settimeout(REQUEST_S)
        try:
            request = protocol.LineReader(conn, protocol.MAX_REQUEST_BYTES).read()
        except (OSError, EOFError, ValueError):
            channel.error(MoonmindError("invalid_argument", "The owner received a malformed request.",
                                        "Use the same moonmind-worker version for the CLI and the owner."))
            return
        conn.settimeout(None)
        op, args = request.get("op"), request.get("args")
        if request.get("v") != protocol.VERSION or not isinstance(op, str) or not isinstance(args, dict):
            channel.error(MoonmindError("invalid_argument", "The owner received a request it does not understand.",
                                        "Use the same moonmind-worker version for the CLI and the owner."))
            return
        from .ops import WRITES, run

        if op in WRITES and self.read_only:
            channel.error(MoonmindError("store_busy", f"The store's owner (PID {os.getpid()}) serves it read-only: {self.read_only}.",
                                        "Stop it to write, or write through a Celery worker or a Qdrant server."))
            return
        settings = self._scoped(request.get("scope"))
        progress = channel.progress if request.get("progress") else channel.check_open
        heartbeat = threading.Thread(target=channel.heartbeat, name="moonmind-owner-beat", daemon=True)
        heartbeat.start()
        try:
            with _event_scope(settings):
                result = run(op, args, settings, progress=progress)
        except _ClientGone:
            log.info("client left during %s; stopped it", op)
            return
        except MoonmindError as err:
            channel.error(err)
            return
        except Exception:  # noqa: BLE001 - logged here, generic for the client
            log.exception("owner operation %s failed", op)
            channel.error(MoonmindError("internal_error", f"The store's owner failed during {op}.",
                                        f"See the owner's log (PID {os.getpid()}) for the traceback and report it."))
            return
        finally:
            channel.done.set()
        channel.send({"result": result})

    def _scoped(self, scope: Any) -> Any:
        """The owner's settings with the client's job scope (its job's events, packs and defaults)."""
        from .client import SCOPE_FIELDS

        if not isinstance(scope, dict):
            return self.settings
        update = {k: scope.get(k) for k in SCOPE_FIELDS}
        update = {k: (v if isinstance(v, str) and v else None) for k, v in update.items()}
        try:
            return self.settings.model_copy(update=update)
        except MoonmindError:
            return self.settings


class _ClientGone(Exception):
    """The client closed its connection mid-operation (Ctrl-C): stop, as a one-shot command would."""


class _Channel:
    """The server side of one connection: JSON lines out, one writer at a time."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.gone = False
        self._last_progress = 0.0

    def send(self, message: dict[str, Any]) -> None:
        data = protocol.encode(message)
        with self.lock:
            if self.gone:
                return
            try:
                self.conn.sendall(data)
            except OSError:
                self.gone = True

    def error(self, err: MoonmindError) -> None:
        details = {k: v for k, v in err.details.items() if _json_safe(v)}
        self.send({"error": {"code": err.code, "message": err.message, "action": err.action}, "details": details})

    def heartbeat(self) -> None:
        while not self.done.wait(protocol.HEARTBEAT_S):
            self.send({"alive": 1})

    def check_open(self, done: int = 0, total: int = 0, chunks: int | None = None) -> None:
        if self.gone:
            raise _ClientGone()

    def progress(self, done: int, total: int, chunks: int | None = None) -> None:
        now = time.monotonic()
        if done == total or now - self._last_progress >= 0.1:
            self._last_progress = now
            self.send({"progress": [done, total] if chunks is None else [done, total, chunks]})
        self.check_open()


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


@contextmanager
def _event_scope(settings: Any) -> Iterator[None]:
    """Queue events of this request carry the client's job scope, not the owner's environment."""
    from ..observe.events import scope_override
    from .client import SCOPE_FIELDS

    token = scope_override.set({k: getattr(settings, k) for k in SCOPE_FIELDS})
    try:
        yield
    finally:
        scope_override.reset(token)


# --------------------------------------------------------------- starting ---


def serve_store(settings: Any, *, role: str, read_only: str | None = None, idle_exit_s: float | None = None) -> OwnerServer | None:
    """Hold the embedded store for good and serve it on the owner socket; None when there is nothing to own.

    Called by every process that means to own the store (Celery worker, gateway, `moonmind
    serve`). Raises store_busy when another process owns it already.
    """
    if not settings.embedded_store:
        return None  # a Qdrant server serves every process itself
    from .. import runtime

    store = cast("EmbeddedStore", runtime.get_store(settings))  # settings.embedded_store: an EdgeStore
    store.hold()
    server = current_server()
    if server is not None and server.path == protocol.socket_path(settings.data_dir, settings.collection):
        return server
    return OwnerServer(settings, role=role, read_only=read_only, idle_exit_s=idle_exit_s).start()


def stop_serving() -> None:
    server = current_server()
    if server is not None:
        server.stop()
