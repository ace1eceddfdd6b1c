"""The per-round progress line of the paired rounds: what it says before a CI exists and when the rounds are
counted rather than sized to a CI (a fixed-round confirm printed "over ±100% (target ±0%)")."""

from __future__ import annotations

import math

from tuner.rounds.joint import ci_note


def test_one_round_has_no_ci_yet() -> None:
    assert ci_note(1, math.inf, 3, 6, 3.0) == "widest 95% CI after round 2 (target ±3%)"


def test_a_ci_target_is_named() -> None:
    assert ci_note(3, 2.46, 3, 6, 3.0) == "widest 95% CI ±2.5% (target ±3%)"
    assert ci_note(3, 140.0, 3, 6, 3.0) == "widest 95% CI over ±100% (target ±3%)"


def test_counted_rounds_name_no_target() -> None:
    fixed = ci_note(2, 4.0, 3, 3, 0.0)
    assert fixed == "widest 95% CI ±4.0% (a fixed number of rounds)"
    assert "±0%" not in ci_note(1, math.inf, 3, 5, 0.0)
    assert ci_note(4, 1.0, 3, 5, 0.0).endswith("(3 rounds, more only where the verdict is open)")
