"""Pick winners from measured configurations: no-harm rule, then min-max regret per context bucket.

This mirrors llama.cpp's Metal tuner (tools/tuning, see ../shared/research/anchors.md §3):

* a *point* is one (phase, depth) measurement, e.g. ``("tg", 16384)``;
* a config may represent a bucket of points only if it is *admissible* there: not slower than the
  baseline beyond noise at any point of the bucket (the no-harm rule);
* among admissible configs the one with the smallest worst-case regret ``best(p) / speed(c, p)``
  over the bucket wins (min-max regret);
* a phase's depths are split into contiguous buckets only when the split lowers the worst regret by
  more than ``tau``; otherwise one config serves the whole phase.

A bucket whose pick is not significantly faster than the baseline at any of its points stays at the
baseline: "no difference beyond noise" is a valid result and is reported as such.
"""

from __future__ import annotations

__all__ = ["Point", "Measurement", "BucketPick", "Selection", "select_winners", "PHASES"]

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence

from tuner.measure.stats import compare

PHASES = ("pp", "tg")

Point = tuple[str, int]
"""(phase, depth): ``("pp", 0)``, ``("tg", 32768)``."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measurement:
    """Samples (tokens/s) of one config at one point."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))


@dataclasses.dataclass(frozen=True, kw_only=True)
class BucketPick:
    phase: str
    depths: tuple[int, ...]
    config: str
    """Config id of the pick (the baseline id when nothing beats it)."""
    worst_regret: float
    """max over the bucket's points of best(p)/speed(pick, p); 1.0 = best everywhere."""
    per_point: Mapping[int, Mapping[str, object]]
    """depth -> {delta_pct, ci_low, ci_high, p_value, verdict, base_median, pick_median, n_base, n_pick}."""
    reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Selection:
    baseline: str
    buckets: tuple[BucketPick, ...]
    rejected: Mapping[str, str]
    """config id -> why it could not represent any bucket (first failing point)."""

    def pick_for(self, phase: str, depth: int) -> BucketPick:
        for b in self.buckets:
            if b.phase == phase and depth in b.depths:
                return b
        raise KeyError((phase, depth))


def _partitions(depths: Sequence[int]) -> list[list[tuple[int, ...]]]:
    """All ways to cut a sorted depth list into contiguous segments (n <= ~8, so 2^(n-1) is fine)."""
    n = len(depths)
    out = []
    for cuts in itertools.product((False, True), repeat=max(0, n - 1)):
        segs, cur = [], [depths[0]]
        for i, cut in enumerate(cuts, start=1):
            if cut:
                segs.append(tuple(cur))
                cur = []
            cur.append(depths[i])
        segs.append(tuple(cur))
        out.append(segs)
    return out


def select_winners(
    results: Mapping[str, Mapping[Point, Measurement]],
    baseline: str,
    *,
    eligible: Callable[[str, str], bool] | None = None,
    fallback: str | None = None,
    noise_floor: Mapping[Point, float] | None = None,
    min_effect_pct: float = 2.0,
    tau: float = 0.05,
    confidence: float = 0.95,
    seed: int = 0,
) -> Selection:
    """Choose one config per context bucket of each phase.

    Args:
        results: config id -> point -> measurement. The baseline must cover every point; configs
            may cover a subset (pruned trials) and are only considered where they were measured.
        baseline: Id of the upstream-default config.
        eligible: Optional filter ``(config, phase) -> bool`` (e.g. "shares the winning build").
            The baseline stays the reference of the no-harm rule even when it is not eligible.
        fallback: The config a bucket keeps when no eligible config beats the baseline beyond noise
            there (default: the baseline itself).
        noise_floor: Per point, the run-to-run drift (percent) seen between baseline anchors; a
            verdict needs an effect beyond it (identical H100 runs minutes apart differed by up to
            14% at pp d0, so a confidence interval from one run alone is not enough).
        min_effect_pct: The noise floor where no anchor drift was measured (percent).
        tau: A phase is split into more buckets only if that lowers the worst regret by more than
            this fraction.
        confidence: Confidence level of the per-point verdicts.
        seed: Bootstrap seed (verdicts are reproducible).

    Returns:
        The Selection, with per-point evidence for each bucket.
    """
    base = results[baseline]
    verdicts: dict[tuple[str, Point], dict[str, object]] = {}
    for cfg, pts in results.items():
        for p, m in pts.items():
            if p not in base:
                continue
            floor = max(min_effect_pct, (noise_floor or {}).get(p, 0.0))
            v = compare(base[p].samples, m.samples, confidence=confidence, seed=seed, min_effect_pct=floor)
            verdicts[(cfg, p)] = {
                "delta_pct": v.delta_pct,
                "ci_low": v.ci_low,
                "ci_high": v.ci_high,
                "p_value": v.p_value,
                "verdict": v.verdict,
                "base_median": base[p].median,
                "pick_median": m.median,
                "n_base": len(base[p].samples),
                "n_pick": len(m.samples),
                "noise_floor_pct": floor,
            }

    rejected: dict[str, str] = {}
    buckets: list[BucketPick] = []
    for phase in PHASES:
        depths = sorted(d for (ph, d) in base if ph == phase)
        if not depths:
            continue

        def ok(cfg: str, seg: tuple[int, ...]) -> bool:
            if eligible is not None and not eligible(cfg, phase):
                return False
            for d in seg:
                v = verdicts.get((cfg, (phase, d)))
                if v is None:
                    return False
                if v["verdict"] == "slower":
                    rejected.setdefault(cfg, f"slower than baseline at {phase} d{d} ({v['delta_pct']:+.1f}%)")
                    return False
            return True

        best = {
            d: max(m[(phase, d)].median for c, m in results.items() if (phase, d) in m and ok(c, (d,)))
            for d in depths
        }

        def regret(cfg: str, seg: tuple[int, ...]) -> float:
            return max(best[d] / results[cfg][(phase, d)].median for d in seg)

        def pick(seg: tuple[int, ...]) -> tuple[str, float]:
            cands = [c for c in results if ok(c, seg)]
            if not cands:
                raise ValueError(f"no eligible config was measured at every {phase} depth of {seg}")
            # Prefer the fallback/baseline on ties: a non-default must earn its place.
            pref = fallback or baseline
            r, _, c = min((regret(c, seg), c != pref, c) for c in cands)
            return c, r

        one = [tuple(depths)]
        best_parts, best_worst = one, pick(one[0])[1]
        for parts in _partitions(depths):
            if len(parts) == 1:
                continue
            worst = max(pick(seg)[1] for seg in parts)
            # Extra buckets must pay for themselves (more rules to maintain and export).
            if worst < best_worst * (1.0 - tau) or (
                len(parts) < len(best_parts) and worst <= best_worst
            ):
                best_parts, best_worst = parts, worst
        for seg in best_parts:
            cfg, worst = pick(seg)
            pts = {d: verdicts[(cfg, (phase, d))] for d in seg}
            faster = [d for d in seg if pts[d]["verdict"] == "faster"]
            keep = fallback or baseline
            if cfg != keep and not faster:
                cfg = keep
                pts = {d: verdicts[(keep, (phase, d))] for d in seg}
                worst = regret(keep, seg)
                reason = "no config beats the baseline beyond noise here"
            elif cfg == keep and not faster:
                reason = "baseline is best or tied (no admissible config is faster)"
            else:
                reason = f"faster at depth {', '.join(map(str, faster))}; not slower anywhere in the bucket"
            buckets.append(
                BucketPick(
                    phase=phase,
                    depths=seg,
                    config=cfg,
                    worst_regret=worst if math.isfinite(worst) else float("inf"),
                    per_point=pts,
                    reason=reason,
                )
            )
    return Selection(baseline=baseline, buckets=tuple(buckets), rejected=rejected)
