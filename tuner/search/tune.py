"""Tune: Optuna only for what really is a joint search (compile-time rows, process-wide knobs), with the
composed rules fixed; kernel rules are the screen's job. A candidate the constraint check rejects is recorded
infeasible, never built.

A trial measures only the phases its knobs declare (``phases = ["pp"]`` in the space file; both by default),
each against the composed reference in one paired round, one objective per phase. The best trial is only a
proposal: confirm decides. A trial whose decode CPU% rises beyond the screen's A/A CPU noise without a decode
t/s gain beyond its noise is infeasible (docs/design.md, "CPU% in decode decisions"); one paired round has no
interval, so its point estimates are held against the noise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fnmatch
import math
import os
import platform
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import TrialState

from tuner import interrupts, log
from tuner.errors import TunerError, UsageError
from tuner.measure.paired import CPU_REJECTED, rejects_cpu_cost
from tuner.plan.fa_rules import FaRule, rules_env
from tuner.plan.space import Knob, SearchSpace, check_constraints, compile_values_of, runtime_env_and_args
from tuner.rounds.budget import BudgetReached
from tuner.rounds.joint import Candidate, Measure
from tuner.search.context import ALL_KERNELS, MeasureFactory, Proposal, SearchRun, gate, kernel_factory
from tuner.search.device_guard import OtherDevice
from tuner.search.kernel_screen import METHOD_BENCH, METHOD_KERNEL
from tuner.search.study import SearchConfig
from tuner.study import storage as sto
from tuner.study.record import TunedTrial
from tuner.study.state import StudyState, TuneFocus, retry_attrs, trial_attr, write_trial, write_trial_in_storage

TUNE_KINDS = ("tile_row", "mma_row", "wmma", "env", "bench_flag")
ROW_KERNELS = {"tile_row": "TILE", "mma_row": "MMA"}
"""Config-row kinds -> the FlashAttention kernel their translation units build (as the gate names it)."""


def trial_method(knobs: Sequence[Knob], *, screen_method: str | None, recorded: str | None) -> str:
    """What times the tune's trials: ``kernel`` (the FA op alone) or ``llama-bench``.

    The op level where the screen ran there and every sampled knob is a tile/MMA config row, which changes that
    op alone (seconds a trial, where two deep llama-bench calls spend most of a minute refilling the context); a
    process knob or a build variant changes the whole step. A study with trials keeps its ``recorded`` method:
    two methods' ratios are not one objective."""
    if recorded is not None:
        return recorded
    if screen_method == METHOD_KERNEL and knobs and all(k.kind in ROW_KERNELS for k in knobs):
        return METHOD_KERNEL
    return METHOD_BENCH


def trial_factory(
    st: StudyState, study: optuna.Study, knobs: Sequence[Knob], bench: MeasureFactory, op: Callable[[], MeasureFactory]
) -> MeasureFactory:
    """``bench`` or ``op()``, as :func:`trial_method` picks; the method is recorded before the first trial."""
    # trials measured before the method was recorded were llama-bench's
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    recorded = st.tune_method or (METHOD_BENCH if done else None)
    method = trial_method(knobs, screen_method=st.screen_method, recorded=recorded)
    st.set_tune_method(method)
    if method != METHOD_KERNEL:
        return bench
    log.info(
        "Tune: each trial is timed at the op level (test-backend-ops FLASH_ATTN_EXT at the model's shape, as the "
        "screen was): its knobs are config rows, which change that op alone; llama-bench judges the proposal "
        "in the confirm"
    )
    return op()


def gate_kernels(changed: Sequence[Knob | str]) -> list[str]:
    """The kernels a trial's test-backend-ops gate forces: those whose config rows the trial changed (the
    others are the base build's, gated already); a variant or process knob can change any, so all are forced."""
    kernels = {None if isinstance(k, str) else ROW_KERNELS.get(k.kind) for k in changed}
    if not changed or None in kernels:
        return list(ALL_KERNELS)
    return [k for k in ALL_KERNELS if k in kernels]


def tunable_knobs(
    space: SearchSpace, fixed: Mapping[str, object], *, head_dim: int | None = None, patterns: Sequence[str] = ()
) -> list[Knob]:
    """Knobs the tune stage samples: compile-time rows and process-wide knobs not pinned by --set, matching
    ``patterns`` (``--tune-knobs`` globs). A row of another head size than ``head_dim`` is left out: the model
    never runs it."""
    out = []
    for k in (*space.compile_knobs, *space.runtime_knobs):
        if k.kind not in TUNE_KINDS or k.name in fixed:
            continue
        dkq = k.meta.get("dkq") if k.kind in ("tile_row", "mma_row") else None
        if head_dim and dkq is not None and int(dkq) != int(head_dim):
            continue
        if patterns and not wanted(k.name, patterns):
            continue
        out.append(k)
    return out


def wanted(name: str, patterns: Sequence[str]) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def check_patterns(space: SearchSpace, patterns: Sequence[str]) -> None:
    """UsageError for a ``--tune-knobs`` glob that matches no tunable knob (nor ``variant``) of ``space``."""
    names = [k.name for k in tunable_knobs(space, {})] + ["variant"]
    bad = [p for p in patterns if not any(wanted(n, (p,)) for n in names)]
    if bad:
        raise UsageError(
            f"--tune-knobs {','.join(bad)} matches no knob the {space.arch} space tunes. Its knobs: "
            f"{', '.join(names)}. Give globs over these names, e.g. --tune-knobs 'mma.ampere.d64.c8.*'."
        )


def knob_phases(knob: Knob) -> tuple[str, ...]:
    ph = knob.meta.get("phases")
    return tuple(ph) if ph else ("pp", "tg")


def geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x and math.isfinite(x) and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def pick(
    trials: Sequence[optuna.trial.FrozenTrial], *, min_gain: float = 1.02, floor: float = 0.99
) -> optuna.trial.FrozenTrial | None:
    """The trial worth confirming, the best by the product of its objectives: not rejected for its CPU cost, no
    objective below ``floor``, the product at least ``min_gain``. None when no trial qualifies."""
    best, best_v = None, min_gain
    for t in trials:
        if trial_attr(t, "rejected"):
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


def paired_objectives(
    m_ref: Measure,
    ref: Candidate,
    m_cand: Measure,
    cand: Candidate,
    phases: Sequence[str],
    depths: Sequence[int],
    *,
    label: str,
    flip: bool,
) -> tuple[list[float], dict[str, float], dict[str, float]]:
    """One paired round per phase the trial can change, reference and candidate back to back (order flipped on
    alternate trials). Returns the objectives ``[pp, tg]`` (geometric mean of the per-depth ratios; 1.0 for a
    phase not measured), the ratios and the CPU% differences candidate - reference, keyed ``tg@4096``.
    TunerError where llama-bench gave no result for a measured phase."""
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


def screen_noise(cells: Mapping[str, Mapping[str, float | None]]) -> tuple[float, float]:
    """(t/s noise %, CPU% noise points) of a phase's stored screen cells: the medians over depths, as compose's
    floors; infinite where unknown (older studies)."""

    def med(key: str) -> float:
        vals = sorted(float(v) for c in cells.values() if (v := c.get(key)) is not None and math.isfinite(float(v)))
        return vals[len(vals) // 2] if vals else math.inf

    return med("noise_pct"), med("cpu_noise")


def cpu_rejection(objs: Sequence[float], cpu: Mapping[str, float], ts_noise_pct: float, cpu_noise: float) -> str:
    """Why a trial is rejected for its decode CPU cost, or '' when it is not (``objs``, ``cpu``:
    :func:`paired_objectives`')."""
    rises = [v for k, v in cpu.items() if k.startswith("tg@")]
    if not rises:
        return ""
    rise = sum(rises) / len(rises)
    if not rejects_cpu_cost(objs[1], ts_noise_pct, rise, cpu_noise):
        return ""
    return (
        f"{CPU_REJECTED}: decode CPU% {rise:+.1f} points (screen A/A CPU noise ±{cpu_noise:.1f}), "
        f"t/s x{objs[1]:.3f} (noise ±{ts_noise_pct:.1f}%)"
    )


# trials cut off by an interruption (Ctrl-C, SIGTERM, kill -9, a lost machine)
INTERRUPTED = "interrupted"
"""``status`` of a trial that was cut off: it measured nothing, does not count and is queued again."""
_COUNTED = ("ok", "failed", "infeasible")
"""``status`` of a FAIL trial that counts as done: judged (infeasible) or failed with its reason."""


def count_done(study: optuna.Study) -> int:
    """Trials that count toward ``--trials``: measured or failed with a reason; RUNNING and interrupted
    trials do not (a resumed search runs them again)."""
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
        if t.state != TrialState.FAIL or trial_attr(t, "status") in _COUNTED:
            n += 1
    return n


def _fail_and_requeue(
    study: optuna.Study, storage: optuna.storages.BaseStorage, trial: optuna.Trial | optuna.trial.FrozenTrial, why: str
) -> bool:
    """Record a trial interrupted and FAIL it, and queue its parameters again; False where it had ended already.

    A trial cut inside ``ask`` holds only the values sampled before the cut, perhaps none: its retry is queued
    all the same, repeating those and sampling the rest, so every cut-off trial has one retry that names it."""
    write_trial_in_storage(storage, trial._trial_id, status=INTERRUPTED, reason=why)
    if not storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.enqueue_trial(dict(trial.params), user_attrs=retry_attrs(trial.number))
    return True


def _orphan(t: optuna.trial.FrozenTrial) -> bool:
    """A RUNNING trial whose ``worker`` is a dead PID of this host, or that names no worker and started longer ago
    than the heartbeat's grace period: its asker lost the storage between asking and recording itself (no
    heartbeat either), so nothing else would ever fail it."""
    host, _, pid = str(trial_attr(t, "worker", "")).rpartition(":")
    if host == platform.node() and pid.isdigit() and int(pid) != os.getpid():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except OSError:  # EPERM: it exists as another user
            return False
        return False
    start = getattr(t, "datetime_start", None)
    if trial_attr(t, "worker") or start is None:
        return False
    return bool((datetime.datetime.now() - start).total_seconds() > sto.GRACE_S)


def fail_interrupted(study: optuna.Study, storage: optuna.storages.RDBStorage) -> list[int]:
    """Fail the RUNNING trials whose process is gone, queue them again; returns their numbers.

    Gone: its ``worker`` (``host:pid``) is a dead PID of this host, or its heartbeat is older than the
    storage's grace period (another host's worker that died)."""
    stale: set[int] = set()
    if is_heartbeat_enabled(storage):
        stale = set(storage._get_stale_trial_ids(study._study_id))
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t._trial_id not in stale and not _orphan(t):
            continue
        why = f"its process ({trial_attr(t, 'worker', 'unknown')}) stopped before the trial was measured"
        try:
            if _fail_and_requeue(study, storage, t, why):
                out.append(t.number)
        except UpdateFinishedTrialError:  # another process finished or failed it meanwhile
            continue
    return out


@contextlib.contextmanager
def asked_trial(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    dists: Mapping[str, optuna.distributions.BaseDistribution],
) -> Iterator[optuna.Trial]:
    """A new (or queued) trial with its heartbeat; a block cut off by Ctrl-C, SIGTERM or an error fails it and
    queues it again. SIGTERM is held until the trial is bound: ``study.ask`` stores it RUNNING before it returns."""
    trial = None
    try:
        with warnings.catch_warnings(), interrupts.held():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # Optuna records heartbeats in optimize() only; sto.trial_heartbeat does for this ask/tell trial
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
            trial = study.ask(dict(dists))
            # who runs it, at once: a storage lost before this write leaves a trial no one can tell is dead
            write_trial(trial, worker=f"{platform.node()}:{os.getpid()}")
        with sto.trial_heartbeat(storage, trial._trial_id):
            yield trial
    except BaseException:
        # fail it and queue its parameters again; best effort, so that a second error never hides the interruption
        with contextlib.suppress(Exception):
            if trial is not None:
                why = "interrupted (Ctrl-C, SIGTERM or an error) before it was measured"
                _fail_and_requeue(study, study._storage, trial, why)
        raise


def tune_focus(cfg: SearchConfig, st: StudyState, study: optuna.Study) -> SearchConfig:
    """``cfg`` with the tune focus (``--tune-knobs``, ``--tune-depths``) its study's trials were asked with.

    The first run that samples records its focus; a ``tuner worker`` without those flags takes it. Another
    focus of a study with trials is refused: its trials would mix two spaces in one sampler."""
    if not cfg.trials and not cfg.worker:  # this run samples nothing (e.g. a rerun that only exports)
        return cfg
    mine: TuneFocus = {"knobs": list(cfg.tune_knobs), "depths": list(cfg.tune_depths or [])}
    recorded = st.tune_focus
    if recorded is None:
        st.set_tune_focus(mine["knobs"], mine["depths"])
        return cfg
    if cfg.worker and not any(mine.values()):
        knobs, depths = tuple(recorded["knobs"]), tuple(recorded["depths"]) or None
        return dataclasses.replace(cfg, tune_knobs=knobs, tune_depths=depths)
    if mine != recorded and study.get_trials(deepcopy=False):

        def flags(f: TuneFocus) -> str:
            return (
                " ".join(
                    [f"--tune-knobs {','.join(f['knobs'])}"] * bool(f["knobs"])
                    + [f"--tune-depths {','.join(map(str, f['depths']))}"] * bool(f["depths"])
                )
                or "no --tune-knobs/--tune-depths"
            )

        raise UsageError(
            f"study {cfg.study!r} has tune trials asked with {flags(recorded)}; this run asks {flags(mine)}. "
            "Its trials would mix two spaces in one sampler. Rerun with the study's flags, or give a new --study."
        )
    st.set_tune_focus(mine["knobs"], mine["depths"])
    return cfg


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Trials:
    """What every trial of one tune stage shares."""

    knobs: tuple[Knob, ...]
    rule_env: Mapping[str, str]
    ref: Candidate
    factory: MeasureFactory


def tune_stage(run: SearchRun, rules: Sequence[FaRule]) -> Proposal:
    """Optuna trials paired with the composed ``rules``; returns the rules with the best trial (:func:`pick`)."""
    study, st = run.study, run.st
    run = dataclasses.replace(run, cfg=tune_focus(run.cfg, st, study))
    cfg = run.cfg
    knobs = tunable_knobs(run.space, run.fixed, head_dim=run.shape.head_dim, patterns=cfg.tune_knobs)
    dists = {k.name: k.to_optuna_distribution() for k in knobs}
    if len(run.variants) > 1 and "variant" not in run.fixed and wanted("variant", cfg.tune_knobs):
        dists["variant"] = optuna.distributions.CategoricalDistribution(run.variants)
    proposal = Proposal(rules=tuple(rules))
    if not dists or cfg.trials <= 0:
        log.info("Tune: nothing to sample (no compile-time rows or process knobs left, or --trials 0)")
        return proposal
    rule_env = {"GGML_TUNER_FA_RULES": rules_env(rules)} if rules else {}
    trials = _Trials(
        knobs=tuple(knobs),
        rule_env=rule_env,
        ref=Candidate(name="composed", env={**run.base_env, **rule_env}, args=run.base_args),
        factory=trial_factory(
            st, study, knobs if "variant" not in dists else [], run.factory, lambda: kernel_factory(run)
        ),
    )
    reaped = fail_interrupted(study, run.storage)
    if reaped:
        log.notice(
            f"tune trial(s) {', '.join(map(str, reaped))} were cut off by an interrupted search or worker; "
            "they are marked failed and run again"
        )
    with log.step(f"Tune: {cfg.trials} Optuna trial(s) over {len(dists)} knob(s), each paired with the composed rules"):
        while (n_done := count_done(study)) < cfg.trials:
            run.budget.check(f"tune (after {n_done} trial(s))")
            with asked_trial(study, run.storage, dists) as trial:
                _run_trial(run, trials, trial)
    best = pick([t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE])
    if best is None:
        log.info(
            "Tune: no trial beat the composed rules by 2% without costing a phase 1%: process knobs stay upstream's"
        )
        return proposal
    log.info(f"Tune: trial {best.number} goes to confirm ({best.params})")
    tuned = TunedTrial(trial=best.number, values=dict(trial_attr(best, "values", {})), params=dict(best.params))
    return dataclasses.replace(proposal, tuned=tuned)


def _run_trial(run: SearchRun, trials: _Trials, trial: optuna.Trial) -> None:
    """One tune trial, told to the study however it ends."""
    cfg, study, space, fixed = run.cfg, run.study, run.space, run.fixed
    write_trial(trial, worker=f"{platform.node()}:{os.getpid()}")
    vals = {**{k.name: k.default for k in trials.knobs}, **fixed, **trial.params}
    variant = str(vals.get("variant", fixed.get("variant", run.variants[0])))
    compile_values = compile_values_of(space, vals)
    changed: list[Knob | str] = [k for k in trials.knobs if vals.get(k.name) != k.default]
    changed += [] if variant == run.variants[0] else ["variant"]
    phases = sorted({p for k in changed for p in (("pp", "tg") if isinstance(k, str) else knob_phases(k))})
    write_trial(trial, values={k: vals[k] for k in sorted(vals)}, phases=phases)
    # the one constraint check, at the model's shape (the build renders these values as checked)
    viol = check_constraints(
        cfg.arch,
        cfg.source.era,
        compile_values,
        model_shape=dict(run.header.shape) or None,
        space=space,
        source_root=Path(cfg.source.root),
    )
    if viol:
        why = "; ".join(str(v) for v in viol)
        write_trial(trial, status="infeasible", reason=why)
        trial.set_constraint("constraint_check", 1.0)
        study.tell(trial, state=TrialState.FAIL)
        log.info(f"  [trial {trial.number}] infeasible: {why[:120]}")
        return
    trial.set_constraint("constraint_check", 0.0)
    try:
        b = run.builds.get(variant, compile_values)
        g = gate(run, b, gate_kernels(changed))
        if g.status == "fail":
            raise TunerError(f"test-backend-ops failed: {list(g.failing)}; log {g.log}")
        env, args = runtime_env_and_args(space, vals)
        cand = Candidate(name="candidate", env={**env, **trials.rule_env}, args=(*args, *run.host_args))
        objs, ratios, cpu = paired_objectives(
            trials.factory(run.builds.get(run.base_variant, {})),
            trials.ref,
            trials.factory(b),
            cand,
            phases,
            cfg.tune_depths or cfg.depths,
            label=f"tune-t{trial.number}",
            flip=bool(trial.number % 2),
        )
        write_trial(trial, ratios=ratios, cpu=cpu)
        rejected = cpu_rejection(objs, cpu, *screen_noise(run.st.screen("tg")))
        trial.set_constraint("cpu_cost", 1.0 if rejected else 0.0)
        if rejected:
            write_trial(trial, rejected=rejected)
            log.info(f"  [trial {trial.number}] {rejected}")
        write_trial(trial, status="ok")
        study.tell(trial, objs)
        log.info(
            f"  [trial {trial.number}] {', '.join(k if isinstance(k, str) else k.name for k in changed) or 'upstream'}: "
            f"pp x{objs[0]:.3f}, tg x{objs[1]:.3f} (one paired round; confirm decides)"
        )
    except (OtherDevice, BudgetReached):  # not this trial's failure: asked_trial queues the trial again
        raise
    except TunerError as err:  # a failed build/gate/benchmark is a failed trial with its reason
        write_trial(trial, status="failed", reason=str(err)[:2000])
        study.tell(trial, state=TrialState.FAIL)
        log.warning(f"  [trial {trial.number}] failed: {str(err)[:200]}")
