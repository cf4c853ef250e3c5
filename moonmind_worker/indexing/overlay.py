"""Workspace overlays, write side: a run's own edits, searchable before any re-index.

A worker that edits files upserts them here; the chunks are written to the same
collection as the canonical index, chunked and embedded exactly as the indexer
does, but tagged `trust_class="workspace_overlay"`, the run id and an expiry.
How a search reads them is `retrieval/overlay_plan.py`.

Overlay writes only ever touch points whose filter says `workspace_overlay` and
whose id is derived from the run id, so canonical points are never modified.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .. import observe
from ..contracts import PAYLOAD_SCHEMA_VERSION, WORKSPACE_OVERLAY, ChunkPayload
from ..embedding import Embedder
from ..errors import MoonmindError
from ..ids import utc_timestamp
from ..retrieval.overlay_plan import MAX_OVERLAY_FILES
from ..settings import Settings
from ..store import Match, MatchAny, PointIn, Range, SparseVec, Store, Where
from ..store.guardrails import check_collection
from ..store.scopes import every_overlay, run_overlay
from ..text.chunking import Chunk, chunk_text, language_of, sha256_text
from ..text.files import Skipped, TreeReader, WalkRules, excluded_reason, name_problem
from .indexer import content_hash
from .payloads import build_points
from .points import point_id

#: Default lifetime of an overlay upsert (`--ttl`); a job normally cleans its run sooner.
DEFAULT_TTL_S = 24 * 3600.0
MAX_TTL_S = 30 * 24 * 3600.0

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|m|min|mins|h|hr|hrs|d|day|days)?\s*$", re.IGNORECASE)
_UNITS = {"s": 1, "sec": 1, "secs": 1, "m": 60, "min": 60, "mins": 60, "h": 3600, "hr": 3600, "hrs": 3600,
          "d": 86400, "day": 86400, "days": 86400}


# ------------------------------------------------------------------ inputs ---


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `2h`, `1d` → seconds; anything else is `invalid_argument`."""
    m = _DURATION.match(text or "")
    seconds = float(m.group(1)) * _UNITS[(m.group(2) or "s").lower()] if m else 0.0
    if not m or not 0 < seconds <= MAX_TTL_S:
        raise MoonmindError(
            "invalid_argument",
            f"Invalid overlay TTL {text!r}: expected a positive duration up to 30d such as 900s, 30m, 2h or 1d.",
            "Pass --ttl with a number and a unit (s, m, h, d), e.g. --ttl 2h.",
        )
    return seconds


def _require(value: str | None, what: str, flag: str, env: str) -> str:
    value = (value or "").strip()
    if not value:
        raise MoonmindError(
            "invalid_argument",
            f"No {what} given for the workspace overlay.",
            f"Pass {flag} or export {env}.",
        )
    if len(value) > 200 or any(ord(ch) < 32 for ch in value):
        raise MoonmindError(
            "invalid_argument",
            f"Invalid {what} {value[:40]!r}: at most 200 printable characters.",
            f"Pass a plain identifier with {flag}.",
        )
    return value


def _outside(path: str, root: Path, why: str) -> MoonmindError:
    return MoonmindError(
        "path_outside_workspace",
        f"{path} is outside the workspace root {root} ({why}); nothing was written.",
        "Overlay only files inside the workspace (pass --root to name it); paths are stored repo-relative.",
    )


def resolve_workspace_paths(paths: Iterable[str | os.PathLike], root: Path) -> list[tuple[str, Path]]:
    """(repo-relative POSIX path, resolved path) for each input, all validated before anything is written.

    Relative inputs are taken relative to `root`. A path is refused when it
    leaves the root lexically (`..`), is absolute elsewhere, or resolves through
    a symlink to a place outside the root; a directory is refused too.
    """
    given = Path(os.path.normpath(os.path.abspath(root)))
    root = given.resolve()
    out: dict[str, Path] = {}
    for raw in paths:
        text = os.fspath(raw)
        if not text.strip() or "\x00" in text:
            raise MoonmindError("invalid_argument", f"Invalid overlay path {text!r}.", "Pass file paths inside the workspace.")
        candidate = Path(text) if os.path.isabs(text) else given / text
        lexical = Path(os.path.normpath(candidate))
        if not any(lexical == r or r in lexical.parents for r in (given, root)):
            raise _outside(text, root, "it leaves the root" if ".." in Path(text).parts else "absolute path elsewhere")
        resolved = candidate.resolve()  # follows symlinks, tolerates a missing file
        if resolved != root and root not in resolved.parents:
            raise _outside(text, root, "a symlink on the way points outside the root")
        if resolved.is_dir():
            raise MoonmindError(
                "invalid_argument",
                f"{text} is a directory; the overlay takes files.",
                "Name the edited files, e.g. `moonmind rag overlay upsert $(git diff --name-only)`.",
            )
        rel = resolved.relative_to(root).as_posix()
        out.setdefault(rel, resolved)
    return sorted(out.items())


# ------------------------------------------------------------------ upsert ---


@dataclass
class OverlaySummary:
    """What one upsert did; `files` and `tombstones` are repo-relative paths."""

    run_id: str
    repo: str
    tenant: str
    expires_at: float
    files: list[str] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)
    chunks_written: int = 0
    chunks_replaced: int = 0  # stale overlay chunks of the same files removed
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "repo": self.repo,
            "tenant": self.tenant,
            "expires_at": utc_timestamp(self.expires_at),
            "files": self.files,
            "tombstones": self.tombstones,
            "chunks_written": self.chunks_written,
            "chunks_replaced": self.chunks_replaced,
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "seconds": round(self.seconds, 4),
        }

    def line(self) -> str:
        return (
            f"overlay run={self.run_id} repo={self.repo} tenant={self.tenant}: {len(self.files)} files, "
            f"{len(self.tombstones)} tombstones, {self.chunks_written} chunks written, "
            f"{self.chunks_replaced} replaced, {len(self.skipped)} skipped, expires {utc_timestamp(self.expires_at)}, "
            f"{self.seconds:.2f}s"
        )


def _tombstone(embedder: Embedder, rel: str, *, repo: str, tenant: str, run_id: str, expires_at: float) -> PointIn:
    """A point that says "this path is gone for this run": no text, hides the canonical chunks."""
    empty = sha256_text("")
    payload = ChunkPayload(
        path=rel, repo=repo, tenant=tenant, language=language_of(rel), chunk_id=f"{rel}#deleted",
        chunk_hash=empty, content_hash=empty, offset_start=0, offset_end=0, line_start=0, line_end=0,
        section_title="", chunk_sequence=0, total_chunks=0, text="", token_count=0,
        model_version=embedder.name,
        indexed_at=utc_timestamp(time.time()), trust_class=WORKSPACE_OVERLAY, run_id=run_id, expires_at=expires_at,
        deleted=True,
    )
    unit = np.zeros(embedder.dimensions, dtype=np.float32)
    unit[0] = 1.0  # cosine needs a non-zero vector; tombstones are only found by filter, never by similarity
    return PointIn(
        id=point_id(tenant, repo, rel, 0, WORKSPACE_OVERLAY, run_id),
        dense=unit,
        sparse=SparseVec([], []),
        payload=payload.model_dump(),
    )


def _read_targets(
    targets: list[tuple[str, Path]], root_path: Path, settings: Settings, skipped: list[Skipped]
) -> tuple[list[tuple[str, str, list[Chunk]]], list[str]]:
    """The targets' chunks (path, content hash, chunks), and the paths that are gone or emptied; the rest skipped."""
    docs: list[tuple[str, str, list[Chunk]]] = []
    gone: list[str] = []
    with TreeReader(root_path) as reader:  # each file read under the root, never through a link swapped in
        for rel, path in targets:
            reason = name_problem(rel) or excluded_reason(root_path, rel, rules=WalkRules.of(settings))
            if reason is not None:
                skipped.append(Skipped(rel, reason))
                continue
            if not path.exists():
                gone.append(rel)
                continue
            text, why = reader.read_text(rel, settings.max_file_bytes)
            if text is None:
                skipped.append(Skipped(rel, why or "unreadable"))
                continue
            chunks = chunk_text(text, rel, settings.chunk_chars, settings.chunk_overlap_lines, redact=settings.redact_secrets == "on")
            if chunks:
                docs.append((rel, content_hash(text), chunks))
            else:
                gone.append(rel)  # emptied: the canonical text no longer exists either
    return docs, gone


def _chunk_points(
    docs: list[tuple[str, str, list[Chunk]]], settings: Settings, embedder: Embedder,
    *, repo: str, tenant: str, run_id: str, expires_at: float,
) -> list[PointIn]:
    """The files' points, embedded in batches cut as the indexer cuts them."""
    points: list[PointIn] = []
    batch_chunks = max(settings.embedding_batch_size * 4, 256)
    batch: list[tuple[str, str, list[Chunk]]] = []
    for doc in docs + [None]:  # None flushes the last batch
        if doc is not None:
            batch.append(doc)
        if batch and (doc is None or sum(len(d[2]) for d in batch) >= batch_chunks):
            points.extend(build_points(
                embedder, batch, repo=repo, tenant=tenant, trust_class=WORKSPACE_OVERLAY,
                run_id=run_id, expires_at=expires_at,
            ))
            batch = []
    return points


@observe.overlay_upsert
def upsert_overlay(
    paths: Sequence[str | os.PathLike],
    *,
    root: str | os.PathLike,
    run_id: str,
    ttl_s: float,
    repo: str,
    tenant: str,
    settings: Settings,
    embedder: Embedder,
    store: Store,
) -> OverlaySummary:
    """Write the run's overlay for `paths` (files inside `root`); a missing file becomes a tombstone.

    Re-upserting a file replaces that file's previous overlay chunks for the run:
    the new points are written first, then the stale ones removed, so a search
    never sees the file missing. Every path is validated before anything is
    written. Binary, oversized and excluded (lock, vendored, .gitignored) files
    are skipped with a reason, exactly as the canonical indexer skips them.
    """
    started = time.perf_counter()
    run_id = _require(run_id, "run id", "--run-id", "MOONMIND_RUN_ID")
    repo = _require(repo, "repo", "--repo", "MOONMIND_REPO")
    tenant = _require(tenant, "tenant", "--tenant", "MOONMIND_TENANT")
    if not (isinstance(ttl_s, (int, float)) and math.isfinite(ttl_s) and 0 < ttl_s <= MAX_TTL_S):
        raise MoonmindError(
            "invalid_argument", f"Invalid overlay TTL {ttl_s!r} seconds.", "Use a TTL between 1 second and 30 days."
        )
    root_path = Path(root).resolve()
    if not root_path.is_dir():
        raise MoonmindError("invalid_argument", f"Workspace root {root} is not a directory.", "Pass --root DIR.")
    if not paths:
        raise MoonmindError("invalid_argument", "No files given to overlay.", "Pass one or more edited file paths.")
    targets = resolve_workspace_paths(paths, Path(root))

    now = time.time()
    expires_at = now + float(ttl_s)
    summary = OverlaySummary(run_id=run_id, repo=repo, tenant=tenant, expires_at=expires_at)
    docs, gone = _read_targets(targets, root_path, settings, summary.skipped)
    written = [rel for rel, _, _ in docs] + gone
    if not written:
        summary.seconds = time.perf_counter() - started
        return summary

    if check_collection(store, embedder, must_exist=False) is None:
        store.create(embedder.dimensions, embedder.name, PAYLOAD_SCHEMA_VERSION)

    base = run_overlay(run_id, tenant=tenant, repo=repo)
    live = {h.payload["path"] for h in store.scroll(
        Where(must=(*base, Match("chunk_sequence", 0), Range("expires_at", gt=now))), ["path"])}
    if len(live | set(written)) > MAX_OVERLAY_FILES:
        raise MoonmindError(
            "invalid_argument",
            f"Run {run_id} would overlay {len(live | set(written))} files; the limit is {MAX_OVERLAY_FILES}.",
            "Re-index the repository canonically (`moonmind rag index`) and clean the overlay "
            "(`moonmind rag overlay clean`) instead of overlaying that many files.",
        )
    old: dict[str, set[str]] = {}
    for h in store.scroll(Where(must=(*base, MatchAny("path", tuple(written)))), ["path"]):
        old.setdefault(h.payload["path"], set()).add(h.id)

    points = _chunk_points(docs, settings, embedder, repo=repo, tenant=tenant, run_id=run_id, expires_at=expires_at)
    points.extend(_tombstone(embedder, rel, repo=repo, tenant=tenant, run_id=run_id, expires_at=expires_at)
                  for rel in gone)
    for i in range(0, len(points), 512):
        store.upsert(points[i : i + 512])
    new_ids = {p.id for p in points}
    stale = sorted(i for ids in old.values() for i in ids if i not in new_ids)
    store.delete_ids(stale)
    store.flush()

    summary.files = [rel for rel, _, _ in docs]
    summary.tombstones = gone
    summary.chunks_written = sum(len(c) for _, _, c in docs)
    summary.chunks_replaced = len(stale)
    summary.seconds = time.perf_counter() - started
    return summary


# ------------------------------------------------------------ clean / list ---


@observe.overlay_clean
def clean_overlay(
    *, run_id: str | None = None, expired: bool = False, settings: Settings, store: Store, now: float | None = None
) -> int:
    """Remove one run's overlay (`run_id`) or every expired overlay point (`expired`); returns points removed.

    The delete is a filter evaluated by the store at delete time, so it is
    idempotent and safe beside concurrent upserts (a fresh point is never
    expired) and searches (which filter expired points out anyway). A run clean
    is narrowed to MOONMIND_TENANT / MOONMIND_REPO when those are set; the
    expired sweep covers every tenant, since expired points are visible to no one.
    """
    run_id = (run_id or "").strip() or None
    if run_id is None and not expired:
        raise MoonmindError(
            "invalid_argument",
            "Nothing to clean: no run id and --expired not given.",
            "Pass --run-id ID (or export MOONMIND_RUN_ID) to drop a run's overlay, or --expired for the TTL sweep.",
        )
    if store.info() is None:
        return 0
    if run_id is not None:
        must = run_overlay(run_id, tenant=settings.tenant, repo=settings.repo)
    else:
        must = every_overlay()
    if expired:
        must.append(Range("expires_at", lte=time.time() if now is None else now))
    where = Where(must=tuple(must))
    removed = store.count(where)
    if removed:
        store.delete(where)
        store.flush()
    return removed


_LIST_FIELDS = ["run_id", "tenant", "repo", "path", "expires_at", "deleted", "content_hash", "indexed_at"]


def list_overlay(*, run_id: str | None = None, settings: Settings, store: Store) -> list[dict]:
    """What is overlaid: one row per (run, tenant, repo, path) with its chunk count and expiry.

    Narrowed to `run_id` when given and to MOONMIND_TENANT / MOONMIND_REPO when set.
    """
    if store.info() is None:
        return []
    run_id = (run_id or "").strip() or None
    if run_id is not None:
        must = run_overlay(run_id, tenant=settings.tenant, repo=settings.repo)
    else:
        must = every_overlay(tenant=settings.tenant, repo=settings.repo)
    now = time.time()
    rows: dict[tuple[str, str, str, str], dict] = {}
    for h in store.scroll(Where(must=tuple(must)), _LIST_FIELDS):
        p = h.payload
        key = (p.get("run_id", ""), p.get("tenant", ""), p.get("repo", ""), p["path"])
        row = rows.get(key)
        if row is None:
            row = rows[key] = {
                "run_id": key[0], "tenant": key[1], "repo": key[2], "path": key[3], "chunks": 0,
                "tombstone": False, "content_hash": p.get("content_hash", ""), "indexed_at": p.get("indexed_at", ""),
                "_expires": p.get("expires_at") or 0.0,
            }
        if p.get("deleted"):
            row["tombstone"] = True
        else:
            row["chunks"] += 1
        row["indexed_at"] = max(row["indexed_at"], p.get("indexed_at", ""))
        row["_expires"] = max(row["_expires"], p.get("expires_at") or 0.0)
    out = []
    for key in sorted(rows):
        row = rows[key]
        expires = row.pop("_expires")
        row["expires_at"] = utc_timestamp(expires)
        row["expires_in_s"] = round(expires - now, 1)
        row["expired"] = expires <= now
        out.append(row)
    return out
