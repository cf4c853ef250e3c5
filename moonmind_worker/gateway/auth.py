"""Gateway bearer tokens and their scopes, from a file the operator manages.

The file holds only sha256 hashes of tokens, each with the repos and tenants it
may read and an optional top_k ceiling:

    {"tokens": [{"name": "ci-workers", "hash": "sha256:<hex>",
                 "repos": ["moonmind"], "tenants": ["prod"], "max_top_k": 20}]}

Why hashes: a leaked file grants nothing. Why compare every entry with
`hmac.compare_digest`: the time taken does not depend on which (or whether a)
token matched. The file is re-read when it changes (checked on each request by
mtime/size/inode/mode) or on SIGHUP; a reload swaps one immutable tuple, so requests
in flight keep the grants they started with.

It is a credential file, so it fails closed: a file that is deleted, emptied, broken or
world-writable grants nothing (every token is refused, logged as an error) until it is
fixed, rather than leaving the last grants in force, and a gateway does not start on one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
import threading
from pathlib import Path

from ..contracts import RetrievalQuery, TokenFile, TokenGrant
from ..errors import MoonmindError
from ..store.scopes import Scope

log = logging.getLogger("moonmind.gateway.auth")

#: Longest value echoed back in a 403 message (very long values are cut, not reflected).
_ECHO_MAX = 64


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh worker token: 256 bits from the OS CSPRNG, URL-safe."""
    return "mmw_" + secrets.token_urlsafe(32)


def load_token_file(path: Path) -> TokenFile:
    from pydantic import ValidationError

    from ..text.files import Unreadable, read_regular

    try:
        data, st = read_regular(path, 16 << 20)  # a FIFO or device in its place must not hang the gateway
        mode, raw = st.st_mode, data.decode("utf-8")
    except Unreadable as exc:
        raise MoonmindError(
            "missing_credentials",
            f"Gateway token file {path} was not read: {exc}.",
            "Point MOONMIND_GATEWAY_TOKENS_FILE at a regular file written by `moonmind gateway add-token`.",
        ) from None
    except FileNotFoundError:
        raise MoonmindError(
            "missing_credentials",
            f"Gateway token file {path} does not exist.",
            "Create it with `moonmind gateway add-token --name NAME --repo R --tenant T`.",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MoonmindError(
            "invalid_setting", f"Gateway token file {path} cannot be read ({type(exc).__name__}).",
            "Make it a readable UTF-8 file (`moonmind gateway add-token` writes one).",
        ) from None
    if mode & stat.S_IWOTH:
        raise MoonmindError(
            "invalid_setting",
            f"Gateway token file {path} is world-writable (mode {stat.S_IMODE(mode):o}): anyone on this host "
            "could grant themselves access, so it is not used.",
            f"chmod 600 {path} (add-token creates it 0600).",
        )
    try:
        return TokenFile.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": "not valid JSON"}
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise MoonmindError(
            "invalid_argument",
            f"Gateway token file {path} is invalid at {where}: {first['msg']}.",
            "Fix the file (see docs/gateway.md, 'Token file') and send SIGHUP or save it again.",
        ) from None


def add_token(path: Path, grant: TokenGrant) -> None:
    """Append a grant to the token file atomically (mode 0600), creating the file when needed."""
    current = load_token_file(path) if path.exists() else TokenFile()
    if any(g.name == grant.name for g in current.tokens):
        raise MoonmindError(
            "invalid_argument", f"A token named {grant.name!r} already exists in {path}.", "Pick another --name."
        )
    current.tokens.append(grant)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(current.model_dump_json(indent=2, exclude_none=True) + "\n")
    os.replace(tmp, path)


class TokenRegistry:
    """The current grants, reloaded from the token file when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._state: tuple[tuple, tuple[TokenGrant, ...]] = ((), ())
        self._state = (self._stamp(), tuple(load_token_file(self.path).tokens))

    def _stamp(self) -> tuple:
        try:
            st = self.path.stat()
        except OSError:
            return ()
        return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)

    @property
    def grants(self) -> tuple[TokenGrant, ...]:
        return self._state[1]

    def reload(self) -> bool:
        """Re-read the file; when it is missing or unusable, revoke every grant (fail closed). True when reloaded."""
        with self._lock:
            stamp = self._stamp()
            try:
                grants = tuple(load_token_file(self.path).tokens)
            except MoonmindError as err:
                log.error("token file unusable, every token is refused until it is fixed: %s %s", err.message, err.action)
                self._state = (stamp, ())  # not retried until it changes again
                return False
            self._state = (stamp, grants)
            log.info("token file reloaded: %d grant(s)", len(grants))
            return True

    def _maybe_reload(self) -> None:
        if self._stamp() != self._state[0]:
            self.reload()

    def authenticate(self, authorization: str | None) -> TokenGrant:
        """The grant for an `Authorization: Bearer <token>` header, or 401."""
        self._maybe_reload()
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise MoonmindError(
                "unauthenticated",
                "Missing bearer token.",
                "Send `Authorization: Bearer <token>` (the CLI reads MOONMIND_RETRIEVAL_TOKEN).",
            )
        presented = hash_token(token).encode()
        found: TokenGrant | None = None
        for grant in self._state[1]:  # every entry compared, in constant time each
            if hmac.compare_digest(presented, grant.hash.encode()):
                found = grant
        if found is None:
            raise MoonmindError(
                "unauthenticated",
                "The bearer token is not valid for this gateway.",
                "Check MOONMIND_RETRIEVAL_TOKEN, or ask the gateway operator for a token.",
            )
        return found


def _echo(value: str) -> str:
    return repr(value if len(value) <= _ECHO_MAX else value[:_ECHO_MAX] + "…")


#: A repository or tenant name shown as is in a suggested command (anything else: a placeholder).
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _add_token(*, repo: str | None = None, tenant: str | None = None) -> str:
    """The command that issues a token for `repo` / `tenant` on the gateway's host (`moonmind gateway add-token`)."""

    def shown(value: str | None, placeholder: str) -> str:
        return value if value is not None and _PLAIN_NAME.fullmatch(value) else placeholder

    return (f"`moonmind gateway add-token --name NAME --repo {shown(repo, 'REPO')} --tenant {shown(tenant, 'TENANT')}` "
            "(prints the new token once; the gateway reloads its tokens file)")


def authorize(grant: TokenGrant, query: RetrievalQuery, default_top_k: int) -> tuple[RetrievalQuery, Scope]:
    """Enforce the grant on a query: 403 outside the allow-list; the Scope every search is confined to.

    Values are compared exactly (no case folding or Unicode normalisation): a
    look-alike is a different repo, and it is refused rather than mapped.
    """
    f = query.filters
    if f.repo is not None and f.repo not in grant.repos:
        raise MoonmindError(
            "forbidden",
            f"Repository {_echo(f.repo)} is not permitted for this worker token.",
            f"Filter on a repository this token allows, or ask the gateway's operator for a token that allows it: "
            f"{_add_token(repo=f.repo)}.",
        )
    if f.tenant is not None and f.tenant not in grant.tenants:
        raise MoonmindError(
            "forbidden",
            f"Tenant {_echo(f.tenant)} is not permitted for this worker token.",
            f"Filter on a tenant this token allows, or ask the gateway's operator for a token that allows it: "
            f"{_add_token(tenant=f.tenant)}.",
        )
    update: dict = {}
    if grant.max_top_k is not None:
        if query.top_k is not None and query.top_k > grant.max_top_k:
            raise MoonmindError(
                "forbidden",
                f"top_k={query.top_k} exceeds this worker token's limit of {grant.max_top_k}.",
                f"Ask for at most top_k={grant.max_top_k}.",
            )
        if query.top_k is None:
            update["top_k"] = min(default_top_k, grant.max_top_k)
    if update:
        query = query.model_copy(update=update)
    return query, Scope(repos=tuple(grant.repos), tenants=tuple(grant.tenants))
