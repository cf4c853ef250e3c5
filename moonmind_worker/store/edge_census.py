"""Which filter conditions every point of the embedded store's loaded shard satisfies (edge.py).

Why: the engine checks a search's filter on every point it scores, and on a box that holds one
repository of one tenant the usual filter (canonical chunks, this repository) holds for all of
them. Such a condition selects nothing and costs most of a search: on Django 5.1.4 a dense
request scanned whole took 1.90 ms with it and 0.76 without (BENCHMARKS.md, "The HNSW graph").
A condition is dropped only once the engine has counted no point failing it in the shard as
loaded, and what was learned is forgotten on every write and load (`clear`), so a search's
results never change, only its cost.

Only text matches are decided (`Match`, `MatchAny`): a `Range` may hold now and not later
(an overlay's expiry), whatever the writes.
"""

from __future__ import annotations

from typing import Any

from .base import Match, MatchAny, Where
from .edge_query import _edge_filter

#: Conditions kept at most (then forgotten): a warm owner that takes no write would otherwise keep one per
#: path or run a search ever filtered on.
MAX_KNOWN = 4096


class Census:
    """What this process has counted of the loaded shard: condition -> holds for every point."""

    def __init__(self) -> None:
        self._known: dict[Any, bool] = {}
        self._points: int | None = None

    def clear(self) -> None:
        """Forget everything: the shard's points changed, or another shard object was loaded."""
        self._known = {}
        self._points = None

    def trimmed(self, shard: Any, where: Where) -> Where:
        """`where` without the top-level conditions every point satisfies (the caller holds the engine lock)."""
        if not where.must:
            return where
        keep = tuple(c for c in where.must if not self._everywhere(shard, c))
        if len(keep) == len(where.must):
            return where
        return Where(must=keep, must_not=where.must_not, should=where.should)

    def _everywhere(self, shard: Any, condition: Any) -> bool:
        if not isinstance(condition, (Match, MatchAny)):
            return False
        known = self._known.get(condition)
        if known is None:
            if len(self._known) >= MAX_KNOWN:
                self._known = {}
            known = self._known[condition] = _holds_for_all(shard, condition, self._total(shard))
        return known

    def _total(self, shard: Any) -> int:
        if self._points is None:
            self._points = shard.info().points_count
        return self._points


def _holds_for_all(shard: Any, condition: Any, total: int) -> bool:
    """Whether no point of `shard` fails `condition`: an exact count of those that do.

    The engine's estimate (a payload index's count, ~0.02 ms) first rules out a condition that
    many points fail (an overlay's run, one path) without the exact count (~0.5-3 ms on Django);
    it only ever keeps a condition, so its error cannot change a result.
    """
    from qdrant_edge import CountRequest

    if total and shard.count(CountRequest(filter=_edge_filter(Where(must=(condition,))), exact=False)) < total:
        return False
    return shard.count(CountRequest(filter=_edge_filter(Where(must_not=(condition,))), exact=True)) == 0
