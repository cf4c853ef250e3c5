"""Errors users see: a stable code, what is wrong, what to do, and an exit code.

Every failure that reaches a user is a `MoonmindError`; entry points turn it into
the `{"error": {"code", "message", "action"}}` envelope and exit with
the documented code of its class. Anything else is an internal error.
"""

from __future__ import annotations

import re
from collections import namedtuple

#: Exit code per class of failure (documented in docs/cli.md).
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_CONNECTIVITY = 4
EXIT_BUDGET = 5

#: Everything the code base decides from an error code, as the columns of one table, with no
#: defaults (a new code must say each one, or the module does not import): `exit` the CLI's exit
#: code (its class), `http` the gateway's status, `traits` among TRAITS, `health` the
#: /retrieval/health reason when the store or embedder fails with it (None: not such a failure;
#: reported as store_unavailable should it ever reach the health check).
#: (A namedtuple, not typing.NamedTuple: the thin CLI paths import this module and not `typing`.)
Code = namedtuple("Code", "exit http traits health")


#: transient — a Celery task retries it with backoff (the service may be back in a moment);
#: fallback — a gateway failure after which the CLI may retry direct (never a 4xx: those are the caller's);
#: caller — the gateway tells a remote caller as it is (anything else there becomes `retrieval_failed`).
TRAITS = frozenset({"transient", "fallback", "caller"})
#: The coarse health reasons: they name the failing part, never the collection or the exception.
HEALTH_REASONS = frozenset({"collection_not_ready", "embedding_mismatch", "embedder_unavailable", "store_unavailable"})


def _is(*traits: str) -> frozenset[str]:
    return frozenset(traits)


CODES: "dict[str, Code]" = {
    "invalid_query": Code(EXIT_USAGE, 400, _is("caller"), None),
    "invalid_argument": Code(EXIT_USAGE, 400, _is(), None),
    "path_outside_workspace": Code(EXIT_USAGE, 400, _is(), None),
    # a setting (environment, .env or keyword) breaks its rule; HTTP 500: on a server it is the operator's
    "invalid_setting": Code(EXIT_USAGE, 500, _is(), None),
    "missing_credentials": Code(EXIT_CONFIG, 500, _is(), "embedder_unavailable"),
    "collection_missing": Code(EXIT_CONFIG, 500, _is(), "collection_not_ready"),
    "embedding_dimension_mismatch": Code(EXIT_CONFIG, 500, _is(), "embedding_mismatch"),
    "embedding_model_mismatch": Code(EXIT_CONFIG, 500, _is(), "embedding_mismatch"),
    "schema_unsupported": Code(EXIT_CONFIG, 500, _is(), "collection_not_ready"),
    "store_busy": Code(EXIT_CONFIG, 503, _is("transient"), "store_unavailable"),
    # the store's filesystem has no room for a write (or an open that must write): the operator's to free
    "disk_full": Code(EXIT_CONFIG, 507, _is(), "store_unavailable"),
    "qdrant_unreachable": Code(EXIT_CONNECTIVITY, 500, _is("transient"), "store_unavailable"),
    # as a store's or embedding provider's answer; the gateway's own 401 is answered before any of this
    "unauthenticated": Code(EXIT_CONNECTIVITY, 401, _is(), "embedder_unavailable"),
    "forbidden": Code(EXIT_CONNECTIVITY, 403, _is(), "store_unavailable"),
    "embedding_provider_error": Code(EXIT_CONNECTIVITY, 500, _is("transient"), "embedder_unavailable"),
    "quota_exhausted": Code(EXIT_CONNECTIVITY, 429, _is(), "embedder_unavailable"),
    "broker_unreachable": Code(EXIT_CONNECTIVITY, 503, _is(), "store_unavailable"),
    "worker_unavailable": Code(EXIT_CONNECTIVITY, 503, _is(), "store_unavailable"),
    # the local process that owns the embedded store stopped answering (owner/client.py)
    "owner_unresponsive": Code(EXIT_CONNECTIVITY, 503, _is(), "store_unavailable"),
    "job_blocked": Code(EXIT_CONFIG, 503, _is(), "store_unavailable"),
    "retrieval_failed": Code(EXIT_CONNECTIVITY, 500, _is("fallback"), "store_unavailable"),
    "latency_budget_exceeded": Code(EXIT_BUDGET, 408, _is("fallback", "caller"), "store_unavailable"),
    "token_budget_exceeded": Code(EXIT_BUDGET, 413, _is("caller"), "store_unavailable"),
    "task_timeout": Code(EXIT_BUDGET, 504, _is(), "store_unavailable"),
    "internal_error": Code(EXIT_INTERNAL, 500, _is("fallback"), "store_unavailable"),
    # HTTP-only: an unknown path or method on the gateway
    "not_found": Code(EXIT_USAGE, 404, _is(), None),
    "method_not_allowed": Code(EXIT_USAGE, 405, _is(), None),
    # HTTP-only: a connection did not deliver its whole request in time (gateway/uvicorn_adapter.py)
    "request_timeout": Code(EXIT_CONNECTIVITY, 408, _is("fallback"), None),
}


def codes_that(trait: str) -> frozenset[str]:
    """Every code with `trait` (a column of CODES)."""
    return frozenset(code for code, row in CODES.items() if trait in row.traits)


class MoonmindError(Exception):
    """A failure with a stable code and a remedy; never carries a secret.

    `MoonmindError(code, …)` is an instance of that code's class in the tree below (as httpx
    derives its exception tree): its exit class (`UsageError`, `ConfigError`, `ConnectivityError`,
    `BudgetError`, `InternalError`) and its traits (`TransientError`, `FallbackError`,
    `CallerError`), all derived from CODES, so callers catch by type: `except TransientError`.
    """

    def __new__(cls, code: str = "internal_error", *args: object, **details: object) -> "MoonmindError":
        if cls is MoonmindError:
            cls = _CLASSES.get(code, MoonmindError)
        return super().__new__(cls)

    def __init__(self, code: str, message: str, action: str, **details: object) -> None:
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.action = action
        self.details = details

    def __reduce__(self):  # pickled across processes (index workers) by its triple, whatever its class
        return (_rebuild, (self.code, self.message, self.action, self.details))

    @property
    def exit_code(self) -> int:
        return CODES[self.code][0]

    @property
    def http_status(self) -> int:
        return CODES[self.code][1]

    def envelope(self, secrets: list[str] | None = None) -> dict:
        body = {"code": self.code, "message": self.message, "action": self.action}
        if secrets:
            body = {k: redact(v, secrets) for k, v in body.items()}
        return {"error": body}


class UsageError(MoonmindError):
    """The caller's input or setting is wrong (exit 2)."""


class ConfigError(MoonmindError):
    """The deployment is not ready for the request: credentials, collection, store ownership (exit 3)."""


class ConnectivityError(MoonmindError):
    """A service did not answer, refused, or said no (exit 4)."""


class BudgetError(MoonmindError):
    """A latency, token or time budget ran out (exit 5)."""


class InternalError(MoonmindError):
    """A bug or an unexpected failure (exit 1)."""


class TransientError(MoonmindError):
    """The service may be back in a moment: a Celery write task retries it with backoff and jitter."""


class FallbackError(MoonmindError):
    """A gateway failure after which the CLI may retry direct."""


class CallerError(MoonmindError):
    """A gateway tells a remote caller this one as it is."""


_EXIT_CLASSES = {EXIT_USAGE: UsageError, EXIT_CONFIG: ConfigError, EXIT_CONNECTIVITY: ConnectivityError,
                 EXIT_BUDGET: BudgetError, EXIT_INTERNAL: InternalError}
_TRAIT_CLASSES = {"transient": TransientError, "fallback": FallbackError, "caller": CallerError}


def _class_for(code: str, row: Code) -> type[MoonmindError]:
    bases = (_EXIT_CLASSES[row.exit], *(_TRAIT_CLASSES[t] for t in sorted(row.traits)))
    name = "".join(part.capitalize() for part in code.split("_")) + "Error"
    return type(name, bases, {"__module__": __name__, "__doc__": f"The `{code}` error (errors.CODES)."})


#: code -> its class in the tree (e.g. "store_busy" -> StoreBusyError(ConfigError, TransientError)).
_CLASSES: dict[str, type[MoonmindError]] = {code: _class_for(code, row) for code, row in CODES.items()}


def _rebuild(code: str, message: str, action: str, details: dict) -> MoonmindError:
    return MoonmindError(code, message, action, **details)


def error_class(code: str) -> type[MoonmindError]:
    """The class a MoonmindError of `code` is an instance of."""
    return _CLASSES[code]


_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")

#: A credential passed as a URL query (or fragment) parameter: `?key=AIza...` (Gemini), `&api_key=`, `token=`,
#: `access_token=`, `password=`, `client_secret=`, `X-Amz-Signature=`, `sig=`... A name counts when it is one of
#: these words or ends in one after a `_`, `-` or `.` (so `monkey=` or `keyword=` do not). The value runs to the
#: next `&`, `#`, quote or whitespace; punctuation right before a space or the end (`...?key=x: cannot connect`)
#: is the sentence's, not the value's.
_SECRET_QUERY_PARAM = re.compile(
    r"(?P<name>[?&#](?:[\w.-]*[_.-])?(?:api_?key|key|token|password|passwd|pwd|pass|secret|signature|sig|auth))="
    r"[^&#\s\"'<>]+?(?=[.,;:)\]]*(?:[&#\s\"'<>]|$))",
    re.IGNORECASE,
)


def redact(text: str, secrets: list[str] | None = None) -> str:
    """Remove credentials from text: known secret values, `user:pass@` in URLs and secret query parameters.

    Why the URL shapes too: a URL is printed in connectivity errors, and its credentials
    are often not a configured secret value (a key pasted into QDRANT_URL's query).
    """
    out = _URL_CREDENTIALS.sub(r"\g<scheme>***@", text)
    out = _SECRET_QUERY_PARAM.sub(r"\g<name>=***", out)
    for s in secrets or ():
        if s:
            out = out.replace(s, "***")
    return out


def has_surrogate(text: str) -> bool:
    """True when `text` holds an unpaired surrogate: bytes that were not UTF-8 (argv decoded with
    surrogateescape, a JSON "\\udc80" escape), which neither the store nor a terminal can carry.
    (Strict UTF-8 encoding fails on exactly those, in C; this module is on every command's path.)"""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def disk_full(where: object, free: int, need: int | None, doing: str, said: str = "") -> MoonmindError:
    """`disk_full` for `doing` (e.g. "writing 64 chunks") at `where`: free and needed bytes, and what to do.

    `said`: the storage engine's own words, when it is the one that ran out of room.
    """
    need_s = f"; it needs about {_mib(need)}" if need else ""
    said_s = f" (the engine: {said})" if said else ""
    more = f" (at least {_mib(need - free, up=True)} more)" if need and need > free else ""
    return MoonmindError(
        "disk_full",
        f"No room for {doing} on the filesystem of {where}: {_mib(free)} free{need_s}{said_s}.",
        f"Free space on that filesystem{more}, or move MOONMIND_HOME (with what it holds) to one with room, then retry: "
        "what is stored is intact, and a new index run resumes where this one stopped.",
    )


#: What the storage engine says when it runs out of room (it raises a bare Exception: its text is all there is).
#: (Patterns, compiled on first use: this module is on every command's path.)
_NO_ROOM = r"No space left on device|Not enough space|Disk quota exceeded|os error (?:28|122)\b"
_NEEDED = r"needed: ([\d.]+) (KiB|MiB|GiB|B)\b"


def disk_full_from(exc: BaseException, where: object, doing: str) -> "MoonmindError | None":
    """`disk_full` for an exception that says the disk is full (ENOSPC/EDQUOT, or the engine's words), else None."""
    import errno

    if isinstance(exc, MoonmindError):
        return None
    if isinstance(exc, OSError):
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return None
        where = exc.filename or where
        return disk_full(where, free_bytes(where), None, doing)
    said = str(exc)
    if not re.search(_NO_ROOM, said):
        return None
    need = None
    m = re.search(_NEEDED, said)
    if m:
        need = int(float(m.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)])
    said = said.removeprefix("Service runtime error: ")
    return disk_full(where, free_bytes(where), need, doing, said=said[:300])


def free_bytes(where: object) -> int:
    """Bytes an unprivileged write may still take on the filesystem of `where` (its nearest existing parent)."""
    import os

    path = os.path.abspath(str(where))
    while True:
        try:
            st = os.statvfs(path)
            return st.f_bavail * st.f_frsize
        except OSError:
            parent = os.path.dirname(path)
            if parent == path:
                return 0
            path = parent


def _mib(n: int, up: bool = False) -> str:
    tenths = -(-n * 10 // (1 << 20)) if up else round(n * 10 / (1 << 20))  # up: never "0.0 MiB more"
    return f"{tenths / 10:.1f} MiB"


def invalid_query(message: str, action: str = "Fix the query or flags and retry.") -> MoonmindError:
    return MoonmindError("invalid_query", message, action)


class RagTaskError(Exception):
    """A Celery task's failure with the MoonmindError triple as its args (so JSON results carry it intact)."""

    def __init__(self, code: str, message: str, action: str) -> None:
        super().__init__(code, message, action)
        self.code, self.message, self.action = code, message, action

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class TransientTaskError(RagTaskError):
    """A task failure worth retrying (a `TransientError`): write tasks list it in `autoretry_for`."""


def task_error(err: MoonmindError) -> RagTaskError:
    """A MoonmindError as the exception a Celery task raises (transient ones are retried)."""
    kind = TransientTaskError if isinstance(err, TransientError) else RagTaskError
    return kind(err.code, err.message, err.action)
