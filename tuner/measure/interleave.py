"""Interleaved anchors: candidates measured between baseline runs (A B A C A ... A).

:func:`run_interleaved` reports anchor drift per (test, depth) and, when drift exceeds the noise,
rescales candidates by the local anchor ratio (the anchor rule of llama.cpp's Metal tuner, ``tools/tuning``). Each bench
run is :func:`tuner.measure.bench.run_bench`; the frames returned have its schema.

The anchors of a baseline are pooled into one baseline (:func:`pool`), and how far its repeats drift apart is
:func:`drift_pct`: ``(max - min) / min`` of the anchors' medians, in percent: the largest speedup the baseline
showed over itself, so it reads in the unit of a candidate's speedup over the baseline (the noise floor such a
speedup has to clear). Dividing by the median instead would understate it (two anchors 10% apart: 9.5%).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner import log
from tuner.errors import UsageError
from tuner.measure.bench import COLUMNS, run_bench
from tuner.measure.stats import summarize_samples as _summarize

if TYPE_CHECKING:
    import pandas as pd


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchTarget:
    """One thing to benchmark: a build's bin dir plus runtime settings."""

    label: str
    bin_dir: Path
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra_args: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterleavedResult:
    """Outcome of :func:`run_interleaved`."""

    frames: dict[str, pd.DataFrame]
    """label -> DataFrame: candidates (drift-corrected where flagged) and the baseline (pooled anchors)."""
    anchors: pd.DataFrame
    """Every anchor measurement: bench rows plus ``anchor_index``."""
    drift: pd.DataFrame
    """Per (test, depth): ``drift_pct``, ``noise_pct``, ``flagged``, ``reference_ts``."""


def _anchor_median(df: pd.DataFrame, test: str, depth: int) -> float:
    r = df[(df["test"] == test) & (df["depth"] == depth)]
    return float(r["median_ts"].iloc[0]) if len(r) else math.nan


def _row_dict(row: pd.Series) -> dict[str, Any]:
    return {str(k): v for k, v in row.items()}


def _restated(row: dict[str, Any], samples: Sequence[float], *, confidence: float, seed: int) -> dict[str, Any]:
    """``row`` with the statistics of ``samples`` and its roofline percentage recomputed from them."""
    row.update(_summarize(samples, confidence=confidence, seed=seed))
    if math.isfinite(row.get("roofline_tps", math.nan)) and row["roofline_tps"]:
        row["roofline_pct"] = 100.0 * row["median_ts"] / row["roofline_tps"]
    return row


def _anchor_rows(
    anchor_df: pd.DataFrame, drift_factor: float, *, confidence: float, seed: int
) -> tuple[dict[tuple[str, int], dict[str, Any]], list[dict[str, Any]]]:
    """Per (test, depth) of the anchors: the drift row (reference: median of anchor medians, drift %
    (:func:`drift_pct`), noise % and whether flagged) and the baseline's row (every
    anchor's samples pooled, each rescaled to the reference when flagged)."""
    drift_rows, base_rows = {}, []
    for (test, _depth), grp in anchor_df.groupby(["test", "depth"], sort=False):
        meds = grp["median_ts"].to_numpy(dtype=float)
        ok = meds[np.isfinite(meds)]
        ref = float(np.median(ok)) if ok.size else math.nan
        drift = drift_pct(ok)
        noise = float(np.nanmax(grp["ci_pct"].to_numpy(dtype=float))) if ok.size else math.nan
        flagged = bool(math.isfinite(drift) and math.isfinite(noise) and drift > drift_factor * noise)
        depth = int(grp["depth"].iloc[0])  # the group's key; pandas types keys as Hashable
        drift_rows[(str(test), depth)] = {
            "test": test,
            "phase": grp["phase"].iloc[0],
            "depth": depth,
            "n_anchors": int(ok.size),
            "reference_ts": ref,
            "drift_pct": drift,
            "noise_pct": noise,
            "flagged": flagged,
        }
        pooled = pool(
            grp["samples"], [ref / a["median_ts"] if flagged and a["n"] > 0 else 1.0 for _, a in grp.iterrows()]
        )
        first = _restated(_row_dict(grp.iloc[-1]), pooled, confidence=confidence, seed=seed)
        first.update(
            n_batches=int(grp["n_batches"].sum()),
            warmup_discarded=int(grp["warmup_discarded"].sum()),
            drift_corrected=flagged,
            anchor_ratio=math.nan,
            status="ok" if pooled else "failed",
        )
        base_rows.append(first)
    return drift_rows, base_rows


def run_interleaved(
    candidates: Sequence[BenchTarget],
    baseline: BenchTarget,
    model: Path,
    *,
    log_dir: Path,
    drift_factor: float = 2.0,
    **bench_kwargs: Any,
) -> InterleavedResult:
    """Measure candidates between baseline anchors: A B A C A ... A (``bench_kwargs`` go to :func:`run_bench`).

    Drift of a (test, depth) is ``(max - min) / min`` of the anchor medians
    (:func:`drift_pct`); the reference is the median of anchor medians; noise is the
    largest anchor CI half-width (%). When drift exceeds ``drift_factor`` times the noise (the anchors' CIs
    cannot all overlap), each candidate's samples are multiplied by ``reference / local``, local being the
    geometric mean of the two anchors around it, and the pooled baseline's anchors are rescaled alike.
    """
    import pandas as pd

    if not candidates:
        raise UsageError("run_interleaved needs at least one candidate besides the baseline.")
    labels = [c.label for c in candidates]
    if baseline.label in labels or len(set(labels)) != len(labels):
        raise UsageError(f"Labels must be distinct (baseline {baseline.label!r}, candidates {labels}).")
    confidence = bench_kwargs.get("confidence", 0.95)
    seed = bench_kwargs.get("seed", 0)

    def bench(t: BenchTarget) -> pd.DataFrame:
        return run_bench(
            t.bin_dir, model, env=t.env, extra_args=t.extra_args, log_dir=log_dir, label=t.label, **bench_kwargs
        )

    anchors = [bench(baseline)]
    cands = []
    for c in candidates:
        cands.append(bench(c))
        anchors.append(bench(baseline))
    anchor_df = pd.concat([a.assign(anchor_index=i) for i, a in enumerate(anchors)], ignore_index=True)

    drift_rows, base_rows = _anchor_rows(anchor_df, drift_factor, confidence=confidence, seed=seed)
    drift_df = pd.DataFrame(list(drift_rows.values()))
    for r in drift_rows.values():
        if r["flagged"]:
            log.warning(
                f"anchor drift {r['drift_pct']:.1f}% > {drift_factor:g}x noise "
                f"{r['noise_pct']:.1f}% at {r['test']} @ d{r['depth']}: correcting by anchor ratio"
            )

    frames: dict[str, pd.DataFrame] = {}
    for i, (c, df) in enumerate(zip(candidates, cands)):
        # rescaled by reference / local anchor (the geometric mean of the two anchors around it) where its (test,
        # depth) is flagged; anchor_ratio is recorded either way
        rows = []
        for _, row in df.iterrows():
            t, d = row["test"], row["depth"]
            dr = drift_rows.get((t, d))
            local = math.sqrt(_anchor_median(anchors[i], t, d) * _anchor_median(anchors[i + 1], t, d))
            factor = dr["reference_ts"] / local if dr and local > 0 else math.nan
            if dr and dr["flagged"] and math.isfinite(factor) and row["n"] > 0:
                scaled = _restated(
                    _row_dict(row), [s * factor for s in row["samples"]], confidence=confidence, seed=seed
                )
                rows.append(scaled | {"anchor_ratio": factor, "drift_corrected": True})
            else:
                rows.append(_row_dict(row) | {"anchor_ratio": factor})
        frames[c.label] = pd.DataFrame(rows, columns=list(COLUMNS))
    frames[baseline.label] = pd.DataFrame(base_rows, columns=list(COLUMNS))
    return InterleavedResult(frames=frames, anchors=anchor_df, drift=drift_df)
