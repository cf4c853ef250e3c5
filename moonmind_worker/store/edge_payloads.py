"""How the embedded store (edge.py) lays a chunk's payload out in the engine: the fields a filter
reads as they are, the rest in one JSON string.

Why: the engine takes each payload value from Python by trying its types in turn (bool, two
integer kinds, float, then string: a failed try raises, so a string value costs ~10 µs), and each
segment build reads every point's payload again once per payload index. Handing over a chunk's
25 fields was the largest per-point cost of the index run's writer; figures: BENCHMARKS.md
("The payload's layout in the embedded store"). The store's callers see the payload they wrote,
in its order; a payload written before this layout (no `PACKED` field) reads as it is.

A keyed store (created by this version: `KEYED_LAYOUT` in its meta.json) also holds the keyword
fields a filter matches (`KEYED`) as one list of "field=value" entries, `KEYS`, under one payload
index, and not on their own. Why: a segment build reads every point's whole payload again once
per payload index; seven keyword indexes made those passes the largest share of the builds of a
cold index run (BENCHMARKS.md, "One index for the keyword fields"). Filters on them are rewritten
to match entries (`keyed_where`); a store made before keeps its fields and indexes as they are.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from .base import PAYLOAD_INDEXES, Match, MatchAny, Where

#: The one field that holds the others, as a JSON object in the payload's own order.
PACKED = "_packed"
#: A keyed store's list of "field=value" entries, one per value of a `KEYED` field (see above).
KEYS = "_keys"
#: Fields left as they are: every one a store filter names (the indexed ones, and the two an
#: overlay search matches without an index); the chunk's text; and the small fields that reads of
#: every chunk take (`rag repos`, `rag stats`, the indexer without its file table), which then never
#: decode the packed string. A filter on any other field is refused (`filtered`).
FLAT = frozenset(name for name, _ in PAYLOAD_INDEXES) | {KEYS} | {
    "chunk_sequence", "total_chunks", "text", "content_hash", "token_count", "model_version", "indexed_at"}


#: The keyword fields a keyed store holds as "field=value" entries of `KEYS` (every keyword index of the
#: previous layout); `LISTED` ones hold a list, one entry per element.
KEYED = frozenset(name for name, kind in PAYLOAD_INDEXES if kind in ("keyword", "tenant"))
LISTED = frozenset({"symbols"})
#: The payload indexes of a keyed store (name, kind as in base.PAYLOAD_INDEXES).
KEYED_INDEXES: tuple[tuple[str, str], ...] = (
    (KEYS, "keyword"), *((name, kind) for name, kind in PAYLOAD_INDEXES if name not in KEYED))
#: meta.json's key and value for a keyed store.
LAYOUT_KEY = "payload_layout"
KEYED_LAYOUT = "keyed"


def _entries_of(key: str, value: Any) -> list[str] | None:
    """A keyed field's entries: "field=value" per text (a list: per element), the bare name for None,
    "field[]" for an empty list; None for a value of another type (kept flat, as the previous layout did)."""
    if key in LISTED:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [f"{key}={v}" for v in value] if value else [f"{key}[]"]
        return None
    if isinstance(value, str):
        return [f"{key}={value}"]
    return [key] if value is None else None


def pack(payload: dict[str, Any], keyed: bool = False) -> dict[str, Any]:
    """The payload as the engine keeps it (the flat and keyed fields stand as null in the packed order)."""
    flat: dict[str, Any] = {}
    order: dict[str, Any] = {}
    keys: list[str] = []
    for key, value in payload.items():
        entries = _entries_of(key, value) if keyed and key in KEYED else None
        if entries is not None:
            keys.extend(entries)
            order[key] = None
        elif key in FLAT:
            flat[key] = value
            order[key] = None
        else:
            order[key] = value
    if keyed:
        flat[KEYS] = keys
    if any(key not in FLAT for key in order):
        flat[PACKED] = json.dumps(order, ensure_ascii=False, separators=(",", ":"))
    return flat


def _entries(keys: list[str]) -> dict[str, Any]:
    """The keyed fields' values from their entries (see `_entries_of`), in the order written."""
    out: dict[str, Any] = {}
    for entry in keys:
        key, eq, value = entry.partition("=")
        if not eq:  # the bare name: None; with "[]": an empty list
            if key.endswith("[]"):
                out[key[:-2]] = []
            else:
                out[key] = None
        elif key in LISTED:
            out.setdefault(key, []).append(value)
        else:
            out[key] = value
    return out


def keyed_where(where: Where) -> Where:
    """`where` for a keyed store: a match on a keyed field becomes a match of its entry in `KEYS`."""

    def entry(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"a filter on payload field {key!r} matches text, not {value!r}")
        return f"{key}={value}"

    def cond(c: Any) -> Any:
        if isinstance(c, Where):
            return keyed_where(c)
        if isinstance(c, Match) and c.key in KEYED:
            return Match(KEYS, entry(c.key, c.value))
        if isinstance(c, MatchAny) and c.key in KEYED:
            return MatchAny(KEYS, tuple(entry(c.key, v) for v in c.values))
        return c

    return Where(must=tuple(map(cond, where.must)), must_not=tuple(map(cond, where.must_not)),
                 should=tuple(map(cond, where.should)))


def unpack(stored: dict[str, Any] | None, fields: Sequence[str] | bool = True) -> dict[str, Any]:
    """The payload a caller wrote, from what the engine returned; only `fields` of it when a list."""
    stored = stored or {}
    packed = stored.get(PACKED)
    keys = stored.get(KEYS)  # None: a store of the previous layout, or the entries were not asked for
    keyed = _entries(keys) if keys is not None else {}
    if packed is None:  # written before this layout, or with no field to pack
        out = {key: value for key, value in stored.items() if key != KEYS}
        out.update(keyed)
    else:
        out = {}
        for key, value in json.loads(packed).items():
            if key in keyed:
                out[key] = keyed[key]
            elif key not in FLAT:
                out[key] = value
            elif key in stored:
                out[key] = stored[key]
    if isinstance(fields, bool):
        return out
    wanted = set(fields)
    return {k: v for k, v in out.items() if k in wanted}


def selector(fields: Sequence[str] | bool) -> list[str] | bool:
    """The engine's payload selector for these fields: with the packed field when one may be in it."""
    if isinstance(fields, bool):
        return fields
    names = list(fields)
    if any(name not in FLAT for name in names):
        names.append(PACKED)
    if any(name in KEYED for name in names):
        names.append(KEYS)  # a keyed store's entries (a store of the previous layout has no such field)
    return names


def filtered(key: str) -> str:
    """`key`, which a filter names: refused when the embedded store keeps it packed (no filter could match it)."""
    if key not in FLAT:
        raise ValueError(f"the embedded store cannot filter on payload field {key!r}: add it to edge_payloads.FLAT")
    return key
