"""Baseline anchors: the baseline measured again between candidates, pooled into one baseline, and how
far its repeats drift apart. One pooling and one drift formula for both places that use anchors:
``tuner bench`` with several builds (:mod:`tuner.measure.interleave`) and the studies of the earlier
one-TPE search (:mod:`tuner.search.record`).

Drift is ``(max - min) / min`` of the anchors' medians, in percent: the largest speedup the baseline
showed over itself, so it reads in the unit of a candidate's speedup over the baseline (the noise floor
such a speedup has to clear; :func:`tuner.search.select.select_winners`). Dividing by the median
instead would understate it (two anchors 10% apart: 9.5%).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def pool(anchors: Iterable[Sequence[float]], factors: Iterable[float] | None = None) -> list[float]:
    """The baseline's samples: every anchor's samples in measurement order, each anchor's multiplied by
    its factor (a rescale to the reference where drift was corrected; None: as measured)."""
    anchors = list(anchors)
    scale = [1.0] * len(anchors) if factors is None else list(factors)
    if len(scale) != len(anchors):
        raise ValueError(f"{len(scale)} factors for {len(anchors)} anchors")
    return [x * f if f != 1.0 else x for a, f in zip(anchors, scale) for x in a]


def drift_pct(medians: Iterable[float]) -> float:
    """``100 * (max - min) / min`` of the finite anchor medians; NaN with fewer than two or a minimum <= 0."""
    ok = [m for m in medians if math.isfinite(m)]
    return 100.0 * (max(ok) - min(ok)) / min(ok) if len(ok) >= 2 and min(ok) > 0 else math.nan
