"""POST /retrieval/related and POST /retrieval/symbols: `rag related` and `rag symbols` on the gateway.

The body is a RetrievalQuery, its `query` the location (`auth/tokens.py#L10-L40`, a chunk
id) or the name; the bearer token is checked and its allow-list applied exactly as for
/retrieval/context (`auth.authorize`), so a token never reaches a repository or tenant outside it,
as an anchor or as a result. The operation runs where a search would: the box's owner, else here.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..contracts import ContextPack, ErrorEnvelope, RetrievalQuery, SymbolsResult, parse_query
from ..errors import MoonmindError
from ..settings import Settings
from .auth import authorize
from .envelope import RESPONSES, as_caller_error, error_response, read_json
from .state import Gateway, GatewayDep

log = logging.getLogger("moonmind.gateway")

#: Besides the pipeline's caller codes: an unknown location or name, and a malformed location, are the caller's.
NAVIGATION_CODES = frozenset({"not_found", "invalid_argument"})


#: Both routes' request body and auth, as /retrieval/context documents them.
SCHEMA = {"requestBody": {"required": True,
                          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RetrievalQuery"}}}},
          "security": [{"bearer": []}]}
DOCUMENTED = {**RESPONSES, 404: {"model": ErrorEnvelope, "description": "not_found: no indexed chunk at the location, "
                                                                      "or nothing defines or mentions the name"}}

router = APIRouter()


async def run(op: str, request: Request, gw: Gateway) -> Response:
    """`op` for the request's query, with the gateway's one error rule (navigation's own codes reach the caller)."""
    started = time.monotonic()
    settings, resources, limiter = gw.settings, gw.resources, gw.retrievals
    grant = gw.registry.authenticate(request.headers.get("authorization"))
    query = parse_query(await read_json(request), fields="json")
    query, scope = authorize(grant, query.model_copy(update={"transport": "gateway"}), settings.top_k)
    try:
        data = await anyio.to_thread.run_sync(_navigate, op, settings, resources, query, scope, started, limiter=limiter)
    except MoonmindError as err:
        return error_response(err if err.code in NAVIGATION_CODES else as_caller_error(err))
    return JSONResponse(data)


@router.post("/retrieval/related", response_model=ContextPack, responses=DOCUMENTED, openapi_extra=SCHEMA,
             summary="Chunks most similar to a location")
async def retrieval_related(request: Request, gw: GatewayDep) -> Response:
    """`query` is PATH#Lx-Ly, PATH#Lx, a chunk id (PATH#N) or PATH; the ContextPack of similar chunks, itself left out."""
    return await run("related", request, gw)


@router.post("/retrieval/symbols", response_model=SymbolsResult, responses=DOCUMENTED, openapi_extra=SCHEMA,
             summary="Where a name is defined")
async def retrieval_symbols(request: Request, gw: GatewayDep) -> Response:
    """`query` is the name; its definitions (kind, path, lines, signature), best first, then mentions."""
    return await run("symbols", request, gw)


def _navigate(op: str, settings: Settings, resources: Any, query: RetrievalQuery, scope: Any, started: float) -> dict:
    from .forward import via_box_owner

    args: dict[str, Any] = {"query": query.model_dump(mode="json"), "transport": "gateway"}
    if scope is not None:
        args["scope"] = {"repos": list(scope.repos), "tenants": list(scope.tenants)}
    try:
        served = via_box_owner(resources, lambda owner: owner.call(op, args, settings=settings.wire(), timeout_s=30.0))
        if served is not None:
            return served
        embedder, store = resources()
        if op == "related":
            from ..contracts import json_dump
            from ..retrieval.related import related_pack

            return json_dump(related_pack(query, settings=settings, embedder=embedder, store=store, scope=scope,
                                          started=started))
        from ..retrieval.symbols import find_symbols

        return find_symbols(query, settings=settings, store=store, scope=scope, started=started)
    except MoonmindError:
        raise
    except Exception:  # noqa: BLE001 - logged here, generic for the caller
        log.exception("unexpected error in %s", op)
        raise MoonmindError("retrieval_failed", "Retrieval failed on the gateway (internal error).",
                            "Retry shortly; if it persists, report it to the gateway operator (details are in the gateway log).") from None
