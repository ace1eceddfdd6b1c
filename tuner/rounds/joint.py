"""Paired rounds: every candidate measured once per round, back to back, in an order rotated each round.

Rounds are added until every cell's CI half-width is at most ``target_ci`` percent, or ``max_rounds``, or the
deadline; with a settle rule (:func:`tuner.rounds.compose.open_depths`) a settled depth gets no rounds past the
minimum, so the rounds go where a decision is still open. Prefill and decode are judged separately. Where the
measure can run both phases in one llama-bench call (:func:`run_joint_rounds`), they share every depth fill, the
larger part of a long-context call. The kernel screen's candidates (:func:`candidates_for`: upstream's choice vs
every legal forced kernel) run in the one-phase form, :func:`run_phase_rounds`.

The round records are plain JSON stored in the study, so a resumed search adds rounds. Next to t/s (``values``)
they keep CPU% of the process tree (``cpu``), of its busiest thread (``core``) and GPU% (``gpu``); records of
older studies lack them (derived values are then NaN), and each records its stop rule's limits (``limits``).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tuner import log, progress
from tuner.errors import TunerError
from tuner.measure.paired import rotated
from tuner.plan.fa_rules import FaRule, Phase, parse_fa_rules, rules_env
from tuner.rounds.budget import UNBOUNDED, Budget, BudgetReached
from tuner.rounds.stats import AA_NAME, OBSERVED, UPSTREAM, PhaseScreen, summarize_phase


class AllCallsFailed(TunerError):
    """Every llama-bench call of a stage's rounds so far failed: the search stops (exit 1) instead of composing
    from no data. The failed round is not stored."""

    def __init__(self, tag: str, calls: int, errors: Sequence[str]) -> None:
        self.tag, self.calls, self.errors = tag, calls, list(errors)
        said, where = _bench_said(errors[0] if errors else "")
        # a signal's known cause (targets.host.crash_hint), which the truncated text would lose
        self.crash = next((e[e.index(_KILLED) :].strip() for e in self.errors if _KILLED in e), "")
        super().__init__(
            f"all {calls} llama-bench call(s) of the first {tag} round failed, so nothing was measured; "
            f"llama-bench said: {said!r}" + (f" (log: {where})." if where else ".")
        )


_KILLED = "llama-bench was killed by"


def _bench_said(error: str) -> tuple[str, str]:
    """llama-bench's own last lines for a failed call's error text (from the log it names), and the log."""
    m = re.search(r"see (\S+\.log)", error)
    log_file = m[1] if m else ""
    try:
        lines = Path(log_file).read_text(errors="replace").splitlines() if log_file else []
    except OSError:
        lines = []
    if not lines:
        lines = error.split("Last lines:", 1)[-1].splitlines()
    # the command line (first line of a log) and progress lines say nothing about the failure
    keep = [ln.strip() for ln in lines if ln.strip() and not ln.startswith(("$ ", "llama-bench: benchmark"))]
    keep = list(dict.fromkeys(keep))  # a retried call repeats its error
    return (" | ".join(keep[-3:]) or error[:300] or "no error text"), log_file


EARLY_SETTLE_ROUNDS = 2
"""Rounds after which a depth settled by futility stops, below ``min_rounds`` (:func:`depths_to_measure`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
    """One runtime configuration measured in a round."""

    name: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    args: tuple[str, ...] = ()
    kernel: str | None = None
    """The kernel this candidate forces (None: upstream's choice)."""


Point = Mapping[str, Any]
"""What a measure returns per depth: ``{"ts": float|None, "kernel": str|None, "why": str|None, "error": str,
optional "cpu"/"core"/"gpu": float|None}``."""

# joint(candidate, phases, depths, label) -> {phase: {depth: Point}}: one llama-bench call, several phases
JointMeasure = Callable[[Candidate, Sequence[str], Sequence[int], str], Mapping[str, Mapping[int, Point]]]


class Measure(Protocol):
    """``measure(candidate, phase, depths, label) -> {depth: Point}``: one call of one phase."""

    def __call__(self, cand: Candidate, phase: str, depths: Sequence[int], label: str, /) -> Mapping[int, Point]: ...


@runtime_checkable
class SharedMeasure(Measure, Protocol):
    """A :class:`Measure` that also runs several phases in one call (``joint``), sharing each depth's fill."""

    joint: JointMeasure


# settle(phase, cells) -> the depths whose decision more rounds could still change
Settle = Callable[[str, "PhaseScreen"], Set[int]]


def merge_call(by_phase: Mapping[str, Candidate], *, depths: Sequence[int], pp_tokens: int) -> Candidate | None:
    """One candidate that runs each phase's candidate in one process, or None where env or args differ.

    A forced prefill kernel is narrowed to the timed tests' n_kv windows ``(d, d + pp + 256]`` so the untimed
    depth fill runs upstream's prefill kernel whichever candidate is measured."""
    cands = list(by_phase.values())
    rest = [({k: v for k, v in c.env.items() if k != "GGML_TUNER_FA_RULES"}, c.args) for c in cands]
    if any(r != rest[0] for r in rest[1:]):
        return None
    rules: list[FaRule] = []
    for phase, c in by_phase.items():
        want = Phase.from_bench(phase)
        for r in parse_fa_rules(c.env.get("GGML_TUNER_FA_RULES", "")):
            if r.phase is not want:
                continue
            if r == FaRule(phase=Phase.PREFILL, lo=0, hi=None, kernel=str(c.kernel)):  # a forced prefill kernel
                rules += [dataclasses.replace(r, lo=d + 1, hi=d + pp_tokens + 257) for d in depths]
            else:
                rules.append(r)
    env = dict(rest[0][0]) | ({"GGML_TUNER_FA_RULES": rules_env(rules)} if rules else {})
    return Candidate(name="+".join(c.name for c in cands), env=env, args=rest[0][1])


def candidates_for(
    phase: str, kernels: Sequence[str], *, base_env: Mapping[str, str] | None = None, base_args: Sequence[str] = ()
) -> list[Candidate]:
    """Upstream plus one forced candidate per kernel (or the A/A twin when nothing can be forced), each with
    ``base_env``/``base_args`` (the knobs pinned with --set)."""
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
    budget: Budget = UNBOUNDED,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    tag: str = "screen",
    prior: Sequence[Mapping[str, Any]] = (),
    settle: Settle | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Paired rounds of several phases at once, call ``j`` of a round running the ``j``-th candidate of each
    phase's rotated order in one process. Records stay per phase. ``prior``: an earlier stage's rounds, pricing
    only this loop's first round against the budget."""
    want = set(depths)
    mine = {p: [r for r in rounds if r["phase"] == p and want & {int(d) for d in r["depths"]}] for p in cands}
    calls = max(len(c) for c in cands.values()) * max(0, max_rounds - min(len(m) for m in mine.values()))
    with progress.track(
        f"{tag} {'+'.join(cands)} (up to {max_rounds} rounds)", total=calls, unit="measuring calls"
    ) as bar:
        while True:
            todo = {
                p: depths_to_measure(p, mine[p], depths, min_rounds, max_rounds, target_ci, settle=settle)
                for p in cands
            }
            active = [p for p in cands if todo[p]]
            if not active:
                break
            ds = sorted({d for p in active for d in todo[p]})
            n_calls = max(len(cands[p]) for p in active)
            est = _round_estimate([r for p in active for r in mine[p]], prior, n_calls, ds)
            n = min(len(mine[p]) for p in active)
            try:
                budget.fits(est, f"{tag} {'+'.join(active)} round {n + 1}")
            except BudgetReached as stop:
                log.warning(
                    f"no time for {stop} within the budget; rerun the same command to add rounds"
                    + ("" if n else ", with a --time-budget long enough for one")
                )
                raise
            recs = _joint_round(joint, {p: cands[p] for p in active}, ds, mine, bar, pp_tokens=pp_tokens, tag=tag)
            # no number in a stage that has none yet: the model or build does not run at all (a phase failing
            # beside one that measures is data, and kept)
            if not _any_value(recs.values()) and not _any_value(rounds):
                raise AllCallsFailed(tag, n_calls, sorted({e for r in recs.values() for e in r["errors"].values()}))
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
    budget: Budget = UNBOUNDED,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    tag: str = "screen",
    prior: Sequence[Mapping[str, Any]] = (),
    settle: Settle | None = None,
) -> list[dict[str, Any]]:
    """Add rounds for ``phase`` at ``depths`` to ``rounds`` (records of earlier calls count) until the stop rule
    holds; returns the records for these depths. The one-phase form of :func:`tuner.rounds.joint.run_joint_rounds`;
    ``on_round`` persists each record."""

    def one(c: Candidate, phases: Sequence[str], ds: Sequence[int], label: str) -> dict[str, Mapping[int, Point]]:
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
        budget=budget,
        on_round=on_round,
        tag=tag,
        prior=prior,
        settle=settle,
    )[phase]


def ci_note(n_rounds: int, worst: float, min_rounds: int, max_rounds: int, target_ci: float) -> str:
    """A round's progress note: the widest CI so far and what stops the rounds (a target of 0: counted rounds)."""
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


def _round_estimate(
    done: Sequence[Mapping[str, Any]], prior: Sequence[Mapping[str, Any]], n_calls: int, depths: Sequence[int]
) -> float:
    """The next round's seconds: the longest round so far, or before the first the slowest call of the latest
    ``prior`` rounds scaled to this round's calls and depths; 0 without either."""
    if done:
        return max(float(r.get("seconds") or 0) for r in done)
    # the latest rounds only: an older one may have run another way
    recent = [r for r in prior if r.get("seconds") and r.get("depths")][-4:]
    rates = [float(r["seconds"]) / (max(1, len(r.get("order") or ())) * _call_weight(r["depths"])) for r in recent]
    return max(rates, default=0.0) * n_calls * _call_weight(depths)


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
    *,
    settle: Settle | None = None,
) -> list[int]:
    """The depths the next round of ``phase`` measures (empty: the phase is done).

    Each depth gets rounds until it has ``min_rounds``; after that until its widest CI is within ``target_ci``,
    or it has ``max_rounds``, or its decision is settled. A depth with a changed kernel that ``settle`` calls
    settled after :data:`EARLY_SETTLE_ROUNDS` stops before ``min_rounds``: only futility can settle it there.
    A depth with no changed kernel keeps ``min_rounds``: its A/A rounds are the noise the report shows."""
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


def _joint_round(
    joint: JointMeasure,
    cands: Mapping[str, Sequence[Candidate]],
    depths: Sequence[int],
    mine: Mapping[str, Sequence[Mapping[str, Any]]],
    bar: progress.Tracker,
    *,
    pp_tokens: int,
    tag: str,
) -> dict[str, dict[str, Any]]:
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


def _any_value(records: Iterable[Mapping[str, Mapping[str, Mapping[str, object]]]]) -> bool:
    return any(v is not None for r in records for vals in r["values"].values() for v in vals.values())


def _store(rec: dict[str, Any], name: str, res: Mapping[int, Point], depths: Sequence[int]) -> None:
    rec["values"][name] = {str(d): _num(res.get(d, {}).get("ts")) for d in depths}
    for key in OBSERVED:
        rec.setdefault(key, {})[name] = {str(d): _num(res.get(d, {}).get(key), util=True) for d in depths}
    rec["kernels"][name] = {str(d): res.get(d, {}).get("kernel") for d in depths}
    rec["why"][name] = {str(d): res.get(d, {}).get("why") for d in depths}
    errs = sorted({str(res[d]["error"]) for d in res if res[d].get("error")})
    if errs:
        rec["errors"][name] = "; ".join(errs)[:500]


def _num(x: float | str | None, *, util: bool = False) -> float | None:
    """A t/s above 0, or (``util``) a utilization in percent rounded to 0.01, where 0 is a real value, unlike a t/s
    of 0; None when unknown."""
    try:
        v = math.nan if x is None else float(x)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v) or v < 0 or (v == 0 and not util):
        return None
    return round(v, 2) if util else v
