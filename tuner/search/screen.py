"""Kernel screen: upstream's choice vs every legal forced kernel, per phase and depth, on one build
(:func:`candidates_for`), in the rounds of :mod:`tuner.rounds.joint`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuner.plan.fa_rules import FaRule, Phase, rules_env
from tuner.rounds.budget import UNBOUNDED, Budget
from tuner.rounds.joint import Candidate, Measure, Point, Settle, run_joint_rounds
from tuner.rounds.stats import AA_NAME, UPSTREAM


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
