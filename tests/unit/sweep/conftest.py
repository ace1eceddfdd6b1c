"""Fixtures shared by the sweep tests."""

from __future__ import annotations

import time

import pytest


class Clock:
    """A ``time.monotonic`` that moves only when a test moves it (``now``): the budget tests' fake calls
    advance it by the seconds they stand for."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """``time.monotonic`` replaced by a :class:`Clock` for the test."""
    c = Clock()
    monkeypatch.setattr(time, "monotonic", c)
    return c
