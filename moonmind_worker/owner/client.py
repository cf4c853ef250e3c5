"""The thin client: find the box's owner by itself and hand it one operation.

`execute(settings, op, args)` is what every command calls: the owner runs the operation
when one is alive, otherwise this process runs it one-shot (`ops.run`), so a
command behaves the same beside a worker, a gateway or nothing. Found by itself, no flag:

* socket alive → the owner answers;
* no socket → one-shot, as before (with ``MOONMIND_OWNER=auto``, a background owner is
  started first, and it answers this call and the next ones);
* a socket nobody listens on (its owner died) → the file is removed, one-shot;
* the owner dies mid-request → its lock is free: one-shot, with a note.

Every wait is bounded: connecting (`CONNECT_S`), and owner silence (`protocol.SILENCE_S`:
it sends a heartbeat every `protocol.HEARTBEAT_S` while it works), plus the caller's own
timeout for a search. Standard library only (plus `errors`): a search through the owner
imports no numpy, pydantic, qdrant, celery or fastapi.
"""

from __future__ import annotations

import _socket  # the C module under `socket`: the Python wrapper pulls in enum and selectors, a visible share of a call
import os
import sys
import time
from pathlib import Path

from ..errors import MoonmindError
from . import protocol, trust

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any, Callable

    Progress = Callable[..., None]  # (done, total[, chunks])


#: How long connecting to a live owner may take (it accepts in a loop of its own).
CONNECT_S = 2.0
#: How long `MOONMIND_OWNER=auto` waits for the owner it started to answer.
AUTO_START_S = 20.0
#: The scope fields a client's requests carry (the owner reports and caches under the client's job).
SCOPE_FIELDS = ("job_id", "run_id", "repo", "tenant")


class OwnerGone(Exception):
    """The owner closed the connection before its answer: it died (its lock is free again)."""


def scope_of(settings: Any) -> dict[str, Any]:
    return {k: getattr(settings, k) for k in SCOPE_FIELDS}


def owner_pid(path: Path) -> str:
    """The PID recorded in the store's lock file beside the socket (for messages)."""
    try:  # never through a link planted at that name
        fd = os.open(path.parent / "owner.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
    except OSError:
        return "unknown"


class Owner:
    """A connection to the live owner of one collection."""

    def __init__(self, sock: _socket.socket, path: Path) -> None:
        self.sock = sock
        self.path = path

    @property
    def pid(self) -> str:
        return owner_pid(self.path)

    def call(
        self, op: str, args: dict[str, Any], *, scope: dict[str, Any] | None = None, settings: dict[str, Any] | None = None,
        progress: Progress | None = None, timeout_s: float | None = None,
    ) -> Any:
        """Send one operation, read until its answer; the result, or the owner's error as a MoonmindError.

        `settings` (`Settings.wire()`): the owner runs the operation with the client's own settings.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        request = {"v": protocol.VERSION, "op": op, "args": args, "scope": scope or {}, "progress": progress is not None}
        if settings is not None:
            request["settings"] = settings
        line = protocol.encode(request)
        if len(line) > protocol.MAX_REQUEST_BYTES:  # the owner would stop reading it: say so, not "owner went away"
            self.close()
            raise MoonmindError(
                "invalid_argument",
                f"The {op} request is {len(line) / (1 << 20):.1f} MiB; the store's owner takes requests of at most "
                f"{protocol.MAX_REQUEST_BYTES >> 20} MiB.",
                "Shorten the query (only its first MOONMIND_MAX_QUERY_CHARS characters are searched) or pass fewer paths.",
            )
        try:
            self.sock.sendall(line)
            reader = protocol.LineReader(self.sock)
            while True:
                wait = protocol.SILENCE_S
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        raise self._timeout(op, timeout_s)
                self.sock.settimeout(wait)
                try:
                    message = reader.read()
                except TimeoutError:  # what a socket timeout raises
                    if deadline is not None and time.monotonic() >= deadline:
                        raise self._timeout(op, timeout_s) from None
                    raise self._silent(op) from None
                if "result" in message:
                    return message["result"]
                if "error" in message:
                    raise _error(message)
                if "progress" in message and progress is not None:
                    done, total, *chunks = message["progress"]  # chunks: index runs report them too
                    progress(int(done), int(total), *(int(c) for c in chunks[:1]))
        except (EOFError, ConnectionResetError, BrokenPipeError) as exc:
            raise OwnerGone(str(exc)) from None
        finally:
            self.close()

    def _timeout(self, op: str, timeout_s: float | None) -> MoonmindError:
        return MoonmindError(
            "task_timeout",
            f"The store's owner (PID {self.pid}) did not answer {op} within {timeout_s:g}s.",
            "Raise the latency budget or --timeout, or check what the owner is busy with.",
        )

    def _silent(self, op: str) -> MoonmindError:
        return MoonmindError(
            "owner_unresponsive",
            f"The process that owns the embedded store (PID {self.pid}) stopped answering during {op} "
            f"(nothing for {protocol.SILENCE_S:g}s).",
            f"Check that process (is it stopped or overloaded?); if it is stuck, stop it and retry: "
            f"commands then run on their own. Socket: {self.path}",
        )

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _error(message: dict[str, Any]) -> MoonmindError:
    from ..errors import CODES

    err = message.get("error") or {}
    code = str(err["code"]) if err.get("code") in CODES else "internal_error"
    details: dict[str, Any] = message["details"] if isinstance(message.get("details"), dict) else {}
    return MoonmindError(code, str(err.get("message", "")), str(err.get("action", "")), **details)


def connect(data_dir: Path, collection: str, timeout_s: float = CONNECT_S) -> Owner | None:
    """A connection to the collection's live owner, or None when there is none (a stale socket is removed)."""
    path = protocol.socket_path(data_dir, collection)
    try:  # an untrusted home or socket is refused before connecting (MoonmindError), a missing one means no owner
        if not trust.check_private_dirs(*trust.store_dirs(data_dir, collection)):
            return None
        st = trust.check_own_entry(path)
    except OSError:
        return None
    if st is None:
        return None
    inode = st.st_ino
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        protocol.at_short_path(path, sock.connect)
    except ConnectionRefusedError:
        sock.close()
        _remove_stale(path, inode)
        return None
    except OSError:
        # gone meanwhile, another user's owner (one-shot then reports the store as busy), or
        # an owner too busy to accept: one-shot waits for the lock, which is bounded too
        sock.close()
        return None
    try:  # before any byte is sent: a socket another user listens on would read our requests
        trust.check_peer(sock, path)
    except BaseException:
        sock.close()
        raise
    return Owner(sock, path)


def _remove_stale(path: Path, inode: int) -> None:
    """Unlink a socket file nobody listens on: its owner died without removing it.

    An owner creates its socket under another name and renames it into place once it
    listens, so a refused connection means the file is stale; the inode check keeps a
    socket that a new owner renamed into place meanwhile.
    """
    try:
        if path.lstat().st_ino == inode:
            path.unlink()
    except OSError:
        pass


def _holds_here(settings: Any, collection: str | None) -> bool:
    """True when this very process holds the store (a worker's own hook, a gateway's doctor)."""
    runtime = sys.modules.get("moonmind_worker.runtime")
    store = runtime.existing_store(settings, collection) if runtime is not None else None
    return store is not None and getattr(store, "holding", True)


def find(settings: Any, collection: str | None = None, *, start: bool = True, creates: bool = False) -> Owner | None:
    """The live owner this process should use for `collection`, or None (then run one-shot).

    While another process takes the store over (`handover`), this waits for its socket rather
    than start an owner of its own or run one-shot beside it. An owner is started (auto mode)
    only for a store that is there, or for an operation that `creates` it: an owner holds its lock
    and socket in the store's directory, and a read (a search, stats, the doctor) on an empty
    MOONMIND_HOME must leave nothing behind; run one-shot, it answers collection_missing.
    """
    if not settings.embedded_store or settings.owner_mode == "off" or _holds_here(settings, collection):
        return None
    name = collection or settings.collection
    owner = connect(settings.data_dir, name)
    if owner is None:
        from . import handover

        store_dir = protocol.socket_path(settings.data_dir, name).parent
        if handover.pending(store_dir) is not None:
            until = time.monotonic() + handover.HANDOVER_S
            owner = handover.wait_while_pending(store_dir, until, lambda: connect(settings.data_dir, name))  # type: ignore[assignment]
    if owner is None and start and settings.owner_mode == "auto" and (creates or os.path.lexists(settings.data_dir / name)):
        owner = start_background_owner(settings, name)
    return owner


#: The owner's log is started afresh past this size (the previous one kept as owner.log.1).
LOG_MAX_BYTES = 1 << 20


def _rotate(log: Path) -> None:
    try:
        if os.lstat(log).st_size > LOG_MAX_BYTES:
            os.replace(log, log.with_name(log.name + ".1"))
    except OSError:
        pass


def start_background_owner(settings: Any, collection: str) -> Owner | None:
    """`MOONMIND_OWNER=auto`: start `moonmind serve --idle-exit` in the background and connect to it.

    Returns None when it could not start in time (the store held by a one-shot command, say);
    the caller then runs one-shot as usual.
    """
    import subprocess

    log = Path(trust.ensure_private_dirs(settings.moonmind_home)) / "owner.log"
    cmd = [sys.executable, "-m", "moonmind_worker.cli.main", "serve", "--idle-exit", f"{settings.owner_idle_s:g}"]
    env = dict(os.environ, MOONMIND_COLLECTION=collection, MOONMIND_OWNER="off")
    _rotate(log)
    with os.fdopen(trust.open_private_file(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as out:
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True, close_fds=True,
        )
    deadline = time.monotonic() + AUTO_START_S
    while time.monotonic() < deadline:
        owner = connect(settings.data_dir, collection)
        if owner is not None:
            return owner
        if proc.poll() is not None:
            owner = connect(settings.data_dir, collection)  # another auto owner may have won the race
            return owner
        time.sleep(0.02)
    return None
