"""The search's decision rule (tuner/measure/decide.py) on synthetic rounds of known truth."""

from __future__ import annotations

import math

import numpy as np

from tuner.measure.decide import MIN_EFFECT_PCT, PHASE_ALPHA, CellTest, decide, holm, look_weight, phase_tests

NAMES = ("upstream", "twin", "A", "B")


def _rounds(rng: np.random.Generator, n: int, effects: dict[str, float], sd: float = 0.015) -> dict[str, list[float]]:
    """t/s of upstream, its twin and candidates over ``n`` rounds: a drift per round, the effect, noise."""
    drift = rng.normal(0.0, 0.05, n)
    return {k: list(100.0 * np.exp(drift + math.log1p(effects.get(k, 0.0)) + rng.normal(0.0, sd, n))) for k in NAMES}


def test_the_statistic_is_the_log_ratio_to_the_twin_and_drift_cancels() -> None:
    vals = {"upstream": [100.0, 200.0, 50.0], "twin": [101.0, 198.0, 50.5], "A": [105.0, 212.0, 52.0]}
    t = phase_tests({0: (vals, "upstream", "twin", ["A"])})[0]["A"]
    want = [math.log(a / u) - math.log(w / u) for a, u, w in zip(vals["A"], vals["upstream"], vals["twin"])]
    assert t.n == 3 and math.isclose(t.mean, sum(want) / 3)
    assert t.df == 2 * 2  # (R-1)(C-1) with three configurations
    # a round-level factor (drift) leaves the statistic as it is
    scaled = {k: [v * f for v, f in zip(vs, (1.0, 3.0, 0.2))] for k, vs in vals.items()}
    t2 = phase_tests({0: (scaled, "upstream", "twin", ["A"])})[0]["A"]
    assert math.isclose(t.mean, t2.mean) and math.isclose(t.se, t2.se)


def test_incomplete_rounds_are_left_out_and_too_few_rounds_decide_nothing() -> None:
    vals: dict[str, list[float | None]] = {
        "upstream": [100.0, None, 99.0],
        "twin": [100.0, 100.0, 98.0],
        "A": [110.0, 111.0, 109.0],
    }
    t = phase_tests({0: (vals, "upstream", "twin", ["A"])})[0]["A"]
    assert t.n == 2
    one = phase_tests({0: ({"upstream": [100.0], "twin": [100.0], "A": [150.0]}, "upstream", "twin", ["A"])})[0]["A"]
    assert one.p_two == 1.0 and decide({"x": one})["x"].verdict == "no difference"


def test_holm_steps_down() -> None:
    # thresholds alpha/3, alpha/2, alpha: the step stops at the first p above its threshold
    assert holm({"a": 0.001, "b": 0.02, "c": 0.06}, 0.05) == {"a", "b"}
    assert holm({"a": 0.001, "b": 0.03, "c": 0.04}, 0.05) == {"a"}  # c would pass alone, b stops the step
    assert holm({"a": 0.03, "b": 0.04}, 0.05) == set()  # 0.03 > 0.05/2


def test_a_clear_effect_is_faster_a_small_one_is_not_claimed_and_a_slowdown_is_slower() -> None:
    rng = np.random.default_rng(1)
    vals = _rounds(rng, 6, {"A": 0.08, "B": -0.08}, sd=0.005)
    tests = phase_tests({0: (vals, "upstream", "twin", ["A", "B"])})[0]
    calls = decide(tests)
    assert calls["A"].verdict == "faster" and calls["A"].settled
    assert calls["B"].verdict == "slower"
    # a real but tiny effect, measured very precisely, is below the practical minimum: never claimed
    tiny = phase_tests({0: (_rounds(rng, 6, {"A": MIN_EFFECT_PCT / 200.0}, sd=0.0005), "upstream", "twin", ["A"])})[0]
    assert decide(tiny)["A"].verdict == "no difference" and decide(tiny)["A"].settled


def test_look_shares_sum_to_one_and_the_last_look_gets_most() -> None:
    for limits in ((3, 6), (3, 12), (2, 3), (4, 4)):
        shares = [look_weight(n, limits) for n in range(1, limits[1] + 3)]
        assert math.isclose(sum(shares), 1.0)
        assert look_weight(limits[1], limits) == max(shares)
    assert look_weight(2, (3, 6)) == 0.0 and look_weight(7, (3, 6)) == 0.0


def test_more_looks_and_more_cells_need_more_evidence() -> None:
    t = CellTest(n=4, mean=0.04, se=0.012, df=9)
    assert decide({"x": t}, limits=(4, 4))["x"].verdict == "faster"
    assert decide({"x": t}, limits=(3, 40))["x"].verdict == "no difference"  # an early look of many
    crowd = {i: CellTest(n=4, mean=0.0, se=0.012, df=9) for i in range(40)} | {"x": t}
    assert decide(crowd, limits=(4, 4))["x"].p_adjusted == decide({"x": t}, limits=(4, 4))["x"].p_adjusted
    assert decide(crowd, limits=(4, 4))["x"].verdict == "no difference"


def test_family_wise_false_claims_stay_under_alpha_with_sequential_looks() -> None:
    """Pure A/A data (no effect anywhere), 8 cells, rounds added to open cells from 3 to 6: the share of
    families with any claim stays within alpha (plus the binomial error of the trials)."""
    rng = np.random.default_rng(7)
    trials, bad = 600, 0
    for _ in range(trials):
        data = {d: _rounds(rng, 6, {}) for d in range(4)}
        claimed = False
        for n in range(3, 7):
            tests = phase_tests(
                {d: ({k: v[:n] for k, v in data[d].items()}, "upstream", "twin", ["A", "B"]) for d in data}
            )
            calls = decide({(d, c): t for d, ts in tests.items() for c, t in ts.items()}, limits=(3, 6))
            claimed = claimed or any(c.verdict != "no difference" for c in calls.values())
        bad += claimed
    assert bad / trials <= PHASE_ALPHA + 3 * math.sqrt(PHASE_ALPHA * (1 - PHASE_ALPHA) / trials)


def test_power_rises_with_the_effect() -> None:
    rng = np.random.default_rng(3)
    share = []
    for eff in (0.0, 0.03, 0.06):
        hits = 0
        for _ in range(200):
            tests = phase_tests(
                {d: (_rounds(rng, 6, {"A": eff if d == 0 else 0.0}), "upstream", "twin", ["A", "B"]) for d in range(4)}
            )
            calls = decide({(d, c): t for d, ts in tests.items() for c, t in ts.items()})
            hits += calls[(0, "A")].verdict == "faster"
        share.append(hits / 200)
    assert share[0] < share[1] < share[2]
