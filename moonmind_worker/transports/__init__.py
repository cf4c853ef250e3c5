"""How a search reaches the pipeline: one call, `search(request, …)`, whatever carries it.

Every transport takes the RetrievalQuery fields as the flags gave them (validated once,
by whoever runs the pipeline) and returns the ContextPack as JSON, which the CLI prints
through one function. Selection and fallback live here, once:

* ``gateway`` (`gateway.py`) — one POST to the RetrievalGateway; chosen by
  ``--transport gateway``, or by ``auto`` when MOONMIND_RETRIEVAL_URL is set. When the
  gateway fails (not the request) and ``--fallback direct`` allows it, a note and the
  local transport;
* ``queue`` (`queue.py`) — a Celery worker runs it (``--execution queue``);
* ``local`` (`local.py`) — this box: the warm owner of the embedded store when one is
  alive, else this process one-shot; an owner that dies mid-request falls back to
  one-shot with a note (`owner.dispatch.execute`).
"""

from __future__ import annotations

from ..errors import MoonmindError

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any, Protocol

    class Transport(Protocol):
        name: str

        def search(self, request: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
            """The ContextPack JSON for `request` (RetrievalQuery fields); MoonmindError on failure."""
            ...


def select(settings: Any, transport: str = "auto", execution: str = "sync") -> Transport:
    """The transport the flags and settings ask for (no fallback: see `search`)."""
    if transport == "auto":
        transport = "gateway" if settings.retrieval_url else "direct"
    if transport == "gateway":
        from .gateway import GatewayTransport

        return GatewayTransport(settings)
    if execution == "queue":
        from .queue import QueueTransport

        return QueueTransport(settings)
    from .local import LocalTransport

    return LocalTransport(settings)


def search(
    request: dict[str, Any], *, settings: Any, transport: str = "auto", execution: str = "sync",
    fallback: str | None = None, timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run one search over the selected transport; the gateway falls back to local retrieval when allowed."""
    chosen = select(settings, transport, execution)
    if chosen.name != "gateway":
        return chosen.search(request, timeout_s=timeout_s)
    try:
        return chosen.search(request, timeout_s=timeout_s)
    except MoonmindError as err:
        from ..errors import redact
        from .gateway import FALLBACK_CODES
        from .local import LocalTransport, local_available

        if err.code not in FALLBACK_CODES or (fallback or settings.retrieval_fallback) != "direct" or not local_available(settings):
            raise
        from ..entry import note

        note(redact(f"the RetrievalGateway failed ({err.code}: {err.message}); falling back to direct retrieval "
                    "(--no-fallback to disable)", settings.secrets()))
        return LocalTransport(settings).search(request, timeout_s=timeout_s)


def navigate(
    op: str, request: dict[str, Any], *, settings: Any, transport: str = "auto", fallback: str | None = None,
) -> dict[str, Any]:
    """`related` or `symbols` (RetrievalQuery fields) over the gateway or this box, with search's fallback rule.

    No queue transport: both are one payload read and one store request, done before a task could be sent.
    """
    if transport == "auto":
        transport = "gateway" if settings.retrieval_url else "direct"
    from .local import LocalTransport

    if transport != "gateway":
        return LocalTransport(settings).navigate(op, request)
    from .gateway import GatewayTransport

    try:
        return GatewayTransport(settings).navigate(op, request)
    except MoonmindError as err:
        from ..errors import redact
        from .gateway import FALLBACK_CODES
        from .local import local_available

        if err.code not in FALLBACK_CODES or (fallback or settings.retrieval_fallback) != "direct" or not local_available(settings):
            raise
        from ..entry import note

        note(redact(f"the RetrievalGateway failed ({err.code}: {err.message}); falling back to direct retrieval "
                    "(--no-fallback to disable)", settings.secrets()))
        return LocalTransport(settings).navigate(op, request)
