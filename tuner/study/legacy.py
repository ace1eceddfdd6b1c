"""Studies made by the one-TPE search that came before the pipeline (``tests/data/studies/sm90-study.db.xz``
and its kind): ``tuner export`` still reads them back, no code writes them any more. Their attributes beyond the header
(:class:`tuner.study.record.StudyHeader`), by name, in one place."""

from __future__ import annotations

from typing import Any

from tuner.study.state import UserAttrs

BASELINE_PARAMS_ATTR = "tuner_baseline"
"""Marks the enqueued trial that measured upstream's defaults."""

STUDY_KEYS = (
    "anchors",  # the baseline re-measured during the search: [{"samples": {point: [t/s...]}}...]
    "like",  # the model shape named for the roofline
    "weight_type",  # its weight type
)
TRIAL_KEYS = (
    BASELINE_PARAMS_ATTR,
    "values",  # every knob's value
    "samples",  # {point: [t/s...]}
    "cached_from",  # a trial that reused another's measurement (not a candidate of its own)
    "build_id",
    "gate",  # test-backend-ops of its build
    "toolchain",
    "device",
    "status",
    "ratios",  # per-point ratios (the Wilcoxon pruner stops on them)
    "reason",  # why it failed
)


def _known(key: str, keys: tuple[str, ...], what: str) -> str:
    if key not in keys:
        raise KeyError(f"{key!r} is not an attribute of a one-TPE {what} ({keys})")
    return key


def study_attr(study: UserAttrs, key: str, default: object = None) -> Any:
    key = _known(key, STUDY_KEYS, "study")
    return study.user_attrs.get(key, default)


def trial_attr(trial: object, key: str, default: object = None) -> Any:
    return (getattr(trial, "user_attrs", None) or {}).get(_known(key, TRIAL_KEYS, "trial"), default)


def trial_has(trial: object, key: str) -> bool:
    """Whether the trial holds ``key`` at all (even as null)."""
    return _known(key, TRIAL_KEYS, "trial") in (getattr(trial, "user_attrs", None) or {})
