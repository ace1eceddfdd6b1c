"""Tune: Optuna only for what really is a joint search, with the composed rules fixed.

The dimensions are the space's compile-time rows (tile/MMA config rows, occupancy, WMMA knobs: one
translation unit rebuilt per candidate) and process-wide knobs (CUDA graph/PDL/fusion env, -ub,
threads); kernel rules and selector thresholds are the screen's job and stay out. TPE samples with
``constraints_func`` (a candidate the constraint check rejects is recorded as infeasible, never built).

Each knob declares the phases it can affect (``phases = ["pp"]`` in the space file; both by default);
a trial measures only those phases, each against the composed reference in one paired round (the
order alternates between trials), and reports one objective per phase (geometric mean of the
per-depth ratios; 1.0 for a phase the trial cannot change). No pruning across phases: a prefill
result never stops a decode measurement. The best trial is only a proposal: confirm decides.

The CPU% rule (docs/design.md, "CPU% in decode decisions") applies to the decode objective: a trial whose decode CPU% rises by more than the
screen's A/A CPU noise while its decode t/s gain stays within the screen's t/s noise is infeasible
(``cpu_cost`` constraint, ``rejected`` attribute) and never picked. One paired round has no interval,
so the trial's point estimates are held against the noise.
"""

from __future__ import annotations

__all__ = ["TUNE_KINDS", "tunable_knobs", "knob_phases", "pick", "paired_objectives", "cpu_rejection", "screen_noise"]

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.errors import TunerError
from tuner.measure.paired import CPU_REJECTED, rejects_cpu_cost

TUNE_KINDS = ("tile_row", "mma_row", "wmma", "env", "bench_flag")


def tunable_knobs(space: Any, fixed: Mapping[str, Any]) -> list[Any]:
    """Knobs the tune stage samples: compile-time rows and process-wide knobs not pinned by --set."""
    return [k for k in (*space.compile_knobs, *space.runtime_knobs) if k.kind in TUNE_KINDS and k.name not in fixed]


def knob_phases(knob: Any) -> tuple[str, ...]:
    ph = knob.meta.get("phases") if hasattr(knob, "meta") else None
    return tuple(ph) if ph else ("pp", "tg")


def geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x and math.isfinite(x) and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def pick(trials: Sequence[Any], *, min_gain: float = 1.02, floor: float = 0.99) -> Any | None:
    """The trial worth confirming: not rejected for its CPU cost, no phase objective below ``floor`` and
    the product of the objectives at least ``min_gain``; the best such by that product. None when no
    trial qualifies."""
    best, best_v = None, min_gain
    for t in trials:
        if getattr(t, "user_attrs", {}).get("rejected"):
            continue
        vals = getattr(t, "values", None)
        if not vals or any(v is None or not math.isfinite(v) for v in vals):
            continue
        if min(vals) < floor:
            continue
        v = math.prod(vals)
        if v >= best_v:
            best, best_v = t, v
    return best


def paired_objectives(m_ref: Any, ref: Any, m_cand: Any, cand: Any, phases: Sequence[str], depths: Sequence[int], *,
                      label: str, flip: bool) -> tuple[list[float], dict[str, float], dict[str, float]]:
    """One paired round per phase the trial can change: reference and candidate back to back (order
    flipped on alternate trials). Returns the per-phase objectives ``[pp, tg]`` (geometric mean of the
    per-depth ratios; 1.0 for a phase the trial cannot change, which is not measured), the ratios and
    the CPU% differences candidate - reference (points, where both sides report CPU%), keyed ``tg@4096``.

    Raises:
        TunerError: llama-bench gave no result for a measured phase (the trial fails with the reason).
    """
    objs: list[float] = []
    ratios: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for phase in ("pp", "tg"):
        if phase not in phases:
            objs.append(1.0)
            continue
        order = [("ref", m_ref, ref), ("cand", m_cand, cand)]
        if flip:
            order.reverse()
        res = {tag: m(c, phase, list(depths), f"{label}-{phase}-{tag}") for tag, m, c in order}
        rs = []
        for d in depths:
            a, r = res["cand"][d].get("ts"), res["ref"][d].get("ts")
            if a and r:
                ratios[f"{phase}@{d}"] = a / r
                rs.append(a / r)
            ca, cr = res["cand"][d].get("cpu"), res["ref"][d].get("cpu")
            if ca is not None and cr is not None:
                cpu[f"{phase}@{d}"] = ca - cr
        if not rs:
            raise TunerError(f"llama-bench gave no {phase} result: {dict(res['cand'])}")
        objs.append(geomean(rs))
    return objs, ratios, cpu


def screen_noise(cells: Mapping[str, Mapping[str, Any]]) -> tuple[float, float]:
    """(t/s noise %, CPU% noise points) of a phase's stored screen cells (``CellStats.as_dict`` by
    depth): the medians over depths, as compose's floors; infinite where unknown (older studies)."""
    def med(key: str) -> float:
        vals = sorted(float(c[key]) for c in cells.values() if c.get(key) is not None and math.isfinite(float(c[key])))
        return vals[len(vals) // 2] if vals else math.inf

    return med("noise_pct"), med("cpu_noise")


def cpu_rejection(objs: Sequence[float], cpu: Mapping[str, float], ts_noise_pct: float, cpu_noise: float) -> str:
    """Why a trial is rejected for its decode CPU cost (docs/design.md, "CPU% in decode decisions"), or '' when it is not.

    ``objs`` are :func:`paired_objectives`' ``[pp, tg]``, ``cpu`` its CPU% differences."""
    rises = [v for k, v in cpu.items() if k.startswith("tg@")]
    if not rises:
        return ""
    rise = sum(rises) / len(rises)
    if not rejects_cpu_cost(objs[1], ts_noise_pct, rise, cpu_noise):
        return ""
    return (f"{CPU_REJECTED}: decode CPU% {rise:+.1f} points (screen A/A CPU noise ±{cpu_noise:.1f}), "
            f"t/s x{objs[1]:.3f} (noise ±{ts_noise_pct:.1f}%)")
