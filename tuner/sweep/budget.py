"""A confirmation's time budget (``tuner sweep confirm --time-budget``): no model is made and no round of
paired llama-bench calls starts that would end past the deadline, so a call that a machine's time limit ends
stops between rounds instead of losing the round in flight. What was measured is stored; the same command
resumes."""

from __future__ import annotations

__all__ = ["RoundBudget"]

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from tuner.search.screen import BudgetReached


def _unknown(plan: Any, depths: Sequence[int]) -> float:
    return 0.0


@dataclasses.dataclass(frozen=True)
class RoundBudget:
    """``deadline``: ``time.monotonic()`` seconds. ``round_s(plan, depths)``: a model's first round estimated
    (seconds), which decides whether it starts; later rounds are judged by the model's longest so far
    (:func:`tuner.search.screen.run_joint_rounds`)."""

    deadline: float
    round_s: Callable[[Any, Sequence[int]], float] = _unknown

    @classmethod
    def from_now(cls, seconds: float, round_s: Callable[[Any, Sequence[int]], float] = _unknown) -> RoundBudget:
        return cls(deadline=time.monotonic() + seconds, round_s=round_s)

    def check(self, what: str) -> None:
        """BudgetReached where the deadline has passed: ``what`` is what would have started."""
        if time.monotonic() >= self.deadline:
            raise BudgetReached(what)

    def prior(self, plan: Any, depths: Sequence[int], calls: Sequence[str]) -> list[dict[str, Any]]:
        """The estimate as a round record, as :func:`tuner.search.screen.run_joint_rounds` reads ``prior``."""
        return [{"seconds": self.round_s(plan, depths), "depths": list(depths), "order": list(calls)}]
