"""The one error type the CLI turns into a message and an exit code."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator


class TunerError(Exception):
    """A failure the user can act on. The message is one paragraph: what is wrong, and the fix."""

    exit_code: int = 1


class UsageError(TunerError):
    """Bad input from the user (unknown arch, bad SPEC, missing path...)."""

    exit_code = 2


EXIT_TIME_BUDGET = 3
"""A search or sweep stopped by its --time-budget: what finished is stored, the same command resumes."""

EXIT_STATUSES: dict[int, str] = {
    0: "success",
    TunerError.exit_code: "error: the message says what failed and what to do (also a full disk, a read-only\n"
    "or unwritable folder, or a file in the way of a path tuner writes)",
    UsageError.exit_code: "usage error: a bad flag, argument, path or setting (e.g. TUNER_HOME)",
    EXIT_TIME_BUDGET: "stopped by --time-budget (search, worker, sweep): what finished is stored; the same\n"
    "command resumes",
    70: "internal error: a bug in tuner; the message names a log file with the traceback",
    130: "interrupted (Ctrl-C or SIGTERM)",
}
"""Every status tuner exits with, and what it means: ``tuner --help`` lists them from here."""


def close_matches(word: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ' Did you mean X?' text for the closest choices, or ''."""
    matches = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.5)
    if not matches:
        return ""
    if len(matches) == 1:
        return f" Did you mean {matches[0]!r}?"
    return " Did you mean one of " + ", ".join(repr(m) for m in matches) + "?"


def error_chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and every exception it came from (``__cause__``, ``__context__``, and a database driver's
    error that SQLAlchemy keeps in ``orig``), each once: what a handler looks through to name the real fault."""
    seen: set[int] = set()
    stack: list[object] = [err]
    while stack:
        e = stack.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack += [e.__cause__, e.__context__, getattr(e, "orig", None)]
