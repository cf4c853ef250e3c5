"""The operations' requests and answers as they cross a process: TypedDicts of the contracts' JSON.

Why a second declaration of `contracts.py`'s shapes: `operations.py` is on the thin client's path,
which imports no pydantic (a served `rag search` would take three times as long), so the entry points
are typed against these and the owner (or this process, one-shot) validates each request into its
contract where it runs. `tests/test_wire_contracts.py` holds every TypedDict here to its model's fields.
Imported for annotations only.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict


class QueryFields(TypedDict):
    """`contracts.RetrievalQuery` as the flags (or an MCP tool's arguments) gave it, not yet validated."""

    query: str
    top_k: NotRequired[int | None]
    filters: NotRequired[dict[str, Any]]
    overlay_policy: NotRequired[str]
    transport: NotRequired[str]
    budgets: NotRequired[dict[str, Any] | None]
    score_threshold: NotRequired[float | None]
    cursor: NotRequired[str | None]
    max_lines: NotRequired[int | None]
    locations_only: NotRequired[bool]


class ContextPackJSON(TypedDict):
    """`contracts.ContextPack`."""

    context_text: str
    items: list[dict[str, Any]]
    filters: dict[str, str]
    budgets: dict[str, Any] | None
    usage: dict[str, Any]
    transport: Literal["direct", "gateway"]
    retrieved_at: str
    telemetry_id: str
    query: str
    top_k: int
    score_threshold: float
    best_score: float | None
    truncated: bool
    notes: list[str]
    total_results: int
    offset: int
    next_cursor: str | None
    max_lines: int | None
    locations_only: bool
    freshness: Literal["fresh", "stale"] | None
    stale_paths: list[str]


class SymbolsResultJSON(TypedDict):
    """`contracts.SymbolsResult`."""

    query: str
    symbols: list[dict[str, Any]]
    filters: dict[str, str]
    transport: Literal["direct", "gateway"]
    top_k: int
    latency_ms: float
    notes: list[str]


class IndexRequestJSON(TypedDict):
    """`contracts.IndexRequest` as sent, `path` absolute (the owner's working directory is not the caller's)."""

    path: str
    repo: str | None  # None: refused where it runs, with the flag or variable to set
    tenant: str


class IndexReportJSON(TypedDict):
    """`contracts.IndexReport`."""

    repo: str
    tenant: str
    files_seen: int
    files_indexed: int
    files_unchanged: int
    files_deleted: int
    chunks_written: int
    chunks_deleted: int
    skipped: list[dict[str, Any]]
    seconds: float
    files_skipped: int
    skipped_by_reason: dict[str, int]
    dirs_skipped: int
    rechunked: bool
    resumed: bool
    worker_died: bool
    line: str


class OverlayUpsertRequestJSON(TypedDict):
    """`contracts.OverlayUpsertRequest` as sent: absolute paths inside an absolute `root`."""

    paths: list[str]
    root: str
    run_id: str | None  # None: refused where it runs, with the flag or variable to set
    ttl: str
    repo: str | None
    tenant: str


class OverlayReportJSON(TypedDict):
    """`contracts.OverlayReport`."""

    run_id: str
    repo: str
    tenant: str
    expires_at: str
    files: list[str]
    tombstones: list[str]
    chunks_written: int
    chunks_replaced: int
    skipped: list[dict[str, Any]]
    seconds: float
    line: str


class OverlayCleanResultJSON(TypedDict):
    """`contracts.OverlayCleanResult`."""

    removed: int
    run_id: str | None
    expired: bool


class OverlayRowJSON(TypedDict):
    """One row of `rag overlay list` (`indexing.overlay.list_overlay`)."""

    run_id: str
    tenant: str
    repo: str
    path: str
    chunks: int
    tombstone: bool
    content_hash: str
    indexed_at: str
    expires_at: str
    expires_in_s: float
    expired: bool


class StatsJSON(TypedDict):
    """`rag stats`: the statistics (`indexing.stats.RepoStats.to_dict`) and their printed form."""

    stats: dict[str, Any]
    text: str


class ReposJSON(TypedDict):
    """`rag repos`: the collection searched and every repository it holds."""

    collection: str
    repos: list[dict[str, Any]]


class SyncEmbeddingJSON(TypedDict):
    """`rag sync-embedding`: the plan or what was re-embedded, and its one-line summary."""

    result: dict[str, Any]
    line: str
