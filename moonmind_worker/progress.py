"""Progress on a terminal: a one-line bar for index runs and syncs (standard library only).

Its own module so a command whose work runs on the box's owner (owner/client.py) can show
the owner's progress without importing the indexer (numpy, the model, the engine).
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli.py)
if TYPE_CHECKING:
    from typing import Callable


def tty_progress(stream=None, unit: str = "files") -> Callable[[int, int], None] | None:
    """A one-line progress bar on a terminal, nothing otherwise (stream: the current sys.stderr by default)."""
    stream = stream if stream is not None else sys.stderr
    if not stream.isatty():
        return None
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if done != total and now - last[0] < 0.1:
            return
        last[0] = now
        width = 30
        filled = int(width * done / max(total, 1))
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {unit}")
        if done == total:
            stream.write("\n")
        stream.flush()

    return show

