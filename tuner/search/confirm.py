"""Confirm: the final config against upstream, paired and interleaved, at every point.

Three candidates per round (rotated): upstream, upstream again (the A/A pair) and the final config, at the
screen's ladder plus depths it did not use, so a rule's boundary is checked where it was not measured.

A rule with a point slower than upstream inside its interval, or with none faster, is dropped; so is a
process-wide knob that makes any point slower. A kept rule whose shallowest points are not faster is narrowed
to start at its first confirmed-faster depth. Faster and slower are the decision rule's
(:func:`tuner.rounds.compose.judge_phase`); a decode point rejected for its CPU cost counts as slower. The export
claims only the points that confirmed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from tuner import log
from tuner._hash import stable_hash
from tuner.measure.paired import CPU_REJECTED, NOISE_CEILING_PCT, TOO_NOISY
from tuner.plan.fa_rules import FaRule, rules_env, rules_texts
from tuner.rounds.compose import Family, judge_phase, open_depths
from tuner.rounds.joint import Candidate, Point, SharedMeasure, run_joint_rounds, run_phase_rounds
from tuner.rounds.keep import keep
from tuner.rounds.stats import AA_NAME, UPSTREAM, CellStats, summarize_phase
from tuner.search.context import PHASES, Proposal, SearchRun, confirm_factory
from tuner.search.final_gates import final_of
from tuner.study.record import SearchOutcome, relabel_rows

FINAL = "final"


class Judgement(TypedDict):
    """What survives the confirmation (:func:`judge`)."""

    kept: tuple[FaRule, ...]
    dropped: dict[FaRule, str]
    narrowed: dict[FaRule, str]
    rows: list[dict[str, Any]]
    """The point rows, relabelled where a rule no longer covers a point."""
    process_ok: bool
    process_why: str


def extra_depths(ladder: Sequence[int], *, limit: int = 1, max_depth: int | None = None) -> list[int]:
    """Depths the screen did not use: halfway between consecutive ladder depths from 8192 up (where rule
    boundaries live), at most ``limit``: the shallowest (cheap, and where measured boundaries are), the
    deepest, then the rest from the shallow end."""
    ds = sorted(set(ladder))
    mids = [(a + b) // 2 // 256 * 256 for a, b in itertools.pairwise(ds) if a >= 8192]
    mids = [m for m in mids if m not in ds and (max_depth is None or m <= max_depth)]
    if len(mids) <= limit:
        return mids
    order = [mids[0], mids[-1], *mids[1:-1]]
    return sorted(order[:limit])


def point_rows(
    phase: str, cells: Mapping[int, CellStats], records: Sequence[Mapping[str, Any]], *, family: Family = "changed"
) -> list[dict[str, Any]]:
    """One row per confirmed point: kernels, t/s, Δ% with its paired CI, noise, verdict and utilizations on
    both sides (NaN where unknown). ``family``: the Holm family (``"all"`` where process knobs or the build
    changed too)."""
    out = []
    judged = judge_phase(phase, cells, family=family)  # the same bar and verdicts as the screen's decisions
    for d in sorted(judged):
        c = judged[d]
        e = c.effects.get(FINAL)
        fin_vals = sorted(v for r in records if (v := r["values"].get(FINAL, {}).get(str(d))))
        out.append(
            {
                "phase": phase,
                "depth": d,
                "upstream_kernel": c.upstream_kernel,
                "kernel": _majority_kernel(records, FINAL, d),
                "base_ts": c.upstream_ts,
                "tuned_ts": fin_vals[len(fin_vals) // 2] if fin_vals else math.nan,
                "speedup": e.ratio if e else math.nan,
                "ci_low": e.ci_low if e else math.nan,
                "ci_high": e.ci_high if e else math.nan,
                "rounds": e.n if e else 0,
                "aa_noise_pct": c.bar_pct,
                "verdict": c.verdicts[FINAL] if e else "not measured",
                "rule": "sequential",  # the decision rule that gave the verdict (tuner/measure/decide.py)
                **_utilizations(c),
            }
        )
    return out


def _utilizations(c: CellStats) -> dict[str, float]:
    nan, cpu = math.nan, c.cpu.get(FINAL)
    up, fin = c.levels.get(UPSTREAM, {}), c.levels.get(FINAL, {})
    return {
        "base_cpu": up.get("cpu", nan),
        "tuned_cpu": fin.get("cpu", nan),
        "cpu_delta": cpu.mean if cpu else nan,
        "cpu_ci_low": cpu.ci_low if cpu else nan,
        "cpu_ci_high": cpu.ci_high if cpu else nan,
        "cpu_noise": c.cpu_bar,
        "base_core": up.get("core", nan),
        "tuned_core": fin.get("core", nan),
        "base_gpu": up.get("gpu", nan),
        "tuned_gpu": fin.get("gpu", nan),
    }


def _majority_kernel(records: Sequence[Mapping[str, Any]], name: str, d: int) -> str | None:
    ks = [r["kernels"].get(name, {}).get(str(d)) for r in records]
    ks = [k for k in ks if k]
    return max(set(ks), key=ks.count) if ks else None


def judge(rules: Sequence[FaRule], rows: Sequence[Mapping[str, Any]], *, process_changed: bool) -> Judgement:
    """Which rules (and whether the process-wide knobs) survive the confirmation.

    A kept rule is narrowed (:func:`narrowed_rule`) only where the rules were confirmed alone: with tuned knobs
    upstream's kernel with the knobs alone was never measured, so the rule is kept whole. The points it no
    longer covers are relabelled, and so are a dropped rule's points where the rules were confirmed alone."""
    kept: list[FaRule] = []
    dropped: dict[FaRule, str] = {}
    narrowed: dict[FaRule, tuple[FaRule, str]] = {}
    for r in rules:
        inside = [x for x in rows if x["phase"] == r.phase.bench and r.covers(x["depth"])]
        fate = keep(inside)  # the one rule (tuner.rounds.keep), in the search's words
        bad = [x["depth"] for x in fate.points]
        if not fate.kept:
            dropped[r] = {
                "none": "no confirmed point inside its interval",
                "slower": f"slower than upstream at depth {bad}",
                "cpu": f"CPU% up beyond the noise without a t/s gain at depth {bad}",
                "noisy": f"the A/A noise is above the {NOISE_CEILING_PCT:g}% ceiling: the machine was too noisy "
                "to confirm it",
                "no gain": "not faster than upstream at any depth inside it",
            }[fate.reason]
        elif not process_changed and (n := narrowed_rule(r, inside)) is not None:
            kept.append(n[0])
            narrowed[n[0]] = (r, n[1])
        else:
            kept.append(r)
    slower = [f"{x['phase']}@d{x['depth']}" for x in rows if x["verdict"] == "slower"]
    costly = [f"{x['phase']}@d{x['depth']}" for x in rows if x["verdict"] == CPU_REJECTED]
    noisy = sorted({x["phase"] for x in rows if x["verdict"] == TOO_NOISY})  # nothing can be confirmed there
    ok = not (process_changed and (slower or costly or noisy))
    why = "; ".join(
        ([f"slower than upstream at {', '.join(slower)}"] if slower else [])
        + ([f"CPU% up beyond the noise without a t/s gain at {', '.join(costly)}"] if costly else [])
        + ([f"A/A noise above the {NOISE_CEILING_PCT:g}% ceiling in {', '.join(noisy)}"] if noisy else [])
    )
    return {
        "kept": tuple(kept),
        "dropped": dropped,
        "narrowed": {n: why for n, (_, why) in narrowed.items()},
        # Without tuned knobs the export runs upstream's config wherever no kept rule fires, so the points
        # of a dropped rule show upstream's kernel too (what the forced kernel measured is kept aside).
        "rows": relabel_rows(
            rows, kept, [old for old, _ in narrowed.values()] + ([] if process_changed else [*dropped])
        ),
        "process_ok": ok,
        "process_why": "" if ok else why,
    }


def narrowed_rule(rule: FaRule, inside: Sequence[Mapping[str, Any]]) -> tuple[FaRule, str] | None:
    """``(rule from its shallowest confirmed-faster depth on, why)`` where points of ``inside`` lie below that
    depth; None where its shallowest point is faster (or none is)."""
    faster = [int(x["depth"]) for x in inside if x["verdict"] == "faster"]
    if not faster:
        return None
    first = min(faster)
    below = sorted(int(x["depth"]) for x in inside if int(x["depth"]) < first)
    if not below:
        return None
    why = f"not faster end to end at depths {below}; starts at {first}, the first confirmed-faster depth"
    return rule.starting_at(first), f"narrowed from {rule.text}: {why}"


def run_confirm(run: SearchRun, proposal: Proposal) -> SearchOutcome:
    """The confirm stage: the ``proposal`` against upstream in every phase it changes (resumable). Tuned process
    knobs that make a point slower are dropped and the rules confirmed alone."""
    knobs_dropped: dict[str, object] | None = None
    depths = confirm_depths(run)
    rows, j, phases = _confirm_attempt(run, proposal, depths)
    if not j["process_ok"]:
        log.warning(f"confirm: the tuned process knobs are dropped ({j['process_why']}); confirming the rules alone")
        tuned = proposal.tuned
        knobs_dropped = {
            "trial": tuned.trial if tuned else None,
            "params": dict((tuned.params or tuned.values) if tuned else {}),
            "why": j["process_why"],
            "phases": list(phases),
            # a result is stored only finite
            "rows": [{k: v for k, v in r.items() if not (isinstance(v, float) and not math.isfinite(v))} for r in rows],
        }
        proposal = dataclasses.replace(proposal, tuned=None)
        rows, j, phases = _confirm_attempt(run, proposal, depths)
    for r, why in j["dropped"].items():
        log.info(f"  dropped {r}: {why}")
    for r, why in j["narrowed"].items():
        log.info(f"  kept {r}, {why}")
    return SearchOutcome(
        header=run.header,
        rules=tuple(j["kept"]),
        dropped=dict(j["dropped"]),
        narrowed=dict(j["narrowed"]),
        tuned=proposal.tuned,
        rows=tuple(rows),
        attempt=0 if knobs_dropped is None else 1,
        knobs_dropped=knobs_dropped,
        upstream_phases=tuple(p for p in PHASES if p not in phases),
        confirm_depths=tuple(depths),
        stored_keys=frozenset({"narrowed"}),  # the confirm stores it, empty or not
    )


def confirm_depths(run: SearchRun) -> list[int]:
    """The screen's depths and :func:`extra_depths` up to the model's context length."""
    cfg = run.cfg
    extra = extra_depths(cfg.depths, limit=cfg.confirm_extra, max_depth=run.shape.context_length)
    return sorted(set(cfg.depths) | set(extra))


def _confirm_attempt(
    run: SearchRun, proposal: Proposal, depths: Sequence[int]
) -> tuple[list[dict[str, Any]], Judgement, list[str]]:
    """One confirm of one final config: its rows, the judgement and the phases measured."""
    cfg, st = run.cfg, run.st
    rules, tuned, fin = proposal.rules, proposal.tuned, final_of(run, proposal)
    build, fb = run.builds.get(run.base_variant, {}), run.builds.get(fin.variant, fin.compile_values)
    process_changed = bool(tuned)
    rule_phases = {r.phase.bench for r in rules}
    # one build on both sides: the phase without a change shares each call, nearly free
    factory = confirm_factory(run, proposal)
    m_up, m_fin = factory(build), factory(fb)
    shared = m_up.joint if fb is build and isinstance(m_up, SharedMeasure) else None
    phases = [p for p in PHASES if process_changed or p in rule_phases or (shared and (rules or process_changed))]
    final = Candidate(
        name=FINAL, env={**fin.env, **({"GGML_TUNER_FA_RULES": rules_env(rules)} if rules else {})}, args=fin.args
    )
    up = Candidate(name=UPSTREAM, env=dict(run.base_env), args=run.base_args)
    aa = Candidate(name=AA_NAME, env=dict(run.base_env), args=run.base_args)
    # Records are keyed by what is confirmed: a rerun that confirms another config starts afresh.
    ckey = stable_hash({"rules": rules_texts(rules), "tuned": dict(tuned.values) if tuned else None})[:12]
    recs = st.confirm_rounds(ckey)

    def measure(c: Candidate, phase: str, ds: Sequence[int], label: str) -> Mapping[int, Point]:
        return (m_fin if c.name == FINAL else m_up)(c, phase, ds, label)

    # the rounds' settings, shared and one-phase alike; tuned process knobs act at every depth, rules alone only
    # where a rule changes the kernel
    how: dict[str, Any] = {
        "min_rounds": cfg.min_rounds,
        "max_rounds": cfg.max_rounds,
        "target_ci": cfg.ci_target,
        "budget": run.budget,
        "on_round": functools.partial(st.append_confirm_round, ckey),
        "tag": "confirm",
        "prior": st.screen_rounds,
        "settle": None if process_changed else open_depths,
    }
    family: Family = "all" if process_changed else "changed"
    rows: list[dict[str, Any]] = []
    todo = [p for p in phases if not st.confirm_done(ckey, p)]
    if shared and len(todo) > 1:
        with log.step(
            f"Confirm {' and '.join(todo)} in shared calls: the final config vs upstream (and upstream vs itself) "
            f"at depths {list(depths)}"
        ):
            run_joint_rounds(shared, {p: [up, aa, final] for p in todo}, list(depths), recs, pp_tokens=cfg.pp, **how)
    for phase in phases:
        if st.confirm_done(ckey, phase):
            mine = [r for r in recs if r["phase"] == phase]
            rows += point_rows(phase, summarize_phase(phase, mine, depths), mine, family=family)
            continue
        with log.step(
            f"Confirm {phase}: the final config vs upstream (and upstream vs itself) at depths {list(depths)}"
        ):
            mine = run_phase_rounds(measure, phase, [up, aa, final], list(depths), recs, **how)
        run.budget.check(f"confirm {phase}")
        st.set_confirm_done(ckey, phase)
        rows += point_rows(phase, summarize_phase(phase, mine, depths), mine, family=family)
    j = judge(rules, rows, process_changed=process_changed)  # its rows: relabelled where a rule was narrowed
    judged = {k: v for k, v in j.items() if k != "rows"}
    st.set_confirm(
        ckey,
        {"rules": rules, "tuned": tuned.stored() if tuned else None, "rows": rows, "judge": judged, "phases": phases},
    )
    return j["rows"], j, phases
