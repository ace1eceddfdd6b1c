"""Progress with an ETA for the long phases (builds, trials), readable both in a terminal and in a CI log.

When stderr is a terminal, a :mod:`rich` bar with the count, elapsed time and ETA is redrawn in place
(and removed when the phase ends, so :func:`tuner.log.step` prints its ``✓ 41.2s`` line cleanly).
Otherwise plain lines go to stderr: one at the first step, one each time the count passes another
tenth of the total, one at the last step, and a heartbeat when a minute went by without a line; never
two within 10 seconds (except the last). A CI log of a 7-minute build stays about a dozen lines::

    building cpu: 57/145 steps (39%), 1:02 elapsed, ETA 1:35

``TUNER_PROGRESS=bar|plain|off`` forces a mode (default: ``bar`` on a terminal, else ``plain``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

Mode = Literal["bar", "plain", "off"]

PLAIN_MIN_INTERVAL_S = 10.0
"""Plain mode: no two lines closer than this (the last step excepted)."""
PLAIN_HEARTBEAT_S = 60.0
"""Plain mode: a line at least this often while the count moves, even within one tenth."""


def mode(stream: TextIO | None = None) -> Mode:
    """How progress is shown on ``stream`` (default stderr): ``$TUNER_PROGRESS``, else bar on a TTY."""
    forced = os.environ.get("TUNER_PROGRESS", "").strip().lower()
    if forced in ("bar", "plain", "off"):
        return "bar" if forced == "bar" else "plain" if forced == "plain" else "off"
    stream = stream or sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced stream
        tty = False
    return "bar" if tty and os.environ.get("TERM") != "dumb" else "plain"


def format_seconds(seconds: float) -> str:
    """``75`` -> ``1:15``; ``3725`` -> ``1:02:05``."""
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Tracker:
    """The handle :func:`track` yields: report the count with :meth:`update` or :meth:`advance`."""

    def __init__(
        self,
        description: str,
        *,
        total: int | None,
        unit: str,
        display: Mode,
        stream: TextIO,
        clock: Callable[[], float],
    ) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.completed = 0
        self._display = display
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._last_line_at: float | None = None
        self._last_line_tenth = -1
        self._last_line_count = -1
        self._bar: tuple[Progress, TaskID] | None = None  # bar mode: the rich bar and its one task

    # -- reporting

    def update(self, completed: int, total: int | None = None) -> None:
        """Set the count (and the total, when it becomes known or changes)."""
        if total is not None:
            self.total = total
        self.completed = completed
        if self._bar is not None:
            bar, task = self._bar
            bar.update(task, completed=completed, total=self.total)
        elif self._display == "plain":
            self._maybe_print()

    def advance(self, n: int = 1) -> None:
        """Add ``n`` to the count."""
        self.update(self.completed + n)

    @property
    def elapsed(self) -> float:
        return self._clock() - self._start

    def eta(self) -> float | None:
        """Seconds left at the average rate so far, or None before the first step or without a total."""
        if not self.total or self.completed <= 0:
            return None
        return self.elapsed / self.completed * max(0, self.total - self.completed)

    def line(self) -> str:
        """The plain-mode line for the current state."""
        count = f"{self.completed}/{self.total}" if self.total else f"{self.completed}"
        pct = f" ({100 * self.completed // self.total}%)" if self.total else ""
        eta = self.eta()
        tail = f", ETA {format_seconds(eta)}" if eta is not None and self.completed < (self.total or 0) else ""
        return f"{self.description}: {count} {self.unit}{pct}, {format_seconds(self.elapsed)} elapsed{tail}"

    # -- plain mode

    def _maybe_print(self) -> None:
        now = self._clock()
        tenth = int(10 * self.completed / self.total) if self.total else -1
        final = self.completed >= self.total if self.total else False
        if self.completed == self._last_line_count:
            return
        if self._last_line_at is not None and not final:
            since = now - self._last_line_at
            if since < PLAIN_MIN_INTERVAL_S:
                return
            # Without a total there are no tenths: a line every PLAIN_MIN_INTERVAL_S.
            if self.total and tenth <= self._last_line_tenth and since < PLAIN_HEARTBEAT_S:
                return
        self._last_line_at, self._last_line_tenth, self._last_line_count = now, tenth, self.completed
        print(self.line(), file=self._stream, flush=True)

    # -- bar mode

    def _open_bar(self) -> None:
        # only a terminal draws a bar, and rich takes a tenth of a second to import
        from rich import progress as rp
        from rich.console import Console

        columns = (
            rp.TextColumn("{task.description}"),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TextColumn(self.unit),
            rp.TimeElapsedColumn(),
            rp.TextColumn("ETA"),
            rp.TimeRemainingColumn(),
        )
        bar = rp.Progress(*columns, console=Console(file=self._stream), transient=True)
        bar.start()
        self._bar = (bar, bar.add_task(self.description, total=self.total, completed=self.completed))

    def _close(self) -> None:
        if self._bar is not None:
            self._bar[0].stop()
            self._bar = None


@contextlib.contextmanager
def track(
    description: str,
    *,
    total: int | None = None,
    unit: str = "steps",
    stream: TextIO | None = None,
    display: Mode | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Tracker]:
    """Show progress of one phase (``description``, e.g. ``"building cpu"``, starts each line) while the block runs.

    ``total`` may be set later with ``update(n, total=N)``; ``unit`` is the word after the count; ``display``
    defaults to :func:`mode` of ``stream`` (stderr); ``clock`` is the seconds source (tests pass a fake one).
    """
    stream = stream or sys.stderr
    tracker = Tracker(description, total=total, unit=unit, display=display or mode(stream), stream=stream, clock=clock)
    if tracker._display == "bar":
        tracker._open_bar()
    try:
        yield tracker
    finally:
        tracker._close()
