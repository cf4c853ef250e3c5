"""Retrieval on this box: the warm owner of the embedded store when one is alive, else this process.

Either way the same operation (`operations.search`) runs the pipeline, so the pack is the
same; through the owner, this process imports nothing but the standard library.
"""

from __future__ import annotations

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any

class LocalTransport:
    name = "local"

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def search(self, request: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        from .. import operations

        return operations.search(self.settings, request, timeout_s=timeout_s)  # type: ignore[arg-type,return-value]

    def navigate(self, op: str, request: dict[str, Any]) -> dict[str, Any]:
        """`related` or `symbols` (`operations`), as a search runs."""
        from .. import operations

        return (operations.related if op == "related" else operations.symbols)(self.settings, request)  # type: ignore[arg-type,return-value]


def local_available(settings: Any) -> bool:
    """Retrieval can run on this box: a Qdrant URL is configured, or the embedded store holds the collection."""
    return bool(settings.qdrant_url) or (settings.data_dir / settings.collection / "meta.json").exists()
