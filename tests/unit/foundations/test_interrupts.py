"""A SIGTERM whose exception Python drops (raised inside a finalizer) still stops tuner."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import pytest

from tuner import _run, interrupts, log


class _Finalized:
    """Runs Python code in ``__del__``: a signal handler that fires there raises into a finalizer."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs between these bytecodes, inside the finalizer


def _dropped(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """Record what Python drops ("Exception ignored in ...") instead of pytest's warning about it."""
    seen: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    return seen


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_dropped_sigterm_exception_is_raised_at_the_next_process_start(monkeypatch: pytest.MonkeyPatch) -> None:
    dropped = _dropped(monkeypatch)
    with interrupts.sigterm_interrupts():
        _Finalized()  # freed at once: SIGTERM arrives inside __del__, where Python drops the exception
        gc.collect()
        assert [type(e) for e in dropped] == [interrupts.Terminated]
        with pytest.raises(interrupts.Terminated):
            _run.run([sys.executable, "-c", "pass"], check=False)
        _run.run([sys.executable, "-c", "pass"], check=False)  # raised once: the mark is cleared


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_dropped_sigterm_exception_is_raised_at_the_next_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    dropped = _dropped(monkeypatch)
    with interrupts.sigterm_interrupts():
        _Finalized()
        gc.collect()
        assert dropped
        with pytest.raises(interrupts.Terminated), log.step("next stage"):
            pass


def test_sigterm_raises_terminated_inside_the_block_and_is_a_keyboard_interrupt() -> None:
    with pytest.raises(KeyboardInterrupt), interrupts.sigterm_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    interrupts.check()  # the block's end clears the mark: nothing pending afterwards


_SLOW_COMMAND = """
import sys, time
import click
from tuner import cli

@click.command()
def slow() -> None:
    print("ready", flush=True)
    time.sleep(30)

cli._COMMANDS["slow"] = "__main__:slow"
sys.argv = ["tuner", "slow"]
cli.main()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_to_any_command_exits_130() -> None:
    # Not only `tuner search`: a command with no handler of its own (export, report, ...) ended by
    # SIGTERM's default action (143), which the exit-status help does not list.
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_COMMAND], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "tuner: aborted" in err
