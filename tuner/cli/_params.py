"""Option parsing shared by several commands."""

from __future__ import annotations

__all__ = ["AliasOption", "cpu_mask_option", "depths_option", "find_bin_dir", "output_option", "stamped_run_dir"]

import datetime as _dt
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tuner.errors import UsageError


def depths_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """Click callback: ``0,4096,16384`` -> sorted unique depths (None when the option is absent)."""
    if value is None:
        return None
    parts = [x for x in value.replace(" ", "").split(",") if x]
    # ASCII digits only: int() also takes "1_000", "+5" and other scripts' digits, which llama-bench's -d does not
    if not all(re.fullmatch(r"[0-9]{1,8}", x) for x in parts):
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 0,4096,16384")
    ds = tuple(sorted({int(x) for x in parts}))
    if not ds or ds[0] < 0 or ds[-1] > 1_048_576:
        raise click.BadParameter("depths must be between 0 and 1048576 tokens")
    return ds


def cpu_mask_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """Click callback: ``0-3`` / ``0,2`` -> the CPU ids, checked present here (a UsageError, exit 2)."""
    if value is None:
        return None
    from tuner.targets.host import parse_cpu_mask

    return parse_cpu_mask(value)


CPU_MASK_HELP = (
    "Pin every llama-bench process to these CPUs (taskset -c), e.g. 0-1 or 0,2: a host-paced run where the "
    "CPU is the limit. Threads' legal values then follow the mask's size."
)


def find_bin_dir(path: Path, exe: str = "llama-bench") -> Path:
    """The directory holding ``exe``: PATH itself, PATH/bin or PATH/build/bin (what --build may point at)."""
    for cand in (path, path / "bin", path / "build" / "bin"):
        if (cand / exe).is_file():
            return cand
    raise UsageError(
        f"No {exe} under {path} (looked in ., bin/ and build/bin/). Pass --build with a build "
        "directory or its bin directory (`tuner build` prints it)."
    )


def stamped_run_dir(kind: str) -> Path:
    """``$TUNER_HOME/runs/KIND-YYYYmmdd-HHMMSS``: where a command without -o writes."""
    from tuner.paths import tuner_home

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return tuner_home() / "runs" / f"{kind}-{stamp}"


class AliasOption(click.Option):
    """An option that still accepts old spellings (``hidden_aliases``) but shows only its current names in
    --help, so every command documents one spelling while old scripts keep working."""

    def __init__(self, *args: Any, hidden_aliases: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._hidden = set(hidden_aliases)

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        opts = self.opts
        self.opts = [o for o in opts if o not in self._hidden]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = opts


def output_option(
    dest: str, *, old: tuple[str, ...] = ("--out",), in_place: bool = False, **kw: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``-o/--output``: the one spelling of "where this command writes" across commands (``old`` long
    spellings stay accepted, hidden). ``in_place``: the command writes into the folder as it stands (a run
    directory), so a folder holding a symbolic link is refused (:func:`tuner.paths.refuse_links_inside`);
    exports build a new folder and swap it in, and need no such check."""
    if in_place:
        kw["callback"] = _no_links_inside
    return click.option("-o", "--output", *old, dest, cls=AliasOption, hidden_aliases=old, **kw)


def _no_links_inside(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    from tuner.paths import refuse_links_inside

    if value is not None:
        refuse_links_inside(Path(value))
    return value
