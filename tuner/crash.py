"""What a user sees when tuner itself fails: one paragraph and a log file, never a bare traceback.

:func:`report_crash` is called by :func:`tuner.cli.main` for any exception that is not a
:class:`~tuner.errors.TunerError` or a click exception. It writes the traceback and the run's context
(argv, versions, platform, ``TUNER_*``/``GGML_*`` environment) to ``$TUNER_HOME/logs/crash-*.log``
(or the temp folder when TUNER_HOME is unusable) and prints one paragraph naming that file; URL passwords (a
``--storage postgresql://user:secret@...``) are replaced by ``***`` everywhere in both (:mod:`tuner.redact`).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path

import click

from tuner import __version__
from tuner.paths import tuner_home
from tuner.redact import redact, redact_argv, remember_argv

EXIT_INTERNAL = 70
"""Exit status for a bug in tuner (``EX_SOFTWARE`` in sysexits.h)."""

_ENV_PREFIXES = ("TUNER_", "GGML_")
_DISTS = ("click", "optuna", "scikit-build-core", "cmake", "ninja", "pandas", "numpy", "scipy", "gguf")


def debug_requested(argv: Sequence[str] | None = None) -> bool:
    """``TUNER_DEBUG`` is set to something true, or ``--debug`` is among the group's options."""
    if os.environ.get("TUNER_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off"):
        return True
    for arg in argv if argv is not None else sys.argv[1:]:
        if arg == "--debug":
            return True
        if not arg.startswith("-"):  # the subcommand: its options are not the group's
            return False
    return False


def _context(argv: Sequence[str]) -> list[str]:
    argv = redact_argv(argv)
    lines = [
        f"time:      {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"command:   {shlex.join(['tuner', *argv])}",
        f"argv:      {list(argv)!r}",
        f"cwd:       {os.getcwd()}",
        f"tuner:     {__version__} ({Path(__file__).resolve().parent})",
        f"python:    {sys.version.split()[0]} ({sys.executable})",
        f"platform:  {platform.platform()} {platform.machine()}, {os.cpu_count()} CPUs",
    ]
    versions = []
    for dist in _DISTS:
        try:
            versions.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist} (not installed)")
    lines.append("packages:  " + ", ".join(versions))
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES))
    lines.append("environment:" + ("" if env else " (no TUNER_*/GGML_* variables)"))
    lines += [f"  {k}={redact(v)}" for k, v in env]
    return [redact(ln) for ln in lines]


def write_crash_log(err: BaseException, argv: Sequence[str]) -> Path:
    """Write the traceback and the run's context to a new file in ``$TUNER_HOME/logs`` when that is a writable
    folder, else in ``<tmp>/tuner-logs``; return its path."""
    remember_argv(argv)  # a --storage value's password, hidden in the traceback's messages too
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        d = tuner_home() / "logs"
        d.mkdir(parents=True, exist_ok=True)
        usable = os.access(d, os.W_OK | os.X_OK)
    except Exception:
        usable = False
    if not usable:
        d = Path(tempfile.gettempdir()) / "tuner-logs"
        d.mkdir(parents=True, exist_ok=True)
    path = d / f"crash-{stamp}-{os.getpid()}.log"
    tb = redact("".join(traceback.format_exception(type(err), err, err.__traceback__)))  # messages and locals' reprs
    path.write_text("\n".join(["tuner internal error", *_context(argv), "", tb]), encoding="utf-8")
    return path


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    first = text[0].strip() if text else ""
    if len(first) > 300:
        first = first[:297] + "..."
    name = type(err).__qualname__
    return redact(f"{name}: {first}" if first else name)


def report_crash(err: BaseException, argv: Sequence[str] | None = None) -> int:
    """Print the internal-error paragraph (and, when debugging, the traceback); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    remember_argv(argv)
    command = shlex.join(["tuner", *redact_argv(argv)])
    debug = debug_requested(argv)
    try:
        where = f"The traceback and the run's context are in {write_crash_log(err, argv)} (attach it to a bug report)."
    except Exception as log_err:
        where = f"Writing a crash log failed too ({log_err}), so the traceback is printed above."
        debug = True
    if debug:
        click.echo(redact("".join(traceback.format_exception(type(err), err, err.__traceback__))), err=True, nl=False)
        how = "The traceback is above (--debug / TUNER_DEBUG)."
    else:
        sub = next((a for a in argv if not a.startswith("-")), None)
        again = f"tuner --debug {sub} ..." if sub else "tuner --debug ..."
        how = f"To print the traceback here, rerun with `{again}` or TUNER_DEBUG=1."
    click.echo(
        f"tuner: internal error while running `{command}`: {_one_line(err)}. This is a bug in tuner, "
        f"not something you did. {where} {how}",
        err=True,
    )
    return EXIT_INTERNAL
