"""Statistics for benchmark samples: bootstrap CIs of the median and A/B verdicts.

Throughput samples (tokens/s per llama-bench repetition) are few, skewed and sometimes bimodal
(the first prompt repetition is often much slower than the rest), so everything here is rank- or
resampling-based: the median with a seeded percentile-bootstrap CI, the ratio of medians with a
bootstrap CI, and a two-sided Mann-Whitney U test. A verdict needs both: the CI of the change must
exclude zero *and* the rank test must reject at the same level. With 3 samples per side the exact
U test cannot reach p < 0.05, which is the point: three reps do not decide a 5% question.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

from tuner._compat import tomllib
from tuner.errors import UsageError
from tuner.paths import package_data

N_BOOT = 4000
"""Bootstrap resamples; 4000 keeps the 2.5%/97.5% percentiles stable to ~1% of the CI width."""

BOOT_CHUNK = 1 << 22
"""Most resampled values held at once (32 MiB of indices): the resamples are drawn in chunks of rows, so
memory does not grow with ``n_boot * n`` (4000 resamples of a million samples would be 30 GiB)."""

MAX_BOOT_SAMPLES = 1_000_000
"""Most samples one side may have: beyond it a bootstrap takes minutes and no benchmark has that many
repetitions (tuner.measure.frames refuses files above its own, lower MAX_SAMPLES first)."""


def median(xs: Iterable[float | None], *, upper: bool = False) -> float:
    """The median of the finite values of ``xs`` (None and NaN left out), NaN when there are none.

    ``upper``: of an even count, the upper of the two middle values rather than their mean, so the
    median is a value that was measured (a report row showing one round's value)."""
    vals = sorted(x for x in xs if x is not None and math.isfinite(x))
    n = len(vals)
    if not n:
        return math.nan
    return vals[n // 2] if upper or n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2


def _clean(samples: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(list(samples) if not isinstance(samples, np.ndarray) else samples, dtype=float)
    finite: np.ndarray = arr[np.isfinite(arr)]  # numpy leaves a boolean-mask index untyped
    return finite


def _boot_medians(rng: np.random.Generator, arr: np.ndarray, n_boot: int) -> np.ndarray:
    """Medians of ``n_boot`` resamples of ``arr``, drawn BOOT_CHUNK values at a time (the same draws as one
    ``(n_boot, n)`` call while that fits in one chunk)."""
    if arr.size > MAX_BOOT_SAMPLES:
        raise UsageError(
            f"{arr.size} samples in one bootstrap; tuner resamples at most {MAX_BOOT_SAMPLES}. Pass fewer "
            "repetitions (split the file)."
        )
    rows = max(1, BOOT_CHUNK // arr.size)
    out = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        k = min(rows, n_boot - start)
        out[start : start + k] = np.median(arr[rng.integers(0, arr.size, size=(k, arr.size))], axis=1)
    return out


def _check_confidence(confidence: float) -> None:
    if not 0.5 <= confidence < 1.0:
        raise UsageError(f"confidence must be in [0.5, 1) (got {confidence!r}); use e.g. 0.95 for a 95% interval.")


def bootstrap_median_ci(
    samples: Sequence[float] | np.ndarray, *, confidence: float = 0.95, n_boot: int = N_BOOT, seed: int = 0
) -> tuple[float, float]:
    """Seeded percentile-bootstrap confidence interval of the median (non-finite samples dropped): ``(low,
    high)``; ``(nan, nan)`` without samples, ``(x, x)`` for a single sample."""
    _check_confidence(confidence)
    arr = _clean(samples)
    if arr.size == 0:
        return (math.nan, math.nan)
    if arr.size == 1:
        return (float(arr[0]), float(arr[0]))
    meds = _boot_medians(np.random.default_rng(seed), arr, n_boot)
    alpha = 1.0 - confidence
    low, high = np.quantile(meds, [alpha / 2, 1 - alpha / 2])
    return (float(low), float(high))


def ci_halfwidth_pct(median: float, ci_low: float, ci_high: float) -> float:
    """Half the CI width as a percentage of the median (the ``--target-ci`` quantity)."""
    if not (math.isfinite(median) and median > 0 and math.isfinite(ci_low) and math.isfinite(ci_high)):
        return math.nan
    return 100.0 * (ci_high - ci_low) / 2.0 / median


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """Outcome of comparing B against A (A is the reference, B the candidate)."""

    delta_pct: float
    """``100 * (median(B) / median(A) - 1)``: positive means B has more tokens/s."""
    ci_low: float
    ci_high: float
    """The bootstrap CI of ``delta_pct``."""
    p_value: float
    """Two-sided Mann-Whitney U p-value (nan with fewer than 2 samples a side)."""
    verdict: Literal["faster", "slower", "no difference", "too few samples", "missing"]
    """``faster``/``slower`` only when the CI excludes 0 and ``p_value < 1 - confidence``; ``too few
    samples`` when the CI excludes 0 but the rank test could not reach that level with this many samples
    (3 against 3 gives p >= 0.1 whatever the data), so the run needs more repetitions to decide;
    ``missing`` when a side has no measurement (no finite positive rate): nothing is compared."""
    confidence: float
    n_a: int = 0
    n_b: int = 0


def summarize_samples(samples: Sequence[float], *, confidence: float, seed: int) -> dict[str, Any]:
    """One bench row's statistics columns (n, median/mean/stddev, bootstrap CI, min/max, samples).

    Non-finite samples are dropped; with none left every statistic is NaN and ``n`` is 0.
    """
    arr = np.asarray([s for s in samples if math.isfinite(s)], dtype=float)
    if arr.size == 0:
        stats = ("median_ts", "mean_ts", "stddev_ts", "ci_low", "ci_high", "ci_pct", "min_ts", "max_ts")
        return {"n": 0, **dict.fromkeys(stats, math.nan), "samples": []}
    med = float(np.median(arr))
    low, high = bootstrap_median_ci(arr, confidence=confidence, seed=seed)
    return dict(
        n=int(arr.size),
        median_ts=med,
        mean_ts=float(arr.mean()),
        stddev_ts=float(arr.std(ddof=1)) if arr.size > 1 else math.nan,
        ci_low=low,
        ci_high=high,
        ci_pct=ci_halfwidth_pct(med, low, high),
        min_ts=float(arr.min()),
        max_ts=float(arr.max()),
        samples=[float(x) for x in arr],
    )


def _missing(confidence: float, n_a: int = 0, n_b: int = 0) -> Verdict:
    nan = math.nan
    return Verdict(
        delta_pct=nan, ci_low=nan, ci_high=nan, p_value=nan, verdict="missing", confidence=confidence, n_a=n_a, n_b=n_b
    )


def compare(
    a_samples: Sequence[float] | np.ndarray,
    b_samples: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    seed: int = 0,
    n_boot: int = N_BOOT,
    min_effect_pct: float = 0.0,
) -> Verdict:
    """Compare candidate samples B against reference samples A (both tokens/s, higher is better).

    Only finite positive rates count; a side with none is ``missing``, never ``no difference``. The rank
    test uses ``alpha = 1 - confidence``; a change must also have its CI entirely beyond ``min_effect_pct``.

    Example:
        >>> compare([100, 101, 99, 100, 102], [110, 111, 109, 112, 110]).verdict
        'faster'
    """
    from scipy import stats as sps

    _check_confidence(confidence)
    a, b = _clean(a_samples), _clean(b_samples)
    a, b = a[a > 0], b[b > 0]  # the tokens/s values that are measurements (a zero or negative rate is none)
    if a.size == 0 or b.size == 0:
        return _missing(confidence, int(a.size), int(b.size))
    delta = 100.0 * (float(np.median(b)) / float(np.median(a)) - 1.0)
    rng = np.random.default_rng(seed)
    med_a = _boot_medians(rng, a, n_boot)  # drawn first: the seed's draws go to A, then to B
    ratios = 100.0 * (_boot_medians(rng, b, n_boot) / med_a - 1.0)
    alpha = 1.0 - confidence
    low, high = (float(x) for x in np.quantile(ratios, [alpha / 2, 1 - alpha / 2]))
    p = math.nan
    if a.size >= 2 and b.size >= 2:
        with warnings.catch_warnings():
            # All-equal samples make the normal approximation degenerate; p is then 1.
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(sps.mannwhitneyu(b, a, alternative="two-sided").pvalue)
        p = p if math.isfinite(p) else 1.0
    significant = math.isfinite(p) and p < alpha
    # The smallest two-sided Mann-Whitney p for these sizes (complete separation, no ties).
    # (compared as comb > 2 / alpha: an int against a float, exact however large the comb)
    decidable = a.size >= 2 and b.size >= 2 and math.comb(a.size + b.size, a.size) > 2.0 / alpha
    verdict: Literal["faster", "slower", "no difference", "too few samples", "missing"] = "no difference"
    if significant and low > min_effect_pct:
        verdict = "faster"
    elif significant and high < -min_effect_pct:
        verdict = "slower"
    elif not decidable and (low > min_effect_pct or high < -min_effect_pct):
        verdict = "too few samples"
    return Verdict(
        delta_pct=delta,
        ci_low=low,
        ci_high=high,
        p_value=p,
        verdict=verdict,
        confidence=confidence,
        n_a=int(a.size),
        n_b=int(b.size),
    )


# ----------------------------------------------------- The one verdict rule: no faster/slower without a noise reference

FLOORS_DOC = "docs/noise-floors.md"


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoiseRef:
    """What a change must clear to be called faster or slower, in percent, and where that number came from."""

    pct: float
    """Half-width of the band around 0 (``inf`` when nothing is known: nothing can then be claimed)."""
    kind: Literal["A/A", "floor", "none"]
    """``A/A``: an A/A pair measured with the data (``--aa``, the search's own); ``floor``: the recorded
    run-to-run floor of this backend and phase (:func:`run_floor`); ``none``: neither exists."""
    source: str = ""
    """One line on where it came from (the files, or the floor's backend/phase and how many pairs)."""


def aa_noise(v: Verdict) -> float:
    """The noise an A/A comparison measured, in percent: how far its interval reaches from 0 (as
    :func:`tuner.measure.paired.noise_pct` does for paired effects); infinite when unknown."""
    if not (math.isfinite(v.ci_low) and math.isfinite(v.ci_high)):
        return math.inf
    return max(abs(v.ci_low), abs(v.ci_high), abs(v.delta_pct) if math.isfinite(v.delta_pct) else 0.0)


def run_floor(backend: str | None, phase: str) -> NoiseRef:
    """The recorded run-to-run floor for ``backend`` (llama-bench's ``backends`` field) and ``phase``.

    Measured from the A/A pairs recorded in this repository (``tools/aa_floors.py``, FLOORS_DOC): two
    llama-bench runs of one build differ by less than this in 95% of them. A backend list
    (``CUDA,RPC``) takes the largest floor among its members; a backend with no recorded A/A data has
    no floor (``kind="none"``), so nothing is claimed without ``--aa``.
    """
    table = tomllib.loads(package_data("aa_floors.toml").read_text(encoding="utf-8"))
    names = [b.strip() for b in str(backend or "").split(",") if b.strip()]
    found = [(b, table[b][phase]) for b in names if b in table and phase in table[b]]
    thin = [(b, f) for b, f in found if "floor_pct" not in f]
    if not found:
        why = f"no recorded run-to-run floor for backend {backend or '?'} {phase} ({FLOORS_DOC})"
    elif thin:  # too few recorded pairs for a floor (their 95th percentile would be one outlier's value)
        b, f = thin[0]
        why = (
            f"no run-to-run floor for backend {b} {phase}: only {f['pairs']} recorded A/A pairs, "
            f"fewer than the {table.get('min_pairs', 30)} a floor needs ({FLOORS_DOC})"
        )
    if not found or thin:
        return NoiseRef(pct=math.inf, kind="none", source=why)
    b, f = max(found, key=lambda x: x[1]["floor_pct"])
    return NoiseRef(
        pct=float(f["floor_pct"]),
        kind="floor",
        source=f"run-to-run floor {b} {phase} ±{f['floor_pct']:.1f}% ({f['pairs']} recorded A/A pairs, {FLOORS_DOC})",
    )


def judge(v: Verdict, noise: NoiseRef, *, min_effect_pct: float = 0.0) -> str:
    """The verdict of a comparison against its noise reference: the rule every tuner table applies.

    ``faster`` / ``slower`` only when :func:`compare` found the change (its CI excludes 0 and the rank
    test rejects) *and* the whole CI lies beyond ``noise.pct`` (and ``min_effect_pct``); ``no noise
    reference`` when there is none (``kind="none"``); ``within noise`` when the change is statistically
    clear but does not clear the noise; else :func:`compare`'s own ``no difference`` / ``too few samples``.
    """
    if v.verdict not in ("faster", "slower"):
        return v.verdict
    if noise.kind == "none" or not math.isfinite(noise.pct):
        return "no noise reference"
    bar = max(noise.pct, min_effect_pct)
    if v.verdict == "faster" and v.ci_low > bar:
        return "faster"
    if v.verdict == "slower" and v.ci_high < -bar:
        return "slower"
    return "within noise"


def method_text(confidence: float = 0.95) -> str:
    """What :func:`compare` and the tables built on it compute, in words (kept here, beside the code)."""
    return (
        "t/s: llama-bench's mean t/s as compare-llama-bench.py prints it (the mean over a test's rows of their "
        "avg_ts; for a tuner bench file the mean of its repetitions); Speedup = t/s B / t/s A. Median ratio: the "
        "median of B's repetitions over A's (llama-bench's samples_ts; CSV/SQL output carries only the mean, one "
        f"sample per row, which decides nothing). {confidence * 100:g}% CI: percentile bootstrap ({N_BOOT} "
        "resamples) of that ratio of medians; a change also needs a two-sided Mann-Whitney U test at "
        f"p < {1 - confidence:.2g}."
    )
