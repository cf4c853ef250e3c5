"""How the embedded store (edge.py) lays a chunk's payload out in the engine: the fields a filter
reads as they are, the rest in one JSON string.

Why: the engine takes each payload value from Python by trying its types in turn (bool, two
integer kinds, float, then string: a failed try raises, so a string value costs ~10 µs), and each
segment build reads every point's payload again once per payload index. Handing over a chunk's
25 fields was the largest per-point cost of the index run's writer; figures: BENCHMARKS.md
("The payload's layout in the embedded store"). The store's callers see the payload they wrote,
in its order; a payload written before this layout (no `PACKED` field) reads as it is.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from .base import PAYLOAD_INDEXES

#: The one field that holds the others, as a JSON object in the payload's own order.
PACKED = "_packed"
#: Fields left as they are: every one a store filter names (the indexed ones, and the two an
#: overlay search matches without an index); the chunk's text; and the small fields that reads of
#: every chunk take (`rag repos`, `rag stats`, the indexer without its file table), which then never
#: decode the packed string. A filter on any other field is refused (`filtered`).
FLAT = frozenset(name for name, _ in PAYLOAD_INDEXES) | {
    "chunk_sequence", "total_chunks", "text", "content_hash", "token_count", "model_version", "indexed_at"}


def pack(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as the engine keeps it (the flat fields stand as null in the packed order)."""
    flat: dict[str, Any] = {}
    order: dict[str, Any] = {}
    for key, value in payload.items():
        if key in FLAT:
            flat[key] = value
            order[key] = None
        else:
            order[key] = value
    if len(order) > len(flat):
        flat[PACKED] = json.dumps(order, ensure_ascii=False, separators=(",", ":"))
    return flat


def unpack(stored: dict[str, Any] | None, fields: Sequence[str] | bool = True) -> dict[str, Any]:
    """The payload a caller wrote, from what the engine returned; only `fields` of it when a list."""
    stored = stored or {}
    packed = stored.get(PACKED)
    if packed is None:  # written before this layout, or with no field to pack
        out = dict(stored)
    else:
        out = {key: stored[key] if key in FLAT else value
               for key, value in json.loads(packed).items() if key in stored or key not in FLAT}
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
    return names


def filtered(key: str) -> str:
    """`key`, which a filter names: refused when the embedded store keeps it packed (no filter could match it)."""
    if key not in FLAT:
        raise ValueError(f"the embedded store cannot filter on payload field {key!r}: add it to edge_payloads.FLAT")
    return key
