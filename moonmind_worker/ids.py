"""Sortable identifiers for context packs (`ctx_` + a ULID: 48-bit ms time + 80 random bits), and the one timestamp format."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(now_ms: int | None = None) -> str:
    """26 Crockford base32 characters; lexicographic order follows creation time."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


def telemetry_id() -> str:
    return "ctx_" + ulid()


def utc_timestamp(ts: float | None = None, timespec: str = "seconds") -> str:
    """ISO 8601 in UTC with a `Z` (`2026-11-24T10:00:00Z`): every timestamp a payload, pack, manifest or event carries."""
    moment = datetime.now(timezone.utc) if ts is None else datetime.fromtimestamp(ts, timezone.utc)
    return moment.isoformat(timespec=timespec).replace("+00:00", "Z")
