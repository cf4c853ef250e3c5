"""The gateway's error envelope: how a failure becomes `{"error": {"code", "message", "action"}}`.

One rule for every route (app.py registers the handlers, routes.py and navigation.py answer
pipeline failures through `error_response(as_caller_error(err))`), and the bounded body reader
every POST route parses its RetrievalQuery from.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Awaitable, Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..contracts import ErrorEnvelope
from ..errors import MoonmindError, codes_that, invalid_query

log = logging.getLogger("moonmind.gateway")

#: Largest request body accepted (a query is at most a few KB; anything bigger is refused as invalid).
MAX_BODY_BYTES = 64 * 1024
#: Codes from the pipeline that reach the caller as they are; every other failure is retrieval_failed.
CALLER_CODES = codes_that("caller")  # a column of errors.CODES

ERRORS = {
    400: "invalid_query: empty query, bad overlay policy, unknown or bad filters, top_k outside 1-50, malformed JSON; "
         "invalid_argument: a cursor that is malformed or belongs to another search",
    401: "unauthenticated: missing or invalid bearer token",
    403: "forbidden: repo/tenant outside the token's allow-list, or top_k above its limit",
    408: "latency_budget_exceeded: budgets.latency_ms spent; `usage` carries the actual latency",
    413: "token_budget_exceeded: budgets.tokens cannot hold one full-size chunk; `usage`/`budget` say by how much",
    500: "retrieval_failed: store or embedding provider unavailable; `action` says what to do",
}
#: The documented error answers of the POST routes (OpenAPI `responses`).
RESPONSES: dict[int | str, dict[str, Any]] = {code: {"model": ErrorEnvelope, "description": text}
                                              for code, text in ERRORS.items()}


def error_response(err: MoonmindError, status: int | None = None) -> JSONResponse:
    body: dict[str, Any] = err.envelope()
    usage = err.details.get("usage")
    if isinstance(usage, dict):
        body["usage"] = usage
    if "budget_type" in err.details:
        body["budget"] = {k: err.details[k] for k in ("budget_type", "budget_limit", "budget_spent")}
    headers = {"WWW-Authenticate": "Bearer"} if err.code == "unauthenticated" else None
    return JSONResponse(body, status_code=status or err.http_status, headers=headers)


def as_caller_error(err: MoonmindError) -> MoonmindError:
    """What a pipeline failure may tell a remote caller: budget/query errors as they are, the rest generic."""
    if err.code in CALLER_CODES:
        return err
    log.error("retrieval failed: [%s] %s | %s", err.code, err.message, err.action)
    return MoonmindError(
        "retrieval_failed",
        f"Retrieval failed on the gateway ({err.code}).",
        "Retry shortly; if it persists, ask the gateway operator to run `moonmind worker doctor` on the gateway "
        "host (details are in the gateway log).",
    )


def internal() -> MoonmindError:
    return MoonmindError(
        "retrieval_failed",
        "Retrieval failed on the gateway (internal error).",
        "Retry shortly; if it persists, report it to the gateway operator (details are in the gateway log).",
    )


# ------------------------------------------------ exception handlers ---


async def on_moonmind_error(request: Request, err: MoonmindError) -> JSONResponse:
    return error_response(err)


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(invalid_query("Invalid request.", "Fix the request fields and retry."))


async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        err = MoonmindError("method_not_allowed", f"Method not allowed on this path (allowed: {allow or 'none'}).",
                            "See /docs for the API.")
        response = error_response(err, 405)
        if allow:
            response.headers["Allow"] = allow
        return response
    elif exc.status_code == 404:
        err = MoonmindError("not_found", "No such path.",
                            "The API is POST /retrieval/context (and /retrieval/related, /retrieval/symbols), "
                            "GET /retrieval/health (readiness), GET /retrieval/live (liveness) and "
                            "GET /retrieval/status (also .html, and the badge.svg); see /docs or /redoc.")
    else:
        err = invalid_query("Bad request.", "See /docs for the API.")
    return error_response(err, exc.status_code)


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error")
    return error_response(internal())


#: What create_app registers, in this order.
HANDLERS: tuple[tuple[type[Exception], Callable[..., Awaitable[JSONResponse]]], ...] = (
    (MoonmindError, on_moonmind_error),
    (RequestValidationError, on_validation_error),
    (StarletteHTTPException, on_http_error),
    (Exception, on_unexpected),
)


async def read_json(request: Request) -> dict:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise invalid_query(f"Request body over {MAX_BODY_BYTES} bytes.", "Send a shorter query.")
    parts, size = [], 0
    try:
        async for chunk in request.stream():  # bounded even when no Content-Length is declared
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise invalid_query(f"Request body over {MAX_BODY_BYTES} bytes.", "Send a shorter query.")
            parts.append(chunk)
    except ClientDisconnect:  # gone, or cut off by the read deadline (uvicorn_adapter.py): nobody to answer
        raise MoonmindError("request_timeout", "The client went away before its request arrived whole.",
                            "Send the whole request at once.") from None
    body = b"".join(parts)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise invalid_query("The request body is not valid JSON.", "Send a RetrievalQuery as a JSON object.") from None
    except RecursionError:  # JSON nested ~1,000 deep; no RetrievalQuery nests more than 3
        raise invalid_query("The request body nests too deeply to be a RetrievalQuery.",
                            "Send a RetrievalQuery as a JSON object.") from None
    if not isinstance(data, dict):
        raise invalid_query("The request body must be a JSON object.", "Send a RetrievalQuery as a JSON object.")
    return data
