"""Kernel screen: upstream's choice vs every legal forced kernel, per phase and depth, on one build.

One *round* measures every candidate once, back to back, in an order rotated each round; a
candidate's effect at a depth is its paired ratio to upstream within each round (see
:mod:`tuner.measure.paired`). Rounds are added until every cell's CI half-width is at most
``target_ci`` percent, or ``max_rounds``, or the deadline. Prefill and decode are screened
separately: what one phase measures never stops the other.

Upstream's own pick per depth is read from the patched build's ``GGML_TUNER_FA_LOG`` lines, so the
forced candidate equal to it is a built-in A/A pair that measures the noise. Where no kernel can be
forced (the CPU backend), an explicit second upstream candidate is the A/A pair.

The round records are plain JSON (stored in the study, so a resumed search adds rounds instead of
starting over).
"""

from __future__ import annotations

__all__ = [
    "AA_NAME",
    "UPSTREAM",
    "Candidate",
    "CellStats",
    "Measure",
    "PhaseScreen",
    "candidates_for",
    "run_phase_rounds",
    "summarize_phase",
]

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuner import log, progress
from tuner.measure.paired import Effect, noise_pct, paired_effect, rotated, verdict

UPSTREAM = "upstream"
AA_NAME = "upstream-aa"
PHASE_RULE = {"pp": "prefill", "tg": "decode"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
    """One runtime configuration measured in a round."""

    name: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    args: tuple[str, ...] = ()
    kernel: str | None = None
    """The kernel this candidate forces (None: upstream's own choice)."""


# measure(candidate, phase, depths, label) -> {depth: {"ts": float|None, "kernel": str|None,
#                                                      "why": str|None, "error": str}}
Measure = Callable[[Candidate, str, Sequence[int], str], Mapping[int, Mapping[str, Any]]]


def candidates_for(phase: str, kernels: Sequence[str], *, base_env: Mapping[str, str] | None = None,
                   base_args: Sequence[str] = ()) -> list[Candidate]:
    """Upstream plus one forced candidate per kernel (or the A/A twin when nothing can be forced).

    ``base_env``/``base_args`` are applied to every candidate (the knobs pinned with --set).
    """
    env = dict(base_env or {})
    out = [Candidate(name=UPSTREAM, env=env, args=tuple(base_args))]
    if not kernels:
        return out + [Candidate(name=AA_NAME, env=env, args=tuple(base_args))]
    for k in kernels:
        out.append(Candidate(name=k, env={**env, "GGML_TUNER_FA_RULES": f"{PHASE_RULE[phase]}:0-={k}"},
                             args=tuple(base_args), kernel=k))
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
) -> list[dict[str, Any]]:
    """Add rounds for ``phase`` at ``depths`` to ``rounds`` (records of earlier calls count) until
    the stop rule holds; returns the records for these depths. ``on_round`` persists each record."""
    names = [c.name for c in candidates]
    mine = [r for r in rounds if r["phase"] == phase and set(depths) <= {int(d) for d in r["depths"]}]
    # The ETA assumes every round up to max_rounds; the stop rule usually ends it sooner.
    with progress.track(f"{tag} {phase} (up to {max_rounds} rounds)", total=len(names) * max(0, max_rounds - len(mine)),
                        unit="llama-bench calls") as bar:
        _rounds(measure, phase, candidates, names, depths, rounds, mine, bar, min_rounds=min_rounds, max_rounds=max_rounds,
                target_ci=target_ci, deadline=deadline, on_round=on_round, tag=tag)
    return mine


def _rounds(measure: Measure, phase: str, candidates: Sequence[Candidate], names: Sequence[str], depths: Sequence[int],
            rounds: list[dict[str, Any]], mine: list[dict[str, Any]], bar: Any, *, min_rounds: int, max_rounds: int,
            target_ci: float, deadline: float | None, on_round: Callable[[dict[str, Any]], None] | None, tag: str) -> None:
    """The round loop of :func:`run_phase_rounds` (records appended to ``rounds`` and ``mine``)."""
    while len(mine) < max_rounds:
        if len(mine) >= min_rounds:
            st = summarize_phase(phase, mine, depths)
            worst = max((c.max_halfwidth for c in st.values()), default=math.inf)
            if worst <= target_ci:
                break
        if deadline is not None and time.monotonic() > deadline:
            log.warning(f"{tag} {phase}: time budget reached after {len(mine)} round(s); the intervals stay as wide as measured")
            break
        i = len(mine)
        order = rotated(names, i)
        rec: dict[str, Any] = {"phase": phase, "depths": [int(d) for d in depths], "round": i, "order": order,
                               "values": {}, "kernels": {}, "why": {}, "errors": {}, "t": time.time()}
        t0 = time.monotonic()
        for name in order:
            cand = next(c for c in candidates if c.name == name)
            res = measure(cand, phase, depths, f"{tag}-{phase}-r{i}-{name}")
            bar.advance()
            rec["values"][name] = {str(d): _num(res.get(d, {}).get("ts")) for d in depths}
            rec["kernels"][name] = {str(d): res.get(d, {}).get("kernel") for d in depths}
            rec["why"][name] = {str(d): res.get(d, {}).get("why") for d in depths}
            errs = sorted({str(res[d]["error"]) for d in res if res[d].get("error")})
            if errs:
                rec["errors"][name] = "; ".join(errs)[:500]
        rec["seconds"] = round(time.monotonic() - t0, 1)
        mine.append(rec)
        rounds.append(rec)
        if on_round is not None:
            on_round(rec)
        st = summarize_phase(phase, mine, depths)
        worst = max((c.max_halfwidth for c in st.values()), default=math.inf)
        wide = f"±{worst:.1f}%" if worst < 100 else "over ±100%"  # 2 rounds: Student-t's 12.7 makes any spread huge
        log.info(f"  {tag} {phase} round {i + 1}/{max_rounds} ({rec['seconds']:.0f} s): widest 95% CI "
                 f"{wide} (target ±{target_ci:g}%)" + (f"; errors: {rec['errors']}" if rec["errors"] else ""))


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


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

    @property
    def max_halfwidth(self) -> float:
        return max((e.halfwidth_pct for e in self.effects.values()), default=math.inf)

    def as_dict(self) -> dict[str, Any]:
        return {
            "depth": self.depth, "upstream_kernel": self.upstream_kernel, "aa": self.aa,
            "noise_pct": self.noise_pct, "upstream_ts": self.upstream_ts,
            "effects": {k: {**e.as_dict(), "verdict": self.verdicts[k]} for k, e in self.effects.items()},
            "fallback": list(self.fallback),
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
        effects: dict[str, Effect] = {}
        fallback = []
        for n in names:
            whys = [r["why"].get(n, {}).get(key) for r in recs]
            if any(w == "fallback" for w in whys):
                fallback.append(n)
                continue
            effects[n] = paired_effect([r["values"].get(n, {}).get(key) for r in recs], up)
        aa = AA_NAME if AA_NAME in effects else (up_kernel if up_kernel in effects else None)
        noise = noise_pct(effects[aa]) if aa else math.inf
        ups = [u for u in up if u]
        out[d] = CellStats(
            depth=d, upstream_kernel=up_kernel, aa=aa, noise_pct=noise,
            upstream_ts=sorted(ups)[len(ups) // 2] if ups else math.nan,
            effects=effects, verdicts={n: verdict(e, noise) for n, e in effects.items()},
            fallback=tuple(fallback),
        )
    return out
