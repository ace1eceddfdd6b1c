"""The time budget (``--time-budget``): nothing starts that would end past its deadline, so a call that a
machine's time limit ends stops between units of work (a build, a model, a gate, a round, a trial, a check)
instead of losing the one in flight; the same command resumes. A budget stop is :class:`BudgetReached`, exit
status 3 (:data:`tuner.errors.EXIT_TIME_BUDGET`). The recorded per-step costs that the search's and the sweeps'
budgets price their work with: :func:`load_step_costs`."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from tuner._compat import tomllib
from tuner.errors import EXIT_TIME_BUDGET, TunerError
from tuner.paths import package_data


class BudgetReached(TunerError):
    """The time budget ended a command before what its message names; rerunning the same command resumes it."""

    exit_code = EXIT_TIME_BUDGET


@dataclasses.dataclass(frozen=True)
class Budget:
    """A command's time budget: ``deadline`` in ``time.monotonic()`` seconds (None: no budget, nothing stops)."""

    deadline: float | None = None

    @classmethod
    def counted_from(cls, started: float | None, seconds: float | None) -> Budget:
        """The budget of ``seconds`` from ``started`` (the command's start: its build and model count too; None:
        now); no budget without ``seconds``."""
        return cls((time.monotonic() if started is None else started) + seconds if seconds else None)

    def remaining(self) -> float:
        """Seconds left (infinite without a budget)."""
        return math.inf if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def check(self, what: str) -> None:
        """BudgetReached where the deadline has passed: ``what`` is what would have started."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise BudgetReached(what)

    def fits(self, seconds: float, what: str, *, worded: bool = False) -> None:
        """BudgetReached where ``what``, priced at ``seconds``, would end past the deadline; the message says the
        price and what is left (``worded``: ``what`` alone)."""
        if self.deadline is not None and time.monotonic() + seconds > self.deadline:
            raise BudgetReached(what if worded else f"{what} (about {seconds:.0f} s, {self.remaining():.0f} s left)")


UNBOUNDED = Budget()
"""No budget: nothing stops (the round loops' default)."""


def load_step_costs() -> dict[str, Any]:
    """``tuner/data/step_costs.toml``: recorded per-step costs (machine, figures and their sources)."""
    with open(package_data("step_costs.toml"), "rb") as f:
        return tomllib.load(f)
