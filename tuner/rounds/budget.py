"""The time budget (``--time-budget`` of ``tuner search``, ``tuner worker``, ``tuner sweep run``, ``mmq`` and
``confirm``): one policy, :class:`Budget`. Nothing starts that would end past its deadline, so a call that a
machine's time limit ends stops between units of work instead of losing the one in flight. A unit is what is
stored whole: a build, a model's synthesis, a test-backend-ops gate, a round (the paired calls of a screen's or
a confirm's round; the timer processes of one chunk's round in the kernel sweeps, where
:meth:`tuner.rounds.store.SampleStore.whole_round` measures a round cut off by an earlier call again whole), a tune trial,
an output-equivalence check, a residency probe. What was measured is stored; the same command resumes.

A budget stop is :class:`BudgetReached`, a :class:`~tuner.errors.TunerError` with exit status 3
(:data:`tuner.errors.EXIT_TIME_BUDGET`), mapped once by ``tuner.cli.main``."""

from __future__ import annotations

__all__ = ["UNBOUNDED", "Budget", "BudgetReached", "budget_deadline"]

import dataclasses
import math
import time

from tuner.errors import EXIT_TIME_BUDGET, TunerError


class BudgetReached(TunerError):
    """The time budget ended a command before what its message names; rerunning the same command resumes it."""

    exit_code = EXIT_TIME_BUDGET


def budget_deadline(started: float | None, seconds: float | None) -> float | None:
    """The ``time.monotonic()`` deadline of a ``--time-budget`` of ``seconds`` counted from ``started`` (the
    command's start: its build and model count too; None: from now); None without a budget."""
    if not seconds:
        return None
    return (time.monotonic() if started is None else started) + seconds


@dataclasses.dataclass(frozen=True)
class Budget:
    """A command's time budget: ``deadline`` in ``time.monotonic()`` seconds (None: no budget, nothing stops)."""

    deadline: float | None = None

    @classmethod
    def counted_from(cls, started: float | None, seconds: float | None) -> Budget:
        """The budget of ``seconds`` from ``started`` (the command's start; None: from now); none without seconds."""
        return cls(budget_deadline(started, seconds))

    def remaining(self) -> float:
        """Seconds left (infinite without a budget)."""
        return math.inf if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def check(self, what: str) -> None:
        """BudgetReached where the deadline has passed: ``what`` is what would have started."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise BudgetReached(what)

    def fits(self, seconds: float, what: str, *, worded: bool = False) -> None:
        """BudgetReached where ``what``, priced at ``seconds``, would end past the deadline, so it is not started
        to be cut off; the message says the price and what is left (``worded``: ``what`` alone, as the sweeps
        word their stops, a price named there where they name one)."""
        if self.deadline is not None and time.monotonic() + seconds > self.deadline:
            raise BudgetReached(what if worded else f"{what} (about {seconds:.0f} s, {self.remaining():.0f} s left)")


UNBOUNDED = Budget()
"""No budget: nothing stops (the round loops' default)."""
