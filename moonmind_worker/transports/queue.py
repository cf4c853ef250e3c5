"""The queue transport: a warm Celery worker runs the search (`queue_client`, standard library only)."""

from __future__ import annotations

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli.py)
if TYPE_CHECKING:
    from typing import Any

#: ContextPack keys the CLI relies on (the worker validated the contract; this is the cheap version check).
PACK_KEYS = ("context_text", "items", "filters", "retrieved_at", "telemetry_id", "notes")


class QueueTransport:
    name = "queue"

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def search(self, request: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        from ..cli.rag import expect_keys
        from .queue_client import SEARCH, run_task

        s = self.settings
        budgets = request.get("budgets") or {}
        if timeout_s is None:
            timeout_s = budgets["latency_ms"] / 1000 if budgets.get("latency_ms") else s.queue_timeout_s
        data = run_task(SEARCH, {"query": request}, queue=s.search_queue, broker_url=s.celery_broker_url,
                        backend_url=s.result_backend, timeout_s=timeout_s)
        return expect_keys(data, PACK_KEYS, "a ContextPack")
