"""Errors users see: a stable code, what is wrong, what to do, and an exit code.

Every failure that reaches a user is a `MoonmindError`; entry points turn it into
the `{"error": {"code", "message", "action"}}` envelope (spec 04) and exit with
the documented code of its class. Anything else is an internal error.
"""

from __future__ import annotations

import re

#: Exit code per class of failure (documented in the README).
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_CONNECTIVITY = 4
EXIT_BUDGET = 5

#: code -> (exit code, HTTP status used by the gateway)
CODES: dict[str, tuple[int, int]] = {
    "invalid_query": (EXIT_USAGE, 400),
    "invalid_argument": (EXIT_USAGE, 400),
    "path_outside_workspace": (EXIT_USAGE, 400),
    # a setting (environment, .env or keyword) breaks its rule; HTTP 500: on a server it is the operator's
    "invalid_setting": (EXIT_USAGE, 500),
    "missing_credentials": (EXIT_CONFIG, 500),
    "collection_missing": (EXIT_CONFIG, 500),
    "embedding_dimension_mismatch": (EXIT_CONFIG, 500),
    "embedding_model_mismatch": (EXIT_CONFIG, 500),
    "schema_unsupported": (EXIT_CONFIG, 500),
    "store_busy": (EXIT_CONFIG, 503),
    "qdrant_unreachable": (EXIT_CONNECTIVITY, 500),
    "unauthenticated": (EXIT_CONNECTIVITY, 401),
    "forbidden": (EXIT_CONNECTIVITY, 403),
    "embedding_provider_error": (EXIT_CONNECTIVITY, 500),
    "quota_exhausted": (EXIT_CONNECTIVITY, 429),
    "broker_unreachable": (EXIT_CONNECTIVITY, 503),
    "worker_unavailable": (EXIT_CONNECTIVITY, 503),
    # the local process that owns the embedded store stopped answering (owner/client.py)
    "owner_unresponsive": (EXIT_CONNECTIVITY, 503),
    "job_blocked": (EXIT_CONFIG, 503),
    "retrieval_failed": (EXIT_CONNECTIVITY, 500),
    "latency_budget_exceeded": (EXIT_BUDGET, 408),
    "token_budget_exceeded": (EXIT_BUDGET, 413),
    "task_timeout": (EXIT_BUDGET, 504),
    "internal_error": (EXIT_INTERNAL, 500),
    # HTTP-only: an unknown path or method on the gateway
    "not_found": (EXIT_USAGE, 404),
    "method_not_allowed": (EXIT_USAGE, 405),
    # HTTP-only: a connection did not deliver its whole request in time (gateway_http.py)
    "request_timeout": (EXIT_CONNECTIVITY, 408),
}


class MoonmindError(Exception):
    """A failure with a stable code and a remedy; never carries a secret."""

    def __init__(self, code: str, message: str, action: str, **details: object) -> None:
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.action = action
        self.details = details

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


def invalid_query(message: str, action: str = "Fix the query or flags and retry.") -> MoonmindError:
    return MoonmindError("invalid_query", message, action)
