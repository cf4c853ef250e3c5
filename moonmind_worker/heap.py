"""Handing freed heap memory back to the system, where glibc would keep it."""

from __future__ import annotations

from typing import Any

_trim: Any = None


def give_back_heap() -> None:
    """Return the malloc heap's free pages to the system (glibc's `malloc_trim`; nothing elsewhere).

    Why: glibc keeps the pages of a fragmented heap after their objects are freed, so a process
    that frees a lot at once (an index worker after each job, the engine closing a shard that took
    many writes) stays as large as it was. Costs a few milliseconds on a heap of a few hundred MB.
    """
    global _trim
    if _trim is None:
        import ctypes

        try:
            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)
