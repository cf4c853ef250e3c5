"""The store's filters and query vectors (base.Where, SearchSpec) as Qdrant Edge's request types, and a record's sparse terms."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from .base import DENSE, SPARSE, Match, MatchAny, Range, SparseVec, Where
from .edge_payloads import filtered


def _indices(vector: Any) -> list[int]:
    """A record's sparse term ids (none when the point has no sparse vector: a text with no term)."""
    sparse = (vector or {}).get(SPARSE)
    return list(sparse.indices) if sparse is not None else []


def _edge_filter(where: Where | None):
    from qdrant_edge import FieldCondition, Filter, MatchValue, RangeFloat
    from qdrant_edge import MatchAny as EMatchAny

    if where is None:
        return None

    def cond(c):
        if isinstance(c, Where):
            return _edge_filter(c)
        if isinstance(c, Match):
            return FieldCondition(key=filtered(c.key), match=MatchValue(c.value))
        if isinstance(c, MatchAny):
            return FieldCondition(key=filtered(c.key), match=EMatchAny(list(c.values)))
        if isinstance(c, Range):
            return FieldCondition(key=filtered(c.key), range=RangeFloat(gt=c.gt, gte=c.gte, lt=c.lt, lte=c.lte))
        raise TypeError(c)

    return Filter(
        must=[cond(c) for c in where.must] or None,
        must_not=[cond(c) for c in where.must_not] or None,
        should=[cond(c) for c in where.should] or None,
    )


def _edge_query(dense: np.ndarray | None, sparse: SparseVec | None):
    from qdrant_edge import Query, SparseVector

    if dense is not None:
        return Query.Nearest(dense.tolist(), using=DENSE)
    if sparse is None:
        raise ValueError("a search branch needs a dense or a sparse query")
    return Query.Nearest(SparseVector(indices=sparse.indices, values=sparse.values), using=SPARSE)
