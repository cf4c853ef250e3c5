"""The RetrievalGateway: the retrieval-only HTTP service (FastAPI app factory).

A thin adapter around `pipeline.retrieve_context_pack`, the same function the
CLI calls, so both transports return the same pack. It adds only what the
network needs: bearer-token auth and scope (auth.py), the error envelope with
the status codes docs/gateway.md lists, and server-side timing. No generative model is called.

Errors: 400 invalid_query, 401 unauthenticated, 403 forbidden, 408
latency_budget_exceeded, 413 token_budget_exceeded, 500 retrieval_failed, all
as `{"error": {"code", "message", "action"}}`; budget errors add `usage` and
`budget` (budget_type / budget_limit / budget_spent). Server-side failures are
logged in full on the gateway and reported to the caller as retrieval_failed
with a remedy, never with exception text, names or secrets (envelope.py).

`create_app` only wires: the shared state (state.py, handed to routes by
`Depends`), the exception handlers (envelope.py), and the routers: routes.py
(context, health, live), navigation.py (related, symbols), status.py (status
page, badge) and docs.py (/docs, /redoc).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.utils import get_openapi
from starlette.concurrency import run_in_threadpool

from ..contracts import RetrievalQuery
from ..errors import MoonmindError
from ..settings import Settings, get_settings
from ..store import Store
from . import navigation, routes, status
from .auth import TokenRegistry
from .docs import add_docs
from .envelope import CALLER_CODES, HANDLERS
from .state import Gateway

if TYPE_CHECKING:
    from .balance import Balancer

__all__ = ["CALLER_CODES", "create_app", "default_concurrency", "log"]

log = logging.getLogger("moonmind.gateway")


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
    settings = settings or get_settings()
    gateway = Gateway.create(settings, registry or TokenRegistry(settings.tokens_file),
                             concurrency or default_concurrency(settings), store, balancer)
    app = FastAPI(
        title="MoonMind RetrievalGateway",
        version="1",
        description="Retrieval-only: embed → Qdrant → ContextPack. No generative model is ever called.",
        lifespan=lifespan,
        docs_url=None,  # served by docs.add_docs from package assets: FastAPI's pages load them from a CDN
        redoc_url=None,
    )
    app.state.gateway = gateway  # what the routes' `Depends(state.gateway)` hands them
    app.state.registry = gateway.registry
    app.state.settings = settings

    app.add_middleware(_StatusCounter, balancer=balancer)
    for exc_class, handler in HANDLERS:
        app.exception_handler(exc_class)(handler)

    app.include_router(routes.search)  # POST /retrieval/context
    app.include_router(navigation.router)  # POST /retrieval/related, /retrieval/symbols
    app.include_router(routes.probes)  # GET /retrieval/health, /retrieval/live
    app.include_router(status.router)  # GET /retrieval/status, /retrieval/status.html, /retrieval/badge.svg
    add_docs(app)  # GET /docs, /redoc and their assets

    app.openapi = partial(openapi, app)  # type: ignore[method-assign]
    return app


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Load the model and open the store before the first request; SIGHUP reloads the tokens; close all at exit."""
    from .. import runtime

    gateway: Gateway = app.state.gateway
    try:
        await run_in_threadpool(gateway.resources)
    except MoonmindError as err:
        log.error("gateway starting without a usable store/embedder: [%s] %s", err.code, err.message)
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        try:
            loop.add_signal_handler(signal.SIGHUP, gateway.registry.reload)
        except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - non-Unix
            pass
    yield
    runtime.close_all()
    gateway.close()


def openapi(app: FastAPI) -> dict:
    """FastAPI's schema, plus the RetrievalQuery body the POST routes read themselves and the bearer scheme."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        query_schema = RetrievalQuery.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {})
        components.setdefault("schemas", {}).update(query_schema.pop("$defs", {}))
        components["schemas"]["RetrievalQuery"] = query_schema
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = jsonable_encoder(schema)
    return app.openapi_schema


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
