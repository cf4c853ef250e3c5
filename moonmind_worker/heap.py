"""The process's memory in bulk work: freed heap pages handed back to the system, where glibc would keep
them, and the cyclic collector run less often, where CPython's default would run it for nothing."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_libc: Any = None

#: glibc's mallopt parameter for the size from which an allocation gets pages of its own (mmap).
_M_MMAP_THRESHOLD = -3
#: glibc's starting value, kept fixed: see `keep_large_blocks_out_of_the_heap`.
LARGE_BLOCK = 128 * 1024


def _glibc() -> Any:
    global _libc
    if _libc is None:
        import ctypes

        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim, _libc.mallopt  # noqa: B018 (both exist: glibc)
        except (OSError, AttributeError):
            _libc = False
    return _libc


def give_back_heap() -> None:
    """Return the malloc heap's free pages to the system (glibc's `malloc_trim`; nothing elsewhere).

    Why: glibc keeps the pages of a fragmented heap after their objects are freed, so a process
    that frees a lot at once (an index worker after each job, the engine closing a shard that took
    many writes) stays as large as it was. Cheap next to the work that freed the memory.
    """
    libc = _glibc()
    if libc:
        libc.malloc_trim(0)


def keep_large_blocks_out_of_the_heap() -> None:
    """Give every allocation of `LARGE_BLOCK` or more pages of its own, returned as soon as it is freed.

    Why: glibc starts there but raises the bar to the largest block freed so far (up to 32 MB), so
    after a few batches of an index run (vectors, pickled results, the engine's growing buffers)
    such blocks come from the heap, where a small live object above them keeps their pages after
    they are freed, and `give_back_heap` cannot reach them. Fixed, the indexing processes' summed
    peak is lower (BENCHMARKS.md, "The run's peak memory under 500 MiB"). Process-wide and idempotent;
    a no-op off glibc.
    """
    libc = _glibc()
    if libc:
        libc.mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK)


#: The cyclic collector's thresholds in bulk work (CPython's default: 700, 10, 10). Why: an index run
#: allocates millions of container objects that live for one batch (payload dicts, chunk lists,
#: unpickled results) and seldom form a cycle; by default every 700 of them start a collection, and
#: the older generations' collections walk every live object again: about 2 s of CPU in a cold run
#: of Django, spread over the indexing process and its workers (BENCHMARKS.md, "Index speed against
#: the peer"). A cycle is still collected, a few batches later.
BULK_GC_THRESHOLDS = (50_000, 20, 20)

_bulk_runs = 0  # bulk runs in progress in this process (the owner may run several at once)
_bulk_lock = threading.Lock()
_saved_thresholds: tuple[int, int, int] = gc.get_threshold()


@contextmanager
def collect_rarely() -> Iterator[None]:
    """`BULK_GC_THRESHOLDS` while the block runs; the thresholds it found once the last such block ends."""
    global _bulk_runs, _saved_thresholds
    with _bulk_lock:
        if _bulk_runs == 0:
            _saved_thresholds = gc.get_threshold()
            gc.set_threshold(*BULK_GC_THRESHOLDS)
        _bulk_runs += 1
    try:
        yield
    finally:
        with _bulk_lock:
            _bulk_runs -= 1
            if _bulk_runs == 0:
                gc.set_threshold(*_saved_thresholds)
