"""User-facing progress lines on stderr: steps with timings, warnings, notices.

Library code logs through ``logging``; this module is for what a person watches while waiting.
Every line goes through :func:`tuner.redact.redact` first: a storage password in a message (a URL a
stage echoes, a driver's error text) never reaches the screen or a captured log.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Sequence

import click

from tuner import interrupts
from tuner.redact import redact

_TTY = sys.stderr.isatty()


def _style(text: str, *, fg: str | None = None, bold: bool | None = None) -> str:
    return click.style(text, fg=fg, bold=bold) if _TTY else text


def info(msg: str) -> None:
    click.echo(redact(msg), err=True)


def notice(msg: str) -> None:
    click.echo(_style("note: ", fg="cyan") + redact(msg), err=True)


def warning(msg: str) -> None:
    click.echo(_style("warning: ", fg="yellow", bold=True) + redact(msg), err=True)


def progress(msg: str) -> None:
    """A transient progress line: overwritten in a terminal, one line per call otherwise."""
    msg = redact(msg)
    if _TTY:
        click.echo("\r\033[K" + msg[:200], err=True, nl=False)
    else:
        click.echo(msg, err=True)


@contextlib.contextmanager
def step(title: str) -> Iterator[None]:
    """Print ``title...``, run the block, then ``✓ 12.3s`` or ``✕ 0.4s``."""
    interrupts.check()  # a SIGTERM whose exception was dropped: start no new stage
    click.echo(_style("==> ", fg="blue", bold=True) + redact(title), err=True)
    start = time.monotonic()
    ok = False
    try:
        yield
        ok = True
    finally:
        if _TTY:
            click.echo("\r\033[K", err=True, nl=False)
        mark, color = ("✓", "green") if ok else ("✕", "red")
        click.echo(_style(f"    {mark} {time.monotonic() - start:.1f}s", fg=color), err=True)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Render a plain Markdown table (pastes into a pull request as is)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    return "\n".join([lines[0], "|" + "|".join("-" * (w + 2) for w in widths) + "|", *lines[1:]])
