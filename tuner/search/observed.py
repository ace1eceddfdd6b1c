"""A measure with something done around each of its calls (counting it, checking its device)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from tuner.rounds.joint import Candidate, JointMeasure, Measure, Point

T = TypeVar("T")


class Observed:
    """The measure ``m`` with ``before()`` run ahead of each call and ``after(m)`` once it returned (``joint``
    too, only when ``m`` has one); its attributes (info, calls...) are copied from ``m``."""

    joint: JointMeasure

    def __init__(
        self, m: Measure, before: Callable[[], None] | None = None, after: Callable[[Measure], None] | None = None
    ) -> None:
        self.__dict__.update(getattr(m, "__dict__", {}))
        self._m, self._before, self._after = m, before, after
        if (joint := getattr(m, "joint", None)) is not None:
            self._m_joint: JointMeasure = joint
            self.joint = self._joint

    def __call__(self, cand: Candidate, phase: str, depths: Sequence[int], label: str, /) -> Mapping[int, Point]:
        return self._around(lambda: self._m(cand, phase, depths, label))

    def _joint(
        self, cand: Candidate, phases: Sequence[str], depths: Sequence[int], label: str, /
    ) -> Mapping[str, Mapping[int, Point]]:
        return self._around(lambda: self._m_joint(cand, phases, depths, label))

    def _around(self, call: Callable[[], T]) -> T:
        if self._before is not None:
            self._before()
        out = call()
        if self._after is not None:
            self._after(self._m)
        return out
