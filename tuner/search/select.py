"""Pick winners from measured configurations: no-harm rule, then min-max regret per context bucket.

This mirrors llama.cpp's Metal FA-vec tuner (``tools/tuning`` in llama.cpp 0c1e570): a config may represent a
bucket of (phase, depth) points only if it is not slower than the baseline beyond noise at any of them; among
those the one with the smallest worst-case regret ``best(p) / speed(c, p)`` wins; a phase's depths are split
into contiguous buckets only when that lowers the worst regret by more than ``tau``. A bucket whose pick is not
faster than the baseline beyond noise anywhere stays at the baseline.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence

from tuner.measure.stats import compare

PHASES = ("pp", "tg")

Point = tuple[str, int]


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
    worst_regret: float
    per_point: Mapping[int, Mapping[str, object]]
    reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Selection:
    baseline: str
    buckets: tuple[BucketPick, ...]
    rejected: Mapping[str, str]


def _partitions(depths: Sequence[int]) -> list[list[tuple[int, ...]]]:
    """All ways to cut a sorted depth list into contiguous segments (n <= ~8, so 2^(n-1))."""
    n = len(depths)
    cuts = itertools.product((False, True), repeat=max(0, n - 1))
    bounds = ([0, *(i for i, cut in enumerate(c, start=1) if cut), n] for c in cuts)
    return [[tuple(depths[a:b]) for a, b in itertools.pairwise(bs)] for bs in bounds]


@dataclasses.dataclass(kw_only=True)
class _Phase:
    """One phase's admissibility and regret over the configs."""

    phase: str
    results: Mapping[str, Mapping[Point, Measurement]]
    verdicts: Mapping[tuple[str, Point], Mapping[str, object]]
    eligible: Callable[[str, str], bool] | None
    rejected: dict[str, str]
    keep: str
    best: dict[int, float] = dataclasses.field(default_factory=dict)

    def ok(self, cfg: str, seg: tuple[int, ...]) -> bool:
        """Admissible over the segment: eligible, measured at every depth and not slower anywhere."""
        if self.eligible is not None and not self.eligible(cfg, self.phase):
            return False
        for d in seg:
            v = self.verdicts.get((cfg, (self.phase, d)))
            if v is None:
                return False
            if v["verdict"] == "slower":
                self.rejected.setdefault(cfg, f"slower than baseline at {self.phase} d{d} ({v['delta_pct']:+.1f}%)")
                return False
        return True

    def set_best(self, depths: Sequence[int]) -> None:
        phase, results = self.phase, self.results
        self.best = {
            d: max(m[(phase, d)].median for c, m in results.items() if (phase, d) in m and self.ok(c, (d,)))
            for d in depths
        }

    def regret(self, cfg: str, seg: tuple[int, ...]) -> float:
        return max(self.best[d] / self.results[cfg][(self.phase, d)].median for d in seg)

    def pick(self, seg: tuple[int, ...]) -> tuple[str, float]:
        cands = [c for c in self.results if self.ok(c, seg)]
        if not cands:
            raise ValueError(f"no eligible config was measured at every {self.phase} depth of {seg}")
        # Prefer the fallback/baseline on ties: a non-default must earn its place.
        r, _, c = min((self.regret(c, seg), c != self.keep, c) for c in cands)
        return c, r


def _best_partition(ph: _Phase, depths: list[int], tau: float) -> list[tuple[int, ...]]:
    one = [tuple(depths)]
    best_parts, best_worst = one, ph.pick(one[0])[1]
    for parts in _partitions(depths):
        if len(parts) == 1:
            continue
        worst = max(ph.pick(seg)[1] for seg in parts)
        # Extra buckets must pay for themselves (more rules to maintain and export).
        if worst < best_worst * (1.0 - tau) or (len(parts) < len(best_parts) and worst <= best_worst):
            best_parts, best_worst = parts, worst
    return best_parts


def _bucket(ph: _Phase, seg: tuple[int, ...]) -> BucketPick:
    cfg, worst = ph.pick(seg)
    pts = {d: ph.verdicts[(cfg, (ph.phase, d))] for d in seg}
    faster = [d for d in seg if pts[d]["verdict"] == "faster"]
    keep = ph.keep
    if cfg != keep and not faster:
        cfg = keep
        pts = {d: ph.verdicts[(keep, (ph.phase, d))] for d in seg}
        worst = ph.regret(keep, seg)
        reason = "no config beats the baseline beyond noise here"
    elif cfg == keep and not faster:
        reason = "baseline is best or tied (no admissible config is faster)"
    else:
        reason = f"faster at depth {', '.join(map(str, faster))}; not slower anywhere in the bucket"
    return BucketPick(
        phase=ph.phase,
        depths=seg,
        config=cfg,
        worst_regret=worst if math.isfinite(worst) else float("inf"),
        per_point=pts,
        reason=reason,
    )


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
    """Choose one config per context bucket of each phase, with per-point evidence.

    ``results``: config id -> point -> measurement; other configs than the baseline count only where measured.
    ``fallback``: what a bucket keeps when no eligible config beats the baseline (default: the baseline).
    ``noise_floor``: per point, the drift (percent) between baseline anchors a verdict must exceed (identical
    H100 runs minutes apart differed by up to 14%), else ``min_effect_pct``."""
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
        ph = _Phase(
            phase=phase,
            results=results,
            verdicts=verdicts,
            eligible=eligible,
            rejected=rejected,
            keep=fallback or baseline,
        )
        ph.set_best(depths)
        buckets += [_bucket(ph, seg) for seg in _best_partition(ph, depths, tau)]
    return Selection(baseline=baseline, buckets=tuple(buckets), rejected=rejected)
