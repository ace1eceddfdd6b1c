"""Confirm: the final config against upstream, paired and interleaved, at every point.

Three candidates per round (rotated): upstream, upstream again (the A/A pair that measures the noise
of this very procedure) and the final config. Depths: the screen's ladder plus depths it did not use
(halfway between deeper neighbours, e.g. 12288 and 49152), so a rule's boundary is checked where it
was not measured. Only phases whose config differs from upstream are measured; the others are
upstream's by construction and reported so.

What does not confirm is dropped: a rule with a point slower than upstream inside its interval, or
with no point faster, goes; so does a process-wide knob that makes any point slower. Faster and slower
are the search's decision rule's (:mod:`tuner.measure.decide`, through
:func:`tuner.search.compose.judge_phase`: per-round differences to the A/A pair, Holm over the phase's
points, Bonferroni over the round counts a point may stop at). A decode point whose CPU% rises beyond the A/A CPU noise without a t/s gain beyond the
t/s noise (docs/design.md, "CPU% in decode decisions") counts as slower: its verdict is ``rejected: CPU% up without a t/s gain``.
The export claims only the points that confirmed.
"""

from __future__ import annotations

__all__ = ["FINAL", "extra_depths", "judge", "point_rows"]

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.measure.paired import CPU_REJECTED, NOISE_CEILING_PCT, TOO_NOISY
from tuner.plan.fa_rules import FaRule
from tuner.search.compose import judge_phase
from tuner.search.screen import UPSTREAM, CellStats

FINAL = "final"


def extra_depths(ladder: Sequence[int], *, limit: int = 2, max_depth: int | None = None) -> list[int]:
    """Depths the screen did not use: halfway between consecutive ladder depths from 8192 up (where
    rule boundaries live), at most ``limit`` of them, the shallowest and the deepest first."""
    ds = sorted(set(ladder))
    mids = [(a + b) // 2 // 256 * 256 for a, b in itertools.pairwise(ds) if a >= 8192]
    mids = [m for m in mids if m not in ds and (max_depth is None or m <= max_depth)]
    if len(mids) <= limit:
        return mids
    picked = [mids[0], mids[-1]] if limit >= 2 else [mids[-1]]
    return sorted(set(picked))[:limit]


def point_rows(
    phase: str, cells: Mapping[int, CellStats], records: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per confirmed point: kernels on both sides, t/s, Δ% with its paired CI, noise, verdict;
    and CPU% (total, busiest core) and GPU% on both sides with the paired CPU% difference and the A/A
    CPU noise (NaN where the records carry no utilizations)."""
    out = []
    judged = judge_phase(phase, cells)  # the same bar and verdicts as the screen's decisions
    for d in sorted(judged):
        c = judged[d]
        e = c.effects.get(FINAL)
        noise, cpu, cpu_noise = c.bar_pct, c.cpu.get(FINAL), c.cpu_bar
        v = c.verdicts[FINAL] if e else "not measured"
        fin_k = _majority_kernel(records, FINAL, d)
        fin_vals = [r["values"].get(FINAL, {}).get(str(d)) for r in records if str(d) in r["values"].get(FINAL, {})]
        fin_vals = sorted(v for v in fin_vals if v)
        out.append(
            {
                "phase": phase,
                "depth": d,
                "upstream_kernel": c.upstream_kernel,
                "kernel": fin_k,
                "base_ts": c.upstream_ts,
                "tuned_ts": fin_vals[len(fin_vals) // 2] if fin_vals else math.nan,
                "speedup": e.ratio if e else math.nan,
                "ci_low": e.ci_low if e else math.nan,
                "ci_high": e.ci_high if e else math.nan,
                "rounds": e.n if e else 0,
                "aa_noise_pct": noise,
                "verdict": v,
                "rule": "sequential",  # the decision rule that gave the verdict (tuner/measure/decide.py)
                **_utilizations(c, cpu, cpu_noise),
            }
        )
    return out


def _utilizations(c: CellStats, cpu: Any, cpu_noise: float) -> dict[str, float]:
    nan = math.nan
    up, fin = c.levels.get(UPSTREAM, {}), c.levels.get(FINAL, {})
    return {
        "base_cpu": up.get("cpu", nan),
        "tuned_cpu": fin.get("cpu", nan),
        "cpu_delta": cpu.mean if cpu else nan,
        "cpu_ci_low": cpu.ci_low if cpu else nan,
        "cpu_ci_high": cpu.ci_high if cpu else nan,
        "cpu_noise": cpu_noise,
        "base_core": up.get("core", nan),
        "tuned_core": fin.get("core", nan),
        "base_gpu": up.get("gpu", nan),
        "tuned_gpu": fin.get("gpu", nan),
    }


def _majority_kernel(records: Sequence[Mapping[str, Any]], name: str, d: int) -> str | None:
    ks = [r["kernels"].get(name, {}).get(str(d)) for r in records]
    ks = [k for k in ks if k]
    return max(set(ks), key=ks.count) if ks else None


def judge(rules: Sequence[FaRule], rows: Sequence[Mapping[str, Any]], *, process_changed: bool) -> dict[str, Any]:
    """Which rules (and whether the process-wide knobs) survive the confirmation.

    Returns ``{"kept": (rule, ...), "dropped": {rule: why}, "process_ok": bool, "process_why": str}``.
    """
    kept: list[FaRule] = []
    dropped: dict[FaRule, str] = {}
    for r in rules:
        inside = [x for x in rows if x["phase"] == r.phase.bench and r.covers(x["depth"])]
        v = [x["verdict"] for x in inside]
        if not inside:
            dropped[r] = "no confirmed point inside its interval"
        elif "slower" in v:
            bad = [x["depth"] for x in inside if x["verdict"] == "slower"]
            dropped[r] = f"slower than upstream at depth {bad}"
        elif CPU_REJECTED in v:
            bad = [x["depth"] for x in inside if x["verdict"] == CPU_REJECTED]
            dropped[r] = f"CPU% up beyond the noise without a t/s gain at depth {bad}"
        elif TOO_NOISY in v:
            dropped[r] = (
                f"the A/A noise is above the {NOISE_CEILING_PCT:g}% ceiling: the machine was too noisy to confirm it"
            )
        elif "faster" not in v:
            dropped[r] = "not faster than upstream at any depth inside it"
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
    return {"kept": tuple(kept), "dropped": dropped, "process_ok": ok, "process_why": "" if ok else why}
