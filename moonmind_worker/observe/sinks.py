"""Where observations go: queue events, carrying the searched scope (shared by hooks and artifacts)."""

from __future__ import annotations

from typing import Any


def publish(event: str, **fields: Any) -> None:
    """Send a queue event; never raises (events.publish is itself bounded and no-op without a broker)."""
    from . import events

    try:
        events.publish(event, **{k: v for k, v in fields.items() if v is not None})
    except Exception:  # noqa: BLE001 - an event must never break the action it reports
        pass


def scope_fields(filters: dict | None) -> dict[str, Any]:
    """The repo/tenant/run a search was scoped to, so its events carry the searched scope."""
    f = filters or {}
    return {k: f[k] for k in ("repo", "tenant", "run_id") if f.get(k)}
