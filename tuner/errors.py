"""The one error type the CLI turns into a message and an exit code."""

from __future__ import annotations

__all__ = ["TunerError", "UsageError", "close_matches"]

import difflib
from collections.abc import Iterable


class TunerError(Exception):
    """A failure the user can act on. The message is one paragraph: what is wrong, and the fix."""

    exit_code: int = 1


class UsageError(TunerError):
    """Bad input from the user (unknown arch, bad SPEC, missing path...)."""

    exit_code = 2


def close_matches(word: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ' Did you mean X?' text for the closest choices, or ''."""
    matches = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.5)
    if not matches:
        return ""
    if len(matches) == 1:
        return f" Did you mean {matches[0]!r}?"
    return " Did you mean one of " + ", ".join(repr(m) for m in matches) + "?"
