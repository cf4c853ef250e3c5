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
from ..settings import serving
from . import protocol, trust

if TYPE_CHECKING:
    from ..store import EmbeddedStore

log = logging.getLogger("moonmind.owner")

#: Connections served at once; more wait in the listen backlog (bounded by the client's connect timeout).
#: When all are taken, a newcomer gets the slot of the connection that has been sending its request the longest.
MAX_CONNECTIONS = 32
#: A served client must send its whole request within this many seconds (it writes it right after connecting).
REQUEST_S = 5.0
#: The control request a newcomer (Celery worker, gateway) sends to take the store over (see _step_down).
STEP_DOWN = "step_down"
#: How long stopping an owner waits for its requests in flight to finish.
DRAIN_S = 10.0
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
        #: connections still sending their request → when they got their slot (evictable); running ones are not here
        self._reading: dict[socket.socket, float] = {}
        self._reading_lock = threading.Lock()
        self._active = 0
        self._active_lock = threading.Lock()
        self._idle_cond = threading.Condition(self._active_lock)  # notified when a request ends (drain)
        #: set once a newcomer takes the store over: no new requests, the running ones finish
        self.handing_over = False
        self.handed_to: Any = None
        self._last = time.monotonic()
        self._uid = os.geteuid()
        self.freshness: Any = None  # the watchers of the trees indexed into this store (freshness.py)

    # -- life cycle ---------------------------------------------------------
    def start(self) -> OwnerServer:
        """Listen (the socket appears under its final name only once it accepts) and serve in a thread."""
        # a home another user can write to could hand our socket's name to their listener
        trust.ensure_private_dirs(*trust.store_dirs(self.settings.data_dir, self.settings.collection))
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
        if self.read_only is None:  # an owner that writes keeps what it indexed fresh
            from .freshness import Freshness
            from .ops import run

            self.freshness = Freshness(self.settings, run).start()
        return self

    def stop(self) -> None:
        """Stop accepting, then let the requests in flight finish (bounded) before the store is let go."""
        self.stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self._close_listener()
        if self.freshness is not None:  # its re-index in flight ends before the store is let go
            self.freshness.stop(DRAIN_S)
        if not self.drain(DRAIN_S):
            log.warning("stopping with requests still in flight after %.0f s: their clients retry", DRAIN_S)
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
                    self.stopped.set()
                continue
            except OSError:
                if self.stopped.is_set() or self.handing_over:
                    break
                time.sleep(_TICK_S)
                continue
            if not self._take_slot():
                conn.close()
                continue
            with self._active_lock:
                self._active += 1
                self._last = time.monotonic()
            with self._reading_lock:
                self._reading[conn] = time.monotonic()
            threading.Thread(target=self._serve, args=(conn,), name="moonmind-owner-conn", daemon=True).start()
        self._close_listener()

    def _take_slot(self) -> bool:
        """A slot for a new connection: a free one, else the longest-reading one's, else wait (bounded) for one."""
        if self._slots.acquire(blocking=False):
            return True
        self._evict_slowest_reader()
        return self._slots.acquire(timeout=protocol.SILENCE_S / 2)

    def _evict_slowest_reader(self) -> None:
        """Drop the connection that has been sending its request the longest (slow clients never starve fast ones)."""
        with self._reading_lock:
            if not self._reading:
                return  # every slot runs an operation: those are never cut short
            conn = min(self._reading, key=self._reading.__getitem__)
            since = self._reading.pop(conn)
            try:  # under the lock: its thread cannot close the socket (and free its fd for reuse) meanwhile
                conn.shutdown(socket.SHUT_RDWR)  # wakes its blocked recv; its thread then releases the slot
            except OSError:
                pass
        log.info("dropped a client still sending its request after %.1f s: a new connection needed its slot",
                 time.monotonic() - since)

    def _done_reading(self, conn: socket.socket) -> bool:
        """Take `conn` out of the reading set (past its request: never evicted); False when it was evicted already."""
        with self._reading_lock:
            return self._reading.pop(conn, None) is not None

    def _read_request(self, conn: socket.socket, channel: _Channel) -> dict[str, Any] | None:
        """The client's request, read within `REQUEST_S` of its slot; None when the connection is to be dropped."""
        with self._reading_lock:
            since = self._reading.get(conn)
        if since is None:
            return None  # evicted before its thread got here
        try:
            request = protocol.LineReader(conn, protocol.MAX_REQUEST_BYTES).read(deadline=since + REQUEST_S)
        except TimeoutError:
            if self._done_reading(conn):
                log.info("dropped a client that did not send its request within %g s", REQUEST_S)
            return None
        except (OSError, EOFError, ValueError):
            if self._done_reading(conn):  # an evicted connection is gone: nobody to tell
                channel.error(MoonmindError("invalid_argument", "The owner received a malformed request.",
                                            "Use the same moonmind-worker version for the CLI and the owner."))
            return None
        if not self._done_reading(conn):
            return None  # evicted just as its request arrived: dropped like the others
        return request

    def _idle(self) -> bool:
        """True when an auto-started owner should exit: quiet for `idle_exit_s`, or grown past its memory bound."""
        if self.idle_exit_s is None:
            return False
        with self._active_lock:
            if self._active:
                return False
            quiet = time.monotonic() - self._last
        if quiet >= self.idle_exit_s:
            log.info("no request for %.0f s: the owner exits", self.idle_exit_s)
            return True
        limit = getattr(self.settings, "owner_max_rss_mb", None)
        rss = _rss_mb()
        if limit is not None and rss is not None and rss > limit:
            log.info("the owner holds %.0f MiB (MOONMIND_OWNER_MAX_RSS_MB=%g) and is idle: it exits; the next "
                     "command starts a fresh one", rss, limit)
            return True
        return False

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except Exception:  # noqa: BLE001 - one client's failure never stops the server
            log.exception("owner connection failed")
        finally:
            self._done_reading(conn)  # out of the reading set before close: eviction never shuts down a reused fd
            try:
                conn.close()
            except OSError:
                pass
            with self._active_lock:
                self._active -= 1
                self._last = time.monotonic()
                self._idle_cond.notify_all()
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
        request = self._read_request(conn, channel)
        if request is None:
            return
        conn.settimeout(None)
        op, args = request.get("op"), request.get("args")
        if request.get("v") != protocol.VERSION or not isinstance(op, str) or not isinstance(args, dict):
            channel.error(MoonmindError("invalid_argument", "The owner received a request it does not understand.",
                                        "Use the same moonmind-worker version for the CLI and the owner."))
            return
        from .ops import WRITES, run

        if op == STEP_DOWN:
            self._step_down(channel, args)
            return
        if op in WRITES and self.read_only:
            channel.error(MoonmindError("store_busy", f"The store's owner (PID {os.getpid()}) serves it read-only: {self.read_only}.",
                                        "Stop it to write, or write through a Celery worker or a Qdrant server."))
            return
        try:
            settings = self._request_settings(request)
        except MoonmindError as err:
            channel.error(err)
            return
        progress = channel.progress if request.get("progress") else channel.check_open
        heartbeat = threading.Thread(target=channel.heartbeat, name="moonmind-owner-beat", daemon=True)
        heartbeat.start()
        try:
            with serving(settings), _event_scope(settings):
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

    def _request_settings(self, request: dict[str, Any]) -> Any:
        """The client's own settings (what it would have run one-shot with), on this owner's store.

        A request without them (an older client) runs with the owner's settings and the client's job scope.
        """
        wire = request.get("settings")
        if wire is None:
            return self._scoped(request.get("scope"))
        from ..settings import Settings

        settings = Settings.from_wire(wire)
        if not settings.embedded_store or settings.data_dir.absolute() != self.settings.data_dir.absolute():
            raise MoonmindError(
                "invalid_argument",
                f"This owner serves the embedded store at {self.settings.data_dir}, not the one the command names.",
                "Check MOONMIND_HOME and QDRANT_URL: the command reached this owner through its socket.",
            )
        # the store is the one this socket serves, whatever collection the client's settings name
        return settings.model_copy(update={"collection": self.settings.collection})

    # -- hand-over ----------------------------------------------------------
    def _step_down(self, channel: _Channel, args: dict[str, Any]) -> None:
        """A Celery worker or a gateway starting on this box asks to own the store: a `serve` owner lets it.

        Why only `serve` (and the auto owner, a `serve --idle-exit`): the processes that run jobs
        or HTTP must open the store themselves, a `serve` owner only stands in for them. A worker
        or gateway owner refuses; the newcomer then uses it through this socket.
        """
        taker = args.get("pid")
        if self.role != "serve":
            channel.error(MoonmindError(
                "store_busy", f"The store is owned by a {self.role} (PID {os.getpid()}), which keeps it.",
                "Use it through its socket (moonmind commands do by themselves), or stop it first.",
            ))
            return
        log.info("handing the store over to PID %s: no new requests; finishing the ones in flight", taker)
        self.handing_over = True
        self.handed_to = taker
        self._close_listener()  # new clients wait for the next owner (see client.find)
        channel.send({"result": {"pid": os.getpid(), "role": self.role}})
        threading.Thread(target=self._finish_then_stop, name="moonmind-owner-handover", daemon=True).start()

    def _finish_then_stop(self) -> None:
        self.drain(None)
        self.stopped.set()

    def drain(self, timeout_s: float | None) -> bool:
        """Wait until no request is in flight (the step-down request itself excepted); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._active_lock:
            while self._active:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    return False
                self._idle_cond.wait(wait)
        return True

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


def _rss_mb() -> float | None:
    """This process's resident memory in MiB (Linux), or None."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return None


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

    Called by every process that means to own the store. A Celery worker or a gateway (any
    `role` but "serve") takes the store over from a `serve` owner (`moonmind serve`, the auto
    owner): it announces itself, asks that owner to step down and waits for its lock. A `serve`
    owner never takes it from anyone. Raises store_busy when the store stays another's.
    """
    if not settings.embedded_store:
        return None  # a Qdrant server serves every process itself
    from .. import runtime
    from . import handover

    store = cast("EmbeddedStore", runtime.get_store(settings))  # settings.embedded_store: an EdgeStore
    path = protocol.socket_path(settings.data_dir, settings.collection)
    server = current_server()
    if server is not None and server.path == path:
        store.hold()
        return server
    if role == "serve":
        taker = handover.pending(path.parent, exclude=os.getpid())
        if taker is not None:
            raise MoonmindError("store_busy", f"PID {taker} is taking the store over; it serves this box.",
                                "Nothing to do: moonmind commands use it by themselves.")
        store.hold()
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        handover.announce(path.parent, role)  # withdrawn once this process listens: clients wait till then
    try:
        if role != "serve":
            _take_over(settings, store)
        return OwnerServer(settings, role=role, read_only=read_only, idle_exit_s=idle_exit_s).start()
    except BaseException:
        store.close()  # never hold the store without serving it
        raise
    finally:
        if role != "serve":
            handover.withdraw(path.parent)


def _take_over(settings: Any, store: EmbeddedStore) -> None:
    """Become the owner: a `serve` owner steps down (its requests in flight finish first); store_busy otherwise."""
    from . import handover
    from .client import OwnerGone, connect

    owner = connect(settings.data_dir, settings.collection)
    if owner is not None:
        pid = owner.pid
        try:
            owner.call(STEP_DOWN, {"pid": os.getpid()}, timeout_s=protocol.SILENCE_S)
            log.info("PID %s steps down; waiting for it to finish its requests and let go of the store", pid)
        except OwnerGone:
            pass  # it exited meanwhile: its lock is free
    store.hold(wait_s=handover.HANDOVER_S)


def stop_serving() -> None:
    server = current_server()
    if server is not None:
        server.stop()
