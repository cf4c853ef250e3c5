"""/docs (Swagger UI) and /redoc from package assets, never a CDN (FastAPI's own pages are blank offline)."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import Response

log = logging.getLogger("moonmind.gateway")

#: Where the docs pages' assets come from: the `fastapi-offline` wheel's static files (Swagger UI,
#: ReDoc, favicon; MIT/Apache-2.0), served by this app, so /docs and /redoc work offline.
DOCS_ASSETS = "/docs/assets"

router = APIRouter(include_in_schema=False)


def docs_assets_dir() -> Path | None:
    """The directory of the packaged Swagger UI / ReDoc files, found without importing the package."""
    import importlib.util

    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    static = Path(next(iter(spec.submodule_search_locations))) / "static"
    return static if (static / "swagger-ui-bundle.js").is_file() else None


def add_docs(app: FastAPI) -> None:
    """Mount the assets and add the two pages (a router cannot carry a mount)."""
    from fastapi.staticfiles import StaticFiles

    assets = docs_assets_dir()
    if assets is None:  # pragma: no cover - a broken install; the API itself still works
        log.warning("Swagger UI / ReDoc assets not found (package fastapi-offline); /docs and /redoc are off")
        return
    app.mount(DOCS_ASSETS, StaticFiles(directory=assets), name="docs-assets")
    app.include_router(router)


def _base(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


@router.get("/docs")
async def swagger_ui(request: Request) -> Response:
    root, app = _base(request), request.app
    return get_swagger_ui_html(
        openapi_url=root + (app.openapi_url or ""), title=f"{app.title} - Swagger UI",
        swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
    )


@router.get("/redoc")
async def redoc(request: Request) -> Response:
    root, app = _base(request), request.app
    return get_redoc_html(
        openapi_url=root + (app.openapi_url or ""), title=f"{app.title} - ReDoc",
        redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js", redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
        with_google_fonts=False,
    )
