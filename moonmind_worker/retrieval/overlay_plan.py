"""Workspace overlays, read side: how a search merges a run's live overlay with the canonical index.

Retrieval (`pipeline.retrieve_context_pack`) searches the run's live overlay in the
same batched store request as the canonical data and merges them:

* overlay hits come only from the query's `run_id` and only while unexpired
  (a Range on `expires_at` in the query itself, so expired points never take a
  `top_k` slot); a query without a run id never sees any overlay;
* a path the run has overlaid (or tombstoned) shadows that path's canonical
  chunks: they describe the old file;
* overlay items come first, then canonical ones; within each, the pipeline's
  order (score, then path, then offset) is kept; duplicates by
  `(path, chunk_hash)` are dropped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..contracts import WORKSPACE_OVERLAY, RetrievalQuery
from ..store import Hit, Match, Range, SearchSpec
from ..store.scopes import overlay_query

#: Most files one run may overlay: every overlaid path must be known at query
#: time to shadow its canonical chunks, and that list comes back in the batch.
MAX_OVERLAY_FILES = 2000


@dataclass
class OverlayPlan:
    """The overlay half of one retrieval: extra branches for the batch, then the merge.

    `specs` follow the canonical branches in the same `store.search` call:
    one mirror per canonical branch (same vector, same limit, the run's live
    non-tombstone chunks) and a manifest branch listing every path the run has
    overlaid. Inactive (no run id, or `overlay_policy="skip"`) → no specs, and
    `combine`/`order` change nothing.
    """

    specs: list[SearchSpec]
    branches: int
    run_id: str | None = None
    #: (repo, tenant, path) of every file the run has overlaid: a path alone is not a file once
    #: a token spans repositories (a tombstone for lib.py in repo A hid lib.py of repo B)
    shadowed: set[tuple[str, str, str]] = field(default_factory=set)

    @property
    def active(self) -> bool:
        return bool(self.specs)

    def combine(self, results: list[list[Hit]]) -> list[list[Hit]]:
        """Per canonical branch: its hits minus shadowed paths, plus the mirrored overlay hits."""
        if not self.specs:
            return results
        n = self.branches
        base, mirrored, manifest = results[:n], results[n : 2 * n], results[2 * n :]
        self.shadowed = {_file_of(h.payload) for b in manifest for h in b}
        self.shadowed |= {_file_of(h.payload) for b in mirrored for h in b}
        return [[h for h in base[i] if _file_of(h.payload) not in self.shadowed] + mirrored[i] for i in range(n)]

    def order(self, ranked: list) -> list:
        """Overlay items ahead of canonical ones, each group in the pipeline's own (score, path, offset) order."""
        if not self.specs:
            return ranked
        seen: set[tuple[tuple[str, str, str], str]] = set()
        first: list[Any] = []
        rest: list[Any] = []
        for c in ranked:
            key = (_file_of(c.payload), c.payload["chunk_hash"])
            if key in seen:
                continue
            seen.add(key)
            (first if c.payload.get("trust_class") == WORKSPACE_OVERLAY else rest).append(c)
        return first + rest


def _file_of(payload: dict) -> tuple[str, str, str]:
    """Which file a point belongs to: (repo, tenant, path)."""
    return payload.get("repo", ""), payload.get("tenant", ""), payload.get("path", "")


def plan_search(query: RetrievalQuery, specs: Sequence[SearchSpec], *, now: float | None = None) -> OverlayPlan:
    """The overlay branches to add to the canonical `specs` for this query (none without a run id)."""
    run_id = query.filters.run_id
    if query.overlay_policy == "skip" or not run_id or not specs:
        return OverlayPlan([], len(specs))
    now = time.time() if now is None else now
    mirrored = [
        replace(s, where=overlay_query(s.where, run_id, now, Range("total_chunks", gte=1))) for s in specs
    ]
    extra = list(mirrored)
    dense = next((s for s in specs if s.dense is not None), None)
    if dense is not None:
        extra.append(SearchSpec(
            where=overlay_query(dense.where, run_id, now, Match("chunk_sequence", 0)),
            limit=MAX_OVERLAY_FILES,
            dense=dense.dense,
            fields=("path", "repo", "tenant"),
        ))
    return OverlayPlan(extra, len(specs), run_id)
