"""Checks that must pass before any vector operation touches the store.

Why: a dimension or model mismatch does not fail loudly in Qdrant; it silently
returns nonsense. Refuse first, say expected vs actual, and name the remedy.
"""

from __future__ import annotations

from ..contracts import READABLE_SCHEMA_VERSIONS
from ..embedding import RETIRED_STATIC_MODELS, Embedder
from ..errors import MoonmindError
from . import CollectionInfo, Store


def check_collection(store: Store, embedder: Embedder, *, must_exist: bool = True) -> CollectionInfo | None:
    """The collection's info when it is usable with this embedder; a MoonmindError otherwise."""
    info = store.info()
    if info is None:
        if must_exist:
            raise MoonmindError(
                "collection_missing",
                f"Collection {store.collection} does not exist yet.",
                "Run `moonmind rag index PATH --repo NAME` to create and fill it.",
            )
        return None
    if info.schema_version not in READABLE_SCHEMA_VERSIONS:
        raise MoonmindError(
            "schema_unsupported",
            f"Collection {info.name} uses payload schema v{info.schema_version}; this version reads "
            f"{sorted(READABLE_SCHEMA_VERSIONS)}.",
            "Re-index into a fresh collection (`moonmind rag index PATH --repo NAME`) or upgrade moonmind-worker.",
        )
    if info.dimensions != embedder.dimensions:
        raise MoonmindError(
            "embedding_dimension_mismatch",
            f"Collection {info.name} expects dim={info.dimensions} but {embedder.name} outputs {embedder.dimensions}.",
            f"Run moonmind rag sync-embedding --collection {info.name}",
        )
    if info.model and info.model != embedder.name:
        raise MoonmindError(
            "embedding_model_mismatch",
            f"Collection {info.name} was embedded with {info.model} but the configured model is {embedder.name}.",
            f"Run moonmind rag sync-embedding --collection {info.name}"
            + ("." if info.model in RETIRED_STATIC_MODELS else f", or configure {info.model} again."),
        )
    return info
