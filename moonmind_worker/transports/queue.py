"""The queue transport: a warm Celery worker runs the search; the task is sent by the box's owner when one is up."""

from __future__ import annotations

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any

#: ContextPack keys the CLI relies on (the worker validated the contract; this is the cheap version check).
PACK_KEYS = ("context_text", "items", "filters", "retrieved_at", "telemetry_id", "notes")


class QueueTransport:
    name = "queue"

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def search(self, request: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        from ..entry import expect_keys
        from .queue_client import SEARCH

        s = self.settings
        budgets = request.get("budgets") or {}
        if timeout_s is None:
            timeout_s = budgets["latency_ms"] / 1000 if budgets.get("latency_ms") else s.queue_timeout_s
        data = enqueue(SEARCH, {"query": request}, queue=s.search_queue, timeout_s=timeout_s, settings=s)
        return expect_keys(data, PACK_KEYS, "a ContextPack")


def enqueue(task: str, kwargs: dict[str, Any], *, queue: str, timeout_s: float | None, wait: bool = True,
            settings: Any = None, progress: Any = None) -> Any:
    """`queue_client.run_task` run by the box's warm owner when one is up (Celery loaded, connections open),
    else in this process; with the caller's broker settings either way."""
    from .. import operations

    if settings is None:
        from ..settings import get_settings

        settings = get_settings()
    return operations.enqueue(settings, task, kwargs, queue=queue, timeout_s=timeout_s, wait=wait, progress=progress)
