"""One pooling, one drift formula and one median for the baseline anchors of `tuner bench`."""

from __future__ import annotations

import math
import statistics

import pandas as pd
import pytest

from tuner.measure.interleave import _anchor_rows, drift_pct, pool
from tuner.measure.stats import median

ANCHORS = [[100.0, 101.0, 99.0], [108.0, 110.0, 109.0], [104.0, 103.0, 105.0]]  # medians 100, 109, 104


def test_drift_is_the_largest_speedup_of_the_baseline_over_itself() -> None:
    assert drift_pct([100.0, 109.0, 104.0]) == pytest.approx(9.0)  # 109 / 100 - 1, not / the median 104
    assert math.isnan(drift_pct([100.0])) and math.isnan(drift_pct([0.0, 5.0])) and math.isnan(drift_pct([]))
    assert drift_pct([100.0, math.nan, 110.0]) == pytest.approx(10.0)


def test_pool_keeps_order_and_scales_per_anchor() -> None:
    assert pool([[1.0, 2.0], [3.0]]) == [1.0, 2.0, 3.0]
    assert pool([[1.0, 2.0], [3.0]], [2.0, 0.5]) == [2.0, 4.0, 1.5]
    with pytest.raises(ValueError):
        pool([[1.0]], [1.0, 2.0])


def test_the_anchor_rows_use_the_one_drift_and_pooling() -> None:
    """A bench frame's anchors give drift_pct of their medians and, unflagged, pool() of their samples."""
    frame = pd.DataFrame(
        [
            {
                "test": "tg8",
                "phase": "tg",
                "depth": 0,
                "median_ts": statistics.median(a),
                "ci_pct": 0.5,
                "n": len(a),
                "samples": a,
                "n_batches": 1,
                "warmup_discarded": 1,
            }
            for a in ANCHORS
        ]
    )
    rows = list(_anchor_rows(frame, drift_factor=2.0, confidence=0.95, seed=0)[0].values())
    assert rows[0]["drift_pct"] == pytest.approx(drift_pct([statistics.median(a) for a in ANCHORS]))
    assert rows[0]["drift_pct"] == pytest.approx(9.0) and rows[0]["reference_ts"] == 104.0
    # a drift factor the 9% drift stays under: the baseline's anchors pooled as measured
    unflagged, (pooled,) = _anchor_rows(frame, drift_factor=100.0, confidence=0.95, seed=0)
    assert not unflagged["tg8", 0]["flagged"]
    assert pooled["samples"] == pool(ANCHORS) == pytest.approx([x for a in ANCHORS for x in a]) and pooled["n"] == 9


@pytest.mark.parametrize("xs", [[3.0, 1.0, 2.0], [4.0, 1.0, 3.0, 2.0], [5.0]])
def test_one_median(xs: list[float]) -> None:
    assert median(xs) == statistics.median(xs)
    assert median([*xs, None, math.nan, math.inf]) == statistics.median(xs)  # unmeasured values left out
    assert median(xs, upper=True) == sorted(xs)[len(xs) // 2]  # a measured value, for a report row
    assert math.isnan(median([])) and math.isnan(median([None, math.nan]))
