"""The one keep-or-not rule after a confirmation (tuner.rounds.keep), which the search and the sweep share."""

from __future__ import annotations

from tuner.measure.paired import CPU_REJECTED, TOO_NOISY
from tuner.rounds.keep import keep


def _pts(*verdicts: str, kernel: str = "MMA") -> list[dict[str, object]]:
    return [{"depth": 1024 * i, "verdict": v, "kernel": kernel} for i, v in enumerate(verdicts)]


def test_kept_only_where_faster_somewhere_and_nothing_against_it() -> None:
    f = keep(_pts("faster", "no difference"))
    assert f.kept and f.reason == "faster" and [p["depth"] for p in f.points] == [0]
    assert keep([]).reason == "none" and not keep([]).kept
    assert keep(_pts("faster"), gate_failed=True).reason == "gate"
    f = keep(_pts("no difference", "fell back"))
    assert not f.kept and f.reason == "no gain" and len(f.points) == 2


def test_slower_cpu_rejected_or_too_noisy_anywhere_is_not_kept_in_that_order() -> None:
    assert keep(_pts("faster", TOO_NOISY, CPU_REJECTED, "slower")).reason == "slower"
    assert keep(_pts("faster", TOO_NOISY, CPU_REJECTED)).reason == "cpu"
    f = keep(_pts("faster", TOO_NOISY))  # the sweep kept this before the rule was one: no claim stands there
    assert not f.kept and f.reason == "noisy" and [p["depth"] for p in f.points] == [1024]


def test_a_kernel_counts_a_faster_point_only_where_it_ran() -> None:
    assert not keep(_pts("faster", kernel="TILE"), kernel="MMA").kept
    assert keep(_pts("faster", kernel="TILE")).kept  # no kernel given (the search): the verdict alone
