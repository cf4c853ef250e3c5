"""POST /retrieval/context (`search`), GET /retrieval/health and /retrieval/live (`probes`).

A thin adapter around `pipeline.retrieve_context_pack`, the same function the CLI calls, so
both transports return the same pack; the app's shared state comes from `state.GatewayDep`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Literal

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from .. import observe
from ..contracts import ContextPack, HealthStatus, RetrievalQuery, parse_query
from ..errors import MoonmindError
from ..retrieval import paging
from ..settings import Settings
from .auth import authorize
from .envelope import RESPONSES, as_caller_error, error_response, internal, read_json
from .state import GatewayDep, Resources

if TYPE_CHECKING:
    from ..owner.client import Owner

log = logging.getLogger("moonmind.gateway")

#: Retry-After (seconds) on a 503 from /retrieval/health while the collection does not exist yet.
NOT_READY_RETRY_S = 10

search = APIRouter()
probes = APIRouter()


class Liveness(BaseModel):
    """`GET /retrieval/live`: the process is up (whether or not retrieval is ready)."""

    status: Literal["up"]


@search.post(
    "/retrieval/context",
    response_model=ContextPack,
    responses=RESPONSES,
    summary="Retrieve a context pack",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RetrievalQuery"}}},
        },
        "security": [{"bearer": []}],
    },
)
async def retrieval_context(request: Request, gw: GatewayDep) -> Response:
    """The same pack `moonmind rag search` builds, with transport "gateway" and server-measured latency."""
    started = time.monotonic()
    settings, resources = gw.settings, gw.resources
    grant = gw.registry.authenticate(request.headers.get("authorization"))
    query = parse_query(await read_json(request), fields="json")  # remedies name the body's fields, not CLI flags
    query, scope = authorize(grant, query.model_copy(update={"transport": "gateway"}), settings.top_k)
    paging.read(query)  # a bad cursor is the caller's 400 invalid_argument, not a failed retrieval
    try:
        if gw.on_loop:
            # pure CPU, one at a time: a worker thread would only add GIL hand-offs with the loop,
            # which costs throughput. The limiter keeps
            # arrivals in order; yielding after each lets health checks and new connections in.
            async with gw.retrievals:
                pack = _retrieve(settings, resources, query, scope, started)
                await asyncio.sleep(0)
        else:
            pack = await anyio.to_thread.run_sync(_retrieve, settings, resources, query, scope, started, limiter=gw.retrievals)
    except MoonmindError as err:
        return error_response(as_caller_error(err))
    gw.last_retrieval = pack.retrieved_at  # the status page's "last retrieval"
    return Response(pack.model_dump_json(), media_type="application/json")


@probes.get(
    "/retrieval/health",
    response_model=HealthStatus,
    responses={503: {"model": HealthStatus, "description": "store or embedder unusable; `reason` says which"}},
    summary="Is retrieval available?",
)
async def retrieval_health(request: Request, gw: GatewayDep) -> JSONResponse:
    """`ok`, or 503 with a coarse reason. Callers with a valid token also get the operator's remedy."""
    reason, err = await gw.health()
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
            gw.registry.authenticate(request.headers.get("authorization"))
            body["error"] = err.envelope(gw.settings.secrets())["error"]
        except MoonmindError:
            pass
    # "up, no collection yet" is a wait, not a failure: Retry-After says when to look again
    headers = {"Retry-After": str(NOT_READY_RETRY_S)} if reason == "collection_not_ready" else None
    return JSONResponse(body, status_code=503, headers=headers)


@probes.get("/retrieval/live", response_model=Liveness, summary="Is the gateway process up?")
async def retrieval_live() -> JSONResponse:
    """200 whenever this process serves HTTP, with or without a collection (an orchestrator's liveness probe).

    `/retrieval/health` is readiness (`ok` only when a search can be served); a fresh
    stack is live but not ready until the first `rag index`.
    """
    return JSONResponse({"status": "up"})


def _through_owner(owner: Owner, settings: Settings, query: RetrievalQuery, scope) -> ContextPack:
    """One retrieval run by the box's owner with this gateway's settings and the token's scope."""
    args: dict[str, Any] = {"query": query.model_dump(mode="json"), "record": False, "transport": "gateway"}
    if scope is not None:
        args["scope"] = {"repos": list(scope.repos), "tenants": list(scope.tenants)}
    budget = query.budgets.latency_ms if query.budgets else None
    data = owner.call("search", args, settings=settings.wire(), timeout_s=None if budget is None else budget / 1000 + 1)
    return ContextPack.model_validate(data)


def _retrieve(settings: Settings, resources: Resources, query: RetrievalQuery, scope, started: float) -> ContextPack:
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
        raise internal() from None
