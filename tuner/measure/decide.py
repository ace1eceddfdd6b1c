"""The search's decision rule: A/A-controlled paired differences, Holm over cells, Bonferroni over looks.

One *cell* is a candidate at one depth of one phase. In every round the candidate, upstream and the A/A
twin (upstream again, or the forced kernel upstream picks anyway) are measured back to back; the cell's
per-round statistic is

    d_i = log(candidate_i / upstream_i) - log(twin_i / upstream_i)

(``log(candidate_i / twin_i)``): round-level drift cancels, and so does any bias the harness gives a forced
candidate, since the twin carries it too. The A/A noise is inside the interval of ``mean(d)``, so the
interval is not widened by a separate noise bar again (the earlier rule needed effect > noise + half-width).
The variance is pooled over the configurations of each depth (the two-way residual mean square with
(R-1)(C-1) degrees of freedom, as :func:`tuner.measure.paired.block_effects`), with ``pool="phase"`` over
the phase's depths too; ``se = sqrt(2 s^2 / R)``, Student-t.

Decision per *family* (the cells of one phase, each phase gets ``alpha / 2``). A cell whose candidate ran
upstream's own kernel (:func:`tuner.rounds.compose.sequential_calls`) is A/A by construction: it is not
tested and does not raise the others' Holm thresholds (which kernel ran decides it, not the measured t/s):

1. each p-value of ``mean(d) = 0`` is divided by the alpha share of the round count ``n`` it stopped at
   (weighted Bonferroni over the sequential looks ``min_rounds..max_rounds``, :func:`look_weight`: the last
   gets 0.8, where most undecided cells end, the earlier ones share 0.2; the shares sum to 1, so ``p /
   share`` is valid whatever the data-dependent stopping);
2. Holm's step-down over the family's adjusted p-values at the family's alpha;
3. a rejected cell is ``faster`` when ``mean(d) >= log(1 + min_effect)`` (2%: a condition on the estimate
   that keeps tiny real effects from being claimed), ``slower`` when ``mean(d) < 0`` (any proven slowdown
   counts: it only protects upstream);
4. an unrejected cell is *settled* (``no difference``) when the one-sided 95% upper bound of its effect is
   below the practical minimum; else it is *open* and gets more rounds (up to ``max_rounds``).

By the union bound over the looks and Holm's guarantee, a false claim in a family has probability at most
``alpha`` under any dependence between cells and rounds; futility stops and the minimum effect only remove
claims. ``tools/power.py`` measures the rule on the recorded rounds (docs/decision-rule.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal, TypeVar

from scipy import stats as _stats

from tuner.measure.paired import complete_logs, residual

ALPHA = 0.05
"""Family-wise error of a search: the chance that it claims anything where nothing differs."""
PHASE_ALPHA = ALPHA / 2
"""Each phase (prefill, decode) is a family with half of :data:`ALPHA`."""
MIN_EFFECT_PCT = 2.0
"""The smallest effect, percent, a claim is made for (the point estimate must reach it)."""
DEFAULT_LIMITS = (3, 6)
"""The search's default round limits (``--min-rounds``, ``--max-rounds``): the round counts a cell can stop at."""
FINAL_SHARE = 0.8
"""The share of a cell's alpha spent at the last look (``max_rounds``); the earlier looks share the rest."""
RULE_NAME = "A/A-controlled paired t, Holm over cells, Bonferroni over looks"

Pool = Literal["depth", "phase"]
K = TypeVar("K", bound=Hashable)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellTest:
    """One cell's statistic: ``mean`` of the per-round ``d_i`` (log), its standard error and df."""

    n: int
    mean: float
    se: float
    df: int

    @property
    def p_two(self) -> float:
        """Two-sided p-value of ``mean = 0`` (1.0 when unknown)."""
        if self.df < 1 or not (math.isfinite(self.se) and self.se > 0 and math.isfinite(self.mean)):
            return 1.0
        return float(2.0 * _stats.t.sf(abs(self.mean) / self.se, self.df))

    def upper(self, level: float) -> float:
        """One-sided upper confidence bound of ``mean`` at ``level`` (inf when unknown)."""
        if self.df < 1 or not (math.isfinite(self.se) and math.isfinite(self.mean)):
            return math.inf
        return self.mean + float(_stats.t.ppf(level, self.df)) * self.se


@dataclasses.dataclass(frozen=True, kw_only=True)
class Call:
    """The rule's decision for one cell."""

    verdict: Literal["faster", "slower", "no difference"]
    settled: bool
    """True when more rounds cannot change the decision's direction (a claim, or futility)."""
    p_adjusted: float
    """``p / look_weight`` (capped at 1), the value Holm's step compares."""
    effect_pct: float
    """``100 * (exp(mean(d)) - 1)``, NaN when unknown."""


def phase_tests(
    depths: Mapping[int, tuple[Mapping[str, Sequence[float | None]], str, str, Sequence[str]]], *, pool: Pool = "depth"
) -> dict[int, dict[str, CellTest]]:
    """Each candidate's :class:`CellTest` at every depth of a phase: ``depths[d]`` is (values, reference, twin,
    candidates), ``values[name][i]`` a config's t/s in round ``i``. Only rounds where the reference, the twin and
    every candidate have a value count (complete blocks). The variance is the depth's two-way residual mean
    square over those configurations; ``pool="phase"`` pools it over the phase's depths."""
    ys = {d: complete_logs(v, [ref, twin, *cands]) for d, (v, ref, twin, cands) in depths.items()}
    res = {d: residual(y) for d, y in ys.items()}  # each depth's (SS, df)
    tot_ss, tot_df = sum(r[0] for r in res.values()), sum(r[1] for r in res.values())
    out: dict[int, dict[str, CellTest]] = {}
    for d, y in ys.items():
        ss, df = (tot_ss, tot_df) if pool == "phase" else res[d]
        s2 = ss / df if df > 0 else math.nan
        se = math.sqrt(2.0 * s2 / len(y)) if y and df > 0 else math.inf
        # the mean of d_i = log(candidate_i / upstream_i) - log(twin_i / upstream_i) over the rounds
        out[d] = {
            c: CellTest(
                n=len(y),
                mean=sum((r[2 + j] - r[0]) - (r[1] - r[0]) for r in y) / len(y) if y else math.nan,
                se=se,
                df=df,
            )
            for j, c in enumerate(depths[d][3])
        }
    return out


def holm(p: Mapping[K, float], alpha: float) -> set[K]:
    """The keys Holm's step-down procedure rejects at family-wise level ``alpha``."""
    order = sorted(p, key=lambda k: p[k])
    m = len(order)
    out: set[K] = set()
    for i, k in enumerate(order):
        if not p[k] <= alpha / (m - i):
            break
        out.add(k)
    return out


def look_weight(n: int, limits: tuple[int, int] = DEFAULT_LIMITS, final_share: float = FINAL_SHARE) -> float:
    """The share of alpha a cell stopped after ``n`` rounds may spend (weighted Bonferroni over looks).

    The looks are the round counts ``min_rounds..max_rounds``: the last gets ``final_share``, each earlier
    one an equal part of the rest, so the shares sum to 1 over the looks; a count outside them gets 0 (no
    claim before the minimum, nor past a maximum the rounds were not planned for)."""
    lo, hi = limits
    if not lo <= n <= hi:
        return 0.0
    if lo == hi:
        return 1.0
    return final_share if n == hi else (1.0 - final_share) / (hi - lo)


def decide(
    tests: Mapping[K, CellTest],
    *,
    limits: tuple[int, int] = DEFAULT_LIMITS,
    final_share: float = FINAL_SHARE,
    alpha: float = PHASE_ALPHA,
    min_effect_pct: float = MIN_EFFECT_PCT,
) -> dict[K, Call]:
    """The rule (module docstring) over one family of cells; ``limits``: the rounds' (min, max)."""
    if not (1 <= limits[0] <= limits[1] and 0.0 < final_share <= 1.0):
        raise ValueError(f"bad round limits {limits} or final share {final_share}")
    weight = {k: look_weight(t.n, limits, final_share) for k, t in tests.items()}
    adj = {k: min(1.0, t.p_two / weight[k]) if weight[k] > 0 else 1.0 for k, t in tests.items()}
    rejected = holm(adj, alpha)
    floor = math.log1p(min_effect_pct / 100.0)
    out: dict[K, Call] = {}
    for k, t in tests.items():
        eff = 100.0 * math.expm1(t.mean) if math.isfinite(t.mean) else math.nan
        if k in rejected and t.mean >= floor:
            out[k] = Call(verdict="faster", settled=True, p_adjusted=adj[k], effect_pct=eff)
        elif k in rejected and t.mean < 0:
            out[k] = Call(verdict="slower", settled=True, p_adjusted=adj[k], effect_pct=eff)
        else:
            settled = t.upper(0.95) < floor
            out[k] = Call(verdict="no difference", settled=settled, p_adjusted=adj[k], effect_pct=eff)
    return out


def method_text() -> str:
    """The rule in one paragraph, for reports whose verdicts it decided."""
    return (
        f"Verdict ({RULE_NAME}): per round, the log ratio candidate/upstream minus the A/A pair's log ratio; "
        "a Student-t test of its mean (variance pooled over the round's configurations) against zero, its p-value "
        f"divided by the share of alpha of the round count the point stopped at ({FINAL_SHARE:g} at the maximum, "
        "the rest split over the earlier counts), Holm's step-down over a phase's "
        f"points at {PHASE_ALPHA * 100:g}% ({ALPHA * 100:g}% for the search); faster only where that rejects and the "
        f"estimate is at least +{MIN_EFFECT_PCT:g}%, slower where it rejects below zero."
    )
