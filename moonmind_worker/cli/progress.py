"""Progress of index runs and syncs on stderr, for a terminal and for a log alike (standard library only).

On a terminal: a one-line bar with the rate and the time left. Anywhere else (CI, a job log,
`2> file`): one plain line every few seconds, so a long run is never silent for minutes, and
nothing at all for a run shorter than that (its summary line says the rest). An index run keeps
its line going by itself (`reporter(until_closed=True)`) through the phases that report no figures:
before the first file, while a batch is embedded, and after the last file, while the search index
is built, up to the summary. A Ctrl-C ends the bar's line first (`break_line`), so "interrupted"
starts a line of its own.

Its own module so a command whose work runs on the box's owner (owner/client.py) can show
the owner's progress without importing the indexer (numpy, the model, the engine).
"""

from __future__ import annotations

import _thread
import sys
import time

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any, Callable, TextIO

    Progress = Callable[..., None]

#: Seconds between two lines when stderr is not a terminal (MOONMIND_PROGRESS_INTERVAL_S).
DEFAULT_INTERVAL_S = 5.0
#: Seconds between two redraws of the bar.
REDRAW_S = 0.1
#: Seconds between two redraws of a bar kept going while nothing reports (see `reporter`).
BEAT_S = 1.0

#: The stream whose last line is an unfinished bar, if any (what `break_line` ends).
_open_bar: list = []
#: Reporters whose own thread keeps a line going (what `break_line` stops).
_alive: list = []


def reporter(
    stream: TextIO | None = None, unit: str = "files", interval_s: float = DEFAULT_INTERVAL_S, *,
    until_closed: bool = False, starting: str = "starting", working: str = "working", finishing: str = "finishing",
) -> _Report:
    """A progress callback `(done, total, chunks=None)`: a bar on a terminal, periodic lines otherwise.

    `until_closed`: the run is not over at done == total (an index run still removes deleted
    files' chunks and builds the search index then), nor silent before the first figures (the
    model loads, the tree is walked). The reporter then keeps a line going from its creation
    until `close()`: a line at least every `interval_s` in a log (a redraw every second on a
    terminal), saying `starting` before the first figures, `working` while they stand still
    (a batch being embedded), `finishing` after the last; `close()` prints the last line, right
    before the command's summary.
    """
    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    report: _Report = _Bar(stream, unit) if tty else _Lines(stream, unit, interval_s)
    if until_closed:
        report.keep_alive(BEAT_S if tty else interval_s, starting, working, finishing)
    return report


def break_line() -> None:
    """Stop the reporters' own lines and end an unfinished bar line (before "interrupted" or an error)."""
    for report in list(_alive):
        report.close(final=False)
    while _open_bar:
        stream = _open_bar.pop()
        try:
            stream.write("\n")
            stream.flush()
        except (OSError, ValueError):
            pass


def _seconds(seconds: float) -> str:
    """A short elapsed time: tenths below a minute (a phase line every 0.2 s must show it moving)."""
    return f"{seconds:.1f}s" if seconds < 60 else _duration(seconds)


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
        self.state: tuple[int, int, int | None] | None = None  # the last figures reported
        self.shown: tuple[int, int, int | None] | None = None  # the figures of the last line or frame
        self.until_closed = False
        self.starting, self.working, self.finishing = "starting", "working", "finishing"
        self.closed = False
        self._lock = _thread.allocate_lock()  # the caller's thread and the keep-alive thread write lines
        self._stop: Any = None  # a threading.Event while a keep-alive thread runs

    def __call__(self, done: int, total: int, chunks: int | None = None) -> None:
        with self._lock:
            if self.closed:
                return
            self.state = (done, total, chunks)
            try:
                self.report(done, total, chunks, time.monotonic())
            except (OSError, ValueError):
                pass

    def report(self, done: int, total: int, chunks: int | None, now: float) -> None:
        raise NotImplementedError

    def beat(self, now: float) -> None:
        """What the keep-alive thread shows when nothing reported for a while."""
        raise NotImplementedError

    def end(self, now: float) -> None:
        """The last line, at `close()`."""
        raise NotImplementedError

    def phase(self, now: float) -> str:
        """While nothing reports: 'starting, 1.2s' before the first figures, else the figures and what is going on."""
        elapsed = _seconds(now - self.started)
        if self.state is None:
            return f"{self.starting}, {elapsed}"
        return f"{self.figures(*self.state)[0]}; {self.tail(now)}"

    def tail(self, now: float) -> str:
        """'finishing…, 9.0s so far' after the last figures, 'working…, 3.1s so far' between two."""
        assert self.state is not None
        done, total, _ = self.state
        return f"{self.finishing if done >= total else self.working}, {_seconds(now - self.started)} so far"

    def keep_alive(self, every_s: float, starting: str, working: str, finishing: str) -> None:
        import threading

        self.until_closed = True
        self.starting, self.working, self.finishing = starting, working, finishing
        self._stop = threading.Event()
        _alive.append(self)
        threading.Thread(target=self._beat, args=(every_s,), name="moonmind-progress", daemon=True).start()

    def _beat(self, every_s: float) -> None:
        step = max(0.02, min(every_s / 10, 0.25))
        while not self._stop.wait(step):
            with self._lock:
                if self.closed:
                    return
                try:
                    self.beat(time.monotonic())
                except (OSError, ValueError):
                    return

    def close(self, final: bool = True) -> None:
        """End the run's progress: its last line when `final` (right before the summary), else just end a bar's line."""
        if self._stop is not None:
            self._stop.set()
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self in _alive:
                _alive.remove(self)
            try:
                if final:
                    self.end(time.monotonic())
                elif self.stream in _open_bar:
                    _open_bar.remove(self.stream)
                    self.stream.write("\n")
                    self.stream.flush()
            except (OSError, ValueError):
                pass

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

    def report(self, done: int, total: int, chunks: int | None, now: float) -> None:
        if done < total and now - self.last < REDRAW_S:
            return
        if done >= total and self.until_closed:  # not over yet: close() draws the last frame
            self._draw(done, total, chunks, now, end=False, tail=self.tail(now))
            return
        self._draw(done, total, chunks, now, end=done >= total)

    def _draw(self, done: int, total: int, chunks: int | None, now: float, *, end: bool, tail: str | None = None) -> None:
        self.last = now
        self.shown = (done, total, chunks)
        filled = int(self.WIDTH * done / max(total, 1))
        counts, speed = self.figures(done, total, chunks)
        self._frame(f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {counts}  {tail or speed}", end)

    def _frame(self, text: str, end: bool) -> None:
        self.stream.write(f"\r{text}\x1b[K")
        if end:
            self.stream.write("\n")
            if self.stream in _open_bar:
                _open_bar.remove(self.stream)
        elif self.stream not in _open_bar:
            _open_bar.append(self.stream)
        self.stream.flush()

    def beat(self, now: float) -> None:
        if now - self.last < BEAT_S:
            return
        self.last = now
        if self.state is None:
            self._frame(f"{self.starting}, {_seconds(now - self.started)}", end=False)
            return
        moved = self.state != self.shown and self.state[0] < self.state[1]  # figures a redraw skipped: with rate and ETA
        self._draw(*self.state, now, end=False, tail=None if moved else self.tail(now))

    def end(self, now: float) -> None:
        if self.state is not None:
            self._draw(*self.state, now, end=True)
        elif self.stream in _open_bar:
            _open_bar.remove(self.stream)
            self.stream.write("\n")
            self.stream.flush()


class _Lines(_Report):
    """One full line every `interval_s` (a log has no \\r); a last one when any was written."""

    def __init__(self, stream: TextIO, unit: str, interval_s: float) -> None:
        super().__init__(stream, unit)
        self.interval_s = interval_s
        self.last = self.started
        self.wrote = False
        self.finished = False

    def report(self, done: int, total: int, chunks: int | None, now: float) -> None:
        if self.until_closed:  # the run ends at close(), which prints the last line
            # the last file done: said at once in a log that has lines (in a one-shot run the engine's
            # build of the search index holds this process, and the next line may come only after it)
            finishing = done >= total and self.wrote and (self.shown is None or self.shown[0] < self.shown[1])
            if finishing or now - self.last >= self.interval_s:
                self._line(self.phase(now) if done >= total else ", ".join(self.figures(done, total, chunks)), now)
            return
        final = done >= total
        if self.finished or (not (final and self.wrote) and now - self.last < self.interval_s):
            return
        self.finished = final
        self._line(", ".join(self.figures(done, total, chunks)), now)

    def _line(self, text: str, now: float) -> None:
        self.last = now
        self.wrote = True
        self.shown = self.state
        self.stream.write(f"progress: {text}\n")
        self.stream.flush()

    def beat(self, now: float) -> None:
        if now - self.last < self.interval_s:
            return
        if self.state is not None and self.state != self.shown and self.state[0] < self.state[1]:
            self._line(", ".join(self.figures(*self.state)), now)  # the figures moved: they say it
        else:
            self._line(self.phase(now), now)

    def end(self, now: float) -> None:
        if self.wrote and self.state is not None:  # nothing at all for a run shorter than one interval
            self._line(", ".join(self.figures(*self.state)), now)
