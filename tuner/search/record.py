"""How a study records its measurements in Optuna storage, and how they are read back.

Each trial's user attrs hold its samples per point (``point_key``: ``pp@4096``); the study's user attrs
hold the baseline anchors re-measured during the search. The readers here pool them into the
measurements :func:`tuner.search.select.select_winners` compares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.measure.interleave import drift_pct, pool
from tuner.measure.stats import median
from tuner.search.select import Measurement
from tuner.study import legacy
from tuner.study.legacy import BASELINE_PARAMS_ATTR

if TYPE_CHECKING:
    import optuna


def point_key(phase: str, depth: int) -> str:
    return f"{phase}@{depth}"


def parse_point_key(key: str) -> tuple[str, int]:
    phase, depth = key.split("@")
    return phase, int(depth)


def study_results(study: optuna.Study) -> tuple[dict[str, dict[tuple[str, int], Measurement]], str]:
    """Measurements per config id for :func:`tuner.search.select.select_winners`, plus the baseline id: the
    baseline's samples are the pooled anchors; each COMPLETE or pruned trial is a config ``"trial<N>"``."""
    import optuna  # lazy: `import tuner.search` (which reads point keys) does not load Optuna

    results: dict[str, dict[tuple[str, int], Measurement]] = {}
    repeats = baseline_repeats(study)
    results["baseline"] = {
        parse_point_key(k): Measurement(samples=tuple(pool(v))) for k, v in _anchor_samples(study, repeats).items()
    }
    skip = {t.number for t in repeats}
    for t in study.get_trials(deepcopy=False):
        if t.state not in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
            continue
        if t.number in skip or legacy.trial_has(t, "cached_from"):
            continue
        if legacy.trial_attr(t, "gate", {}).get("status") == "fail":
            continue
        sam = legacy.trial_attr(t, "samples") or {}
        if sam:
            results[f"trial{t.number}"] = {
                parse_point_key(k): Measurement(samples=tuple(v)) for k, v in sam.items() if v
            }
    return results, "baseline"


def baseline_repeats(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Finished trials that measured the upstream default itself: more anchors, pooled into the baseline."""
    import optuna  # lazy, as above

    trials = study.get_trials(deepcopy=False)
    base = next((t for t in trials if legacy.trial_attr(t, BASELINE_PARAMS_ATTR)), None)
    if base is None or not legacy.trial_has(base, "values"):
        return []
    ref = legacy.trial_attr(base, "values")
    return [
        t
        for t in trials
        if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        and legacy.trial_attr(t, "values") == ref
        and not legacy.trial_has(t, "cached_from")
    ]


def _anchor_samples(study: optuna.Study, repeats: list[optuna.trial.FrozenTrial]) -> dict[str, list[Sequence[float]]]:
    out: dict[str, list[Sequence[float]]] = {}
    anchors = [a["samples"] for a in legacy.study_attr(study, "anchors", [])]
    for samples in anchors + [legacy.trial_attr(t, "samples") or {} for t in repeats]:
        for k, v in samples.items():
            out.setdefault(k, []).append(v)
    return out


def anchor_drift(study: optuna.Study) -> dict[tuple[str, int], float]:
    """Per point, the spread of the baseline anchors' medians in percent (the run-to-run noise)."""
    out = {}
    for k, anchors in _anchor_samples(study, baseline_repeats(study)).items():
        d = drift_pct([median(v) for v in anchors if v])
        if math.isfinite(d):
            out[parse_point_key(k)] = d
    return out
