"""Even out keep-alive connections across the processes of `gateway serve --workers N`.

Why: the workers share one listening socket, and whichever wakes first accepts a whole
burst of connections. Long-lived clients (a proxy's upstream pool, an `httpx.Client` in a
Celery worker, wrk) then stay piled on one worker: 32 connections split 21/11 or 23/9 in
measurements, and the busier worker's queue sets everyone's p99. Each worker publishes
its count of open connections in a small shared file; a worker holding more than its
fair share (total / workers, rounded up) answers one request with `Connection: close`.
The client reconnects to whichever worker accepts first, so repeated sheds converge to
an even split, and an even split sheds nothing.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path

_SLOT_BYTES = 8
#: A worker closes at most one connection per this many seconds: each close must land before
#: the counts say whether another is needed.
SHED_INTERVAL_S = 0.05


def create_file(path: Path, slots: int) -> Path:
    """The shared counts file, one zeroed slot per possible worker (the parent creates it first)."""
    path.write_bytes(b"\0" * (slots * _SLOT_BYTES))
    return path


class Balancer:
    """One worker's view of the shared counts: its own slot, written on every response.

    `connections` says how many connections this process holds now (uvicorn_adapter.open_connections).
    """

    def __init__(self, path: Path, workers: int, connections: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = workers
        self._connections = connections
        self._clock = clock
        self._fd = os.open(path, os.O_RDWR)
        self._slots = os.fstat(self._fd).st_size // _SLOT_BYTES
        self.slot = self._claim()
        self._map = mmap.mmap(self._fd, self._slots * _SLOT_BYTES)
        self._counts = memoryview(self._map).cast("q")
        self._counts[self.slot] = 0
        self._next_shed = 0.0

    def _claim(self) -> int:
        """The first free slot, held by a byte-range lock that the kernel drops if this process dies."""
        for slot in range(self._slots):
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, _SLOT_BYTES, slot * _SLOT_BYTES)
                return slot
            except OSError:
                continue
        os.close(self._fd)
        raise RuntimeError(f"all {self._slots} balance slots are taken")

    def should_close(self) -> bool:
        """Publish this worker's count; True when it holds more than its share and may shed one now."""
        mine = self._connections()
        self._counts[self.slot] = mine
        fair = -(-sum(self._counts) // self.workers)
        if mine <= fair:
            return False
        now = self._clock()
        if now < self._next_shed:
            return False
        self._next_shed = now + SHED_INTERVAL_S
        return True

    def close(self) -> None:
        """Leave the slot at zero so a stopped worker's connections no longer count."""
        self._counts[self.slot] = 0
        self._counts.release()
        self._map.close()
        os.close(self._fd)
