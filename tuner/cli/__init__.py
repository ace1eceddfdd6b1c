"""The ``tuner`` command line: a Click group whose subcommands load lazily.

Each subcommand lives in ``tuner/cli/<name>.py`` and only parses flags and calls a stage module;
only :func:`main` turns a :class:`~tuner.errors.TunerError` into a message and an exit code.
"""

from __future__ import annotations

__all__ = ["cli", "main", "os_error_message"]

import errno
import importlib
import logging
import os
import sys
from pathlib import Path

import click

from tuner import __version__, log
from tuner.cli._params import SuggestingGroup
from tuner.errors import EXIT_STATUSES, EXIT_TIME_BUDGET, TunerError, error_chain
from tuner.redact import redact

# name -> "module:attribute"; modules are imported only when the command runs (fast --help).
_COMMANDS: dict[str, str] = {
    "source": "tuner.cli.source_cmd:source",
    "archs": "tuner.cli.archs_cmd:archs",
    "estimate": "tuner.cli.archs_cmd:estimate",
    "model": "tuner.cli.model_cmd:model",
    "render": "tuner.cli.render_cmd:render",
    "build": "tuner.cli.build_cmd:build",
    "toolchain": "tuner.cli.build_cmd:toolchain",
    "bench": "tuner.cli.bench_cmd:bench",
    "compare": "tuner.cli.bench_cmd:compare",
    "ab": "tuner.cli.ab_cmd:ab",
    "report": "tuner.cli.bench_cmd:report",
    "check": "tuner.cli.bench_cmd:check",
    "equivalence": "tuner.cli.equivalence_cmd:equivalence",
    "search": "tuner.cli.search_cmd:search",
    "worker": "tuner.cli.search_cmd:worker",
    "export": "tuner.cli.export_cmd:export",
    "validate": "tuner.cli.export_cmd:validate",
    "sweep": "tuner.cli.sweep_cmd:sweep",
}


class _LazyGroup(SuggestingGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        mod_name, attr = target.split(":")
        cmd = getattr(importlib.import_module(mod_name), attr)
        if not isinstance(cmd, click.Command):
            raise TypeError(f"{target} is not a click command")
        return cmd


def _epilog() -> str:
    rows = []
    for code, what in EXIT_STATUSES.items():
        first, *rest = what.split("\n")
        rows += [f"  {code:<4} {first}", *(f"       {line}" for line in rest)]
    return "\b\nExit status:\n" + "\n".join(rows) + "\n"


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_epilog())
@click.version_option(__version__, prog_name="tuner")
@click.option("-v", "--verbose", count=True, help="More log output (-vv: debug).")
@click.option(
    "--debug",
    is_flag=True,
    expose_value=False,  # read by tuner.crash.debug_requested
    help="Print the traceback of an internal error (also TUNER_DEBUG=1).",
)
def cli(verbose: int) -> None:
    """Find the fastest way to build and run llama.cpp on a given GPU.

    tuner renders CMake flag sets and FlashAttention kernel parameters, builds llama.cpp
    variants, benchmarks them with llama-bench across context depths and lets Optuna search
    the build, compile-time and runtime knobs. Numbers it prints are measured on this machine;
    AMD targets without an AMD GPU are rendered, constraint-checked and compile-checked only.
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("scikit_build_core", "optuna"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING if verbose < 2 else level))


def os_error_message(err: OSError) -> str | None:
    """One paragraph for an OSError the user can fix (where, what is wrong, the fix): the OS names a path, or
    the disk is full; None (a bug) otherwise."""
    path = os.fsdecode(err.filename) if isinstance(err.filename, (str, bytes, os.PathLike)) else None
    where = f" ({path})" if path else ""
    code = err.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        what = "no space left on the device" if code == errno.ENOSPC else "the disk quota is exhausted"
        target = (
            f"the disk holding {os.path.dirname(path) or path}"
            if path
            else "the disk tuner was writing to (-o, the run folder or TUNER_HOME)"
        )
        return (
            f"{what} while writing{where}. Free space on {target} (`df -h` shows it) or point -o / --run-dir / "
            "TUNER_HOME at another disk, then rerun the same command (a search resumes; an export that failed left "
            "the previous one in place)."
        )
    if path is None:
        return None
    if code == errno.EROFS:
        return (
            f"{path} is on a read-only file system ({err.strerror}). Choose another -o (or --run-dir / TUNER_HOME) on "
            "a writable disk, or remount it read-write."
        )
    if code in (errno.EACCES, errno.EPERM):
        folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
        return (
            f"permission denied on {path} ({err.strerror}). Make {folder} writable for this user (e.g. "
            f"`chmod u+w {folder}`) or choose another -o / --run-dir / TUNER_HOME."
        )
    if code in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        # the first existing ancestor of path that is not a folder (the file in the way), else path
        p = Path(path)
        blocker = next((str(a) for a in [*reversed(p.parents), p] if a.exists() and not a.is_dir()), path)
        kind = "a folder" if code == errno.EISDIR else "a file"
        return (
            f"{kind} is in the way at {blocker} ({err.strerror}: {path}). Remove or rename {blocker}, or choose "
            "another path."
        )
    if code == errno.ENOENT:
        return (
            f"{path} does not exist ({err.strerror}). Check the path (a folder in it may be missing or was moved) "
            "and rerun."
        )
    return f"{err.strerror or err} on {path}. Check the path and this machine's disk, then rerun."


_SQLITE_FULL = "database or disk is full"  # SQLITE_FULL's message (sqlite3, sqlalchemy and Optuna pass it on)


def main() -> None:
    """Console-script entry point: a TunerError is its message and exit code (1; 2 usage; 3 a --time-budget stop,
    shown as a note); an OSError about the machine (:func:`os_error_message`) its paragraph and exit 1; anything
    else is a bug for :func:`tuner.crash.report_crash` (one paragraph, a log file, exit 70)."""
    from tuner import interrupts

    try:
        # SIGTERM unwinds every command like Ctrl-C (exit 130, as the help says), not only a search:
        # the default action would end the process at once (status 143) with no cleanup.
        with interrupts.sigterm_interrupts():
            cli.main(standalone_mode=False)
            interrupts.check()  # a SIGTERM whose exception was dropped in a finalizer
    except TunerError as err:
        if err.exit_code == EXIT_TIME_BUDGET:  # a --time-budget stop is no error: what finished is stored
            log.notice(str(err))
        else:  # a storage password in any message stays off the screen
            click.echo(f"tuner: error: {redact(str(err))}", err=True)
        sys.exit(err.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("tuner: aborted", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except OSError as err:
        msg = os_error_message(err)
        if msg is None:
            from tuner import crash

            sys.exit(crash.report_crash(err))
        click.echo(f"tuner: error: {msg}", err=True)
        sys.exit(1)
    except Exception as err:  # a bug, or a missing optional module: one paragraph, never a traceback
        from tuner import crash, extras

        usage = extras.missing_module_error(err) if isinstance(err, ImportError) else None
        if usage is not None:
            click.echo(f"tuner: error: {usage}", err=True)
            sys.exit(usage.exit_code)
        # a full disk without a path, in err or an exception it came from: a study's SQLite write
        # (sqlite3.OperationalError, wrapped by SQLAlchemy/Optuna) fails so during a search
        if any(
            (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or _SQLITE_FULL in str(e)
            for e in error_chain(err)
        ):
            click.echo(
                f"tuner: error: {os_error_message(OSError(errno.ENOSPC, 'No space left on device'))} "
                f"(the study database reported: {' '.join(str(err).split())[:200]})",
                err=True,
            )
            sys.exit(1)
        sys.exit(crash.report_crash(err))
