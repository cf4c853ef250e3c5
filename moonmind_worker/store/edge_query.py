"""The store's filters and query vectors (base.Where, SearchSpec) as Qdrant Edge's request types, and a record's sparse terms."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from .base import DENSE, DENSE_SEARCH_BEAM, SPARSE, Match, MatchAny, Range, SearchSpec, SparseVec, Where
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


def branch_request(s: SearchSpec) -> Any:
    """One search branch as the engine's request: ids and scores only; a dense one walks the graph with the wide beam."""
    from qdrant_edge import QueryRequest, SearchParams

    return QueryRequest(limit=s.limit, query=_edge_query(s.dense, s.sparse), filter=_edge_filter(s.where),
                        with_payload=False, with_vector=False,
                        params=SearchParams(hnsw_ef=DENSE_SEARCH_BEAM) if s.dense is not None else None)


def rescoring_request(found: set, dense: np.ndarray | None, sparse: SparseVec | None) -> Any:
    """The other query's scores of a branch's candidates (`found`: the engine's ids), by id: no second walk of the graph."""
    from qdrant_edge import Filter, HasIdCondition, QueryRequest

    return QueryRequest(limit=len(found), query=_edge_query(dense, sparse), filter=Filter(must=[HasIdCondition(found)]),
                        with_payload=False, with_vector=False)


def rows(batch: Any, points_of: dict[Any, Any]) -> list[list[tuple[Any, float]]]:
    """Each request's (id key, score) pairs; `points_of` learns each key's engine id.

    Keyed by the id's integer: the binding builds a new UUID object on every `.id` access, and
    UUIDs hash and compare in Python (~1,000 such calls per search).
    """
    out = []
    for points in batch:
        row = []
        for p in points:
            pid = p.id
            k = _point_key(pid)
            points_of[k] = pid
            row.append((k, p.score))
        out.append(row)
    return out


def _point_key(pid: Any) -> Any:
    """A point id as a cheap dict key: a UUID's integer (ids are UUIDs here), anything else as is."""
    return pid.int if pid.__class__ is uuid.UUID else pid
