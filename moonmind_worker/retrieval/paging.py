"""Paging through one ranked list: `cursor` in a RetrievalQuery, `next_cursor` in its pack.

A search ranks one window of candidates (each branch's best `window` hits, fused and ranked); the
results are the ranked candidates that score at or above the threshold (`total_results`), and a page
is `top_k` of them from `offset` on. The next page ranks the same window again and reads further on,
so it continues the page before it exactly: no duplicate, no gap, for an unchanged index.

The cursor is opaque to callers: the offset of the next page, the window the first page searched
(a later page with another `top_k` must rank the same window) and a fingerprint of what defines the
list (query text, filters, score threshold, overlay policy). A cursor sent with another query or
filters is refused (`invalid_argument`) rather than silently paging some other list. It is no
security boundary: the caller's scope is applied to every page as it is to the first.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

from ..contracts import TOP_K_MAX, RetrievalQuery
from ..errors import MoonmindError

#: Written in front of every cursor, so a cursor of a later format is told apart.
PREFIX = "p1."
#: The largest window a search uses (retrieval/pipeline.py: four candidates per item asked for).
MAX_WINDOW = TOP_K_MAX * 4
#: The most results a window can yield: both branches' hits, distinct, plus an overlay's as many again.
MAX_OFFSET = MAX_WINDOW * 4


@dataclass(frozen=True)
class Page:
    """Where a page starts in the ranked results, and the window it ranks."""

    offset: int
    window: int


def fingerprint(query: RetrievalQuery) -> str:
    """What makes two requests the same ranked list: the query's words, filters, threshold and overlay policy."""
    key = [" ".join(query.query.split()), query.filters.scope(), query.score_threshold, query.overlay_policy]
    return hashlib.sha256(json.dumps(key, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def encode(query: RetrievalQuery, offset: int, window: int) -> str:
    raw = json.dumps([offset, window, fingerprint(query)], separators=(",", ":")).encode()
    return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read(query: RetrievalQuery) -> Page | None:
    """The page the query's cursor asks for (None: no cursor, the first page); `invalid_argument` for a bad one."""
    cursor = query.cursor
    if cursor is None:
        return None
    try:
        if not cursor.startswith(PREFIX):
            raise ValueError
        body = cursor[len(PREFIX):]
        offset, window, print_ = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        if (type(offset) is not int or type(window) is not int or type(print_) is not str
                or not 0 <= offset <= MAX_OFFSET or not 1 <= window <= MAX_WINDOW):
            raise ValueError
    except (ValueError, TypeError, UnicodeDecodeError):
        raise _bad("The cursor is not one a search returned (malformed or cut short).") from None
    if print_ != fingerprint(query):
        raise _bad("The cursor belongs to another search (its query, filters, score threshold or overlay policy differ).")
    return Page(offset, window)


def _bad(message: str) -> MoonmindError:
    return MoonmindError(
        "invalid_argument", message,
        "Pass the `next_cursor` of the previous page unchanged, with the same query and filters; "
        "leave the cursor out for the first page.",
    )
