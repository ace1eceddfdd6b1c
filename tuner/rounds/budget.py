"""The time budgets (``--time-budget`` of ``tuner search``, ``tuner sweep run``, ``mmq`` and ``confirm``): nothing starts
that would end past the deadline, so a call that a machine's time limit ends stops between units of work
instead of losing the one in flight. A unit is a round: the timer processes of one chunk's round in the kernel
sweeps (:meth:`tuner.rounds.store.SampleStore.whole_round` measures a round cut off by an earlier call again whole), the
paired llama-bench calls of one model's round in the confirmation, and there each output-equivalence check
and test-backend-ops run. What was measured is stored; the same command resumes."""

from __future__ import annotations

__all__ = ["BudgetReached", "RoundBudget", "SweepBudget", "budget_deadline", "check_fits"]

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any


class BudgetReached(Exception):
    """The time budget ended a stage; rerunning the same command resumes it."""


def budget_deadline(started: float | None, seconds: float | None) -> float | None:
    """The ``time.monotonic()`` deadline of a ``--time-budget`` of ``seconds`` counted from ``started`` (the
    command's start: its build and model count too; None: from now); None without a budget."""
    if not seconds:
        return None
    return (time.monotonic() if started is None else started) + seconds


def check_fits(deadline: float | None, seconds: float, what: str) -> None:
    """BudgetReached where ``what``, priced at ``seconds``, would end past ``deadline`` (a unit that is not a
    round: a build, a model's synthesis), so it is not started to be cut off."""
    if deadline is not None and time.monotonic() + seconds > deadline:
        raise BudgetReached(f"{what} (about {seconds:.0f} s, {max(0.0, deadline - time.monotonic()):.0f} s left)")


def _unknown(plan: Any, depths: Sequence[int]) -> float:
    return 0.0


@dataclasses.dataclass(frozen=True)
class RoundBudget:
    """The confirmation's. ``deadline``: ``time.monotonic()`` seconds. ``round_s(plan, depths)``: a model's first
    round estimated (seconds), which decides whether it starts; later rounds are judged by the model's longest
    so far (:func:`tuner.rounds.joint.run_joint_rounds`)."""

    deadline: float
    round_s: Callable[[Any, Sequence[int]], float] = _unknown

    @classmethod
    def from_now(cls, seconds: float, round_s: Callable[[Any, Sequence[int]], float] = _unknown) -> RoundBudget:
        return cls(deadline=time.monotonic() + seconds, round_s=round_s)

    def check(self, what: str) -> None:
        """BudgetReached where the deadline has passed: ``what`` is what would have started."""
        if time.monotonic() >= self.deadline:
            raise BudgetReached(what)

    def fits(self, seconds: float, what: str) -> None:
        """BudgetReached where ``what``, estimated at ``seconds``, would end past the deadline (a gate check,
        a test-backend-ops run: units that are not rounds, stored as each ends)."""
        if time.monotonic() + seconds > self.deadline:
            raise BudgetReached(what)

    def prior(self, plan: Any, depths: Sequence[int], calls: Sequence[str]) -> list[dict[str, Any]]:
        """The estimate as a round record, as :func:`tuner.rounds.joint.run_joint_rounds` reads ``prior``."""
        return [{"seconds": self.round_s(plan, depths), "depths": list(depths), "order": list(calls)}]


@dataclasses.dataclass
class SweepBudget:
    """A kernel sweep's, per round of a chunk (its configs' timer processes, run back to back: a round is
    paired, so it is started whole or not at all). A round starts only where its estimate (the sweep's recorded
    H100 rates), times the most any finished round of this call overran its own, ends by the deadline: a
    slower machine or a longer case than recorded stops the call earlier, never later."""

    deadline: float
    slower: float = 1.0

    @classmethod
    def from_now(cls, seconds: float) -> SweepBudget:
        return cls(deadline=time.monotonic() + seconds)

    def start(self, estimate_s: float, what: str) -> float:
        """The start time of a round estimated at ``estimate_s``; BudgetReached where it would end too late."""
        now = time.monotonic()
        if now + estimate_s * self.slower > self.deadline:
            raise BudgetReached(what)
        return now

    def done(self, estimate_s: float, started: float) -> None:
        """Record how long a round took against its estimate."""
        if estimate_s > 0:
            self.slower = max(self.slower, (time.monotonic() - started) / estimate_s)
