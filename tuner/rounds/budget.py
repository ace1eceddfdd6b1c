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

__all__ = ["Budget", "BudgetReached", "RoundBudget", "SweepBudget", "budget_deadline"]

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

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

    def fits(self, seconds: float, what: str) -> None:
        """BudgetReached where ``what``, priced at ``seconds``, would end past the deadline, so it is not started
        to be cut off; the message says the price and what is left."""
        if self.deadline is not None and time.monotonic() + seconds > self.deadline:
            raise BudgetReached(self._stop(what, seconds))

    def _stop(self, what: str, seconds: float) -> str:
        return f"{what} (about {seconds:.0f} s, {self.remaining():.0f} s left)"


def _unknown(plan: Any, depths: Sequence[int]) -> float:
    return 0.0


@dataclasses.dataclass(frozen=True)
class RoundBudget(Budget):
    """The sweep confirmation's :class:`Budget`, with ``round_s(plan, depths)``: a model's first round estimated
    (seconds), which decides whether it starts; later rounds are judged by the model's longest so far
    (:func:`tuner.rounds.joint.run_joint_rounds`). Its callers word the price in ``what`` themselves."""

    deadline: float | None = None
    round_s: Callable[[Any, Sequence[int]], float] = _unknown

    @classmethod
    def from_now(cls, seconds: float, round_s: Callable[[Any, Sequence[int]], float] = _unknown) -> RoundBudget:
        return cls(deadline=time.monotonic() + seconds, round_s=round_s)

    def _stop(self, what: str, seconds: float) -> str:
        return what

    def prior(self, plan: Any, depths: Sequence[int], calls: Sequence[str]) -> list[dict[str, Any]]:
        """The estimate as a round record, as :func:`tuner.rounds.joint.run_joint_rounds` reads ``prior``."""
        return [{"seconds": self.round_s(plan, depths), "depths": list(depths), "order": list(calls)}]


@dataclasses.dataclass
class SweepBudget:
    """A kernel sweep's, per round of a chunk (its configs' timer processes, run back to back: a round is
    paired, so it is started whole or not at all). A round starts only where its estimate (the sweep's recorded
    H100 rates), times the most any finished round of this call overran its own, fits the :class:`Budget`: a
    slower machine or a longer case than recorded stops the call earlier, never later."""

    deadline: float
    slower: float = 1.0

    @classmethod
    def from_now(cls, seconds: float) -> SweepBudget:
        return cls(deadline=time.monotonic() + seconds)

    def start(self, estimate_s: float, what: str) -> float:
        """The start time of a round estimated at ``estimate_s``; BudgetReached where it would end too late."""
        RoundBudget(self.deadline).fits(estimate_s * self.slower, what)
        return time.monotonic()

    def done(self, estimate_s: float, started: float) -> None:
        """Record how long a round took against its estimate."""
        if estimate_s > 0:
            self.slower = max(self.slower, (time.monotonic() - started) / estimate_s)
