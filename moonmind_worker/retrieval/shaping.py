"""Answers sized for an agent's budget: each hit cut to a window of lines, or to its location alone.

Why in the pipeline, before the token budget: the budget then counts what the caller receives, and
every transport (owner, Celery, gateway, MCP) returns the same shaped pack.

`max_lines` N: the N consecutive lines of the chunk that hold the most distinct query terms (the
BM25 terms of `text.lexical`), then the most term hits, then the earliest; a hit that holds no query
term keeps its first N lines, where the chunker puts a definition's signature. The item's `text`,
offsets, lines and `token_count` describe that window, so its citation points at exactly the text
shown; `chunk_id`, `chunk_hash` and `payload` (the stored chunk's own offsets and lines) still name
the whole chunk, to read the rest of it.

`locations_only`: `text` is "" and `token_count` 0; citation, score, `section_title` (the symbols
the chunk defines), trust class and payload stay.
"""

from __future__ import annotations

from ..contracts import ContextItem
from ..text import lexical
from ..text.chunking import estimate_tokens


def shape_items(items: list[ContextItem], query: str, *, max_lines: int | None = None,
                locations_only: bool = False) -> list[ContextItem]:
    """The items as the request asks for them (unchanged when it asks for neither shape)."""
    if locations_only:
        return [item.model_copy(update={"text": "", "token_count": 0}) for item in items]
    if max_lines:
        wanted = frozenset(lexical.terms(query))
        return [cut_to_lines(item, max_lines, wanted) for item in items]
    return items


def _lines(text: str) -> list[str]:
    """The text's numbered lines, with their ends, cut where `chunk_text` advances its line numbers."""
    out: list[str] = []
    part = ""
    for piece in text.splitlines(keepends=True):
        part += piece
        if piece.endswith(("\n", "\r")):
            out.append(part)
            part = ""
    return out + ([part] if part else [])


def best_window(lines: list[str], n: int, wanted: frozenset[str]) -> int:
    """Index of the first line of the best `n`-line window (see the module docstring)."""
    found = [wanted.intersection(lexical.terms(line)) if wanted else frozenset() for line in lines]
    best, best_key = 0, (-1, -1)
    for start in range(len(lines) - n + 1):
        window = found[start:start + n]
        key = (len(frozenset().union(*window)), sum(len(f) for f in window))
        if key > best_key:  # strictly better: a tie keeps the earlier window
            best, best_key = start, key
    return best


def cut_to_lines(item: ContextItem, n: int, wanted: frozenset[str]) -> ContextItem:
    """`item` with its text cut to its best `n`-line window, and its location moved to match."""
    lines = _lines(item.text)
    if len(lines) <= n:
        return item
    start = best_window(lines, n, wanted)
    text = "".join(lines[start:start + n])
    offset_start = item.offset_start + sum(len(line) for line in lines[:start])
    return item.model_copy(update={
        "text": text,
        "offset_start": offset_start,
        "offset_end": offset_start + len(text),
        "line_start": item.line_start + start,
        "line_end": item.line_start + start + n - 1,
        "token_count": estimate_tokens(text),
    })
