"""What every gateway route shares: one `Gateway` per app, on `app.state.gateway`, handed to routes by `Depends`.

Settings, the token registry, the embedder and store (or the box's owner that serves them), the
retrieval limiter, the cached readiness check and the status page's "last retrieval" live here,
so the routes (routes.py, navigation.py, status.py) are plain module functions and create_app
only wires them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from ..errors import CODES, MoonmindError
from ..settings import Settings
from ..store import Store
from .auth import TokenRegistry
from .envelope import internal

if TYPE_CHECKING:
    from ..owner.client import Owner
    from .balance import Balancer

log = logging.getLogger("moonmind.gateway")

HEALTH_TTL_S = 1.0

Health = tuple[str | None, MoonmindError | None]


class Resources:
    """`resources()`: the embedder and store a retrieval uses; `box_owner()`: the process that serves them instead."""

    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        self.store = store

    def __call__(self) -> tuple[Any, Store]:
        from .. import runtime

        return runtime.get_embedder(self.settings), self.store or runtime.get_store(self.settings)

    def box_owner(self) -> Owner | None:
        # a worker's replica is this process's own; otherwise another process may own the embedded store
        return None if self.store is not None else box_owner(self.settings)


class HealthCache:
    """`check_health`, run at most once per HEALTH_TTL_S (health probes and badges may poll often)."""

    def __init__(self, settings: Settings, resources: Resources) -> None:
        self.settings = settings
        self.resources = resources
        self._lock = threading.Lock()
        self._at = 0.0
        self._value: Health | None = None

    async def __call__(self) -> Health:
        now = time.monotonic()
        with self._lock:
            cached = self._value if now - self._at < HEALTH_TTL_S else None
        if cached is None:
            cached = await run_in_threadpool(check_health, self.settings, self.resources)
            with self._lock:
                self._at, self._value = time.monotonic(), cached
        return cached


@dataclass
class Gateway:
    """One app's shared state (see `create`)."""

    settings: Settings
    registry: TokenRegistry
    resources: Resources
    retrievals: anyio.CapacityLimiter
    #: a search runs on the event loop itself (one at a time, static embedder, embedded store)
    on_loop: bool
    health: HealthCache
    store: Store | None = None
    balancer: Balancer | None = None
    #: `retrieved_at` of the last pack served: the status page's "last retrieval"
    last_retrieval: str | None = None

    @classmethod
    def create(cls, settings: Settings, registry: TokenRegistry, concurrency: int,
               store: Store | None = None, balancer: Balancer | None = None) -> Gateway:
        resources = Resources(settings, store)
        retrievals = anyio.CapacityLimiter(concurrency)
        on_loop = retrievals.total_tokens == 1 and settings.embedding_provider == "static" and settings.embedded_store
        return cls(settings, registry, resources, retrievals, bool(on_loop), HealthCache(settings, resources),
                   store, balancer)

    def close(self) -> None:
        """Close what was handed to the app (a worker's replica, its balancer); runtime's own are closed by runtime."""
        if self.store is not None:
            self.store.close()
        if self.balancer is not None:
            self.balancer.close()


async def gateway(request: Request) -> Gateway:
    """The app's `Gateway` (a coroutine: FastAPI would run a plain function in a worker thread per request)."""
    return request.app.state.gateway


#: A route parameter typed so receives the app's `Gateway`.
GatewayDep = Annotated[Gateway, Depends(gateway)]


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


def check_health(settings: Settings, resources: Resources) -> Health:
    """(None, None) when a search can be served, else a coarse reason and the error behind it."""
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
        return "internal_error", internal()
