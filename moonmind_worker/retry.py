"""Retry transient failures with exponential backoff and jitter; never retry auth or validation.

Why here: the embedder and the store both talk to remote services; one policy,
bounded by the caller's deadline, keeps their behaviour the same.
"""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

from .errors import MoonmindError

T = TypeVar("T")

#: Attempts for a transient failure (first try included).
MAX_ATTEMPTS = 4


def classify(exc: BaseException, what: str, service: str = "embedding") -> tuple[bool, MoonmindError]:
    """(transient?, the user-facing error) for an exception from a remote call.

    `service` is "embedding" or "qdrant": it picks the code for server and connection failures.
    """
    failed = "qdrant_unreachable" if service == "qdrant" else "embedding_provider_error"
    where = "QDRANT_URL and that the Qdrant server is up" if service == "qdrant" else "the provider URL and network"
    if service == "qdrant":
        key_remedy = "Check QDRANT_API_KEY (read from the environment or .env): it must be a key of this Qdrant server."
        denied_remedy = "Use a QDRANT_API_KEY with access to this collection (read-write for index and overlay writes)."
    else:
        key_remedy = ("Check the provider's API key (OPENAI_API_KEY for openai, GOOGLE_API_KEY for google; "
                      "read from the environment or .env).")
        denied_remedy = "Ask the provider for access to this model, or configure another model."
    if isinstance(exc, MoonmindError):
        return False, exc
    name = type(exc).__name__
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    text = str(exc).lower()
    if status == 429 or name == "RateLimitError":
        if "quota" in text or "insufficient_quota" in text or "exhausted" in text:
            return False, MoonmindError(
                "quota_exhausted",
                f"{what}: the provider reports the quota is exhausted (HTTP 429).",
                "Wait for the quota to reset, raise it with the provider, or switch provider/model.",
            )
        return True, MoonmindError(failed, f"{what}: rate limited (HTTP 429).", "Retry later or lower the request rate.")
    if status in (401,) or name == "AuthenticationError":
        return False, MoonmindError(
            "unauthenticated", f"{what}: the credential was rejected (HTTP 401).", key_remedy
        )
    if status in (403,) or name == "PermissionDeniedError":
        return False, MoonmindError(
            "forbidden", f"{what}: access denied (HTTP 403).", denied_remedy
        )
    if isinstance(status, int) and status >= 500:
        return True, MoonmindError(
            failed, f"{what}: server error (HTTP {status}).", "Retry later; check the provider's status."
        )
    if isinstance(status, int) and 400 <= status < 500:
        if service == "qdrant":
            return False, MoonmindError(
                "retrieval_failed", f"{what}: request rejected (HTTP {status}).",
                "Check the collection name and that it was created by moonmind (`moonmind worker doctor`).",
            )
        return False, MoonmindError(
            "embedding_provider_error",
            f"{what}: request rejected (HTTP {status}).",
            "Check the model name and dimensions configured for this provider.",
        )
    connect_names = ("APIConnectionError", "APITimeoutError", "ConnectError", "ConnectTimeout", "ReadTimeout",
                     "ResponseHandlingException", "RpcError", "_InactiveRpcError")
    if name in connect_names or isinstance(exc, (ConnectionError, TimeoutError)):
        return True, MoonmindError(failed, f"{what}: cannot connect ({name}).", f"Check {where}, then retry.")
    return False, MoonmindError(failed, f"{what}: failed ({name}).", f"Check {where}.")


def call_with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    service: str = "embedding",
    deadline: float | None = None,
    attempts: int = MAX_ATTEMPTS,
) -> T:
    """Call fn, retrying transient failures; raise a MoonmindError naming attempts when they run out."""
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_before_delay, wait_random_exponential

    stop: Any = stop_after_attempt(attempts)
    if deadline is not None:
        stop = stop | stop_before_delay(max(deadline - time.monotonic(), 0.0))
    count = 0

    def transient(exc: BaseException) -> bool:
        return classify(exc, what, service)[0]

    try:
        for attempt in Retrying(
            stop=stop, wait=wait_random_exponential(multiplier=0.2, max=4.0), retry=retry_if_exception(transient),
            reraise=True,
        ):
            with attempt:
                count += 1
                return fn()
    except MoonmindError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes an actionable error
        _, err = classify(exc, what, service)
        if count > 1:
            err.message = f"{err.message} Gave up after {count} attempts."
        if deadline is not None and count < attempts and classify(exc, what, service)[0]:
            err.message = f"{err.message} Retries stopped at the caller's latency budget."
        err.details["attempts"] = count
        err.args = (err.message,)
        raise err from None
    raise AssertionError("unreachable")
