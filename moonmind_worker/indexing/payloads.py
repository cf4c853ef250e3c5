"""A batch's payload template, validated by the contract, and the points built from it.

Why a module of its own: the indexer, the overlays and the worker pool (`workers.Pool.points`) all
build points this way; below all three, it lets the pool do so without importing the indexer.
`points` stays free of pydantic for the worker processes: the template is validated here, once.
"""

from __future__ import annotations

from typing import Any

from ..contracts import CANONICAL, ChunkPayload, TrustClass
from ..embedding import Embedder
from ..ids import utc_timestamp
from ..store import PointIn
from ..text.chunking import language_of
from . import points
from .points import Docs


def payload_template(
    docs: Docs,
    *,
    repo: str,
    tenant: str,
    model_version: str,
    trust_class: TrustClass = CANONICAL,
    run_id: str = "",
    expires_at: float | None = None,
) -> dict[str, Any]:
    """A batch's payload as the contract dumps it, from its first chunk: what `points.build` copies per chunk.

    Why one per batch: the contract's keys, order, defaults and batch-wide values, validated once,
    without pydantic's per-chunk cost (and without pydantic where the points are built).
    """
    path, fhash, chunks = next((d for d in docs if d[2]), docs[0])
    c = chunks[0]
    return ChunkPayload(
        **points.chunk_fields(path, fhash, c, language_of(path)),
        repo=repo,
        tenant=tenant,
        model_version=model_version,
        indexed_at=utc_timestamp(),
        trust_class=trust_class,
        run_id=run_id,
        expires_at=expires_at,
    ).model_dump()


def build_points(
    embedder: Embedder,
    docs: Docs,
    *,
    repo: str,
    tenant: str,
    trust_class: TrustClass = CANONICAL,
    run_id: str = "",
    expires_at: float | None = None,
) -> list[PointIn]:
    """Embed chunks of several files in one batch and wrap them as points (shared with overlays)."""
    if not any(chunks for _, _, chunks in docs):
        return []
    template = payload_template(docs, repo=repo, tenant=tenant, model_version=embedder.name,
                                trust_class=trust_class, run_id=run_id, expires_at=expires_at)
    return points.build(embedder, docs, template)
