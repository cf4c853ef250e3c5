"""Vector stores behind one small interface (`base.Store`): Qdrant Edge (embedded) and qdrant-client (server).

`base.py` declares every operation and the types that cross the seam, `scopes.py` every
scope filter, `edge.py` and `remote.py` implement all of it, `guardrails.py` checks a
collection before any vector operation, `faults.py` injects crashes for the adversarial suite.
"""

from __future__ import annotations

import os

from ..settings import Settings
from .base import (
    DENSE,
    LEXICAL_FORMAT,
    LEXICAL_FORMAT_KEY,
    PAYLOAD_CACHE_POINTS,
    PAYLOAD_INDEXES,
    SPARSE,
    CollectionInfo,
    EmbeddedStore,
    FileTable,
    Hit,
    Match,
    MatchAny,
    PointIn,
    Range,
    SearchSpec,
    SparseVec,
    Store,
    TermTable,
    Where,
)
from .edge import ONE_SHOT_QUEUE_S, EdgeStore, open_replica
from .remote import QdrantClientStore

__all__ = [
    "DENSE", "LEXICAL_FORMAT", "LEXICAL_FORMAT_KEY", "PAYLOAD_CACHE_POINTS", "PAYLOAD_INDEXES", "SPARSE", "CollectionInfo",
    "EdgeStore", "EmbeddedStore", "FileTable", "Hit",
    "Match", "MatchAny", "PointIn", "QdrantClientStore", "Range", "SearchSpec", "SparseVec", "Store", "TermTable", "Where",
    "open_replica", "open_store",
]


def open_store(settings: Settings, collection: str | None = None) -> Store:
    """The configured store: Qdrant Edge when QDRANT_URL is unset, qdrant-client otherwise."""
    name = collection or settings.collection
    store: Store
    if settings.embedded_store:
        # one-shot commands queue behind each other longer than behind an owner, unless told how long
        explicit = "store_wait_s" in settings.model_fields_set
        queue_s = settings.store_wait_s if explicit else max(settings.store_wait_s, ONE_SHOT_QUEUE_S)
        store = EdgeStore(settings.data_dir, name, wait_s=settings.store_wait_s, queue_s=queue_s)
    else:
        store = QdrantClientStore(settings, name)
    if os.environ.get("MOONMIND_FAULT") or os.environ.get("MOONMIND_FAULT_TRACE"):  # the adversarial suite only
        from . import faults

        return faults.wrap(store)
    return store
