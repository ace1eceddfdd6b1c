"""Options shared by the ``tuner sweep`` commands (sweep_cmd, sweep_confirm_cmd)."""

from __future__ import annotations

__all__ = ["budget_stop", "measure_options", "run_options"]

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from tuner.cli._params import DIR, FILE, F, build_option, output_option, stacked


def measure_options(*, build_help: str, backend_help: str, storage: str) -> Callable[[F], F]:
    """--build, --backend, --source and --storage, as `sweep run`, `sweep mmq` and `sweep confirm` take them."""
    return stacked(
        build_option(build_help),
        click.option("--backend", default="CUDA0", show_default=True, help=backend_help),
        click.option("--source", "spec", help="llama.cpp source SPEC to build and patch (default: the pinned tree)."),
        click.option(
            "--storage",
            type=FILE,
            help=f"SQLite file of the samples; a rerun with the same file resumes (default: OUTPUT/{storage}).",
        ),
    )


def run_options(unit: str, dry_help: str, out_help: str) -> Callable[[F], F]:
    """--time-budget (``unit``: what does not start), --dry-run and -o (written in place), as `sweep run`,
    `sweep mmq` and `sweep confirm` take them."""
    return stacked(
        click.option(
            "--time-budget",
            type=click.FloatRange(1),
            help=f"Seconds from now: no {unit} starts that would end past this. What was measured is stored and the "
            "same command goes on from there; exit status 3 where the budget stopped it.",
        ),
        click.option("--dry-run", is_flag=True, help=dry_help),
        output_option("out_dir", type=DIR, default=None, help=out_help, in_place=True),
    )


@contextlib.contextmanager
def budget_stop(storage: Path, emitted: str) -> Iterator[None]:
    """A sweep stopped by its --time-budget: what is stored, how to go on, exit status 3 (``emitted``: what
    the command would have written, and has not)."""
    from tuner import log
    from tuner.rounds.budget import BudgetReached

    try:
        yield
    except BudgetReached as stop:
        log.notice(
            f"time budget reached before {stop}: everything measured so far is stored in {storage}. Run the same "
            f"command again to go on; {emitted} not written yet."
        )
        sys.exit(3)  # SystemExit: click.main(standalone_mode=False) would swallow an Exit
