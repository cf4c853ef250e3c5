"""`moonmind gateway serve`: the gateway's processes: one uvicorn server, or a supervisor of N.

With `--workers N` each process searches its own frozen replica of the embedded store, which
this process holds (no writer can change it) for as long as it serves; the box's other
commands are served by this process too (owner/server.py).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from fastapi import FastAPI

from ..errors import MoonmindError, redact
from ..settings import Settings, get_settings
from ..store import EmbeddedStore, open_replica
from .app import create_app, log
from .auth import TokenRegistry

if TYPE_CHECKING:
    import socket

    import uvicorn


#: Largest `serve --workers`: one per core is the point; far more only multiplies replicas.
MAX_WORKERS = 64
#: How `serve` hands its configuration to its worker processes (spawned, they read the environment).
WORKER_ENV = "MOONMIND_GATEWAY_WORKER"
#: Under MOONMIND_HOME: the workers' private copies of the embedded collection.
REPLICAS_DIR = "gateway-replicas"


def serve(
    host: str,
    port: int,
    settings: Settings | None = None,
    access_log: bool = False,
    concurrency: int | None = None,
    workers: int = 1,
) -> None:
    """Run the gateway with uvicorn until SIGINT/SIGTERM (SIGHUP reloads the token file).

    `workers` > 1 runs that many processes on one listening socket, so retrieval uses that
    many cores (one process is bound to one: the retrieval is CPU work under the GIL).
    """
    import uvicorn

    from .uvicorn_adapter import GatewayHttpProtocol

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings or get_settings()
    GatewayHttpProtocol.read_timeout_s = settings.gateway_read_timeout_s
    if workers <= 1:
        app = create_app(settings, concurrency=concurrency)  # a bad token file stops it here, before it serves anything
        _serve_the_box(settings, None)
        config = uvicorn.Config(app, host=host, port=port, log_level=_log_level(access_log), access_log=access_log,
                                lifespan="on", http=GatewayHttpProtocol)
        sock = config.bind_socket()  # bound here, so the start line gives the real address (--port 0 too)
        announce(sock, config, settings, workers=1)
        uvicorn.Server(config).run(sockets=[sock])
        return
    _serve_workers(host, port, settings, access_log, concurrency, workers)


def _log_level(access_log: bool) -> str:
    """uvicorn's level: its access lines are INFO, so `--access-log` needs "info" to print anything."""
    return "info" if access_log else "warning"


def _serve_workers(host: str, port: int, settings: Settings, access_log: bool, concurrency: int | None, workers: int) -> None:
    """`workers` uvicorn processes; with the embedded store, each searches its own replica.

    This process holds the embedded store for as long as it serves (as a one-process gateway
    does), so no writer can change it and every replica answers exactly like the store.
    """
    import shutil
    import tempfile

    import uvicorn

    from . import balance, uvicorn_adapter

    TokenRegistry(settings.tokens_file)  # a missing or broken token file fails here, once, not in each worker
    spec: dict[str, Any] = {"tokens_file": str(settings.tokens_file), "concurrency": concurrency, "workers": workers}
    held: EmbeddedStore | None = None
    replicas: Path | None = None
    if settings.embedded_store:
        from .. import runtime

        held = cast("EmbeddedStore", runtime.get_store(settings))  # settings.embedded_store: an EdgeStore
        replicas = settings.moonmind_home / REPLICAS_DIR / settings.collection
        # takes the store over from a `moonmind serve` / auto owner; beside a Celery worker it stays the
        # worker's, and hold() below says so (store_busy) before anything starts: replicas need it frozen
        _serve_the_box(settings, "the gateway's workers search frozen copies of it")
        spec |= {"source": str(held.hold()), "replicas": str(replicas)}
    scratch = Path(tempfile.mkdtemp(prefix="moonmind-gateway-"))
    try:
        spec["balance"] = str(balance.create_file(scratch / "connections", MAX_WORKERS))
        os.environ[WORKER_ENV] = json.dumps(spec)
        config = uvicorn.Config(
            f"{__name__}:worker_app", factory=True, host=host, port=port, workers=workers,
            http=uvicorn_adapter.GatewayHttpProtocol, log_level=_log_level(access_log), access_log=access_log,
            lifespan="on",
        )
        sock = config.bind_socket()
        announce(sock, config, settings, workers=workers)
        uvicorn_adapter.run_workers(config, [sock])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if held is not None:
            from ..owner.server import stop_serving

            stop_serving()
            if replicas is not None:
                shutil.rmtree(replicas, ignore_errors=True)
            held.close()


def start_line(address: tuple[Any, ...], settings: Settings, workers: int) -> str:
    """`moonmind gateway: listening on http://HOST:PORT (workers N, store ..., tokens FILE)`: what an operator checks first."""
    host, port = address[0], address[1]
    shown = f"[{host}]" if ":" in host else host
    if settings.embedded_store:
        store = f"embedded {settings.data_dir / settings.collection}"
    else:
        store = f"qdrant {redact(settings.qdrant_url or '', settings.secrets())} collection {settings.collection}"
    return (f"moonmind gateway: listening on http://{shown}:{port} (workers {workers}, store {store}, "
            f"tokens {settings.tokens_file}); docs at /docs, readiness at /retrieval/health, liveness at /retrieval/live")


def announce(sock: socket.socket, config: uvicorn.Config, settings: Settings, workers: int) -> None:
    """Listen, then print the start line on stderr (uvicorn's own banner is below its log level).

    uvicorn's bind_socket does not listen (its server does, after the app's start-up): listening
    here makes the line true at once; connections wait in the backlog until the app is up.
    """
    import sys

    sock.listen(config.backlog)
    sys.stderr.write(start_line(sock.getsockname(), settings, workers) + "\n")
    sys.stderr.flush()


def _serve_the_box(settings: Settings, read_only: str | None) -> None:
    """The gateway owns the embedded store: it also answers this box's `moonmind` commands (owner/server.py)."""
    from ..owner.server import serve_store

    try:
        serve_store(settings, role="gateway", read_only=read_only)
    except MoonmindError as err:
        log.warning("not serving the embedded store to this box: %s Retrievals go through its owner, with each "
                    "token's scope.", err.message)


def worker_app() -> FastAPI:
    """One process of `serve --workers N` (a uvicorn factory): the parent's settings, its own replica."""
    from .balance import Balancer
    from .uvicorn_adapter import GatewayHttpProtocol, open_connections

    spec = json.loads(os.environ[WORKER_ENV])
    store = balancer = None
    try:
        settings = get_settings().model_copy(update={"gateway_tokens_file": Path(spec["tokens_file"])})
        GatewayHttpProtocol.read_timeout_s = settings.gateway_read_timeout_s
        if "replicas" in spec:
            store = open_replica(Path(spec["source"]), Path(spec["replicas"]), settings.collection)
        balancer = Balancer(Path(spec["balance"]), spec["workers"], open_connections)
        return create_app(settings, concurrency=spec["concurrency"], store=store, balancer=balancer)
    except (MoonmindError, OSError, RuntimeError) as err:  # e.g. the token file broke or the disk filled since start-up
        if store is not None:
            store.close()
        if balancer is not None:
            balancer.close()
        message = f"[{err.code}] {err.message} {err.action}" if isinstance(err, MoonmindError) else redact(str(err))
        log.error("gateway worker %d cannot start: %s", os.getpid(), message)
        raise SystemExit(3) from None  # uvicorn's STARTUP_FAILURE: the supervisor stops instead of respawning
