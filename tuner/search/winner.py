"""The winner of a finished study of the earlier one-TPE search, and what the search hands to the result stage.

The *global* pick G is the complete trial with the best objective that is not slower than the baseline beyond
noise at any point (else the baseline); per phase, each bucket takes the min-max-regret config among trials
sharing G's build and process-wide settings, so the buckets combine into one binary and one command line.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import optuna

from tuner.errors import TunerError, UsageError
from tuner.measure.stats import compare
from tuner.plan.fa_rules import FaRule, Phase
from tuner.plan.space import RULE_KINDS, SearchSpace, load_space, render_runtime
from tuner.redact import redact
from tuner.search.record import anchor_drift, study_results
from tuner.search.select import Measurement, select_winners
from tuner.source import Source, fetch_source
from tuner.study import legacy
from tuner.study.legacy import BASELINE_PARAMS_ATTR
from tuner.study.record import load_header


@dataclasses.dataclass(frozen=True, kw_only=True)
class Winner:
    global_config: str
    """``baseline`` or ``trial<N>``."""
    values: Mapping[str, object]
    rules: tuple[FaRule, ...]
    buckets: tuple[Mapping[str, Any], ...]
    rejected: Mapping[str, str]


def _trial_values(study: optuna.Study, cfg: str) -> dict[str, object]:
    if cfg == "baseline":
        # the enqueued upstream-default trial carries the baseline's full knob values
        t = next((t for t in study.trials if legacy.trial_attr(t, BASELINE_PARAMS_ATTR)), None)
        return dict(legacy.trial_attr(t, "values", {})) if t is not None else {}
    n = int(cfg.removeprefix("trial"))
    return dict(legacy.trial_attr(study.trials[n], "values", {}))


def choose_winner(study: optuna.Study, space: SearchSpace) -> Winner:
    """The global pick and per-bucket selection (module docstring)."""
    results, base = study_results(study)
    if not results.get(base):
        raise TunerError(
            f"study {study.study_name!r} has no baseline measurement yet, so there is nothing to export. "
            "Run `tuner search` (it measures the baseline first)."
        )
    rule_names = {k.name: k for k in space.runtime_knobs if k.kind in RULE_KINDS}

    floor = anchor_drift(study)

    def admissible_everywhere(cfg: str) -> bool:
        """Not slower beyond noise at any point, and faster beyond noise at one at least."""
        pts = results[cfg]
        if set(pts) != set(results[base]):
            return False
        verdicts = [
            compare(results[base][p].samples, pts[p].samples, min_effect_pct=max(2.0, floor.get(p, 0.0))).verdict
            for p in pts
        ]
        return "slower" not in verdicts and "faster" in verdicts

    cands = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        cfg = f"trial{t.number}"
        if cfg in results and t.value is not None and math.isfinite(t.value) and admissible_everywhere(cfg):
            cands.append((t.value, -t.number, cfg))
    g = max(cands)[2] if cands else base
    g_vals = _trial_values(study, g)

    def family(cfg: str, phase: str) -> bool:
        if cfg == g:
            return True
        if cfg == base:
            return g == base
        v = _trial_values(study, cfg)
        return all(v.get(k) == g_vals.get(k) for k in set(v) | set(g_vals) if k not in rule_names)

    sel = select_winners(results, base, eligible=family, fallback=g, noise_floor=anchor_drift(study))
    rule_vals: dict[str, object] = {}
    buckets: list[dict[str, object]] = []
    for b in sel.buckets:
        vals = _trial_values(study, b.config) if b.config != base else g_vals
        same_phase = [x for x in sel.buckets if x.phase == b.phase]
        i = same_phase.index(b)
        lo = 0 if i == 0 else b.depths[0]
        hi = same_phase[i + 1].depths[0] if i + 1 < len(same_phase) else None
        fa_phase = Phase.from_bench(b.phase).value
        # The space's rule knobs cover fixed n_kv ranges; each takes the value of the bucket that
        # holds its lower bound, so buckets with different picks never contradict each other.
        taken = []
        for name, k in rule_names.items():
            klo = int(k.meta.get("lo", 0))
            if k.meta.get("phase") == fa_phase and klo >= lo and (hi is None or klo < hi):
                rule_vals[name] = vals.get(name, k.default)
                if rule_vals[name] != k.default:
                    taken.append(f"{name}={rule_vals[name]}")
        buckets.append(
            {
                "phase": b.phase,
                "depths": list(b.depths),
                "kv_range": [lo, hi if hi is not None else "inf"],
                "config": b.config,
                "rules": taken or ["upstream selection"],
                "reason": b.reason,
                "worst_regret": round(b.worst_regret, 4),
                "evidence": {str(d): _clean(v) for d, v in b.per_point.items()},
            }
        )
    rt = render_runtime(space, rule_vals)
    return Winner(global_config=g, values=g_vals, rules=rt.rules, buckets=tuple(buckets), rejected=dict(sel.rejected))


def _clean(d: Mapping[str, object]) -> dict[str, object]:
    """``d`` with its floats rounded, a non-finite one as text (stored data is finite)."""
    return {k: (round(v, 4) if math.isfinite(v) else str(v)) if isinstance(v, float) else v for k, v in d.items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinishedStudy:
    """A finished study with its winner chosen: all :mod:`tuner.result.export` needs, so the result stage never
    imports the study machinery."""

    study: optuna.Study
    source: Source
    """The tree the numbers came from (checked against the study's source id)."""
    space: SearchSpace
    winner: Winner
    results: Mapping[str, Mapping[tuple[str, int], Measurement]]
    base: str
    baseline_trial: optuna.trial.FrozenTrial | None


def load_finished_study(study_name: str, *, storage: str) -> FinishedStudy:
    """Load ``study_name``, check that its source still resolves to the same tree, choose its winner. UsageError
    where no such study exists; TunerError where the source resolves to another tree or no baseline was measured."""
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError as err:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise UsageError(f"no study {study_name!r} in {redact(storage)}; it has {names}. Pass --study NAME.") from err
    h = load_header(study)
    source = fetch_source(h.source_spec)
    if source.source_id != h.source_id:
        raise TunerError(
            f"the study was run on source {h.source_id} but {h.source_spec} now resolves to "
            f"{source.source_id}. Export needs the exact tree the numbers came from."
        )
    space = load_space(h.required(h.arch, "arch"), h.required(h.era, "era"))
    w = choose_winner(study, space)
    results, base = study_results(study)
    baseline_trial = next((t for t in study.trials if legacy.trial_attr(t, BASELINE_PARAMS_ATTR)), None)
    return FinishedStudy(
        study=study, source=source, space=space, winner=w, results=results, base=base, baseline_trial=baseline_trial
    )
