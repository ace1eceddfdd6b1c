"""Per-point statistics of paired rounds: upstream's kernel, the A/A noise and each candidate's effect.

Upstream's own pick per point is read from the patched build's ``GGML_TUNER_FA_LOG`` lines, so the forced
candidate equal to it is a built-in A/A pair; where no kernel can be forced (the CPU backend), a second upstream
candidate (:data:`AA_NAME`) is. Decode cells apply the CPU% rule (docs/design.md, "CPU% in decode decisions").
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.measure.decide import DEFAULT_LIMITS
from tuner.measure.paired import (
    CPU_REJECTED,
    Diff,
    Effect,
    block_effects,
    noise_pct,
    noise_points,
    paired_diff,
    rejects_cpu_cost,
    verdict,
)
from tuner.measure.stats import median

UPSTREAM = "upstream"
AA_NAME = "upstream-aa"
OBSERVED = ("cpu", "core", "gpu")
"""Utilizations a measure may report per depth, stored per candidate beside ``values`` (percent)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellStats:
    """One (phase, depth) of a screen: upstream's kernel, the A/A noise and each candidate's effect."""

    depth: int
    upstream_kernel: str | None
    aa: str | None
    noise_pct: float
    upstream_ts: float
    effects: Mapping[str, Effect]
    """Candidates that really ran their kernel here (no fallback), upstream excluded."""
    verdicts: Mapping[str, str]
    fallback: tuple[str, ...]
    """Forced candidates the hook could not run at this shape (it kept upstream's choice)."""
    cpu: Mapping[str, Diff] = dataclasses.field(default_factory=dict)
    """CPU% of each candidate in ``effects`` minus upstream's, paired by round (points)."""
    cpu_noise: float = math.inf
    levels: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    """Per candidate (upstream included): median ``ts``, ``cpu``, ``core`` and ``gpu`` over the rounds."""
    kernels: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    """Per candidate (upstream included): the kernel it ran most often here."""
    bar_pct: float = math.nan
    """The t/s bar the verdicts were judged against (:func:`tuner.rounds.compose.judge_phase`; NaN: not yet)."""
    cpu_bar: float = math.nan
    series: Mapping[str, tuple[float | None, ...]] = dataclasses.field(default_factory=dict)
    """Per candidate (fallbacks left out): its t/s in each round (what :mod:`tuner.measure.decide` tests)."""
    limits: tuple[int, int] = DEFAULT_LIMITS
    """The rounds' stop rule (min_rounds, max_rounds): the round counts a cell could stop at."""

    @property
    def max_halfwidth(self) -> float:
        return max((e.halfwidth_pct for e in self.effects.values()), default=math.inf)

    @property
    def changed(self) -> list[str]:
        """The candidates that ran another kernel than upstream's here (they can change a decision)."""
        return [
            n
            for n in self.effects
            if n != self.aa and self.kernels.get(n) is not None and self.kernels.get(n) != self.upstream_kernel
        ]

    def as_dict(self) -> dict[str, object]:
        return {
            "depth": self.depth,
            "upstream_kernel": self.upstream_kernel,
            "aa": self.aa,
            "noise_pct": self.noise_pct,
            "upstream_ts": self.upstream_ts,
            "effects": {
                k: {
                    **e.as_dict(),
                    "verdict": self.verdicts[k],
                    **({"cpu": self.cpu[k].as_dict()} if k in self.cpu else {}),
                }
                for k, e in self.effects.items()
            },
            "fallback": list(self.fallback),
            "cpu_noise": self.cpu_noise,
            "levels": {k: dict(v) for k, v in self.levels.items()},
            "kernels": dict(self.kernels),
            "bar_pct": self.bar_pct,
            "cpu_bar": self.cpu_bar,
        }


PhaseScreen = dict[int, CellStats]


def _majority(xs: Sequence[str | None]) -> str | None:
    xs = [x for x in xs if x]
    return Counter(xs).most_common(1)[0][0] if xs else None


def summarize_phase(phase: str, records: Sequence[Mapping[str, Any]], depths: Sequence[int]) -> PhaseScreen:
    """Per depth: paired effects of every candidate vs upstream, the A/A pair and its noise."""
    out: PhaseScreen = {}
    for d in depths:
        key = str(d)
        recs = [r for r in records if r["phase"] == phase and key in r["values"].get(UPSTREAM, {})]
        if not recs:
            continue
        names = [n for n in recs[0]["order"] if n != UPSTREAM]
        up = [r["values"][UPSTREAM].get(key) for r in recs]
        up_kernel = _majority([r["kernels"].get(UPSTREAM, {}).get(key) for r in recs])
        fallback = [n for n in names if any(r["why"].get(n, {}).get(key) == "fallback" for r in recs)]
        # Rounds are blocks: every candidate that ran its kernel shares one pooled error variance.
        effects: dict[str, Effect] = block_effects(
            {UPSTREAM: up, **{n: [r["values"].get(n, {}).get(key) for r in recs] for n in names if n not in fallback}},
            UPSTREAM,
        )
        aa = AA_NAME if AA_NAME in effects else (up_kernel if up_kernel in effects else None)
        noise = noise_pct(effects[aa]) if aa else math.inf
        ups = [u for u in up if u]
        cpu = {n: paired_diff(_series(recs, "cpu", n, key), _series(recs, "cpu", UPSTREAM, key)) for n in effects}
        cpu_noise = noise_points(cpu[aa]) if aa else math.inf
        verdicts = {n: verdict(e, noise) for n, e in effects.items()}
        if phase == "tg":  # decode changes are judged by their CPU cost too (docs/design.md)
            for n, e in effects.items():
                if n != aa and rejects_cpu_cost(e.ci_low, noise, cpu[n].ci_low, cpu_noise):
                    verdicts[n] = CPU_REJECTED
        out[d] = CellStats(
            depth=d,
            upstream_kernel=up_kernel,
            aa=aa,
            noise_pct=noise,
            upstream_ts=sorted(ups)[len(ups) // 2] if ups else math.nan,
            effects=effects,
            verdicts=verdicts,
            fallback=tuple(fallback),
            cpu=cpu,
            cpu_noise=cpu_noise,
            # the upper median of an even count, as ``upstream_ts``: a report row shows one round's value
            levels={
                n: {k: median(_series(recs, k, n, key), upper=True) for k in ("ts", *OBSERVED)}
                for n in [UPSTREAM, *names]
            },
            kernels={n: _majority([r["kernels"].get(n, {}).get(key) for r in recs]) for n in [UPSTREAM, *names]},
            series={
                n: tuple(r["values"].get(n, {}).get(key) for r in recs) for n in [UPSTREAM, *names] if n not in fallback
            },
            limits=_limits(recs),
        )
    return out


def _limits(recs: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """The widest (min, max) rounds the records were measured under; records before it was stored: the
    default limits, the maximum widened to the rounds."""
    recorded = [(int(r["limits"][0]), int(r["limits"][1])) for r in recs if r.get("limits")]
    if recorded:
        return min(x[0] for x in recorded), max(x[1] for x in recorded)
    return DEFAULT_LIMITS[0], max(DEFAULT_LIMITS[1], len(recs))


def _series(recs: Sequence[Mapping[str, Any]], key: str, name: str, depth: str) -> list[float | None]:
    """One candidate's per-round values at a depth: ``ts`` or an OBSERVED key (None where a record lacks it)."""
    field = "values" if key == "ts" else key
    return [r.get(field, {}).get(name, {}).get(depth) for r in recs]
