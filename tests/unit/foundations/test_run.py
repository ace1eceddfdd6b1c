"""tuner._run.run with real (tiny) processes: the deadline holds without output, the child's whole
process group is stopped on a timeout, on Ctrl-C and on SIGTERM, a grandchild holding the pipe does
not block, and a child does not outlive a tuner killed outright (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tuner import _run
from tuner.errors import TunerError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups and signals are POSIX")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie waiting for a slow init to reap it counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: os.kill said it is there
    return state not in ("Z", "X")


def _gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


def _kill_if_alive(*pids: int) -> None:
    """Test hygiene: never leave a sleep behind when an assertion failed."""
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_deadline_holds_without_output(tmp_path: Path) -> None:
    log = tmp_path / "sleep.log"
    t0 = time.monotonic()
    with pytest.raises(TunerError, match=r"sleep timed out after 1s: sleep 15\. Log: .*sleep\.log"):
        _run.run(["sleep", "15"], timeout=1, log_file=log)
    assert time.monotonic() - t0 < 3
    assert log.read_text().startswith("$ sleep 15\n")


def test_silent_hang_after_output_is_killed(tmp_path: Path) -> None:
    seen: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(TunerError, match="timed out"):
        _run.run(
            ["sh", "-c", "echo $$; echo started; exec sleep 30"],
            timeout=1,
            on_line=seen.append,
            log_file=tmp_path / "hang.log",
        )
    assert time.monotonic() - t0 < 3
    assert seen[1] == "started" and not _alive(int(seen[0]))
    assert (tmp_path / "hang.log").read_text().splitlines()[1:] == seen


def test_child_ignoring_sigterm_gets_sigkill_after_the_grace() -> None:
    seen: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(TunerError, match="timed out"):
        _run.run(["sh", "-c", "trap '' TERM; echo $$; exec sleep 30"], timeout=1, on_line=seen.append)
    took = time.monotonic() - t0
    assert _run._KILL_GRACE <= took < _run._KILL_GRACE + 3
    assert not _alive(int(seen[0]))


def test_grandchild_holding_stdout_does_not_block_and_is_stopped() -> None:
    t0 = time.monotonic()
    res = _run.run(["sh", "-c", "sleep 30 & echo $!"])
    assert time.monotonic() - t0 < _run._EOF_GRACE + 2
    grandchild = int(res.output.strip())
    try:
        assert res.returncode == 0 and _gone_within(grandchild, 1)
    finally:
        _kill_if_alive(grandchild)


def test_timeout_stops_grandchildren() -> None:
    seen: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(TunerError, match="timed out"):
        _run.run(["sh", "-c", "sleep 30 & echo $!; sleep 30"], timeout=1, on_line=seen.append)
    assert time.monotonic() - t0 < 3
    grandchild = int(seen[0])
    try:
        assert _gone_within(grandchild, 1)
    finally:
        _kill_if_alive(grandchild)


def test_ctrl_c_or_a_failing_callback_stops_the_group() -> None:
    pids: list[int] = []

    def on_line(line: str) -> None:
        pids.append(int(line))
        raise KeyboardInterrupt  # what Ctrl-C raises in the main thread

    with pytest.raises(KeyboardInterrupt):
        _run.run(["sh", "-c", "sleep 30 & echo $!; sleep 30"], on_line=on_line)
    try:
        assert _gone_within(pids[0], 1)
    finally:
        _kill_if_alive(*pids)


_PARENT = textwrap.dedent("""
    import sys
    from tuner import _run
    _run.run(["sh", "-c", sys.argv[1]], on_line=lambda line: print(line, flush=True))
""")


def _start_parent(script: str, lines: int) -> tuple[subprocess.Popen[str], list[int]]:
    """A Python process running ``_run.run(['sh', '-c', script])``; returns it and the first ``lines``
    pids the script printed."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pids = [int(parent.stdout.readline()) for _ in range(lines)]
    return parent, pids


def _stop(parent: subprocess.Popen[str], *pids: int) -> None:
    parent.kill()
    parent.wait()
    assert parent.stdout is not None
    parent.stdout.close()
    _kill_if_alive(*pids)


def test_child_dies_with_a_sigkilled_tuner() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    parent, (child,) = _start_parent("echo $$; exec sleep 60", 1)
    try:
        assert _alive(child)
        parent.kill()
        parent.wait()
        assert _gone_within(child, 2)
    finally:
        _stop(parent, child)


def test_sigterm_to_tuner_stops_the_whole_group() -> None:
    parent, pids = _start_parent("sleep 60 & echo $!; echo $$; sleep 60", 2)
    try:
        assert all(_alive(p) for p in pids)
        parent.send_signal(signal.SIGTERM)
        # tuner still ends the way SIGTERM ends a process, only after stopping what it started
        assert parent.wait(timeout=10) == -signal.SIGTERM
        assert all(_gone_within(p, 1) for p in pids)
    finally:
        _stop(parent, *pids)


def test_on_line_gets_every_line_in_order(tmp_path: Path) -> None:
    script = "import sys\nfor i in range(20000): print(i)\nsys.stdout.write('crlf\\r\\nlast, no newline')"
    seen: list[str] = []
    res = _run.run([sys.executable, "-c", script], on_line=seen.append)
    want = [str(i) for i in range(20000)] + ["crlf", "last, no newline"]
    assert seen == want and res.output == "\n".join(want) and res.returncode == 0
    logged: list[str] = []
    res = _run.run([sys.executable, "-c", script], on_line=logged.append, log_file=tmp_path / "l.log")
    assert logged == want and res.output == ""
    header = f"$ {shlex.join([sys.executable, '-c', script])}\n"
    assert (tmp_path / "l.log").read_text() == header + "\n".join(want)


def test_exit_code_and_check_unchanged(tmp_path: Path) -> None:
    res = _run.run(["sh", "-c", "echo out; echo err >&2; exit 3"], check=False)
    assert (res.returncode, res.output) == (3, "out\nerr\n")
    with pytest.raises(TunerError, match=r"sh failed with exit code 3\. Full log: .*x\.log\. Last lines:\n\$ sh"):
        _run.run(["sh", "-c", "exit 3"], log_file=tmp_path / "x.log")


def test_a_program_that_cannot_start_is_a_tuner_error(tmp_path: Path) -> None:
    with pytest.raises(TunerError, match="'no-such-program-xyz' was not found"):
        _run.run(["no-such-program-xyz"])
    script = tmp_path / "not-executable"
    script.write_text("echo hi\n")
    with pytest.raises(TunerError, match="could not start: .*Permission denied"):
        _run.run([script])


def test_input_reaches_the_child_while_its_output_is_read() -> None:
    # 2 MB each way: more than a pipe holds, so writing all of stdin before reading stdout would deadlock
    text = "".join(f"{i}\n" for i in range(300_000))
    res = _run.run(
        [sys.executable, "-c", "import sys\nfor ln in sys.stdin: print(ln.strip(), flush=False)"], input=text
    )
    assert res.output == text and res.returncode == 0
    assert _run.run(["cat"], input="é ü\n".encode()).output == "é ü\n"  # bytes too
    assert _run.run(["cat"]).output == ""  # no input: the child reads an empty stdin, as before


def test_a_child_that_never_reads_its_input_still_times_out() -> None:
    t0 = time.monotonic()
    with pytest.raises(TunerError, match="timed out after 1s"):
        _run.run(["sleep", "15"], input="x" * (4 << 20), timeout=1)  # the writer blocks on a full pipe
    assert time.monotonic() - t0 < 4
    res = _run.run(["true"], input="x" * (4 << 20))  # a child that exits without reading: no BrokenPipeError
    assert res.returncode == 0
