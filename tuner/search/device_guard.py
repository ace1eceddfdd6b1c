"""One study, one device: a study's rounds are only comparable when measured on the same GPU (or CPU) model, so
a study resumed on another machine stops at the first call that reports another device, before it is stored."""

from __future__ import annotations

from collections.abc import Callable

from tuner.errors import UsageError
from tuner.plan.variant import Build
from tuner.rounds.joint import Measure
from tuner.search.observed import Observed
from tuner.study.state import StudyState


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
