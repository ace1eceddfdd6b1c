"""Option parsing shared by several commands."""

from __future__ import annotations

__all__ = ["depths_option", "parse_pairs"]

import click

from tuner.errors import UsageError


def depths_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """Click callback: ``0,4096,16384`` -> sorted unique depths (None when the option is absent)."""
    if value is None:
        return None
    try:
        ds = tuple(sorted({int(x) for x in value.replace(" ", "").split(",") if x}))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 0,4096,16384") from None
    if not ds or ds[0] < 0 or ds[-1] > 1_048_576:
        raise click.BadParameter("depths must be between 0 and 1048576 tokens")
    return ds


def parse_pairs(values: tuple[str, ...], flag: str, example: str) -> dict[str, str]:
    """``("K=V", ...)`` -> dict; anything without ``=`` is a UsageError naming ``flag`` and an example."""
    out = {}
    for s in values:
        if "=" not in s:
            raise UsageError(f"{flag} {s!r} is not NAME=VALUE. Example: {flag} {example}")
        k, v = s.split("=", 1)
        out[k.strip()] = v.strip()
    return out
