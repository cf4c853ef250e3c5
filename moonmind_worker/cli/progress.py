"""Progress of index runs and syncs on stderr, for a terminal and for a log alike (standard library only).

On a terminal: a one-line bar with the rate and the time left. Anywhere else (CI, a job log,
`2> file`): one plain line every few seconds, so a long run is never silent for minutes, and
nothing at all for a run shorter than that (its summary line says the rest). A Ctrl-C ends the
bar's line first (`break_line`), so "interrupted" starts a line of its own.

Its own module so a command whose work runs on the box's owner (owner/client.py) can show
the owner's progress without importing the indexer (numpy, the model, the engine).
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli.py)
if TYPE_CHECKING:
    from typing import Callable, TextIO

    Progress = Callable[..., None]

#: Seconds between two lines when stderr is not a terminal (MOONMIND_PROGRESS_INTERVAL_S).
DEFAULT_INTERVAL_S = 5.0
#: Seconds between two redraws of the bar.
REDRAW_S = 0.1

#: The stream whose last line is an unfinished bar, if any (what `break_line` ends).
_open_bar: list = []


def reporter(stream: TextIO | None = None, unit: str = "files", interval_s: float = DEFAULT_INTERVAL_S) -> Progress:
    """A progress callback `(done, total, chunks=None)`: a bar on a terminal, periodic lines otherwise."""
    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return _Bar(stream, unit) if tty else _Lines(stream, unit, interval_s)


def break_line() -> None:
    """End an unfinished bar line (before "interrupted" or an error is printed under it)."""
    while _open_bar:
        stream = _open_bar.pop()
        try:
            stream.write("\n")
            stream.flush()
        except (OSError, ValueError):
            pass


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class _Report:
    def __init__(self, stream: TextIO, unit: str) -> None:
        self.stream = stream
        self.unit = unit
        self.started = time.monotonic()
        self.last = 0.0

    def figures(self, done: int, total: int, chunks: int | None) -> tuple[str, str]:
        """('120/800 files (15%), 3400 chunks', '24.0 files/s, ETA 28s') for this point of the run."""
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = done / elapsed
        pct = f" ({100 * done // total}%)" if total else ""
        counts = f"{done}/{total} {self.unit}{pct}" + ("" if chunks is None else f", {chunks} chunks")
        name = self.unit.split()[0]
        speed = f"{rate:.1f} {name}/s"
        if done < total and rate > 0:
            speed += f", ETA {_duration((total - done) / rate)}"
        elif done >= total:
            speed += f", {_duration(elapsed)} in all"
        return counts, speed


class _Bar(_Report):
    """A one-line bar redrawn in place with \\r."""

    WIDTH = 30

    def __call__(self, done: int, total: int, chunks: int | None = None) -> None:
        now = time.monotonic()
        if done < total and now - self.last < REDRAW_S:
            return
        self.last = now
        filled = int(self.WIDTH * done / max(total, 1))
        counts, speed = self.figures(done, total, chunks)
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {counts}  {speed}\x1b[K")
        if done >= total:
            self.stream.write("\n")
            if self.stream in _open_bar:
                _open_bar.remove(self.stream)
        elif self.stream not in _open_bar:
            _open_bar.append(self.stream)
        self.stream.flush()


class _Lines(_Report):
    """One full line every `interval_s` (a log has no \\r); a last one when any was written."""

    def __init__(self, stream: TextIO, unit: str, interval_s: float) -> None:
        super().__init__(stream, unit)
        self.interval_s = interval_s
        self.last = self.started
        self.wrote = False
        self.finished = False

    def __call__(self, done: int, total: int, chunks: int | None = None) -> None:
        now = time.monotonic()
        final = done >= total
        if self.finished or (not (final and self.wrote) and now - self.last < self.interval_s):
            return
        self.finished = final
        self.last = now
        self.wrote = True
        counts, speed = self.figures(done, total, chunks)
        try:
            self.stream.write(f"progress: {counts}, {speed}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass
