"""Points read back from the embedded store's shard (edge.py) by id or by filter, page by page, and counted.

Each function takes the store's `open_shard` (its shard, loaded on first use) and `engine` (the lock
every engine call holds: a reload on the writer's thread closes the shard object a read would use).
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Iterator, Sequence

from .base import SPARSE, Hit, Where
from .edge_payloads import selector, unpack
from .edge_query import _edge_filter, _indices

#: How many points one engine call reads when the caller names no page size.
PAGE = 1024


def retrieve(open_shard: Callable[[], Any], engine: ContextManager[Any], ids: Sequence[str],
             fields: Sequence[str] | bool) -> list[Hit]:
    """Points by id with the payload fields asked for, in the order asked; missing ids are skipped."""
    found = {str(r.id): r for r in by_id(open_shard, engine, ids, with_payload=selector(fields), with_vector=False)}
    return [Hit(id=i, score=0.0, payload=unpack(found[i].payload, fields)) for i in ids if i in found]


def by_id(open_shard: Callable[[], Any], engine: ContextManager[Any], ids: Sequence[str], **request: Any) -> list[Any]:
    """The engine's records of these ids, in one call (none when no id is asked)."""
    if not ids:
        return []
    with engine:
        return open_shard().retrieve(list(ids), **request)


def scroll(open_shard: Callable[[], Any], engine: ContextManager[Any], where: Where | None, fields: Sequence[str] | bool,
           batch: int) -> Iterator[Hit]:
    for r in _pages(open_shard, engine, where, batch, with_payload=selector(fields), with_vector=False):
        yield Hit(id=str(r.id), score=0.0, payload=unpack(r.payload, fields))


def sparse_terms(open_shard: Callable[[], Any], engine: ContextManager[Any], where: Where | None,
                 ids: Sequence[str] | None) -> Iterator[list[int]]:
    if ids is not None:
        for start in range(0, len(ids), PAGE):
            for r in by_id(open_shard, engine, ids[start:start + PAGE], with_payload=False, with_vector=[SPARSE]):
                yield _indices(r.vector)
        return
    for r in _pages(open_shard, engine, where, PAGE, with_payload=False, with_vector=[SPARSE]):
        yield _indices(r.vector)


def count(open_shard: Callable[[], Any], engine: ContextManager[Any], where: Where | None) -> int:
    from qdrant_edge import CountRequest

    with engine:
        return open_shard().count(CountRequest(exact=True, filter=_edge_filter(where) if where else None))


def _pages(open_shard: Callable[[], Any], engine: ContextManager[Any], where: Where | None, batch: int,
           **request: Any) -> Iterator[Any]:
    """The records `where` selects, `batch` per engine call: the lock is held for a page, never between pages."""
    from qdrant_edge import ScrollRequest

    open_shard()  # a missing collection fails here, not at the first batch
    offset = None
    flt = _edge_filter(where) if where else None
    while True:
        with engine:
            records, offset = open_shard().scroll(ScrollRequest(offset=offset, limit=batch, filter=flt, **request))
        yield from records
        if offset is None:
            break
