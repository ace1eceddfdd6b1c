"""The only place tuner starts processes. List arguments, never a shell."""

from __future__ import annotations

__all__ = ["run", "tail", "RunResult"]

import dataclasses
import logging
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from tuner.errors import TunerError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunResult:
    returncode: int
    output: str
    """Combined stdout+stderr when no log file was given; otherwise ''."""
    seconds: float
    log_file: Path | None = None


def tail(path: Path, n: int = 40) -> str:
    """Last ``n`` lines of a log file (for error messages)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _open_log(log_file: Path | None, cmdline: str) -> TextIO | None:
    """Open ``log_file`` for appending, headed by the command line; None when there is no log file."""
    if log_file is None:
        return None
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fh = open(log_file, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
    fh.write(f"$ {cmdline}\n")
    fh.flush()
    return fh


def _pump(proc: subprocess.Popen[str], fh: TextIO | None, out_chunks: list[str],
          on_line: Callable[[str], None] | None, deadline: float | None) -> int:
    """Copy the child's output to the log (or ``out_chunks``) and ``on_line`` until it exits or the
    deadline passes (then it is killed); returns its exit code."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if fh:
            fh.write(line)
        else:
            out_chunks.append(line)
        if on_line:
            on_line(line.rstrip("\n"))
        if deadline is not None and time.monotonic() > deadline:
            proc.kill()
            break
    remaining = None if deadline is None else max(0.1, deadline - time.monotonic())
    try:
        return proc.wait(timeout=remaining)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _check_outcome(what: str, cmdline: str, rc: int, seconds: float, output: str, *, timeout: float | None,
                   check: bool, log_file: Path | None) -> None:
    """Raise TunerError for a timeout, or (with ``check``) a non-zero exit, naming the log and its last lines."""
    if timeout is not None and seconds > timeout:
        where = f" Log: {log_file}." if log_file else ""
        msg = f"{what} timed out after {timeout:.0f}s: {cmdline}.{where} Raise the timeout or shrink the job."
        raise TunerError(msg)
    if check and rc != 0:
        if log_file is not None:
            last = tail(log_file)
            msg = (
                f"{what} failed with exit code {rc}. Full log: {log_file}. Last lines:\n{last}"
            )
        else:
            last = "\n".join(output.splitlines()[-40:])
            msg = f"{what} failed with exit code {rc}: {cmdline}\n{last}"
        raise TunerError(msg)


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    log_file: Path | None = None,
    timeout: float | None = None,
    check: bool = True,
    on_line: Callable[[str], None] | None = None,
    what: str | None = None,
) -> RunResult:
    """Run ``cmd``; stream its output to ``log_file`` (and ``on_line``) or capture it.

    Args:
        cmd: The program and its arguments.
        env: Full environment for the child; ``None`` inherits ours. Never mutates ``os.environ``.
        log_file: Where stdout+stderr go. The file starts with the command line.
        timeout: Seconds before the child is killed; a timeout is a ``TunerError``.
        check: Raise ``TunerError`` on a non-zero exit, naming the log and its last lines.
        on_line: Called with each output line (used for progress display).
        what: Short description for error messages, e.g. "CMake build".

    Returns:
        A RunResult.
    """
    args = [os.fspath(c) for c in cmd]
    cmdline = shlex.join(args)
    logger.info("RUN: %s", cmdline)
    what = what or Path(args[0]).name
    start = time.monotonic()
    out_chunks: list[str] = []
    fh = _open_log(log_file, cmdline)
    try:
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
        )
    except FileNotFoundError as err:
        if fh:
            fh.close()
        msg = f"{what} could not start: {args[0]!r} was not found. Install it or put it on PATH."
        raise TunerError(msg) from err
    try:
        rc = _pump(proc, fh, out_chunks, on_line, None if timeout is None else start + timeout)
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
        if fh:
            fh.close()
    seconds = time.monotonic() - start
    output = "".join(out_chunks)
    _check_outcome(what, cmdline, rc, seconds, output, timeout=timeout, check=check, log_file=log_file)
    return RunResult(returncode=rc, output=output, seconds=seconds, log_file=log_file)
