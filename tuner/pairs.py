"""``NAME=VALUE`` pairs from the command line (``--set``, ``--env``): the one parser every command uses.

What a value means is the caller's: an environment value stays a string, a compile-time knob (``tuner build --set``) is
an integer, a search-space knob is checked against its space (:func:`tuner.plan.space.set_values`).
"""

from __future__ import annotations

from collections.abc import Iterable

from tuner.errors import UsageError


def parse_pairs(items: Iterable[str], flag: str, example: str, *, what: str = "NAME") -> dict[str, str]:
    """``("K=V", ...)`` -> ``{"K": "V"}``, both sides stripped, split at the first ``=``; a later K wins.

    UsageError for an item without ``=`` or without a name, naming ``flag`` and an ``example`` (``what`` names
    the left side in the message: ``KNOB`` for --set).
    """
    out = {}
    for s in items:
        if "=" not in s:
            raise UsageError(f"{flag} {s!r} is not {what}=VALUE. Example: {flag} {example}")
        k, v = s.split("=", 1)
        if not k.strip():
            raise UsageError(f"{flag} {s!r} has no {what} before '='. Example: {flag} {example}")
        out[k.strip()] = v.strip()
    return out
