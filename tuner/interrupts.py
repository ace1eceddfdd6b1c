"""SIGTERM as an exception that is not lost.

A Python signal handler runs between bytecodes of the main thread, and that may be inside a finalizer
or a weakref callback (logging's lock release, SQLAlchemy's pools): an exception raised there is
printed as "Exception ignored in ..." and dropped, and the search went on to export as if nothing
had happened (seen on a loaded CI box). So the handler also leaves a mark, and :func:`check`, called
where tuner starts a process or a stage, raises :class:`Terminated` for a mark nobody acted on.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

_pending = False
_held = 0


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where tuner is, so it unwinds like Ctrl-C (exit status 130)."""


def mark() -> None:
    """Note a SIGTERM that a handler is about to raise (or has raised) as an exception."""
    global _pending
    _pending = True


def check() -> None:
    """Raise :class:`Terminated` once for a SIGTERM whose exception was dropped; else nothing."""
    global _pending
    if _pending:
        _pending = False
        raise Terminated("SIGTERM")


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A block that SIGTERM does not cut (say, one that creates a record and binds it to the name its
    cleanup needs): a SIGTERM meanwhile is only marked, and raised as :class:`Terminated` as it ends."""
    global _held
    _held += 1
    try:
        yield
    finally:
        _held -= 1
    if not _held:
        check()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """A block in which SIGTERM raises :class:`Terminated` (the default would end the process at once,
    without recording the running trial as cut off or releasing the run dir's lock)."""
    global _pending

    def on_term(signum: int, frame: object) -> None:
        mark()
        if not _held:
            raise Terminated("SIGTERM")

    try:
        old = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread (an embedding program): leave its handler alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
        _pending = False
