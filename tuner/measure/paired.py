"""Paired statistics over interleaved rounds.

Within one round every config is measured once, back to back, in a rotated order; a candidate's effect is
the ratio candidate / upstream *within* a round, so drift between rounds cancels. Over rounds the
log-ratios get their mean and a Student-t interval (rounds are few, 3-8: a normal or bootstrap interval
would be too narrow). With more than two configs, :func:`block_effects` reads the rounds as blocks of a
randomized complete block design and pools the error variance over all configs: (R-1)(C-1) degrees of
freedom instead of R-1 (6 instead of 2 on the H100's 3-round, 4-config screens: the t quantile falls from
4.30 to 2.45; results/sm_90/llama-3.1-8b-q4_k_m/evidence). An *A/A pair* measures the noise of the whole
procedure; a verdict needs the candidate's interval to clear it, not just 1.0.

CPU% (and GPU%) are paired as *differences in points* (:func:`paired_diff`), not ratios: a utilization is
bounded and additive (+25 points is a quarter of a core whatever the baseline), and a ratio explodes where
the baseline is small (a GPU backend's host thread). :func:`rejects_cpu_cost` is the CPU% rule for decode
(docs/design.md, "CPU% in decode decisions").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TypeGuard

from scipy import stats as _stats

from tuner.measure.stats import median


@dataclasses.dataclass(frozen=True, kw_only=True)
class Effect:
    """A paired effect: candidate / reference over ``n`` rounds."""

    n: int
    ratio: float
    """Geometric mean of the per-round ratios (1.0 = as fast as the reference)."""
    ci_low: float
    ci_high: float
    """Confidence interval of ``ratio`` (NaN when n < 2)."""

    @property
    def pct(self) -> float:
        return 100.0 * (self.ratio - 1.0)

    @property
    def halfwidth_pct(self) -> float:
        """Half-width of the interval in percent of the ratio (inf when unknown)."""
        if not (math.isfinite(self.ci_low) and math.isfinite(self.ci_high)) or self.ratio <= 0:
            return math.inf
        return 100.0 * (self.ci_high - self.ci_low) / 2.0 / self.ratio

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "ratio": self.ratio, "ci_low": self.ci_low, "ci_high": self.ci_high}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Diff:
    """A paired difference in points: candidate - reference over ``n`` rounds (CPU%, GPU%)."""

    n: int
    mean: float
    ci_low: float
    ci_high: float
    """Confidence interval of ``mean`` (NaN when n < 2)."""

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "mean": self.mean, "ci_low": self.ci_low, "ci_high": self.ci_high}


def _t_interval(xs: Sequence[float], confidence: float) -> tuple[float, float]:
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, float(_stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * sd / math.sqrt(n)


def paired_effect(
    candidate: Sequence[float | None], reference: Sequence[float | None], *, confidence: float = 0.95
) -> Effect:
    """Effect of ``candidate`` over ``reference``, paired by index (one entry per round); rounds where either
    side is missing or not a positive finite value are skipped."""
    logs = [math.log(c / r) for c, r in zip(candidate, reference) if _ok(c) and _ok(r)]
    if not logs:
        return Effect(n=0, ratio=math.nan, ci_low=math.nan, ci_high=math.nan)
    mean, half = _t_interval(logs, confidence)
    return Effect(n=len(logs), ratio=math.exp(mean), ci_low=math.exp(mean - half), ci_high=math.exp(mean + half))


def paired_diff(
    candidate: Sequence[float | None], reference: Sequence[float | None], *, confidence: float = 0.95
) -> Diff:
    """Mean difference ``candidate - reference`` in points, paired by index (one entry per round), with
    a Student-t interval. Rounds where either side is missing or not finite are skipped."""
    ds = [
        float(c) - float(r)
        for c, r in zip(candidate, reference)
        if c is not None and r is not None and math.isfinite(c) and math.isfinite(r)
    ]
    if not ds:
        return Diff(n=0, mean=math.nan, ci_low=math.nan, ci_high=math.nan)
    mean, half = _t_interval(ds, confidence)
    return Diff(n=len(ds), mean=mean, ci_low=mean - half, ci_high=mean + half)


def block_effects(
    values: Mapping[str, Sequence[float | None]], reference: str, *, confidence: float = 0.95
) -> dict[str, Effect]:
    """Effect of every config over ``reference`` with rounds as blocks and the error variance pooled.

    ``values[name][i]`` is the config's t/s in round ``i``. Only rounds where every config has a value
    count (complete blocks); with fewer than two of them, or only two configs, this is
    :func:`paired_effect` per config. The estimate is the mean log-ratio to ``reference`` over those
    rounds, its standard error ``sqrt(2 s^2 / R)`` with ``s^2`` the two-way residual mean square.
    Assumes the configs are equally noisy, as repeated runs of one llama-bench command are.
    """
    names = [n for n in values if n != reference]
    y = complete_logs(values, [reference, *names])
    r, c = len(y), len(names) + 1
    if r < 2 or c < 3:
        return {n: paired_effect(values[n], values[reference], confidence=confidence) for n in names}
    col_m = [sum(y[i][j] for i in range(r)) / r for j in range(c)]
    ss, df = residual(y)
    half = float(_stats.t.ppf(0.5 + confidence / 2.0, df)) * math.sqrt(2.0 * ss / df / r)
    out = {}
    for j, n in enumerate(names, start=1):
        m = col_m[j] - col_m[0]
        out[n] = Effect(n=r, ratio=math.exp(m), ci_low=math.exp(m - half), ci_high=math.exp(m + half))
    return out


def complete_logs(values: Mapping[str, Sequence[float | None]], names: Sequence[str]) -> list[list[float]]:
    """Log t/s of ``names`` (``values[name][round]``) in the rounds where every one of them has a positive
    finite value (complete blocks), one row per round."""
    rows = zip(*(values[x] for x in names))
    return [[math.log(v) for v in row if _ok(v)] for row in rows if all(_ok(v) for v in row)]


def residual(y: Sequence[Sequence[float]]) -> tuple[float, int]:
    """Two-way (round x config) residual sum of squares of ``y[round][config]`` and its degrees of freedom."""
    r, c = len(y), len(y[0]) if y else 0
    if r < 2 or c < 2:
        return 0.0, 0
    row_m = [sum(v) / c for v in y]
    col_m = [sum(y[i][j] for i in range(r)) / r for j in range(c)]
    grand = sum(row_m) / r
    ss = sum((y[i][j] - row_m[i] - col_m[j] + grand) ** 2 for i in range(r) for j in range(c))
    return ss, (r - 1) * (c - 1)


def _ok(x: float | None) -> TypeGuard[float]:
    return x is not None and math.isfinite(x) and x > 0


def noise_pct(aa: Effect) -> float:
    """The noise an A/A pair measured, in percent: how far its interval reaches from 1.0.

    Unknown (fewer than 2 rounds) is infinite, so nothing can be claimed against it.
    """
    if not (math.isfinite(aa.ci_low) and math.isfinite(aa.ci_high)):
        return math.inf
    return 100.0 * max(abs(aa.ci_high - 1.0), abs(1.0 - aa.ci_low))


def noise_points(aa: Diff) -> float:
    """The noise an A/A pair measured in a utilization, in points: how far its interval reaches from 0
    (infinite when unknown)."""
    if not (math.isfinite(aa.ci_low) and math.isfinite(aa.ci_high)):
        return math.inf
    return max(abs(aa.ci_low), abs(aa.ci_high))


CPU_REJECTED = "rejected: CPU% up without a t/s gain"
"""The verdict of a decode point :func:`rejects_cpu_cost` rejects."""


def rejects_cpu_cost(ts_low: float, ts_noise_pct: float, cpu_low: float, cpu_noise: float) -> bool:
    """The CPU% rule for a decode change: reject it when its CPU% rises beyond the CPU noise while its t/s gain
    does not clear the t/s noise (a change that costs host CPU must pay for it in speed; docs/design.md).

    ``ts_low``/``cpu_low``: lower ends of the t/s ratio's interval and of the CPU% difference's (points; the
    point estimates where there is no interval, as in a one-round tune trial); the noises are the A/A pair's
    (percent, points). Unknown numbers (NaN, infinite noise) establish no CPU rise, so no rejection.
    """
    cpu_up = math.isfinite(cpu_low) and math.isfinite(cpu_noise) and cpu_low > cpu_noise
    ts_gain = math.isfinite(ts_low) and math.isfinite(ts_noise_pct) and ts_low > 1.0 + ts_noise_pct / 100.0
    return cpu_up and not ts_gain


NOISE_CEILING_PCT = 20.0
"""The search's A/A noise ceiling, percent: a phase whose A/A noise (the median over its depths) exceeds
it claims nothing. Kernel choices move t/s by 5-15% (docs/h100.md); behind a noise band wider
than 20% a claim would rest on the rare effect that happens to clear it, so none is made. The H100's
noisiest phase measured ±16.5% (prefill, a 1B model); a shared 2-core CPU box measured hundreds of percent."""

TOO_NOISY = "too noisy"
"""The verdict of every point of a phase :func:`too_noisy` judged."""

UPSTREAM_KEPT = "upstream's kernel kept (forced kernel not faster here)"
"""The verdict of a confirmed point a narrowed rule no longer covers (:func:`tuner.search.confirm.judge`): the
forced kernel was measured there and was not faster, so the export keeps upstream's kernel; the measured
numbers stay in the point under ``measured_*`` keys."""


def too_noisy(noises: Sequence[float]) -> bool:
    """Whether a phase's A/A noise (percent, one per depth) is above :data:`NOISE_CEILING_PCT`: the median
    of the measured ones. A depth without an A/A pair (infinite noise) knows no noise, which :func:`verdict`
    already treats as "no difference"; with none measured the phase is not called noisy."""
    med = median(noises)
    return math.isfinite(med) and med > NOISE_CEILING_PCT


def verdict(effect: Effect, noise: float) -> str:
    """``faster`` / ``slower`` when the whole interval clears the A/A noise, else ``no difference``."""
    if not (math.isfinite(effect.ci_low) and math.isfinite(effect.ci_high) and math.isfinite(noise)):
        return "no difference"
    if effect.ci_low > 1.0 + noise / 100.0:
        return "faster"
    if effect.ci_high < 1.0 - noise / 100.0:
        return "slower"
    return "no difference"


def rotated(items: Sequence[str], round_index: int) -> list[str]:
    """The order of one round: ``items`` rotated left by the round's index (A B C, B C A, C A B...)."""
    if not items:
        return []
    k = round_index % len(items)
    return list(items[k:]) + list(items[:k])


def method_text(rounds: Sequence[int] = (), confidence: float = 0.95) -> str:
    """What :func:`block_effects` / :func:`paired_effect` and the search's tables compute, in words (kept
    here, beside the code). ``rounds``: the rounds per point, when known."""
    r = sorted({int(x) for x in rounds if x})
    n = "" if not r else (f" ({r[0]} rounds per point)" if len(r) == 1 else f" ({r[0]}–{r[-1]} rounds per point)")
    return (
        "Both sides were measured in paired, interleaved rounds: each round runs every configuration once, "
        f"back to back, order rotated{n}. t/s: the median over rounds of each side's t/s. Speedup = t/s B / "
        f"t/s A. {confidence * 100:g}% CI: Student-t interval of the geometric mean of the per-round ratios B/A "
        "(rounds as blocks, error variance pooled over the round's configurations), so drift between rounds "
        "cancels; its centre can differ slightly from Speedup."
    )
