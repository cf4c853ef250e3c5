"""Retrieval on this box: the warm owner of the embedded store when one is alive, else this process.

Either way the same function (`owner.ops.search`) runs the pipeline, so the pack is the
same; through the owner, this process imports nothing but the standard library.
"""

from __future__ import annotations

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any

#: Extra wait past a latency budget, so the owner's own latency_budget_exceeded (with its measurement) arrives.
GRACE_S = 0.5


class LocalTransport:
    name = "local"

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def search(self, request: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        from ..owner.dispatch import execute

        # the caller's own RAG_SIMILARITY_TOP_K / RAG_SCORE_THRESHOLD, not the owner's: a job's environment
        # decides its searches' defaults whichever process runs them (one-shot reads the same values)
        fields_set = self.settings.model_fields_set
        for key in ("top_k", "score_threshold"):
            if request.get(key) is None and key in fields_set:
                request = {**request, key: getattr(self.settings, key)}
        budgets = request.get("budgets") or {}
        if timeout_s is None and budgets.get("latency_ms"):
            timeout_s = budgets["latency_ms"] / 1000 + GRACE_S
        return execute(self.settings, "search", {"query": request}, timeout_s=timeout_s)


    def navigate(self, op: str, request: dict[str, Any]) -> dict[str, Any]:
        """`related` / `symbols` (owner/ops.py) with the caller's own RAG_SIMILARITY_TOP_K, as a search has."""
        from ..owner.dispatch import execute

        if request.get("top_k") is None and "top_k" in self.settings.model_fields_set:
            request = {**request, "top_k": self.settings.top_k}
        return execute(self.settings, op, {"query": request})


def local_available(settings: Any) -> bool:
    """Retrieval can run on this box: a Qdrant URL is configured, or the embedded store holds the collection."""
    return bool(settings.qdrant_url) or (settings.data_dir / settings.collection / "meta.json").exists()
