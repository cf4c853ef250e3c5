"""The RetrievalGateway: the retrieval-only HTTP service (FastAPI app factory).

A thin adapter around `pipeline.retrieve_context_pack`, the same function the
CLI calls, so both transports return the same pack. It adds only what the
network needs: bearer-token auth and scope (auth.py), the error envelope with
the status codes docs/gateway.md lists, and server-side timing. No generative model is called.

Errors: 400 invalid_query, 401 unauthenticated, 403 forbidden, 408
latency_budget_exceeded, 413 token_budget_exceeded, 500 retrieval_failed, all
as `{"error": {"code", "message", "action"}}`; budget errors add `usage` and
`budget` (budget_type / budget_limit / budget_spent). Server-side failures are
logged in full here and reported to the caller as retrieval_failed with a
remedy, never with exception text, names or secrets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .. import observe
from ..contracts import ContextPack, ErrorEnvelope, HealthStatus, RetrievalQuery, parse_query
from ..errors import CODES, MoonmindError, codes_that, invalid_query
from ..retrieval import paging
from ..settings import Settings, get_settings
from ..store import Store
from .auth import TokenRegistry, authorize

if TYPE_CHECKING:


    from ..owner.client import Owner
    from .balance import Balancer

log = logging.getLogger("moonmind.gateway")

#: Largest request body accepted (a query is at most a few KB; anything bigger is refused as invalid).
MAX_BODY_BYTES = 64 * 1024
#: Codes from the pipeline that reach the caller as they are; every other failure is retrieval_failed.
CALLER_CODES = codes_that("caller")  # a column of errors.CODES
HEALTH_TTL_S = 1.0
#: Retry-After (seconds) on a 503 from /retrieval/health while the collection does not exist yet.
NOT_READY_RETRY_S = 10

_ERRORS = {
    400: "invalid_query: empty query, bad overlay policy, unknown or bad filters, top_k outside 1-50, malformed JSON; "
         "invalid_argument: a cursor that is malformed or belongs to another search",
    401: "unauthenticated: missing or invalid bearer token",
    403: "forbidden: repo/tenant outside the token's allow-list, or top_k above its limit",
    408: "latency_budget_exceeded: budgets.latency_ms spent; `usage` carries the actual latency",
    413: "token_budget_exceeded: budgets.tokens cannot hold one full-size chunk; `usage`/`budget` say by how much",
    500: "retrieval_failed: store or embedding provider unavailable; `action` says what to do",
}


def _error_response(err: MoonmindError, status: int | None = None) -> JSONResponse:
    body: dict[str, Any] = err.envelope()
    usage = err.details.get("usage")
    if isinstance(usage, dict):
        body["usage"] = usage
    if "budget_type" in err.details:
        body["budget"] = {k: err.details[k] for k in ("budget_type", "budget_limit", "budget_spent")}
    headers = {"WWW-Authenticate": "Bearer"} if err.code == "unauthenticated" else None
    return JSONResponse(body, status_code=status or err.http_status, headers=headers)


def _as_caller_error(err: MoonmindError) -> MoonmindError:
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


def _internal() -> MoonmindError:
    return MoonmindError(
        "retrieval_failed",
        "Retrieval failed on the gateway (internal error).",
        "Retry shortly; if it persists, report it to the gateway operator (details are in the gateway log).",
    )


def default_concurrency(settings: Settings) -> int:
    """How many retrievals run at once: 1 with the in-process static embedder, 16 with a hosted one.

    Why 1: a static-model retrieval is CPU work under the GIL (Qdrant Edge's binding holds it
    during a query), so a second thread only adds switching and lowers throughput (BENCHMARKS.md,
    "Gateway throughput").
    A hosted embedder spends most of a retrieval waiting on the network, so requests overlap.
    """
    return 1 if settings.embedding_provider == "static" else 16


def create_app(
    settings: Settings | None = None,
    registry: TokenRegistry | None = None,
    concurrency: int | None = None,
    store: Store | None = None,
    balancer: Balancer | None = None,
) -> FastAPI:
    """The gateway app. Reads the token file at creation (a broken file fails start-up, not requests).

    `concurrency` bounds simultaneous retrievals (default: `default_concurrency`); requests
    beyond it wait in the event loop, which stays free for health checks and new connections
    (between retrievals, when one retrieval at a time runs on the loop itself).
    `store` replaces the configured one (a worker's replica, see `serve`); it is closed with the app,
    as is `balancer` (a `balance.Balancer`: this worker's share of keep-alive connections).
    """
    from .. import runtime

    settings = settings or get_settings()
    registry = registry or TokenRegistry(settings.tokens_file)
    health_cache: dict[str, Any] = {"at": 0.0, "value": None}
    health_lock = threading.Lock()

    def resources():
        return runtime.get_embedder(settings), store or runtime.get_store(settings)

    # a worker's replica is this process's own; otherwise another process may own the embedded store
    resources.box_owner = (lambda: None) if store is not None else (lambda: box_owner(settings))  # type: ignore[attr-defined]

    retrievals = anyio.CapacityLimiter(concurrency or default_concurrency(settings))
    on_loop = retrievals.total_tokens == 1 and settings.embedding_provider == "static" and settings.embedded_store

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            await run_in_threadpool(resources)  # load the model and open the store before the first request
        except MoonmindError as err:
            log.error("gateway starting without a usable store/embedder: [%s] %s", err.code, err.message)
        loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            try:
                loop.add_signal_handler(signal.SIGHUP, registry.reload)
            except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - non-Unix
                pass
        yield
        runtime.close_all()
        if store is not None:
            store.close()
        if balancer is not None:
            balancer.close()

    app = FastAPI(
        title="MoonMind RetrievalGateway",
        version="1",
        description="Retrieval-only: embed → Qdrant → ContextPack. No generative model is ever called.",
        lifespan=lifespan,
        docs_url=None,  # served by _add_docs from package assets: FastAPI's pages load them from a CDN
        redoc_url=None,
    )
    app.state.registry = registry
    app.state.settings = settings

    app.add_middleware(_StatusCounter, balancer=balancer)

    @app.exception_handler(MoonmindError)
    async def _moonmind_error(request: Request, err: MoonmindError) -> JSONResponse:
        return _error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(invalid_query("Invalid request.", "Fix the request fields and retry."))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            err = MoonmindError("method_not_allowed", f"Method not allowed on this path (allowed: {allow or 'none'}).",
                                "See /docs for the API.")
            response = _error_response(err, 405)
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
        return _error_response(err, exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return _error_response(_internal())

    responses: dict[int | str, dict[str, Any]] = {code: {"model": ErrorEnvelope, "description": text} for code, text in _ERRORS.items()}

    @app.post(
        "/retrieval/context",
        response_model=ContextPack,
        responses=responses,
        summary="Retrieve a context pack",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RetrievalQuery"}}},
            },
            "security": [{"bearer": []}],
        },
    )
    async def retrieval_context(request: Request) -> Response:
        """The same pack `moonmind rag search` builds, with transport "gateway" and server-measured latency."""
        started = time.monotonic()
        grant = registry.authenticate(request.headers.get("authorization"))
        query = parse_query(await _read_json(request), fields="json")  # remedies name the body's fields, not CLI flags
        query, scope = authorize(grant, query.model_copy(update={"transport": "gateway"}), settings.top_k)
        paging.read(query)  # a bad cursor is the caller's 400 invalid_argument, not a failed retrieval
        try:
            if on_loop:
                # pure CPU, one at a time: a worker thread would only add GIL hand-offs with the loop,
                # which costs throughput. The limiter keeps
                # arrivals in order; yielding after each lets health checks and new connections in.
                async with retrievals:
                    pack = _retrieve(settings, resources, query, scope, started)
                    await asyncio.sleep(0)
            else:
                pack = await anyio.to_thread.run_sync(_retrieve, settings, resources, query, scope, started, limiter=retrievals)
        except MoonmindError as err:
            return _error_response(_as_caller_error(err))
        app.state.last_retrieval = pack.retrieved_at  # the status page's "last retrieval"
        return Response(pack.model_dump_json(), media_type="application/json")

    from .navigation import add_navigation  # POST /retrieval/related and /retrieval/symbols

    add_navigation(app, settings, registry, resources, retrievals, responses, _as_caller_error, _error_response, _read_json)

    async def cached_health() -> tuple[str | None, MoonmindError | None]:
        """`_health`, checked at most once per HEALTH_TTL_S (health probes and badges may poll often)."""
        now = time.monotonic()
        with health_lock:
            fresh = now - health_cache["at"] < HEALTH_TTL_S
            cached: tuple[str | None, MoonmindError | None] | None = health_cache["value"] if fresh else None
        if cached is None:
            cached = await run_in_threadpool(_health, settings, resources)
            with health_lock:
                health_cache.update(at=time.monotonic(), value=cached)
        return cached

    @app.get(
        "/retrieval/health",
        response_model=HealthStatus,
        responses={503: {"model": HealthStatus, "description": "store or embedder unusable; `reason` says which"}},
        summary="Is retrieval available?",
    )
    async def retrieval_health(request: Request) -> JSONResponse:
        """`ok`, or 503 with a coarse reason. Callers with a valid token also get the operator's remedy."""
        reason, err = await cached_health()
        if reason is None:
            return JSONResponse({"status": "ok"})
        body: dict[str, Any] = {
            "status": "unavailable",
            "reason": reason,
            "error": {
                "code": "retrieval_failed",
                "message": f"Retrieval is unavailable ({reason}).",
                "action": "Ask the gateway operator to run `moonmind worker doctor` on the gateway host.",
            },
        }
        if err is not None and request.headers.get("authorization"):
            try:
                registry.authenticate(request.headers.get("authorization"))
                body["error"] = err.envelope(settings.secrets())["error"]
            except MoonmindError:
                pass
        # "up, no collection yet" is a wait, not a failure: Retry-After says when to look again
        headers = {"Retry-After": str(NOT_READY_RETRY_S)} if reason == "collection_not_ready" else None
        return JSONResponse(body, status_code=503, headers=headers)

    @app.get("/retrieval/live", response_model=Liveness, summary="Is the gateway process up?")
    async def retrieval_live() -> JSONResponse:
        """200 whenever this process serves HTTP, with or without a collection (an orchestrator's liveness probe).

        `/retrieval/health` is readiness (`ok` only when a search can be served); a fresh
        stack is live but not ready until the first `rag index`.
        """
        return JSONResponse({"status": "up"})

    from .status import add_status  # GET /retrieval/status, /retrieval/status.html, /retrieval/badge.svg

    add_status(app, settings, registry, resources, cached_health)
    _add_docs(app)

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            query_schema = RetrievalQuery.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(query_schema.pop("$defs", {}))
            components["schemas"]["RetrievalQuery"] = query_schema
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            app.openapi_schema = jsonable_encoder(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


class _StatusCounter:
    """rag.gateway.requests.<status>: one counter per HTTP status (low cardinality), 500 for crashes.

    A plain ASGI middleware: Starlette's BaseHTTPMiddleware (`@app.middleware`) wraps every
    response in an extra task and stream, which cost more than the counter is worth. With a
    balancer it also marks a response `Connection: close` when this worker should shed one.
    """

    def __init__(self, app, balancer=None) -> None:
        self.app = app
        self.balancer = balancer

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from ..observe import metrics

        status = 500

        async def send_counted(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if self.balancer is not None and self.balancer.should_close():
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        except Exception:
            metrics.incr("rag.gateway.requests.500")
            raise
        metrics.incr(f"rag.gateway.requests.{status}")


async def _read_json(request: Request) -> dict:
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


def box_owner(settings: Settings) -> Owner | None:
    """The box's owner of the embedded store when it is not this gateway (a Celery worker started first).

    Then retrievals go through it, confined to the token's scope as here. When that owner has
    gone, this gateway takes the store and serves the box itself (None: search here).
    """
    if not settings.embedded_store:
        return None
    from ..owner.client import connect
    from ..owner.server import current_server, serve_store

    if current_server() is not None:
        return None
    owner = connect(settings.data_dir, settings.collection)
    if owner is not None:
        return owner
    try:
        serve_store(settings, role="gateway")
        return None
    except MoonmindError:
        return connect(settings.data_dir, settings.collection)


def _through_owner(owner: Owner, settings: Settings, query: RetrievalQuery, scope) -> ContextPack:
    """One retrieval run by the box's owner with this gateway's settings and the token's scope."""
    args: dict[str, Any] = {"query": query.model_dump(mode="json"), "record": False, "transport": "gateway"}
    if scope is not None:
        args["scope"] = {"repos": list(scope.repos), "tenants": list(scope.tenants)}
    budget = query.budgets.latency_ms if query.budgets else None
    data = owner.call("search", args, settings=settings.wire(), timeout_s=None if budget is None else budget / 1000 + 1)
    return ContextPack.model_validate(data)


def _retrieve(settings: Settings, resources, query: RetrievalQuery, scope, started: float) -> ContextPack:
    from ..retrieval.pipeline import retrieve_context_pack
    from .forward import via_box_owner

    try:
        served = via_box_owner(resources, lambda owner: _through_owner(owner, settings, query, scope))
        if served is not None:
            return served
        embedder, store = resources()
        # the calling worker caches the pack with its own run's artifacts (transports/gateway.py); here it
        # would land on the gateway host, where no run's "Context used" is read
        with observe.no_artifacts():
            pack = retrieve_context_pack(query, settings=settings, embedder=embedder, store=store, scope=scope, started=started)
        from ..owner.freshness import annotate

        return annotate(pack, settings)  # as the owner's search says it (owner/ops.py)
    except MoonmindError:
        raise
    except Exception:  # noqa: BLE001 - logged here, generic for the caller
        log.exception("unexpected error in the retrieval pipeline")
        raise _internal() from None


class Liveness(BaseModel):
    """`GET /retrieval/live`: the process is up (whether or not retrieval is ready)."""

    status: Literal["up"]


#: Where the docs pages' assets come from: the `fastapi-offline` wheel's static files (Swagger UI,
#: ReDoc, favicon; MIT/Apache-2.0), served by this app, so /docs and /redoc work offline.
DOCS_ASSETS = "/docs/assets"


def docs_assets_dir() -> Path | None:
    """The directory of the packaged Swagger UI / ReDoc files, found without importing the package."""
    import importlib.util

    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    static = Path(next(iter(spec.submodule_search_locations))) / "static"
    return static if (static / "swagger-ui-bundle.js").is_file() else None


def _add_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc from package assets, never a CDN (FastAPI's own pages are blank offline)."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    assets = docs_assets_dir()
    if assets is None:  # pragma: no cover - a broken install; the API itself still works
        log.warning("Swagger UI / ReDoc assets not found (package fastapi-offline); /docs and /redoc are off")
        return
    app.mount(DOCS_ASSETS, StaticFiles(directory=assets), name="docs-assets")

    def base(request: Request) -> str:
        return request.scope.get("root_path", "").rstrip("/")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> Response:
        root = base(request)
        return get_swagger_ui_html(
            openapi_url=root + (app.openapi_url or ""), title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> Response:
        root = base(request)
        return get_redoc_html(
            openapi_url=root + (app.openapi_url or ""), title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js", redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )




def _health(settings: Settings, resources) -> tuple[str | None, MoonmindError | None]:
    from ..store.guardrails import check_collection

    try:
        owner = resources.box_owner()
        if owner is not None:
            failed = [c for c in owner.call("checks", {}, settings=settings.wire(), timeout_s=30.0)
                      if c.get("required", True) and not c.get("ok")]
            if not failed:
                return None, None
            code = failed[0].get("code") if failed[0].get("code") in CODES else "internal_error"
            err = MoonmindError(code, failed[0]["detail"], failed[0].get("remedy", ""))
            log.warning("health check failed on the box's owner: [%s] %s", err.code, err.message)
            return CODES[err.code].health or "store_unavailable", err
        embedder, store = resources()
        check_collection(store, embedder)
        return None, None
    except MoonmindError as err:
        log.warning("health check failed: [%s] %s", err.code, err.message)
        return CODES[err.code].health or "store_unavailable", err  # coarse: never the collection or the exception
    except Exception:  # noqa: BLE001
        log.exception("health check failed")
        return "internal_error", _internal()
