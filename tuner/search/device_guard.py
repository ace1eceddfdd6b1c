"""A measure with something done around each of its calls (:class:`Observed`): counting it in the study
(config.toml's ``[cost]``, written by :func:`tuner.study.record.SearchOutcome.cost`), checking its device. One study, one device: a study's rounds are only comparable when measured on the
same GPU (or CPU) model, so a study resumed on another machine stops at the first call that reports another
device, before it is stored."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from tuner.errors import UsageError
from tuner.plan.variant import Build
from tuner.rounds.joint import Candidate, JointMeasure, Measure, Point
from tuner.study.state import StudyState

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


def counted(st: StudyState, factory: Callable[[Build], Measure]) -> Callable[[Build], Measure]:
    """``factory`` whose measures count each ``measure`` or ``joint`` call in the study (``[cost]
    llama_bench_calls``)."""

    def make(build: Build) -> Observed:
        return Observed(factory(build), before=lambda: st.add_llama_bench_calls(1))

    return make


class OtherDevice(UsageError):
    """A measurement came from another device than the study's: not a failed trial, the process must stop."""


def check_device(st: StudyState, measure: Measure) -> None:
    """Record the device ``measure`` reported in a study that has none; OtherDevice when it recorded another."""
    device = (getattr(measure, "info", None) or {}).get("device")
    if not device:
        return
    recorded = st.device
    if recorded is None:
        st.set_device(device)
    elif recorded != device:
        raise OtherDevice(
            f"This study was measured on {recorded}, but this machine measures on {device}. A study's rounds "
            "are compared with each other, so all of them must come from one device model; what this machine "
            "just measured was not stored. Resume the study on a machine with the same device, or start a new "
            "study here (--study NAME, or another --run-dir); the stored rounds stay in the old one."
        )


def device_checked(st: StudyState, factory: Callable[[Build], Measure]) -> Callable[[Build], Measure]:
    """``factory`` whose measures call :func:`check_device` after every call (``joint`` too)."""

    def make(build: Build) -> Observed:
        return Observed(factory(build), after=lambda m: check_device(st, m))

    return make
