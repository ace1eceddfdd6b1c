from __future__ import annotations

import io

import pytest

from tuner import progress
from tuner.builder.cmake import _Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _plain(total: int | None = None, unit: str = "steps") -> tuple[io.StringIO, FakeClock, object]:
    out, clock = io.StringIO(), FakeClock()
    cm = progress.track("building cpu", total=total, unit=unit, stream=out, display="plain", clock=clock)
    return out, clock, cm


def test_format_seconds() -> None:
    assert progress.format_seconds(0) == "0:00"
    assert progress.format_seconds(75) == "1:15"
    assert progress.format_seconds(3725) == "1:02:05"


def test_plain_lines_have_count_elapsed_and_eta() -> None:
    out, clock, cm = _plain(total=100)
    with cm as bar:
        clock.now += 20
        bar.update(25)
    assert out.getvalue() == "building cpu: 25/100 steps (25%), 0:20 elapsed, ETA 1:00\n"


def test_plain_is_rate_limited_to_tenths_and_heartbeats() -> None:
    """A 7-minute, 1450-step build gives about a dozen lines, not 1450."""
    out, clock, cm = _plain()
    with cm as bar:
        for n in range(1, 1451):
            clock.now += 420 / 1450
            bar.update(n, total=1450)
    lines = out.getvalue().splitlines()
    assert 10 <= len(lines) <= 16, lines
    assert lines[0].startswith("building cpu: 1/1450 steps (0%)")
    assert lines[-1] == "building cpu: 1450/1450 steps (100%), 7:00 elapsed"  # no ETA once done


def test_plain_never_two_lines_within_ten_seconds_but_always_the_last() -> None:
    out, clock, cm = _plain(total=10)
    with cm as bar:
        for n in range(1, 11):  # a cached build: all steps in a second
            clock.now += 0.1
            bar.update(n)
    assert [ln.split(":")[1].split()[0] for ln in out.getvalue().splitlines()] == ["1/10", "10/10"]


def test_plain_heartbeat_without_total() -> None:
    out, clock, cm = _plain(total=None, unit="trials")
    with cm as bar:
        for _ in range(6):
            clock.now += 5
            bar.advance()
    lines = out.getvalue().splitlines()
    assert lines == [
        "building cpu: 1 trials, 0:05 elapsed",
        "building cpu: 3 trials, 0:15 elapsed",
        "building cpu: 5 trials, 0:25 elapsed",
    ]


def test_off_prints_nothing() -> None:
    out = io.StringIO()
    with progress.track("x", total=3, stream=out, display="off") as bar:
        bar.update(3)
    assert out.getvalue() == ""


def test_mode_follows_tty_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("TUNER_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert progress.mode(io.StringIO()) == "plain"
    assert progress.mode(Tty()) == "bar"
    monkeypatch.setenv("TUNER_PROGRESS", "plain")
    assert progress.mode(Tty()) == "plain"


def test_bar_mode_draws_with_rich_and_cleans_up() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    with progress.track("building cpu", total=4, stream=out, display="bar") as bar:
        bar.update(2)
        bar.advance(2)
    assert bar.completed == 4
    assert bar._bar is None  # the live display was stopped


def test_ninja_lines_feed_the_tracker() -> None:
    out, clock, cm = _plain()
    with cm as bar:
        feed = _Progress(bar)
        feed("-- Configuring done")
        clock.now += 30
        feed("[3/12] Building CXX object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o")
        clock.now += 90
        feed("[12/12] Linking CXX executable bin/llama-bench")
    assert out.getvalue().splitlines() == [
        "building cpu: 3/12 steps (25%), 0:30 elapsed, ETA 1:30",
        "building cpu: 12/12 steps (100%), 2:00 elapsed",
    ]
