"""Retry transient failures with exponential backoff and jitter; never retry auth or validation.

Why here: the embedder and the store both talk to remote services; one policy,
bounded by the caller's deadline, keeps their behaviour the same.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TypeVar

from .errors import MoonmindError

T = TypeVar("T")

#: Attempts for a transient failure (first try included).
MAX_ATTEMPTS = 4


def classify(exc: BaseException, what: str, service: str = "embedding", credential: str | None = None) -> tuple[bool, MoonmindError]:
    """(transient?, the user-facing error) for an exception from a remote call.

    `service` is "embedding" or "qdrant": it picks the code for server and connection failures.
    """
    failed = "qdrant_unreachable" if service == "qdrant" else "embedding_provider_error"
    where = "QDRANT_URL and that the Qdrant server is up" if service == "qdrant" else "the provider URL and network"
    if service == "qdrant":
        key_remedy = "Check QDRANT_API_KEY (read from the environment or .env): it must be a key of this Qdrant server."
        denied_remedy = "Use a QDRANT_API_KEY with access to this collection (read-write for index and overlay writes)."
    else:
        key_remedy = (f"Check {credential} (read from the environment or .env): it must be a key of this provider."
                      if credential else "Check the provider's API key (OPENAI_API_KEY for openai, GOOGLE_API_KEY for "
                      "google, COHERE_API_KEY for cohere; read from the environment or .env).")
        denied_remedy = "Ask the provider for access to this model, or configure another model."
    if isinstance(exc, MoonmindError):
        return False, exc
    if isinstance(exc.__cause__, MoonmindError):  # raised where a client library read the answer, wrapped by it
        return False, exc.__cause__
    name = type(exc).__name__
    kinds = _library_errors()
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    text = str(exc).lower()
    if status == 429 or isinstance(exc, kinds["rate"]):
        if "quota" in text or "insufficient_quota" in text or "exhausted" in text:
            return False, MoonmindError(
                "quota_exhausted",
                f"{what}: the provider reports the quota is exhausted (HTTP 429).",
                "Wait for the quota to reset, raise it with the provider, or switch provider/model.",
            )
        return True, MoonmindError(failed, f"{what}: rate limited (HTTP 429).", "Retry later or lower the request rate.")
    if status in (401,) or isinstance(exc, kinds["auth"]):
        return False, MoonmindError(
            "unauthenticated", f"{what}: the credential was rejected (HTTP 401).", key_remedy
        )
    if status in (403,) or isinstance(exc, kinds["denied"]):
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
    if isinstance(exc, kinds["connect"]):
        return True, MoonmindError(failed, f"{what}: cannot connect ({name}).", f"Check {where}, then retry.")
    return False, MoonmindError(failed, f"{what}: failed ({name}).", f"Check {where}.")


def _library_errors() -> dict[str, tuple[type[BaseException], ...]]:
    """The client libraries' exception types by what they mean, for those this process has loaded.

    Why `sys.modules`: an exception from a library means the library is loaded; one that is not
    cannot have raised anything, and importing it here would cost every process its import.
    """
    rate: list[type[BaseException]] = []
    auth: list[type[BaseException]] = []
    denied: list[type[BaseException]] = []
    connect: list[type[BaseException]] = [ConnectionError, TimeoutError]
    openai = sys.modules.get("openai")
    if openai is not None:
        rate.append(openai.RateLimitError)
        auth.append(openai.AuthenticationError)
        denied.append(openai.PermissionDeniedError)
        connect.append(openai.APIConnectionError)  # APITimeoutError derives from it
    httpx = sys.modules.get("httpx")
    if httpx is not None:
        connect.append(httpx.TransportError)  # connect, read, write and pool timeouts and errors
    qdrant = sys.modules.get("qdrant_client.http.exceptions")
    if qdrant is not None:
        connect.append(qdrant.ResponseHandlingException)
    grpc = sys.modules.get("grpc")
    if grpc is not None:
        connect.append(grpc.RpcError)
    return {"rate": tuple(rate), "auth": tuple(auth), "denied": tuple(denied), "connect": tuple(connect)}


def call_with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    service: str = "embedding",
    deadline: float | None = None,
    attempts: int = MAX_ATTEMPTS,
    credential: str | None = None,
) -> T:
    """Call fn, retrying transient failures; raise a MoonmindError naming attempts when they run out."""
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_before_delay, wait_random_exponential

    stop: Any = stop_after_attempt(attempts)
    if deadline is not None:
        stop = stop | stop_before_delay(max(deadline - time.monotonic(), 0.0))
    count = 0

    def transient(exc: BaseException) -> bool:
        return classify(exc, what, service, credential)[0]

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
        _, err = classify(exc, what, service, credential)
        if count > 1:
            err.message = f"{err.message} Gave up after {count} attempts."
        if deadline is not None and count < attempts and classify(exc, what, service, credential)[0]:
            err.message = f"{err.message} Retries stopped at the caller's latency budget."
        err.details["attempts"] = count
        err.args = (err.message,)
        raise err from None
    raise AssertionError("unreachable")
