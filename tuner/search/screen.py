"""Kernel screen: upstream's choice vs every legal forced kernel, per phase and depth, on one build.

One *round* measures every candidate once, back to back, in an order rotated each round; a
candidate's effect at a depth is its paired ratio to upstream within each round (see
:mod:`tuner.measure.paired`). Rounds are added until every cell's CI half-width is at most
``target_ci`` percent, or ``max_rounds``, or the deadline; with a settle rule (the search passes
:func:`tuner.search.compose.open_depths`), a depth whose decision is settled gets no rounds past the
minimum, so the rounds go where a decision is still open (a long-context cell on the 1B needed ~12). Prefill and decode are judged
separately: what one phase measures never stops the other. Where the measure can run both phases in
one llama-bench call (:func:`run_joint_rounds`), a round pairs a prefill candidate with a decode
candidate per call, so the two phases share every depth fill, the larger part of a long-context call.

Upstream's own pick per depth is read from the patched build's ``GGML_TUNER_FA_LOG`` lines, so the
forced candidate equal to it is a built-in A/A pair that measures the noise. Where no kernel can be
forced (the CPU backend), an explicit second upstream candidate is the A/A pair. The decisions (claim,
keep upstream, more rounds) are :mod:`tuner.measure.decide`'s, through
:func:`tuner.search.compose.judge_phase` and :func:`tuner.search.compose.open_depths`: each round records
its stop rule's limits (``limits``), the looks that rule accounts for.

The round records are plain JSON (stored in the study, so a resumed search adds rounds instead of
starting over). Next to t/s (``values``) they keep what the measure observed in the timed window:
CPU% of the process tree (``cpu``), of its busiest thread (``core``) and GPU% (``gpu``); records of
older studies lack them, and everything derived from them is then NaN.

Decode cells apply the CPU% rule (docs/design.md, "CPU% in decode decisions"; :func:`tuner.measure.paired.rejects_cpu_cost`): a candidate whose
CPU% rises beyond the A/A pair's CPU noise without a t/s gain beyond the t/s noise gets the verdict
``rejected: CPU% up without a t/s gain``.
"""

from __future__ import annotations

__all__ = [
    "AA_NAME",
    "UPSTREAM",
    "AllCallsFailed",
    "BudgetReached",
    "Candidate",
    "CellStats",
    "JointMeasure",
    "Measure",
    "PhaseScreen",
    "Settle",
    "budget_deadline",
    "candidates_for",
    "check_fits",
    "depths_to_measure",
    "merge_call",
    "run_joint_rounds",
    "run_phase_rounds",
    "summarize_phase",
]

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

from tuner import log, progress
from tuner.errors import TunerError
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
    rotated,
    verdict,
)
from tuner.measure.stats import median
from tuner.plan.fa_rules import FaRule, Phase, parse_fa_rules, rules_env


class BudgetReached(Exception):
    """The time budget ended a stage; rerunning the same command resumes it."""


class AllCallsFailed(TunerError):
    """Every llama-bench call of a stage's rounds so far failed (a model that does not load, a build that
    crashes): nothing can be compared, so the search stops (exit 1) instead of composing from no data.
    The failed round is not stored; rerunning after the fix measures it again."""

    def __init__(self, tag: str, calls: int, errors: Sequence[str]) -> None:
        self.tag, self.calls, self.errors = tag, calls, list(errors)
        said, where = _bench_said(errors[0] if errors else "")
        super().__init__(
            f"all {calls} llama-bench call(s) of the first {tag} round failed, so nothing was measured; "
            f"llama-bench said: {said!r}" + (f" (log: {where})." if where else ".")
        )


def _bench_said(error: str) -> tuple[str, str]:
    """llama-bench's own last lines for a failed call's error text (read from the log it names), and the log."""
    import re
    from pathlib import Path

    m = re.search(r"see (\S+\.log)", error)
    log_file = m[1] if m else ""
    try:
        lines = Path(log_file).read_text(errors="replace").splitlines() if log_file else []
    except OSError:
        lines = []
    if not lines:
        lines = error.split("Last lines:", 1)[-1].splitlines()
    # the command line (first line of a log) and progress lines say nothing about the failure
    keep = [
        ln.strip()
        for ln in lines
        if ln.strip() and not ln.startswith("$ ") and not ln.startswith("llama-bench: benchmark")
    ]
    keep = list(dict.fromkeys(keep))  # a retried call repeats its error
    return (" | ".join(keep[-3:]) or error[:300] or "no error text"), log_file


UPSTREAM = "upstream"
AA_NAME = "upstream-aa"
EARLY_SETTLE_ROUNDS = 2
"""Rounds after which a depth settled by futility stops, below ``min_rounds`` (:func:`depths_to_measure`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
    """One runtime configuration measured in a round."""

    name: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    args: tuple[str, ...] = ()
    kernel: str | None = None
    """The kernel this candidate forces (None: upstream's own choice)."""


# measure(candidate, phase, depths, label) -> {depth: {"ts": float|None, "kernel": str|None,
#                                                      "why": str|None, "error": str,
#                                                      optional "cpu"/"core"/"gpu": float|None}}
Measure = Callable[[Candidate, str, Sequence[int], str], Mapping[int, Mapping[str, Any]]]


# joint(candidate, phases, depths, label) -> {phase: {depth: {...as Measure...}}}: one llama-bench call
# measuring several phases at the same depths, so they share each depth's fill (llama-bench keeps the
# context state of the last depth it filled and restores it for the next test at that depth).
JointMeasure = Callable[[Candidate, Sequence[str], Sequence[int], str], Mapping[str, Mapping[int, Mapping[str, Any]]]]

# settle(phase, cells) -> the depths whose decision more rounds could still change
# (tuner.search.compose.open_depths); the others get no more rounds once they have the minimum.
Settle = Callable[[str, "PhaseScreen"], Set[int]]


def candidates_for(
    phase: str, kernels: Sequence[str], *, base_env: Mapping[str, str] | None = None, base_args: Sequence[str] = ()
) -> list[Candidate]:
    """Upstream plus one forced candidate per kernel (or the A/A twin when nothing can be forced).

    ``base_env``/``base_args`` are applied to every candidate (the knobs pinned with --set).
    """
    env = dict(base_env or {})
    out = [Candidate(name=UPSTREAM, env=env, args=tuple(base_args))]
    if not kernels:
        return out + [Candidate(name=AA_NAME, env=env, args=tuple(base_args))]
    for k in kernels:
        forced = FaRule(phase=Phase.from_bench(phase), lo=0, hi=None, kernel=k)
        out.append(
            Candidate(name=k, env={**env, "GGML_TUNER_FA_RULES": rules_env([forced])}, args=tuple(base_args), kernel=k)
        )
    return out


def run_phase_rounds(
    measure: Measure,
    phase: str,
    candidates: Sequence[Candidate],
    depths: Sequence[int],
    rounds: list[dict[str, Any]],
    *,
    min_rounds: int = 3,
    max_rounds: int = 6,
    target_ci: float = 1.0,
    deadline: float | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    tag: str = "screen",
    prior: Sequence[Mapping[str, Any]] = (),
    settle: Settle | None = None,
) -> list[dict[str, Any]]:
    """Add rounds for ``phase`` at ``depths`` to ``rounds`` (records of earlier calls count) until
    the stop rule holds; returns the records for these depths. ``on_round`` persists each record."""

    def one(
        c: Candidate, phases: Sequence[str], ds: Sequence[int], label: str
    ) -> dict[str, Mapping[int, Mapping[str, Any]]]:
        return {phases[0]: measure(c, phases[0], ds, label)}

    return run_joint_rounds(
        one,
        {phase: candidates},
        depths,
        rounds,
        pp_tokens=0,
        min_rounds=min_rounds,
        max_rounds=max_rounds,
        target_ci=target_ci,
        deadline=deadline,
        on_round=on_round,
        tag=tag,
        prior=prior,
        settle=settle,
    )[phase]


def _phase_rules(cand: Candidate, phase: str) -> list[FaRule]:
    """The candidate's FA rules that act on ``phase`` (read back from the env its llama-bench gets)."""
    want = Phase.from_bench(phase)
    return [r for r in parse_fa_rules(cand.env.get("GGML_TUNER_FA_RULES", "")) if r.phase is want]


def merge_call(by_phase: Mapping[str, Candidate], *, depths: Sequence[int], pp_tokens: int) -> Candidate | None:
    """One candidate that runs each phase's candidate in one process, or None where they cannot share one.

    Kernel rules act per phase, so a prefill candidate and a decode candidate combine; anything else
    (process env, bench args) must be equal. A forced prefill kernel is narrowed to the timed tests'
    n_kv windows ``(d, d + pp + 256]`` so the untimed depth fill runs upstream's prefill kernel
    whichever candidate is measured (a slow forced kernel would otherwise slow every fill).
    """
    cands = list(by_phase.values())
    rest = [({k: v for k, v in c.env.items() if k != "GGML_TUNER_FA_RULES"}, c.args) for c in cands]
    if any(r != rest[0] for r in rest[1:]):
        return None
    rules: list[FaRule] = []
    for phase, c in by_phase.items():
        for r in _phase_rules(c, phase):
            if r == FaRule(phase=Phase.PREFILL, lo=0, hi=None, kernel=str(c.kernel)):  # a forced prefill kernel
                rules += [dataclasses.replace(r, lo=d + 1, hi=d + pp_tokens + 257) for d in depths]
            else:
                rules.append(r)
    env = dict(rest[0][0]) | ({"GGML_TUNER_FA_RULES": rules_env(rules)} if rules else {})
    return Candidate(name="+".join(c.name for c in cands), env=env, args=rest[0][1])


def run_joint_rounds(
    joint: JointMeasure,
    cands: Mapping[str, Sequence[Candidate]],
    depths: Sequence[int],
    rounds: list[dict[str, Any]],
    *,
    pp_tokens: int,
    min_rounds: int = 3,
    max_rounds: int = 6,
    target_ci: float = 1.0,
    deadline: float | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    tag: str = "screen",
    prior: Sequence[Mapping[str, Any]] = (),
    settle: Settle | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """:func:`run_phase_rounds` for several phases at once, sharing llama-bench calls.

    ``prior``: rounds of an earlier stage, used only to estimate this loop's first round against
    the deadline. ``settle``: see :func:`depths_to_measure`.

    Call ``j`` of a round runs the ``j``-th candidate of each phase's rotated order in one process;
    the records are the same per-phase records, so each phase's stop rule, summary and resume stay
    its own: a phase that has met its target stops adding rows while the other goes on. A round
    measures only the depths some active phase still needs (both phases at their union, sharing fills).
    """
    want = set(depths)
    mine = {p: [r for r in rounds if r["phase"] == p and want & {int(d) for d in r["depths"]}] for p in cands}
    calls = max(len(c) for c in cands.values()) * max(0, max_rounds - min(len(m) for m in mine.values()))
    with progress.track(
        f"{tag} {'+'.join(cands)} (up to {max_rounds} rounds)", total=calls, unit="measuring calls"
    ) as bar:
        while True:
            todo = {p: depths_to_measure(p, mine[p], depths, min_rounds, max_rounds, target_ci, settle) for p in cands}
            active = [p for p in cands if todo[p]]
            if not active:
                break
            ds = sorted({d for p in active for d in todo[p]})
            n_calls = max(len(cands[p]) for p in active)
            est = _round_estimate([r for p in active for r in mine[p]], prior, n_calls, ds)
            if deadline is not None and time.monotonic() + est > deadline:
                n, left = min(len(mine[p]) for p in active), max(0.0, deadline - time.monotonic())
                what = f"{tag} {'+'.join(active)} round {n + 1} (about {est:.0f} s, {left:.0f} s left)"
                log.warning(
                    f"no time for {what} within the budget; rerun the same command to add rounds"
                    + ("" if n else ", with a --time-budget long enough for one")
                )
                raise BudgetReached(what)
            recs = _joint_round(joint, {p: cands[p] for p in active}, ds, mine, bar, pp_tokens=pp_tokens, tag=tag)
            # A round without one number, in a stage that has none yet (``rounds`` holds every phase's
            # records): the model or the build does not run at all. A phase failing beside one that
            # measures is data (a prefill crash never stops decode), and is kept as such.
            if not _any_value(recs.values()) and not _any_value(rounds):
                raise AllCallsFailed(
                    tag,
                    max(len(cands[p]) for p in active),
                    sorted({e for r in recs.values() for e in r["errors"].values()}),
                )
            for p, rec in recs.items():
                rec["limits"] = [min_rounds, max_rounds]  # the looks the decision rule accounts for
                mine[p].append(rec)
                rounds.append(rec)
                if on_round is not None:
                    on_round(rec)
                st = summarize_phase(p, mine[p], depths)
                worst = max((c.max_halfwidth for c in st.values()), default=math.inf)
                others = "+".join(q for q in recs if q != p) if rec["shared"] else ""
                where = "" if ds == sorted(want) else f" at depths {ds} (the others are settled)"
                log.info(
                    f"  {tag} {p} round {rec['round'] + 1}/{max_rounds}{where} ({rec['seconds']:.0f} s"
                    + (f", calls shared with {others}" if others else "")
                    + f"): {ci_note(len(mine[p]), worst, min_rounds, max_rounds, target_ci)}"
                    + (f"; errors: {rec['errors']}" if rec["errors"] else "")
                )
    return mine


def ci_note(n_rounds: int, worst: float, min_rounds: int, max_rounds: int, target_ci: float) -> str:
    """A round's progress note: the widest CI so far and what stops the rounds. One round has no CI (inf),
    and a target of 0 means the rounds are counted, not sized to a CI: "over ±100% (target ±0%)" there
    read as a failed measurement."""
    if n_rounds < 2:
        wide = "widest 95% CI after round 2"
    else:
        wide = "widest 95% CI " + (f"±{worst:.1f}%" if worst < 100 else "over ±100%")
    if target_ci > 0:
        goal = f"target ±{target_ci:g}%"
    elif min_rounds >= max_rounds:
        goal = "a fixed number of rounds"
    else:
        goal = f"{min_rounds} rounds, more only where the verdict is open"
    return f"{wide} ({goal})"


def budget_deadline(started: float | None, seconds: float | None) -> float | None:
    """The ``time.monotonic()`` deadline of a ``--time-budget`` of ``seconds`` counted from ``started`` (the
    command's start: its build and model count too; None: from now); None without a budget."""
    if not seconds:
        return None
    return (time.monotonic() if started is None else started) + seconds


def check_fits(deadline: float | None, seconds: float, what: str) -> None:
    """BudgetReached where ``what``, priced at ``seconds``, would end past ``deadline`` (a unit that is not a
    round: a build, a model's synthesis), so it is not started to be cut off."""
    if deadline is not None and time.monotonic() + seconds > deadline:
        raise BudgetReached(f"{what} (about {seconds:.0f} s, {max(0.0, deadline - time.monotonic()):.0f} s left)")


def _round_estimate(
    done: Sequence[Mapping[str, Any]],
    prior: Sequence[Mapping[str, Any]] = (),
    n_calls: int = 1,
    depths: Sequence[int] = (0,),
) -> float:
    """The next round's seconds, judged by the longest round so far (a killed call loses its round in flight;
    stopping before it keeps the budget's promise). Before this loop's first round, the slowest call of
    ``prior`` rounds is scaled to this round's calls and depths (a confirm stage started with too little time
    left would be killed mid-round; a fresh study's screen passes its price, :func:`tuner.search.cost.priced_screen_call`);
    0 without either."""
    est = max((float(r.get("seconds") or 0) for r in done), default=0.0)
    if not done:
        # The latest rounds only: an older one may have run another way (an H100 confirm, results/sm_90/llama-3.1-8b-q4_k_m/evidence, was
        # held back by a 337 s round of an earlier version, when the screen's last rounds took 240 s).
        recent = [r for r in prior if r.get("seconds") and r.get("depths")][-4:]
        rates = [float(r["seconds"]) / (max(1, len(r.get("order") or ())) * _call_weight(r["depths"])) for r in recent]
        est = max(rates, default=0.0) * n_calls * _call_weight(depths)
    return est


def _call_weight(depths: Sequence[int]) -> float:
    # A call's time grows with the tokens it fills (the depths) plus a fixed cost per depth's tests.
    return float(sum(int(d) for d in depths) + 4096 * len(depths))


def depths_to_measure(
    phase: str,
    mine: Sequence[Mapping[str, Any]],
    depths: Sequence[int],
    min_rounds: int,
    max_rounds: int,
    target_ci: float,
    settle: Settle | None = None,
) -> list[int]:
    """The depths of ``depths`` the next round of ``phase`` measures (empty: the phase is done).

    Each depth gets rounds until it has ``min_rounds``; after that until its widest CI is within
    ``target_ci``, or it has ``max_rounds``, or (with ``settle``) its decision is settled. Rounds
    are counted per depth: a round that measured only the open depths counts for those.

    A depth that ``settle`` calls settled after :data:`EARLY_SETTLE_ROUNDS` rounds stops there, before
    ``min_rounds``: below the minimum nothing can be claimed (the decision rule gives those round counts
    no alpha), so a settled depth is one where every candidate that runs another kernel than upstream's
    is settled by futility (its upper bound is below the practical minimum, e.g. TILE forced for
    prefill on an H100 at a tenth of MMA's speed); not a depth where none does (a confirm's points
    outside every rule: those keep ``min_rounds``, their A/A rounds are the noise the report shows). Stopping there
    only gives up claims, so the rule's error guarantee is unchanged.
    """
    st = summarize_phase(phase, mine, depths)
    n = {d: sum(1 for r in mine if str(d) in r["values"].get(UPSTREAM, {})) for d in depths}
    open_ = settle(phase, st) if settle is not None else set(depths)
    out = []
    for d in depths:
        settled_early = (
            settle is not None and d not in open_ and n[d] >= EARLY_SETTLE_ROUNDS and d in st and bool(st[d].changed)
        )
        if (n[d] < min_rounds and not settled_early) or (
            n[d] < max_rounds and d in open_ and not (d in st and st[d].max_halfwidth <= target_ci)
        ):
            out.append(d)
    return out


def phase_stops(
    phase: str,
    mine: Sequence[Mapping[str, Any]],
    depths: Sequence[int],
    min_rounds: int,
    max_rounds: int,
    target_ci: float,
    settle: Settle | None = None,
) -> bool:
    return not depths_to_measure(phase, mine, depths, min_rounds, max_rounds, target_ci, settle)


def _joint_round(
    joint: JointMeasure,
    cands: Mapping[str, Sequence[Candidate]],
    depths: Sequence[int],
    mine: Mapping[str, Sequence[Mapping[str, Any]]],
    bar: Any,
    *,
    pp_tokens: int,
    tag: str,
) -> dict[str, dict[str, Any]]:
    """One round of every active phase; returns its record per phase."""
    orders = {p: rotated([c.name for c in cs], len(mine[p])) for p, cs in cands.items()}
    recs: dict[str, dict[str, Any]] = {
        p: {
            "phase": p,
            "depths": [int(d) for d in depths],
            "round": len(mine[p]),
            "order": orders[p],
            "values": {},
            "kernels": {},
            "why": {},
            "errors": {},
            "t": time.time(),
            "shared": False,
        }
        for p in cands
    }
    t0 = time.monotonic()
    for j in range(max(len(o) for o in orders.values())):
        pick = {p: next(c for c in cands[p] if c.name == orders[p][j]) for p in cands if j < len(orders[p])}
        merged = merge_call(pick, depths=depths, pp_tokens=pp_tokens) if len(pick) > 1 else None
        groups = [(merged, list(pick))] if merged is not None else [(c, [p]) for p, c in pick.items()]
        for p in pick if merged is not None else ():
            recs[p]["shared"] = True
        for cand, phases in groups:
            label = f"{tag}-{'+'.join(phases)}-r{min(recs[p]['round'] for p in phases)}-{cand.name}"
            res = joint(cand, phases, depths, label)
            for p in phases:
                _store(recs[p], pick[p].name, res.get(p, {}), depths)
        bar.advance()
    for rec in recs.values():
        rec["seconds"] = round(time.monotonic() - t0, 1)
    return recs


def _any_value(records: Any) -> bool:
    """True when some round record holds a measured t/s (a call that ran)."""
    return any(v is not None for r in records for vals in r["values"].values() for v in vals.values())


OBSERVED = ("cpu", "core", "gpu")
"""Utilizations a measure may report per depth, stored per candidate beside ``values`` (percent)."""


def _store(rec: dict[str, Any], name: str, res: Mapping[int, Mapping[str, Any]], depths: Sequence[int]) -> None:
    rec["values"][name] = {str(d): _num(res.get(d, {}).get("ts")) for d in depths}
    for key in OBSERVED:
        rec.setdefault(key, {})[name] = {str(d): _util(res.get(d, {}).get(key)) for d in depths}
    rec["kernels"][name] = {str(d): res.get(d, {}).get("kernel") for d in depths}
    rec["why"][name] = {str(d): res.get(d, {}).get("why") for d in depths}
    errs = sorted({str(res[d]["error"]) for d in res if res[d].get("error")})
    if errs:
        rec["errors"][name] = "; ".join(errs)[:500]


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def _util(x: Any) -> float | None:
    """A utilization in percent as stored (0 is a real value, unlike a t/s of 0); None when unknown."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return round(v, 2) if math.isfinite(v) and v >= 0 else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellStats:
    """One (phase, depth) of a screen: upstream's kernel, the A/A noise and each candidate's effect."""

    depth: int
    upstream_kernel: str | None
    aa: str | None
    """The candidate used as the A/A pair here."""
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
    """The A/A pair's CPU% noise (points; infinite when unknown)."""
    levels: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    """Per candidate (upstream included): median ``ts``, ``cpu``, ``core`` and ``gpu`` over the rounds."""
    kernels: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    """Per candidate (upstream included): the kernel it ran most often here (None where unknown)."""
    bar_pct: float = math.nan
    """The t/s bar the verdicts were judged against: the A/A noise, at least the phase's noise floor
    (:func:`tuner.search.compose.judge_phase`); NaN while only this cell's own noise judged them."""
    cpu_bar: float = math.nan
    """The CPU% bar likewise (points)."""
    series: Mapping[str, tuple[float | None, ...]] = dataclasses.field(default_factory=dict)
    """Per candidate (upstream included; fallbacks left out): its t/s in each round, aligned by round
    (what :mod:`tuner.measure.decide` tests; not stored, the rounds are)."""
    limits: tuple[int, int] = DEFAULT_LIMITS
    """The rounds' stop rule (min_rounds, max_rounds): the round counts a cell could stop at (records
    without it: the default limits, the maximum widened to the rounds measured)."""

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

    def as_dict(self) -> dict[str, Any]:
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
            verdicts.update(
                {
                    n: CPU_REJECTED
                    for n in effects
                    if n != aa and rejects_cpu_cost(effects[n].ci_low, noise, cpu[n].ci_low, cpu_noise)
                }
            )
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
    """The (min, max) rounds of the stop rule the records were measured under (a resumed search with a raised
    cap: the widest); records before it was stored: the default limits, the maximum widened to the rounds."""
    recorded = [(int(r["limits"][0]), int(r["limits"][1])) for r in recs if r.get("limits")]
    if recorded:
        return min(x[0] for x in recorded), max(x[1] for x in recorded)
    return DEFAULT_LIMITS[0], max(DEFAULT_LIMITS[1], len(recs))


def _series(recs: Sequence[Mapping[str, Any]], key: str, name: str, depth: str) -> list[float | None]:
    """One candidate's per-round values at a depth: ``ts`` (from ``values``) or an OBSERVED key
    (None in rounds, or whole records of older studies, that lack it)."""
    field = "values" if key == "ts" else key
    return [r.get(field, {}).get(name, {}).get(depth) for r in recs]
