"""Warm resources: one embedder and one store per process, created on first use.

Why: a Celery worker or the gateway must not pay model load or client set-up on
every request; the CLI creates them once per invocation the same way.
"""

from __future__ import annotations

import threading

from .embedding import Embedder, make_embedder
from .settings import Settings, get_settings
from .store import Store, open_store

_lock = threading.Lock()
_embedders: dict[tuple, Embedder] = {}
_stores: dict[tuple, Store] = {}


def _key(settings: Settings, *extra: object) -> tuple:
    return (settings.embedding_provider, settings.model_name, settings.embedding_dimensions, *extra)


def get_embedder(settings: Settings | None = None) -> Embedder:
    settings = settings or get_settings()
    key = _key(settings)
    with _lock:
        if key not in _embedders:
            _embedders[key] = make_embedder(settings)
        return _embedders[key]


def _store_key(settings: Settings, collection: str | None) -> tuple:
    return (settings.qdrant_url, str(settings.data_dir), collection or settings.collection)


def get_store(settings: Settings | None = None, collection: str | None = None) -> Store:
    settings = settings or get_settings()
    key = _store_key(settings, collection)
    with _lock:
        if key not in _stores:
            _stores[key] = open_store(settings, collection)
        return _stores[key]


def existing_store(settings: Settings, collection: str | None = None) -> Store | None:
    """The store this process already holds open, if any (a second embedded open would find it locked)."""
    with _lock:
        return _stores.get(_store_key(settings, collection))


def let_go_unless_serving() -> None:
    """After an operation ran in this process without an owner: a process that lives on and does not
    serve the store (a Celery worker beside another owner, the MCP server) lets go of it, so no
    process ever holds the box's store without serving it. A one-shot command keeps it till it ends."""
    import sys

    from . import process

    if process.one_shot:
        return
    server = sys.modules.get("moonmind_worker.owner.server")
    if server is not None and server.current_server() is not None:
        return
    close_all(keep_embedders=True)


def close_all(flush_only: bool = False, keep_embedders: bool = False) -> None:
    """Release stores (the embedded store's lock in particular).

    `flush_only`: the process is about to end without interpreter teardown (`cli.run`), which
    releases locks and memory itself; only writes still buffered must reach the disk.
    `keep_embedders`: a long-lived process that must not hold the store between calls (the
    MCP server) keeps its model loaded, so only the first call pays for loading it.
    """
    if not flush_only:
        import sys

        server = sys.modules.get("moonmind_worker.owner.server")
        if server is not None:
            server.stop_serving()  # a process that lets go of its stores no longer serves them
    with _lock:
        for store in _stores.values():
            try:
                store.flush() if flush_only else store.close()
            except Exception:  # noqa: BLE001 - closing is best effort at shutdown
                pass
        if not flush_only:
            _stores.clear()
            if not keep_embedders:
                _embedders.clear()
