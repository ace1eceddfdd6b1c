"""Option parsing shared by several commands."""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tuner.errors import UsageError, close_matches

F = TypeVar("F", bound=Callable[..., object])
"""A click command function that an option decorator returns as it was given."""

# The path types the commands' options take (click's types hold no state, so options share them).
DIR = click.Path(file_okay=False, path_type=Path)
FILE = click.Path(dir_okay=False, path_type=Path)
EXISTING_DIR = click.Path(exists=True, file_okay=False, path_type=Path)
EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
PATH = click.Path(path_type=Path)


def stacked(*opts: Callable[[F], F]) -> Callable[[F], F]:
    """The options as one decorator, in the order given (as if listed top to bottom above a command)."""

    def wrap(f: F) -> F:
        for opt in reversed(opts):
            f = opt(f)
        return f

    return wrap


def build_option(help_text: str, *, required: bool = False) -> Callable[[F], F]:
    """``--build``: an existing build (or bin) directory, read as ``build_dir``."""
    return click.option("--build", "build_dir", required=required, type=EXISTING_DIR, help=help_text)


class SuggestingGroup(click.Group):
    """A group whose "No such command" names the closest subcommands: ``tuner serch`` -> Did you mean 'search'?"""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as err:
            name = args[0] if args else ""
            if err.message != f"No such command {name!r}.":
                raise
            # one suggestion, from every command a lazy group has too (click >= 8.4 suggests only from the
            # commands it holds, in its own words; older click not at all)
            hint = close_matches(name, self.list_commands(ctx), n=1)
            raise click.UsageError(err.message + hint, ctx=err.ctx) from None


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


def stamped_run_dir(kind: str) -> Path:
    """``$TUNER_HOME/runs/KIND-YYYYmmdd-HHMMSS``: where a command without -o writes."""
    from tuner.paths import tuner_home

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return tuner_home() / "runs" / f"{kind}-{stamp}"


DEPRECATED = "tuner: {old} is deprecated, use {new}; the old spelling goes in the next release"
"""The one line an old spelling prints on stderr (it still works for one release)."""


class AliasOption(click.Option):
    """An option that still accepts old spellings (``hidden_aliases``) but shows only its current names in
    --help, so every command documents one spelling while old scripts keep working; an old spelling prints
    the :data:`DEPRECATED` line."""

    def __init__(self, *args: Any, hidden_aliases: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._hidden = set(hidden_aliases)

    def _current(self) -> list[str]:
        return [o for o in self.opts if o not in self._hidden]

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        opts = self.opts
        self.opts = self._current()
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = opts

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        # The old spellings get a parser entry of their own, so their use can be told apart (the parser records
        # only the option, not the spelling that matched): its process step prints the line, then stores as usual.
        opts, old = self.opts, [o for o in self.opts if o in self._hidden]
        new = "/".join(self._current())
        try:
            self.opts = self._current()
            super().add_to_parser(parser, ctx)
            if old:
                self.opts = old
                super().add_to_parser(parser, ctx)
        finally:
            self.opts = opts
        for spelling in old:
            entry = parser._long_opt.get(spelling) or parser._short_opt.get(spelling)
            if entry is not None:
                entry.process = _warn_then(entry.process, spelling, new)


def _warn_then(process: Callable[[Any, Any], None], old: str, new: str) -> Callable[[Any, Any], None]:
    def wrapped(value: object, state: object) -> None:
        click.echo(DEPRECATED.format(old=old, new=new), err=True)
        process(value, state)

    return wrapped


def deprecated_option(old: str, dest: str, new: str, **kw: object) -> Callable[[F], F]:
    """A hidden option for an old spelling whose value has another shape than the new one's (``--depth D``,
    repeated, for ``--depths D,...``): the command folds ``dest`` into the new option; given, it prints the
    :data:`DEPRECATED` line."""

    def note(ctx: click.Context, param: click.Parameter, value: object) -> object:
        if param.name and ctx.get_parameter_source(param.name) is click.core.ParameterSource.COMMANDLINE:
            click.echo(DEPRECATED.format(old=old, new=new), err=True)
        return value

    return click.option(old, dest, cls=click.Option, hidden=True, callback=note, **kw)


def number_option(
    name: str, bounds: click.IntRange | click.FloatRange, help_text: str | None = None, *, default: float | None = None
) -> Callable[[F], F]:
    """An option taking a number within ``bounds``; its default is shown in --help where it has one."""
    shown = True if default is not None else None
    return click.option(name, type=bounds, default=default, show_default=shown, help=help_text)


def rounds_option(what: str = "every depth") -> Callable[[F], F]:
    """``--rounds N``: the shorthand every command with paired rounds takes for ``--min-rounds N --max-rounds N``."""
    return click.option(
        "--rounds",
        type=click.IntRange(2, 100),
        help=f"N paired rounds for {what}, fixed: --min-rounds N --max-rounds N (an explicit --max-rounds M "
        "still lets the ones still open go on to M).",
    )


def round_limits(
    ctx: click.Context, rounds: int | None, min_rounds: int, max_rounds: int | None
) -> tuple[int, int | None]:
    """(min, max) paired rounds from ``--rounds``, ``--min-rounds`` and ``--max-rounds`` as every command reads
    them: ``--rounds N`` is ``--min-rounds N`` with ``--max-rounds`` N unless that is given too; ``max`` stays
    None where neither sets it (the command's own default applies)."""

    def given(name: str) -> bool:
        source = click.core.ParameterSource
        return ctx.get_parameter_source(name) in (source.COMMANDLINE, source.ENVIRONMENT)

    if rounds is not None:
        if given("min_rounds") and min_rounds != rounds:
            raise UsageError(
                f"--rounds {rounds} and --min-rounds {min_rounds} disagree: --rounds N is --min-rounds N "
                "--max-rounds N. Give one of them."
            )
        min_rounds = rounds
        if not given("max_rounds"):
            max_rounds = rounds
    if max_rounds is not None and max_rounds < min_rounds:
        raise UsageError(f"--max-rounds {max_rounds} is below --min-rounds {min_rounds}; raise it or drop it.")
    return min_rounds, max_rounds


def output_option(
    dest: str, *, old: tuple[str, ...] = ("--out",), in_place: bool = False, **kw: object
) -> Callable[[F], F]:
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
