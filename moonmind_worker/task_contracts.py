"""The Celery task wire: what `moonmind.rag.index` and the overlay tasks take and return.

The CLI's `rag index` and `rag overlay` print the same reports in sync and queue mode. Field names
are binding, as in `contracts.py` (docs/operations.md "Contracts"), which re-exports every model here.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from .contract_base import Contract


class IndexRequest(Contract):
    """Arguments of the `moonmind.rag.index` task: a tree on the worker's filesystem."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)  # absolute path as the worker sees it
    repo: str = Field(min_length=1)
    tenant: str = Field(min_length=1)


class SkippedFile(Contract):
    path: str
    reason: str
    #: "file" (one of `files_seen`), "directory" (not walked into), "ignore rule" (an ignore pattern not applied)
    kind: str = "file"


class IndexReport(Contract):
    """Result of indexing (CLI `rag index` and the `moonmind.rag.index` task print the same thing from it)."""

    repo: str
    tenant: str
    files_seen: int
    files_indexed: int
    files_unchanged: int
    files_deleted: int
    chunks_written: int
    chunks_deleted: int
    skipped: list[SkippedFile]
    seconds: float
    #: files seen and not indexed: files_seen == files_indexed + files_unchanged + files_skipped
    files_skipped: int = 0
    #: files_skipped by reason ("binary": 3, ...), most frequent first
    skipped_by_reason: dict[str, int] = {}
    #: directories not walked into (unreadable, too deep; each in `skipped` with its reason)
    dirs_skipped: int = 0
    #: every file was chunked again: the chunking recipe changed since this repo's last run
    rechunked: bool = False
    #: the repo's previous run stopped before it finished (Ctrl-C, a kill, a crash): the files it
    #: wrote whole were skipped by hash (`files_unchanged`), the rest written now
    resumed: bool = False
    #: an index worker process died (the kernel's OOM killer picks them first) and its jobs, and
    #: the rest of the run, were done in the indexing process: the same points, more slowly
    worker_died: bool = False
    line: str  # the one-line human summary


class OverlayUpsertRequest(Contract):
    """Arguments of `moonmind.rag.overlay_upsert`: absolute paths inside `root`, as the worker sees them."""

    model_config = ConfigDict(extra="forbid")

    paths: list[str] = Field(min_length=1)
    root: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    ttl: str = "24h"  # a duration as the CLI takes it (900s, 30m, 2h, 1d), parsed by the overlay module
    repo: str = Field(min_length=1)
    tenant: str = Field(min_length=1)


class OverlayReport(Contract):
    """Result of an overlay upsert (the CLI prints the same thing in sync and queue mode)."""

    run_id: str
    repo: str
    tenant: str
    expires_at: str
    files: list[str]
    tombstones: list[str]
    chunks_written: int
    chunks_replaced: int
    skipped: list[SkippedFile]
    seconds: float
    line: str


class OverlayCleanRequest(Contract):
    """Arguments of `moonmind.rag.overlay_clean`: one run's overlay, or every expired point."""

    model_config = ConfigDict(extra="forbid")

    run_id: str | None = None
    expired: bool = False


class OverlayCleanResult(Contract):
    removed: int
    run_id: str | None
    expired: bool


class SweepResult(OverlayCleanResult):
    """The beat sweep: expired overlay points removed, and runs whose cached packs passed retention."""

    artifacts_pruned: int
