"""Compose FlashAttention rules from a kernel screen.

Per phase, each screened depth gets a winner: the fastest forced kernel the decision rule calls ``faster``
(:func:`sequential_calls`), else upstream's own choice. Consecutive depths with the same non-upstream winner form
one rule ``phase/D../gqa../kv..:lo-hi=KERNEL``: ``lo`` the interval's first screened depth (0 for the
shallowest), ``hi`` the next screened depth where the winner differs (open-ended at the deepest), so no depth
where upstream won is covered. Rules carry the model's shape, so they never change the kernel of a differently
shaped model run with the same build.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Literal

from scipy import stats as _stats

from tuner.measure.decide import Call, decide, phase_tests
from tuner.measure.paired import CPU_REJECTED, NOISE_CEILING_PCT, TOO_NOISY, rejects_cpu_cost, too_noisy, verdict
from tuner.plan.fa_rules import FaRule, Phase
from tuner.rounds.stats import UPSTREAM, CellStats

Family = Literal["changed", "all"]
FAMILIES = ("changed", "all")
"""Holm's family of a phase (:func:`sequential_calls`)."""

RULES = ("sequential", "aa-bar")
"""The decision rules: ``sequential`` (:mod:`tuner.measure.decide`, the search's) and ``aa-bar`` (the
earlier one, kept for comparison in tools/power.py: the whole 95% CI beyond the A/A noise bar)."""

_STRIDE = 256  # llama.cpp pads n_kv to FATTN_KQ_STRIDE (256): a depth between two others is rounded to it


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shape:
    """What upstream's kernel choice depends on besides the arch: head size, GQA ratio, K/V type."""

    D: int | None = None
    gqa: int | None = None
    kv: str | None = "f16"

    def key(self) -> str:
        """The shape as a rule's keys spell it (``/D64/gqa4/kvf16``)."""
        return self.rule(Phase.DECODE, 0, None, "VEC").key

    def rule(self, phase: Phase, lo: int, hi: int | None, kernel: str) -> FaRule:
        """A rule keyed to this shape (an unknown head size or GQA ratio, 0 or None, is no key)."""
        return FaRule(
            phase=phase, lo=lo, hi=hi, kernel=kernel, D=self.D or None, gqa=self.gqa or None, kv=self.kv or None
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """One screened depth of one phase: who won and why."""

    phase: str
    depth: int
    upstream_kernel: str | None
    winner: str | None
    """The forced kernel chosen here; None = upstream's own choice stays."""
    effect_pct: float
    """The winner's paired effect vs upstream (0 when upstream stays)."""
    ci: tuple[float, float]
    noise_pct: float
    reason: str

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def phase_noise(cells: Mapping[int, CellStats], *, cpu: bool = False) -> float:
    """The phase's noise floor: the median A/A noise over its depths (one lucky A/A cell must not make every
    small effect look real); ``cpu``: its CPU% noise floor in points, the median A/A CPU noise."""
    vals = [v for c in cells.values() if math.isfinite(v := c.cpu_noise if cpu else c.noise_pct)]
    return statistics.median(vals) if vals else math.inf


def _width(c: CellStats) -> float:
    """A cell's A/A interval width per unit of noise: ``t((n-1)(k-1)) * sqrt(2/n)`` as in
    :func:`tuner.measure.paired.block_effects` (``t(n-1)`` for a lone pair)."""
    e = c.effects.get(c.aa) if c.aa else None
    n, k = (e.n if e else 0), len(c.effects) + 1
    df = (n - 1) * (k - 1) if k >= 3 else n - 1
    if df < 1:
        return math.inf
    return float(_stats.t.ppf(0.975, df)) * math.sqrt((2.0 if k >= 3 else 1.0) / n)


def noise_floor(cells: Mapping[int, CellStats], depth: int) -> float:
    """The phase's noise floor at ``depth``: every depth's A/A noise rescaled to this depth's rounds, then their
    median (:func:`phase_noise` where rounds are equal)."""
    w = _width(cells[depth])
    vals = [
        c.noise_pct / _width(c) * w for c in cells.values() if math.isfinite(c.noise_pct) and math.isfinite(_width(c))
    ]
    if not vals or not math.isfinite(w):
        return phase_noise(cells)
    return statistics.median(vals)


def _unchanged(c: CellStats, name: str) -> bool:
    k = c.kernels.get(name)
    return k is not None and k == c.upstream_kernel


def sequential_calls(cells: Mapping[int, CellStats], *, family: Family = "changed") -> dict[tuple[int, str], Call]:
    """:func:`tuner.measure.decide.decide` over one phase's cells: every candidate but the A/A twin, at every
    depth that has an A/A twin.

    ``family="changed"`` (the search's): a candidate that ran upstream's own kernel at a depth is A/A by
    construction, so it is not tested (nor raises the others' Holm thresholds) and gets a settled ``no
    difference``. A config that differs beyond the kernel it forces passes ``family="all"``."""
    tests = phase_tests(
        {
            d: (c.series, UPSTREAM, c.aa, [n for n in c.effects if n != c.aa])
            for d, c in cells.items()
            if c.aa is not None and c.aa in c.series and UPSTREAM in c.series
        }
    )
    lims = [c.limits for c in cells.values()]
    limits = (min((x[0] for x in lims), default=1), max((x[1] for x in lims), default=1))
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}")
    flat = {(d, n): t for d, ts in tests.items() for n, t in ts.items()}
    tested = {k: t for k, t in flat.items() if family == "all" or not _unchanged(cells[k[0]], k[1])}
    calls = decide(tested, limits=limits)
    for k, t in flat.items():
        if k not in calls:
            eff = 100.0 * math.expm1(t.mean) if math.isfinite(t.mean) else math.nan
            calls[k] = Call(verdict="no difference", settled=True, p_adjusted=1.0, effect_pct=eff)
    return calls


def open_depths(
    phase: str, cells: Mapping[int, CellStats], *, rule: str = "sequential", family: Family = "changed"
) -> set[int]:
    """The depths whose decision more rounds could still change: the screen's and the confirm's settle rule.

    ``sequential``: open while a candidate that ran another kernel than upstream's is neither claimed nor
    settled by futility, or has no A/A twin yet. ``aa-bar`` (the earlier rule): settled once one is faster
    beyond the noise bar, or every one's interval ends at or below it."""
    if too_noisy([c.noise_pct for c in cells.values()]):
        # above the ceiling more rounds can still narrow the A/A CI (an A/A-only CPU screen needs them)
        return set(cells)
    if rule == "sequential":
        calls = sequential_calls(cells, family=family)
        return {d for d, c in cells.items() if any((d, n) not in calls or not calls[(d, n)].settled for n in c.changed)}
    out = set()
    for d, c in cells.items():
        bar = 1.0 + max(c.noise_pct, noise_floor(cells, d)) / 100.0
        changed = [c.effects[n] for n in c.changed]
        if changed and not math.isfinite(bar):  # no noise measured yet: nothing can be judged
            out.add(d)
            continue
        if any(math.isfinite(e.ci_low) and e.ci_low > bar for e in changed):
            continue
        if any(not math.isfinite(e.ci_high) or e.ci_high > bar for e in changed):
            out.add(d)
    return out


def judge_phase(
    phase: str, cells: Mapping[int, CellStats], *, rule: str = "sequential", family: Family = "changed"
) -> dict[int, CellStats]:
    """The cells with every verdict judged against the bar the search decides by (``bar_pct``, ``cpu_bar``: the
    larger of the cell's A/A noise and the phase's noise floor at its rounds), the CPU rejection of decode
    changes included, so what the report calls ``faster`` is what compose and confirm act on."""
    if rule not in RULES:
        raise ValueError(f"unknown decision rule {rule!r}")
    cpu_floor = phase_noise(cells, cpu=True)
    noisy = too_noisy([c.noise_pct for c in cells.values()])  # beyond the ceiling the phase claims nothing
    calls = sequential_calls(cells, family=family) if rule == "sequential" else {}
    out = {}
    for d, c in cells.items():
        bar, cpu_bar = max(c.noise_pct, noise_floor(cells, d)), max(c.cpu_noise, cpu_floor)
        if noisy:
            verdicts = dict.fromkeys(c.effects, TOO_NOISY)
        elif rule == "sequential":
            verdicts = {n: calls[(d, n)].verdict if (d, n) in calls else "no difference" for n in c.effects}
        else:
            verdicts = {n: verdict(e, bar) for n, e in c.effects.items()}
        if phase == "tg" and not noisy:
            for n, e in c.effects.items():
                if n != c.aa and n in c.cpu and rejects_cpu_cost(e.ci_low, bar, c.cpu[n].ci_low, cpu_bar):
                    verdicts[n] = CPU_REJECTED
        out[d] = dataclasses.replace(c, verdicts=verdicts, bar_pct=bar, cpu_bar=cpu_bar)
    return out


def compose_phase(phase: str, cells: Mapping[int, CellStats]) -> list[Decision]:
    """A decision per screened depth (sorted by depth), by :func:`judge_phase`'s verdicts under the sequential
    rule; the reason names a decode kernel rejected for its CPU cost (docs/design.md, "CPU% in decode decisions")."""
    out = []
    judged = judge_phase(phase, cells)
    by = "by the decision rule (A/A-controlled, Holm over the phase's points)"
    for d in sorted(judged):
        c = judged[d]
        noise = c.bar_pct
        best, best_e, costly = None, None, []
        for name, e in c.effects.items():
            if name == c.aa or name == c.upstream_kernel:
                continue  # forcing upstream's own kernel changes nothing
            v = c.verdicts[name]
            if v == CPU_REJECTED:
                costly.append(f"{name} (CPU% {c.cpu[name].mean:+.0f} points)")
            elif v == "faster" and (best_e is None or e.ratio > best_e.ratio):
                best, best_e = name, e
        if best_e is None:
            why = f"no forced kernel was faster than upstream {by}" if math.isfinite(noise) else "no A/A noise measured"
            if costly:
                why += f"; {CPU_REJECTED}: {', '.join(costly)}"
            if TOO_NOISY in c.verdicts.values():
                why = f"the phase's A/A noise is above the {NOISE_CEILING_PCT:g}% ceiling: too noisy to claim anything"
            effect, ci = 0.0, (math.nan, math.nan)
        else:
            effect, ci = best_e.pct, (best_e.ci_low, best_e.ci_high)
            why = (
                f"{best} {best_e.pct:+.1f}% (95% CI {100 * (best_e.ci_low - 1):+.1f}..{100 * (best_e.ci_high - 1):+.1f}%) "
                f"is faster than upstream {by}"
            )
        out.append(
            Decision(
                phase=phase,
                depth=d,
                upstream_kernel=c.upstream_kernel,
                winner=best,
                effect_pct=effect,
                ci=ci,
                noise_pct=noise,
                reason=why,
            )
        )
    return out


def rules_from(decisions: Sequence[Decision], shape: Shape) -> tuple[FaRule, ...]:
    """Rules for the non-upstream intervals of one phase's decisions (see the module docstring)."""
    ds = sorted(decisions, key=lambda x: x.depth)
    rules: list[FaRule] = []
    i = 0  # the run's first decision
    for winner, run in itertools.groupby(ds, key=lambda x: x.winner):
        n = len(list(run))
        if winner is not None:
            hi = ds[i + n].depth if i + n < len(ds) else None
            rules.append(shape.rule(Phase.from_bench(ds[i].phase), 0 if i == 0 else ds[i].depth, hi, str(winner)))
        i += n
    return tuple(rules)


def bisect_depths(decisions: Sequence[Decision], screened: Sequence[int]) -> list[int]:
    """Depths halfway between neighbours whose winners differ (a boundary of some rule) and whose effects are
    further apart than the noise: the boundary then moves there. Rounded to llama.cpp's n_kv stride, never a
    depth already screened."""
    ds = sorted(decisions, key=lambda x: x.depth)
    out = []
    for a, b in itertools.pairwise(ds):
        if a.winner == b.winner or (a.winner is None and b.winner is None):
            continue
        if abs(a.effect_pct - b.effect_pct) <= max(a.noise_pct, b.noise_pct):
            continue
        mid = (a.depth + b.depth) // 2 // _STRIDE * _STRIDE
        if a.depth < mid < b.depth and mid not in screened:
            out.append(mid)
    return out
