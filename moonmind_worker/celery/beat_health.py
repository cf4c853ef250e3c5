"""`python -m moonmind_worker.celery.beat_health SCHEDULE`: exit 0 when beat scheduled the overlay sweep recently.

Why not "the schedule file exists": a beat that is up but no longer sends (stuck, or its schedule lost
the sweep) leaves the file in place, and expired overlays pile up. Beat records in its schedule file (a
shelve) when it last sent each entry (`last_run_at`), and writes it after every send (`beat_sync_every=1`,
worker.py); the sweep's must be less than STALE_AFTER_INTERVALS x MOONMIND_OVERLAY_SWEEP_INTERVAL_S old.
compose/docker-compose.yml's beat healthcheck runs this with beat's `--schedule` file.
"""

from __future__ import annotations

import sys
import time
from typing import Any

#: Sweep intervals that may pass without beat sending the sweep before beat counts as unhealthy.
STALE_AFTER_INTERVALS = 3


def last_sweep(schedule: str) -> float | None:
    """When beat last sent the sweep (epoch seconds) per its schedule file; None: no file, or no sweep entry."""
    import dbm
    import shelve
    from datetime import timezone

    from .worker import SWEEP_SCHEDULE_NAME

    kind = dbm.whichdb(schedule)
    if not kind:  # None: no such file; "": not a database
        return None
    db: Any
    if kind == "dbm.gnu":
        import dbm.gnu

        db = dbm.gnu.open(schedule, "ru")  # "u": no lock; beat holds the file open for writing while it runs
    else:
        db = dbm.open(schedule, "r")
    shelf: Any = shelve.Shelf(db)
    try:
        entry = (shelf.get("entries") or {}).get(SWEEP_SCHEDULE_NAME)
    finally:
        shelf.close()
    at = getattr(entry, "last_run_at", None)
    if at is None:
        return None
    if at.tzinfo is None:  # Celery keeps naive times in UTC
        at = at.replace(tzinfo=timezone.utc)
    return float(at.timestamp())


def check(schedule: str, interval_s: float, now: float | None = None) -> tuple[bool, str]:
    """(healthy, the line that says why) for beat's schedule file and the sweep interval."""
    try:
        at = last_sweep(schedule)
    except Exception as exc:  # noqa: BLE001 - an unreadable schedule is an unhealthy beat, said in one line
        return False, f"beat unhealthy: cannot read its schedule {schedule} ({type(exc).__name__}: {exc})"
    if at is None:
        return False, f"beat unhealthy: {schedule} records no scheduled overlay sweep (is beat running with --schedule {schedule}?)"
    age = (time.time() if now is None else now) - at
    limit = STALE_AFTER_INTERVALS * interval_s
    if age > limit:
        return False, (f"beat unhealthy: it last scheduled the overlay sweep {age:.0f} s ago, over {limit:.0f} s "
                       f"({STALE_AFTER_INTERVALS} x MOONMIND_OVERLAY_SWEEP_INTERVAL_S)")
    return True, f"beat ok: it scheduled the overlay sweep {max(age, 0):.0f} s ago"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m moonmind_worker.celery.beat_health SCHEDULE_FILE\n")
        return 2
    from ..settings import get_settings

    healthy, line = check(args[0], get_settings().overlay_sweep_interval_s)
    (sys.stdout if healthy else sys.stderr).write(line + "\n")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
