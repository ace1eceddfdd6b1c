"""Passwords out of everything tuner prints or writes: one function for storage URLs and free text.

A storage URL such as ``postgresql://user:secret@host/db`` reaches messages, crash logs, reports and
exports; :func:`redact` replaces the password of every URL with userinfo in a text by ``***``
(``postgresql://user:***@host/db``) and the value of a ``password=`` query parameter likewise. The
user name, host and database stay: they are what a reader needs to find the study. PostgreSQL takes
the real password from ``PGPASSWORD`` or ``~/.pgpass`` when a printed command is rerun.
"""

from __future__ import annotations

__all__ = ["MASK", "redact", "redact_argv"]

import re
from collections.abc import Iterable

MASK = "***"

# scheme://user:PASSWORD@host...: the password runs to the last '@' of the URL (whitespace and quotes
# end a URL inside free text or a repr()), so an unencoded '@' or '/' in a password is covered too.
# A URL with an '@' in its path or query loses more than its password: hiding too much beats a leak.
_USERINFO = re.compile(
    r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:'\"]*:)(?P<pw>[^\s'\"]*)@(?=[^\s@'\"]*(?:[\s'\"]|$))"
)
# libpq also takes the password as a query parameter (postgresql://host/db?password=...).
_QUERY = re.compile(r"(?P<pre>[?&](?:password|passwd|pwd)=)(?P<pw>[^&\s'\"#]*)", re.IGNORECASE)


def redact(text: object) -> str:
    """``text`` (anything with a ``str``) with every URL password replaced by ``***``."""
    s = str(text)
    if "://" not in s and "=" not in s:  # the common case: nothing to look at
        return s
    s = _USERINFO.sub(lambda m: m["pre"] + (MASK if m["pw"] else "") + "@", s)
    return _QUERY.sub(lambda m: m["pre"] + MASK, s)


def redact_argv(argv: Iterable[object]) -> list[str]:
    """A command line with every argument redacted (``--storage URL`` and ``--storage=URL`` alike)."""
    return [redact(a) for a in argv]
