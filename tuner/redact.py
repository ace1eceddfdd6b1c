"""Passwords out of everything tuner prints or writes: one function for storage URLs and free text.

A storage URL such as ``postgresql://user:secret@host/db`` reaches messages, crash logs, reports and
exports; :func:`redact` replaces its password by ``***`` (``postgresql://user:***@host/db``). The user
name, host and database stay: they are what a reader needs to find the study. PostgreSQL takes the
real password from ``PGPASSWORD`` or ``~/.pgpass`` when a printed command is rerun.

Every form libpq takes a password in is covered (PostgreSQL's "Connection Strings"): a URI's userinfo
(``scheme://user:PW@host``, with any characters in PW, percent-encoded or not), a ``password=`` query
parameter (its name percent-encoded too), and a keyword/value string (``host=h password=PW`` or
``password = 'a \\' b'``). In free text a URL ends at whitespace or a quote, so a password holding one
is only found where the whole value is known: :func:`redact_value` (one argument, one ``--storage``) and
:func:`remember`, which the storage check calls first so that any later text quoting that value, a
``repr`` of it or its percent-encoded form, is redacted too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from urllib.parse import quote, unquote

MASK = "***"

_PASSWORD_KEYS = frozenset({"password", "passwd", "pwd"})
# A remembered password shorter than this is left to the patterns: replacing every "ab" in a text would
# make messages unreadable and hide nothing a pattern does not.
_MIN_REMEMBERED = 4
_remembered: set[str] = set()

# scheme://user:PASSWORD@host...: the password runs to the last '@' of the URL (whitespace and quotes
# end a URL inside free text or a repr()), so an unencoded '@' or '/' in a password is covered too.
# A URL with an '@' in its path or query loses more than its password: hiding too much beats a leak.
_USERINFO = re.compile(
    r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:'\"]*:)(?P<pw>[^\s'\"]*)@(?=[^\s@'\"]*(?:[\s'\"]|$))"
)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# ?password=... / &password=...: libpq percent-decodes the parameter's name as well as its value.
_QUERY = re.compile(r"(?P<pre>[?&](?P<key>[^=&\s'\"#?]*)=)(?P<pw>[^&\s'\"#]*)")
# password=VALUE of a keyword/value string inside free text: after a separator (not part of a longer
# name such as db_password, not a query parameter), spaces around '=' allowed, VALUE either quoted
# ('...' with \' and \\ escapes) or up to whitespace or a quote.
_KEYWORD = re.compile(
    r"(?<![^\s'\"(\[{,;])(?P<pre>(?P<key>[A-Za-z]+)\s*=\s*)(?P<pw>'(?:\\.|[^'\\])*\\?(?:'|$)|(?:\\.|[^\s'\"\\])+)",
    re.DOTALL,
)


def _is_password_key(key: str) -> bool:
    return unquote(key).strip().lower() in _PASSWORD_KEYS


def _mask_query(s: str) -> str:
    return _QUERY.sub(lambda m: m["pre"] + MASK if _is_password_key(m["key"]) else m[0], s)


def redact(text: object) -> str:
    """``text`` (anything with a ``str``) with every password replaced by ``***``."""
    s = str(text)
    for secret in sorted(_remembered, key=len, reverse=True):
        if secret in s:
            s = s.replace(secret, MASK)
    if "://" not in s and "=" not in s:  # the common case: nothing to look at
        return s
    if not any(c.isspace() for c in s) and _SCHEME.match(s):  # the text is one URL: any character in the password
        return redact_value(s)
    s = _USERINFO.sub(lambda m: m["pre"] + (MASK if m["pw"] else "") + "@", s)
    s = _mask_query(s)
    return _KEYWORD.sub(lambda m: m["pre"] + MASK if _is_password_key(m["key"]) else m[0], s)


def _url_password_span(value: str) -> tuple[int, int] | None:
    """Where the password of a URL ``value`` (the whole string) is: from the userinfo's first ':' to the
    last '@' (SQLAlchemy stops at the first '@', libpq at the first '@' or '/': taking the last hides more)."""
    m = _SCHEME.match(value)
    if m is None:
        return None
    at = value.rfind("@", m.end())
    colon = value.find(":", m.end(), at) if at >= 0 else -1
    if colon < 0 or "/" in value[m.end() : colon]:  # sqlite:////tmp/a:b@c.db: a path, not a user
        return None
    return colon + 1, at


def _keyword_password_spans(value: str) -> list[tuple[int, int]]:
    """The password values of a libpq keyword/value string, parsed as libpq does: ``key = value`` pairs
    split by whitespace, a value either single-quoted (``\\'`` and ``\\\\`` escapes) or up to whitespace
    (a backslash escapes the next character). Where the string stops parsing, the rest counts as a value."""
    spans: list[tuple[int, int]] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i].isspace():
            i += 1
        k = i
        while i < n and not value[i].isspace() and value[i] != "=":
            i += 1
        key = value[k:i]
        while i < n and value[i].isspace():
            i += 1
        if i >= n or value[i] != "=" or not key:
            if "password" in value[k:].lower():
                spans.append((k, n))  # not a keyword string after all: hide the rest rather than guess
            return spans
        i += 1
        while i < n and value[i].isspace():
            i += 1
        v = i
        if i < n and value[i] == "'":
            i += 1
            while i < n and value[i] != "'":
                i += 2 if value[i] == "\\" else 1
            i = min(i + 1, n)
        else:
            while i < n and not value[i].isspace():
                i += 2 if value[i] == "\\" else 1
            i = min(i, n)
        if _is_password_key(key):
            spans.append((v, i))
    return spans


def _password_spans(value: str) -> list[tuple[int, int]]:
    url = _url_password_span(value)
    if url is not None or _SCHEME.match(value):
        spans = [url] if url else []
        return spans + [m.span("pw") for m in _QUERY.finditer(value) if _is_password_key(m["key"])]
    return _keyword_password_spans(value) if "=" in value else []


def _masked(value: str, spans: list[tuple[int, int]]) -> str:
    out, last = [], 0
    for a, b in sorted(spans):
        a = max(a, last)  # a query parameter inside a userinfo already hidden
        if b > a:
            out += [value[last:a], MASK]
            last = b
    return "".join([*out, value[last:]])


def redact_value(value: str) -> str:
    """One storage value (a URL or a keyword/value string, the whole string) with its password hidden,
    whatever characters the password holds; then :func:`redact`'s patterns for anything else in it."""
    s = _masked(value, _password_spans(value))
    for secret in sorted(_remembered, key=len, reverse=True):
        s = s.replace(secret, MASK)
    s = _USERINFO.sub(lambda m: m["pre"] + (MASK if m["pw"] else "") + "@", s) if "://" in s else s
    return _mask_query(s)


def _unquoted(pw: str) -> str:
    """A keyword value as libpq reads it: without its quotes and backslash escapes."""
    if pw.startswith("'"):
        pw = pw[1:-1] if len(pw) > 1 and pw.endswith("'") else pw[1:]
    return re.sub(r"\\(.)", r"\1", pw, flags=re.DOTALL)


def remember(value: str) -> None:
    """Redact the passwords of the storage value ``value`` from every later text, in every spelling a
    message may quote them in: as given, percent-decoded and -encoded, unquoted, escaped by repr/JSON."""
    for a, b in _password_spans(value):
        pw = value[a:b]
        plain = {pw, unquote(pw), _unquoted(pw)}
        forms = plain | {quote(p, safe="") for p in plain}
        forms |= {repr(p)[1:-1] for p in forms} | {json.dumps(p)[1:-1] for p in forms}
        _remembered.update(f for f in forms if len(f) >= _MIN_REMEMBERED and f != MASK)


def _argv_values(argv: Iterable[object]) -> Iterator[str]:
    for a in argv:
        s = str(a)
        opt, eq, rest = s.partition("=")
        yield rest if s.startswith("--") and eq and not any(c.isspace() for c in opt) else s


def remember_argv(argv: Iterable[object]) -> None:
    """:func:`remember` each argument: a crash before the storage check still hides its password in the
    exception's message and traceback."""
    for v in _argv_values(argv):
        remember(v)


def redact_argv(argv: Iterable[object]) -> list[str]:
    """A command line with every argument redacted as one value (``--storage URL`` and
    ``--storage=URL`` alike; a password with spaces or quotes included)."""
    args = [str(a) for a in argv]
    return [a[: len(a) - len(v)] + redact_value(v) for a, v in zip(args, _argv_values(args))]
