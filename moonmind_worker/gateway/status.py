"""The "RAG ready" badge: GET /retrieval/status (JSON), /retrieval/status.html, /retrieval/badge.svg.

What a human reviewing runs looks at: is retrieval ready, which repositories are indexed, how many
chunks, with which model, when each was last indexed (its freshness), who owns the store, and when
this gateway last served a retrieval.

Who sees what follows the gateway's auth (docs/gateway.md, "Status page and badge"):

- the badge, and the status without a token, say only ready or not ready with the coarse reason:
  what the unauthenticated /retrieval/health already says;
- a valid bearer token also gets the owner, the model and the repositories inside its scope (its
  repos x tenants), counted and dated: the names and sizes /retrieval/context would let it search;
  a wrong token is 401, as everywhere;
- MOONMIND_GATEWAY_STATUS=public shows every repository without a token, for a dashboard on a
  trusted network (the operator's choice; a token still narrows the view to its scope).
"""

from __future__ import annotations

import html
import os
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ..errors import MoonmindError
from ..store.scopes import Scope
from .state import Gateway, GatewayDep

#: A repository whose newest index run is older than this is marked stale.
STALE_AFTER_S = 7 * 24 * 3600
#: Said where the repositories would be, to a caller who may not see them.
HIDDEN = ("repositories are listed to a bearer token (those inside its scope), or to anyone when the operator "
          "sets MOONMIND_GATEWAY_STATUS=public")


router = APIRouter()


async def report(request: Request, gw: Gateway) -> dict[str, Any]:
    """Readiness for anyone; owner, model and repositories for a token (its scope) or on a public page."""
    reason, _ = await gw.health()
    body: dict[str, Any] = {"rag_ready": reason is None, "status": "ready" if reason is None else "not_ready",
                            "reason": reason}
    header = request.headers.get("authorization")
    scope = None
    if header:  # checked even where the page is public: a wrong token is told so, as on every route
        grant = gw.registry.authenticate(header)
        scope = Scope(repos=tuple(grant.repos), tenants=tuple(grant.tenants))
    elif gw.settings.gateway_status != "public":
        body["hidden"] = HIDDEN
        return body
    body.update(await run_in_threadpool(details, gw.settings, gw.resources, scope, gw.last_retrieval,
                                        datetime.now(timezone.utc)))
    return body


@router.get("/retrieval/status", summary="Is RAG ready, and what is indexed? (repositories need a token)")
async def retrieval_status(request: Request, gw: GatewayDep) -> JSONResponse:
    return JSONResponse(await report(request, gw), headers={"Cache-Control": "no-store"})


@router.get("/retrieval/status.html", summary="The status as a small HTML page", response_class=HTMLResponse)
async def retrieval_status_page(request: Request, gw: GatewayDep) -> HTMLResponse:
    return HTMLResponse(render_page(await report(request, gw)), headers={"Cache-Control": "no-store"})


@router.get("/retrieval/badge.svg", summary="The RAG ready badge (SVG)", response_class=Response)
async def retrieval_badge(gw: GatewayDep) -> Response:
    reason, _ = await gw.health()
    return Response(render_badge(reason is None), media_type="image/svg+xml", headers={"Cache-Control": "no-cache"})


def details(settings: Any, resources: Any, scope: Scope | None, last_retrieval: str | None, now: datetime) -> dict[str, Any]:
    """Owner, model and the repositories `scope` may see (None: all), each with its freshness."""
    try:
        owner, rows = _repositories(settings, resources)
    except MoonmindError:  # readiness already says why; the page still renders
        owner, rows = None, []
    if scope is not None:
        rows = [r for r in rows if r["repo"] in scope.repos and r["tenant"] in scope.tenants]
    for row in rows:
        row["age_s"] = _age_s(row.get("last_indexed"), now)
        row["fresh"] = row["age_s"] is not None and row["age_s"] <= STALE_AFTER_S
    newest = max((r["last_indexed"] for r in rows if r.get("last_indexed")), default=None)
    return {
        "owner": owner,
        "model": settings.model_name,
        "repositories": rows,
        "files": sum(r["files"] for r in rows),
        "chunks": sum(r["chunks"] for r in rows),
        "last_indexed": newest,
        "freshness": None if newest is None else ("fresh" if all(r["fresh"] for r in rows) else "stale"),
        "last_retrieval": last_retrieval,
    }


def _repositories(settings: Any, resources: Any) -> tuple[dict[str, Any], list[dict]]:
    """Who owns the store, and every indexed repository (`rag repos`' rows), read where the store is."""
    from ..indexing.stats import indexed_repos
    from ..owner.client import OwnerGone
    from ..owner.server import current_server

    owner = resources.box_owner()
    if owner is not None:  # another process on this box owns the embedded store: ask it
        pid = owner.pid
        try:
            out = owner.call("repos", {"tenant": None}, settings=settings.wire(), timeout_s=30.0)
            return {"role": "another moonmind process on this box", "pid": pid}, list(out["repos"])
        except OwnerGone:
            pass
    _, store = resources()
    if not settings.embedded_store:
        who: dict[str, Any] = {"role": "a Qdrant server (QDRANT_URL)"}
    else:
        server = current_server()
        who = {"role": server.role if server else "gateway", "pid": os.getpid()}  # this process holds the store
    return who, indexed_repos(store) if store.info() is not None else []


def _age_s(stamp: str | None, now: datetime) -> float | None:
    if not stamp:
        return None
    try:
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return max((now - at).total_seconds(), 0.0)


def ago(seconds: float | None) -> str:
    """`seconds` as a person says it: "just now", "5 minutes ago", "3 days ago"."""
    if seconds is None:
        return "never"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return "just now"


# ------------------------------------------------------------ rendering ---

_GREEN, _RED, _GREY = "#2e7d32", "#c62828", "#555"


def render_badge(ready: bool) -> str:
    """A flat two-part badge, "RAG | ready" (green) or "RAG | not ready" (red), sized to its text."""
    left, right = "RAG", "ready" if ready else "not ready"
    colour = _GREEN if ready else _RED
    lw, rw = 10 + 7 * len(left), 10 + 7 * len(right)
    width = lw + rw
    label = f"{left}: {right}"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="20" role="img" aria-label="{label}">'
        f"<title>{label}</title>"
        f'<rect width="{lw}" height="20" fill="{_GREY}"/><rect x="{lw}" width="{rw}" height="20" fill="{colour}"/>'
        f'<g fill="#fff" text-anchor="middle" font-family="Verdana,DejaVu Sans,sans-serif" font-size="11">'
        f'<text x="{lw / 2}" y="14">{left}</text><text x="{lw + rw / 2}" y="14">{right}</text></g></svg>'
    )


def render_page(report: dict[str, Any]) -> str:
    """The status report as one self-contained HTML page (no script, no outside asset); every value escaped."""
    e = html.escape
    ready = report["rag_ready"]
    headline = "RAG ready" if ready else f"RAG not ready ({report.get('reason') or 'unknown'})"
    rows = []
    if "repositories" in report:
        owner = report.get("owner") or {}
        who = owner.get("role", "unknown") + (f" (PID {owner['pid']})" if owner.get("pid") else "")
        summary = [
            ("store owner", who), ("model", report.get("model") or ""), ("repositories", str(len(report["repositories"]))),
            ("files", str(report.get("files", 0))), ("chunks", str(report.get("chunks", 0))),
            ("last indexed", report.get("last_indexed") or "never"), ("freshness", report.get("freshness") or "nothing indexed"),
            ("last retrieval here", report.get("last_retrieval") or "none since this gateway started"),
        ]
        rows.append("<table id=\"summary\">" + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in summary) + "</table>")
        head = "".join(f"<th>{h}</th>" for h in ("repository", "tenant", "files", "chunks", "model", "last indexed", "freshness"))
        body = "".join(
            "<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in (
                r["repo"], r["tenant"], r["files"], r["chunks"], r.get("model") or "", r.get("last_indexed") or "never",
                ("fresh, " if r.get("fresh") else "stale, ") + ago(r.get("age_s")),
            )) + "</tr>"
            for r in report["repositories"]
        ) or '<tr><td colspan="7">nothing indexed yet: run <code>moonmind rag index PATH --repo NAME</code></td></tr>'
        rows.append(f'<table id="repositories"><tr>{head}</tr>{body}</table>')
    else:
        rows.append(f'<p id="hidden">{e(report.get("hidden", ""))}</p>')
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>MoonMind retrieval status</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}</style></head><body>"
        f'<h1 id="headline">{e(headline)}</h1><p><img src="badge.svg" alt="{e(headline)}"></p>'
        + "".join(rows)
        + "</body></html>"
    )
