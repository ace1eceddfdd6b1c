"""The one keep-or-not rule after a confirmation, the search's and the sweep's: a change is kept where some
point it acts on is faster beyond the A/A noise and none is slower, CPU-rejected or too noisy to judge."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Generic, Literal, TypeVar

from tuner.measure.paired import CPU_REJECTED, TOO_NOISY

Reason = Literal["none", "gate", "slower", "cpu", "noisy", "faster", "no gain"]
P = TypeVar("P", bound=Mapping[str, object])
_AGAINST: tuple[tuple[Reason, str], ...] = (("slower", "slower"), ("cpu", CPU_REJECTED), ("noisy", TOO_NOISY))


@dataclasses.dataclass(frozen=True)
class Fate(Generic[P]):
    """Kept or not, the ``reason`` and the points it names."""

    kept: bool
    reason: Reason
    points: tuple[P, ...] = ()


def keep(points: Sequence[P], *, gate_failed: bool = False, kernel: str | None = None) -> Fate[P]:
    """The fate of a change over the confirmed ``points`` it acts on (each with its ``verdict``), in this order:
    no point; its output-equivalence gate failed; any point slower, CPU-rejected or too noisy; some point faster
    (with ``kernel``, only one whose ``kernel`` is it: the log shows the change's kernel ran there); else no gain.
    """
    if not points:
        return Fate(False, "none")
    if gate_failed:
        return Fate(False, "gate")
    for reason, v in _AGAINST:
        bad = tuple(p for p in points if p["verdict"] == v)
        if bad:
            return Fate(False, reason, bad)
    faster = tuple(p for p in points if p["verdict"] == "faster" and (kernel is None or p.get("kernel") == kernel))
    return Fate(True, "faster", faster) if faster else Fate(False, "no gain", tuple(points))
