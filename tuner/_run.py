"""The only place tuner starts processes. List arguments, never a shell.

Every child runs in its own session (so its whole process group can be signalled) and, on Linux, with PR_SET_PDEATHSIG
(so it dies with a tuner that was killed outright). The deadline holds whether or not the child prints; at the deadline,
on Ctrl-C or on SIGTERM the group gets SIGTERM, then SIGKILL after a short grace. A grandchild that keeps the output
pipe open after the child exited does not keep tuner waiting.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import dataclasses
import io
import locale
import logging
import os
import selectors
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, TextIO

from tuner import interrupts
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
    fh = open(log_file, "a", encoding="utf-8", errors="replace")
    fh.write(f"$ {cmdline}\n")
    fh.flush()
    return fh


# Seconds between SIGTERM and SIGKILL of a child's group; how long to keep reading after the child
# exited (what a grandchild still writes); how often a quiet child is checked on.
_KILL_GRACE = 2.0
_EOF_GRACE = 1.0
_POLL = 0.1
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_prctl: Callable[..., int] | Literal[False] | None = None  # libc's prctl; False: none to call


def _preexec() -> Callable[[], None] | None:
    """A preexec_fn that sets PR_SET_PDEATHSIG (SIGKILL) in the child; None off Linux or without libc.

    Everything is looked up in the parent: between fork and exec the child only makes the call.
    """
    global _prctl
    if not sys.platform.startswith("linux"):
        return None
    if _prctl is None:
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = False
    if _prctl is False:
        return None
    prctl, parent, kill = _prctl, os.getpid(), int(signal.SIGKILL)

    def set_pdeathsig() -> None:
        prctl(_PR_SET_PDEATHSIG, kill)
        if os.getppid() != parent:  # tuner died before prctl took effect
            os.kill(os.getpid(), kill)

    return set_pdeathsig


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. Zombies do not count: where the init process
    is slow to reap orphans, they would otherwise hold every kill for the whole grace."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    if not sys.platform.startswith("linux"):
        return True
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):  # state, ppid, pgrp
                return True
        return False
    return True


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child's process group, SIGKILL whatever is left after ``_KILL_GRACE``; reap the child."""
    pgid = proc.pid  # start_new_session: the child leads its own group
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone
    else:
        end = time.monotonic() + _KILL_GRACE
        while time.monotonic() < end:
            proc.poll()  # reap the child
            if not _group_alive(pgid):
                break
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    proc.wait()


class _Signalled(BaseException):
    """Raised in the main thread by SIGTERM while a child runs, so the child's group is stopped first."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_stop_child() -> Iterator[None]:
    """While a child runs, SIGTERM raises :class:`_Signalled` (Ctrl-C already raises KeyboardInterrupt);
    afterwards the previous handler gets the signal, so tuner still ends as it would have."""
    main = threading.current_thread() is threading.main_thread()  # handlers can only be set there
    old = signal.getsignal(signal.SIGTERM) if main else None
    if old is None or old == signal.SIG_IGN:
        # Off the main thread, SIGTERM ignored, or a handler set outside Python (None: it could not
        # be put back): leave SIGTERM alone. Ctrl-C and errors still stop the child in ``run``.
        yield
        return

    def handler(signum: int, frame: object) -> None:
        interrupts.mark()  # if this exception is dropped (raised inside a finalizer), check() raises later
        raise _Signalled(signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except _Signalled as sig:
        with contextlib.suppress(interrupts.Terminated):
            interrupts.check()  # acted on here: clear the mark
        signal.signal(signal.SIGTERM, old)
        if callable(old):
            old(sig.signum, None)
        else:
            os.kill(os.getpid(), sig.signum)  # the default action: end the way SIGTERM ends a process
        # Only reached when the previous handler returned: the child is stopped, so say so.
        raise TunerError("Interrupted by SIGTERM; the running command and its processes were stopped.") from None
    finally:
        signal.signal(signal.SIGTERM, old)


class _Lines:
    """Bytes in, text lines out: the child's locale encoding with errors replaced and universal
    newlines (what ``Popen(text=True)`` gave before the reading moved to raw reads)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        enc = locale.getpreferredencoding(False)
        self._dec = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder(enc)(errors="replace"), translate=True)
        self._pending = ""
        self._emit = emit

    def feed(self, data: bytes, final: bool = False) -> None:
        self._pending += self._dec.decode(data, final=final)
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._emit(line + "\n")
        if final and self._pending:
            self._emit(self._pending)
            self._pending = ""


def _pump(
    proc: subprocess.Popen[bytes],
    fh: TextIO | None,
    out_chunks: list[str],
    on_line: Callable[[str], None] | None,
    deadline: float | None,
) -> tuple[int, bool]:
    """Copy the child's output to the log (or ``out_chunks``) and ``on_line`` until it exits or the
    deadline passes (then its group is stopped); returns its exit code and whether it timed out."""
    assert proc.stdout is not None

    def emit(line: str) -> None:
        if fh:
            fh.write(line)
        else:
            out_chunks.append(line)
        if on_line:
            on_line(line.rstrip("\n"))

    lines = _Lines(emit)
    fd = proc.stdout.fileno()
    exited_at: float | None = None
    stop = False  # the group must be stopped: the deadline passed, or a grandchild holds the pipe
    timed_out = False
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            interrupts.check()  # a dropped SIGTERM exception still stops the child (the caller kills its group)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                stop = timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at >= _EOF_GRACE:
                stop = True  # the child is gone but something it started still holds its stdout
                break
            wait = _POLL if deadline is None else max(0.0, min(_POLL, deadline - now))
            if not sel.select(wait):
                continue
            data = os.read(fd, 65536)
            if not data:
                break
            lines.feed(data)
    lines.feed(b"", final=True)
    # EOF while the child still runs (it closed its stdout): wait for it, deadline included.
    while not stop and proc.poll() is None:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            stop = timed_out = True
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=left)
    if stop:
        _kill_group(proc)
    return proc.wait(), timed_out


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> threading.Thread:
    """Write ``data`` to the child's stdin from a thread, then close it: the pump goes on reading the child's
    output meanwhile (a child that answers as it reads would otherwise fill its output pipe and stop reading
    ours). A child that exits, or closes its stdin, before taking it all only ends the write."""
    stdin = proc.stdin
    assert stdin is not None

    def write() -> None:
        with contextlib.suppress(OSError):  # BrokenPipeError: the child is gone or stopped reading
            stdin.write(data)
        with contextlib.suppress(OSError):
            stdin.close()

    writer = threading.Thread(target=write, name="tuner-run-stdin", daemon=True)
    writer.start()
    return writer


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
    input: str | bytes | None = None,  # subprocess.run's name for it
) -> RunResult:
    """Run ``cmd``; stream its output to ``log_file`` (headed by the command line) and ``on_line``, or capture it.

    ``env`` is the child's full environment (``None`` inherits ours; ``os.environ`` is never mutated). A ``timeout``
    (seconds, also while ``input`` is written) kills the child and is a TunerError; ``check`` raises TunerError on a
    non-zero exit, naming the log and its last lines, with ``what`` (e.g. "CMake build") naming the step. ``input`` is
    what the child reads on stdin (text in the locale's encoding, as its output is read); None gives an empty stdin.
    """
    interrupts.check()  # a SIGTERM whose exception was dropped: start nothing more
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
            stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_preexec(),
        )
    except OSError as err:
        if fh:
            fh.close()
        if isinstance(err, FileNotFoundError) and (cwd is None or Path(cwd).is_dir()):
            msg = f"{what} could not start: {args[0]!r} was not found. Install it or put it on PATH."
        else:
            msg = f"{what} could not start: {err}. Check that {args[0]!r} is an executable program."
        raise TunerError(msg) from err
    data = input.encode(locale.getpreferredencoding(False)) if isinstance(input, str) else input
    writer = _feed(proc, data) if data is not None else None
    try:
        with _signals_stop_child():
            try:
                rc, timed_out = _pump(proc, fh, out_chunks, on_line, None if timeout is None else start + timeout)
            except BaseException:
                # Ctrl-C, SIGTERM, or a failing on_line: nothing the child started may outlive this call.
                _kill_group(proc)
                raise
    finally:
        if writer is not None:  # the child is gone (its group was stopped): the write ends with a broken pipe
            writer.join(timeout=_EOF_GRACE)
        if proc.stdout is not None:
            proc.stdout.close()
        if fh:
            fh.close()
    seconds = time.monotonic() - start
    output = "".join(out_chunks)
    if timeout is not None and (timed_out or seconds > timeout):
        where = f" Log: {log_file}." if log_file else ""
        msg = f"{what} timed out after {timeout:.0f}s: {cmdline}.{where} Raise the timeout or shrink the job."
        raise TunerError(msg)
    if check and rc != 0:
        if log_file is not None:
            msg = f"{what} failed with exit code {rc}. Full log: {log_file}. Last lines:\n{tail(log_file)}"
        else:
            last = "\n".join(output.splitlines()[-40:])
            msg = f"{what} failed with exit code {rc}: {cmdline}\n{last}"
        raise TunerError(msg)
    return RunResult(returncode=rc, output=output, seconds=seconds, log_file=log_file)
