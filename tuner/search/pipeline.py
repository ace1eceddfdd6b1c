"""``tuner search``: screen -> compose -> tune -> confirm on one build, resumable.

Every stage writes what it measured into the Optuna study (user attributes for the screen and confirm
rounds, trials for the tune stage), so rerunning the same command continues where a call stopped
(a time budget, a lost machine) instead of starting over, and ``tuner export`` works from the study
database alone.
"""

from __future__ import annotations

__all__ = ["PHASES", "PIPELINE_VERSION", "BudgetReached", "kernels_for", "plan_text", "run_pipeline", "run_tune_worker"]

import contextlib
import dataclasses
import functools
import os
import platform
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import log
from tuner._hash import stable_hash
from tuner.errors import TunerError, UsageError
from tuner.paths import refuse_linked_folder
from tuner.plan.fa_rules import FaRule, Phase, rules_env, rules_from_texts
from tuner.redact import redact
from tuner.rounds import compose as comp

# BudgetReached: the time budget ran out inside a stage; what was measured is in the study, and the
# same command resumes from there (raised by the round loops too, before a round that would overrun).
from tuner.rounds.budget import Budget, BudgetReached
from tuner.rounds.joint import AllCallsFailed, Candidate, phase_stops, run_joint_rounds
from tuner.rounds.stats import summarize_phase
from tuner.sanity import require_finite
from tuner.search import confirm as conf
from tuner.search import tune as tn
from tuner.search.cost import counted as _counted
from tuner.search.cost import full_build_seconds, past_cost_line, priced_screen_call
from tuner.search.device_guard import OtherDevice, device_checked
from tuner.search.final_gates import run_output_gate, run_residency_gate
from tuner.search.kernel_screen import METHOD_BENCH, METHOD_KERNEL
from tuner.search.screen import candidates_for, run_phase_rounds
from tuner.search.screen_choice import coerce_pins, pinned_runtime, screen_method
from tuner.search.study import SearchConfig
from tuner.study.record import SearchOutcome, load_outcome
from tuner.study.state import RESUME_CHECKED, StudyState, trial_attr, write_trial

PIPELINE_VERSION = 2
PHASES = ("tg", "pp")  # decode first: it is where the kernel choice matters most; phases never gate each other


@contextlib.contextmanager
def _timed(st: StudyState, stage: str) -> Any:
    """Wall time per stage, recorded even when the budget stops the stage (resumed calls add up)."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        st.add_seconds(stage, time.monotonic() - t0)


def kernels_for(space: Any, phase: str) -> list[str]:
    """Forced kernels the space allows for a phase (its rule knobs' choices; none on the CPU)."""
    want = Phase.from_bench(phase)
    ks: list[str] = []
    for k in space.runtime_knobs:
        if k.kind == "rule" and k.meta.get("phase") == want.value:
            ks += [str(c) for c in (k.choices or ()) if c != "default" and str(c) not in ks]
    return ks


def plan_text(
    *,
    phases: Sequence[str],
    depths: Sequence[int],
    n_cands: Mapping[str, int],
    rounds: tuple[int, int],
    trials: int,
    confirm_depths: int,
    shared: bool = False,
    method: str = METHOD_BENCH,
) -> str:
    calls = max(n_cands[p] for p in phases) if shared else sum(n_cands[p] for p in phases)
    tool = (
        "test-backend-ops FLASH_ATTN_EXT calls (the op alone at the model's shape; llama-bench judges in confirm)"
        if method == METHOD_KERNEL
        else "llama-bench calls"
    )
    return (
        f"Plan: 1 build (cached after the first run) + gate; screen {len(phases)} phase(s) x {len(depths)} depths "
        f"x {', '.join(f'{n_cands[p]} candidates ({p})' for p in phases)} in {rounds[0]}-{rounds[1]} interleaved rounds "
        f"({calls} {tool} a round{', prefill and decode sharing each call' if shared else ''}); tune {trials} Optuna trial(s) (paired vs the composed rules); "
        f"confirm at {confirm_depths} depths, 3 candidates, {rounds[0]}-{rounds[1]} rounds. "
        "ETAs follow the first measured round."
    )


def _open_study(cfg: SearchConfig) -> Any:
    import optuna

    from tuner.study.storage import make_storage

    storage = make_storage(cfg.storage_url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Feasibility reaches TPE through Trial.set_constraint (Optuna 5's replacement of constraints_func).
    sampler = optuna.samplers.TPESampler(seed=cfg.seed, n_startup_trials=4, multivariate=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.create_study(
                study_name=cfg.study,
                storage=storage,
                directions=["maximize", "maximize"],
                sampler=sampler,
                load_if_exists=True,
            ), storage
    except ValueError as err:  # an existing study with one objective: made by the older search
        raise UsageError(
            f"study {cfg.study!r} in {redact(cfg.storage_url)} was made by an older `tuner search` ({err}). "
            "Pass a new --study NAME (or --run-dir) to start this search beside it."
        ) from err


def run_pipeline(
    cfg: SearchConfig, *, measure_factory: Any = None, equivalence: Any = None, then: Any = None
) -> SearchOutcome:
    """Run (or resume) the whole pipeline; returns its outcome as the study records it (:func:`tuner.study.load_outcome`).

    The run dir's and the study's locks (:mod:`tuner.search.lock`) are held throughout and through ``then(result)`` (the
    CLI's export). ``measure_factory(build) -> Measure`` replaces llama-bench (tests, replay); by default the live
    measure of :mod:`tuner.rounds.live` runs the build's real llama-bench. ``equivalence(check,
    upstream_build, final_build, work_dir) -> record`` replaces the output-equivalence gate's
    llama-perplexity runs (:func:`tuner.rounds.output_gate.run_gate_check`).
    """
    from tuner.plan.space import load_space

    budget = cfg.budget
    source = cfg.source
    space, legal = _resolved_space(cfg, load_space(cfg.arch, source.era))
    variants = [v for v in space.variants if cfg.variants is None or v in cfg.variants]
    if not variants:
        raise UsageError(
            f"none of the requested variants {list(cfg.variants or [])} is in the {cfg.arch} space "
            f"for era {source.era}; it has {space.variants}."
        )
    fixed = coerce_pins(space, cfg.fixed)
    shape_d = _model_shape(cfg.model)
    _check_depths(cfg.depths, shape_d)
    # Everything the user gave is checked (--storage by the CLI first): only now does the run dir appear.
    refuse_linked_folder(cfg.run_dir, "--run-dir").mkdir(parents=True, exist_ok=True)  # the default one too
    from tuner.search.lock import run_dir_lock, study_lock

    # The study's lock too: a second search on it from another run dir (or host) would measure its rounds
    # at the same time and add trials beyond --trials. `tuner worker` takes neither, on purpose.
    with run_dir_lock(cfg.run_dir), study_lock(cfg.storage_url, cfg.study):
        try:
            result = _run_locked(cfg, space, legal, variants, fixed, shape_d, budget, measure_factory, equivalence)
        except AllCallsFailed as err:
            raise TunerError(
                f"llama-bench cannot run the model {cfg.model}: {err} A model that fails to load is usually "
                "truncated or corrupt (an interrupted download or copy): check its size and checksum, or pass "
                "another --model. Nothing of the failed round was stored; rerun the same command after the fix."
            ) from None
        if then is not None:
            then(result)
        return result


def _run_locked(
    cfg: SearchConfig,
    space: Any,
    legal: Any,
    variants: Sequence[str],
    fixed: Mapping[str, Any],
    shape_d: Mapping[str, int],
    budget: Budget,
    measure_factory: Any,
    equivalence: Any,
) -> SearchOutcome:
    """:func:`run_pipeline` past its checks, with the run dir's lock held."""
    study, storage = _open_study(cfg)
    st = StudyState(study)
    model_s = getattr(cfg, "model_seconds", None)
    if model_s:  # the CLI synthesized/quantized the model before the study opened
        st.add_seconds("model", model_s)
        st.add_seconds("total", model_s)
    if cfg.prebuild_seconds:  # ... after building upstream's variant for llama-quantize: the search's build
        st.add_seconds("build", cfg.prebuild_seconds)
        st.add_seconds("total", cfg.prebuild_seconds)
    with _timed(st, "total"):
        return _run_stages(
            cfg, study, storage, st, space, legal, variants, fixed, shape_d, budget, measure_factory, equivalence
        )


def _run_stages(
    cfg: SearchConfig,
    study: Any,
    storage: Any,
    st: StudyState,
    space: Any,
    legal: Any,
    variants: Sequence[str],
    fixed: Mapping[str, Any],
    shape_d: Mapping[str, int],
    budget: Budget,
    measure_factory: Any,
    equivalence: Any,
) -> SearchOutcome:
    source = cfg.source
    _record_attrs(st, cfg, source, shape_d, legal)
    base_env, base_args = pinned_runtime(space, fixed)
    shape = comp.Shape(D=shape_d.get("head_dim"), gqa=shape_d.get("gqa"), kv=_kv_type(base_args))

    # -- the upstream build, gated once ------------------------------------------------------------
    base_variant = str(fixed.get("variant", variants[0]))
    builds = _Builds(cfg, space, budget)
    with _timed(st, "build"):
        build = builds.get(base_variant, {})
    gate = _gate(st, cfg, cfg.target.arch, build, shape_d)
    if gate["status"] == "fail":
        raise TunerError(
            f"the upstream build {build.bin_dir} fails test-backend-ops FLASH_ATTN_EXT ({gate.get('failing')}); "
            f"log: {gate.get('log')}. Nothing was measured."
        )
    factory = _counted(st, device_checked(st, measure_factory or (lambda b: _live(cfg, b))))
    measure = factory(build)
    rounds = (cfg.min_rounds, cfg.max_rounds)
    kernels = {p: kernels_for(space, p) for p in PHASES}
    method = _screen_method(
        st, cfg, kernels, base_args, custom_measure=measure_factory is not None, n_layers=shape_d.get("n_layers")
    )
    screen_measure = measure if method == METHOD_BENCH else _kernel_factory(cfg, st, shape_d, base_args)(build)
    confirm_ds = sorted(
        set(cfg.depths)
        | set(conf.extra_depths(cfg.depths, limit=cfg.confirm_extra, max_depth=shape_d.get("context_length")))
    )
    log.info(
        plan_text(
            phases=PHASES,
            depths=cfg.depths,
            n_cands={p: len(kernels[p]) + 1 + (0 if kernels[p] else 1) for p in PHASES},
            rounds=rounds,
            trials=cfg.trials,
            confirm_depths=len(confirm_ds),
            shared=hasattr(screen_measure, "joint"),
            method=method,
        )
    )
    if (past := past_cost_line(cfg.arch, trials=cfg.trials, shape=shape_d)) is not None:
        log.info(past)

    # -- screen + compose, per phase ---------------------------------------------------------------
    decisions: dict[str, list[comp.Decision]] = {}
    priced = priced_screen_call(shape_d.get("d_model"), cfg.depths, kernel=method == METHOD_KERNEL)
    with _timed(st, "screen"):
        _screen_all(cfg, st, screen_measure, kernels, base_env, base_args, rounds, budget, decisions, priced)
    rules = tuple(r for p in PHASES for r in comp.rules_from(decisions[p], shape))
    st.set_compose(
        {"rules": rules, "decisions": [d.as_dict() for p in PHASES for d in decisions[p]], "shape": shape.key()}
    )
    log.info(
        "Composed rules: " + (", ".join(map(str, rules)) if rules else "none (upstream's selection stays everywhere)")
    )

    with _timed(st, "tune"):
        tuned = _tune(
            cfg, st, study, storage, space, shape_d, fixed, rules, base_env, base_args, factory, budget, builds
        )
    conf_factory = _confirm_factory(cfg, st, factory, measure_factory, rules, tuned)
    with _timed(st, "confirm"):
        result = conf.run_confirm(
            cfg, st, space, fixed, rules, tuned, (base_env, base_args), conf_factory, builds, confirm_ds, budget, PHASES
        )
    with _timed(st, "residency"):
        result = run_residency_gate(cfg, st, space, fixed, result, base_env, base_args, builds, shape_d)
    with _timed(st, "equivalence"):
        result = run_output_gate(
            cfg,
            st,
            space,
            fixed,
            source.era,
            result,
            base_env,
            base_args,
            builds,
            equivalence,
            {p.value: kernels[p.bench] for p in Phase},
        )
    require_finite(result, f"the search's result for {cfg.model}")  # never store (or export) a NaN t/s
    st.set_result(result)
    return load_outcome(study)


def reopen_raised_caps(st: StudyState, depths: Sequence[int], rounds: tuple[int, int], target_ci: float) -> list[str]:
    """Mark a finished phase screen unfinished where this run allows more rounds than it had.

    A screen ends at its round cap or at the CI target; resumed with a higher ``--max-rounds`` (or
    ``--min-rounds``) while its CI is still wider than the target, the phase gets the extra rounds
    instead of composing from the old ones again. Returns the reopened phases."""
    recs = st.screen_rounds
    reopened = []
    for p in PHASES:
        if not st.screen_done(p):
            continue
        mine = [r for r in recs if r["phase"] == p and set(depths) & {int(d) for d in r["depths"]}]
        if not phase_stops(p, mine, depths, rounds[0], rounds[1], target_ci, settle=comp.open_depths):
            log.info(
                f"Screen {p}: {len(mine)} round(s) recorded, CI wider than ±{target_ci:g}%, and this run allows "
                f"{rounds[1]}: screening on"
            )
            st.set_screen_done(p, False)
            reopened.append(p)
    return reopened


def _screen_all(
    cfg: SearchConfig,
    st: StudyState,
    measure: Any,
    kernels: Mapping[str, list[str]],
    base_env: Mapping[str, str],
    base_args: Sequence[str],
    rounds: tuple[int, int],
    budget: Budget,
    decisions: dict[str, list[comp.Decision]],
    priced: dict[str, Any],
) -> None:
    """Screen each phase (resumable: finished phases are marked done), refine boundaries (llama-bench
    screen only, :func:`_refine_steps`), compose.

    Phases not yet done are first screened together in shared llama-bench calls where the measure
    can (the ladder depths); each phase then refines its own boundaries alone. A round that would end past
    ``deadline`` is not started: judged by the study's measured rounds, or without one by ``priced``
    (:func:`tuner.search.cost.priced_screen_call`)."""
    reopen_raised_caps(st, cfg.depths, rounds, cfg.ci_target)
    refine = _refine_steps(cfg, st.screen_method or METHOD_BENCH)  # _screen_method recorded the tool
    todo = [p for p in PHASES if not st.screen_done(p)]
    joint = getattr(measure, "joint", None)
    if joint is not None and len(todo) > 1:
        joint_cands = {p: candidates_for(p, kernels[p], base_env=base_env, base_args=base_args) for p in todo}
        with log.step(
            f"Screen {' and '.join(todo)} in shared calls (one depth fill per depth and call) at depths {list(cfg.depths)}"
        ):
            run_joint_rounds(
                joint,
                joint_cands,
                list(cfg.depths),
                st.screen_rounds,
                pp_tokens=cfg.pp,
                min_rounds=rounds[0],
                max_rounds=rounds[1],
                target_ci=cfg.ci_target,
                deadline=budget.deadline,
                on_round=st.append_screen_round,
                prior=st.screen_rounds or [priced],
                settle=comp.open_depths,
            )
        budget.check("screen")
    for phase in PHASES:
        cands = candidates_for(phase, kernels[phase], base_env=base_env, base_args=base_args)
        recs = st.screen_rounds
        depths = sorted(set(cfg.depths) | {int(d) for d in st.refined(phase)})
        if not st.screen_done(phase):
            with log.step(f"Screen {phase}: upstream vs {', '.join(c.name for c in cands[1:])} at depths {depths}"):
                screen = functools.partial(
                    run_phase_rounds,
                    measure,
                    phase,
                    cands,
                    min_rounds=rounds[0],
                    max_rounds=rounds[1],
                    target_ci=cfg.ci_target,
                    deadline=budget.deadline,
                    on_round=st.append_screen_round,
                    prior=recs or [priced],  # the list the rounds go into: measured ones judge a refinement's first
                    settle=comp.open_depths,
                )
                screen(list(cfg.depths), recs)
                for extra in st.refined(phase):  # a resumed call completes earlier refinements
                    screen([int(extra)], recs)
                budget.check(f"screen {phase}")
                for _ in range(refine - len(st.refined(phase))):
                    new = comp.bisect_depths(comp.compose_phase(phase, summarize_phase(phase, recs, depths)), depths)
                    if not new:
                        break
                    log.info(f"  refining {phase} boundaries at depths {new}")
                    st.set_refined(phase, sorted({*st.refined(phase), *new}))
                    for extra in new:
                        screen([extra], recs)
                    depths = sorted(set(depths) | set(new))
                    budget.check(f"screen {phase} (refining)")
            st.set_screen_done(phase, True)
        cells = comp.judge_phase(phase, summarize_phase(phase, recs, depths))  # the verdicts compose acts on
        decisions[phase] = comp.compose_phase(phase, cells)
        st.set_screen(phase, {str(d): c.as_dict() for d, c in cells.items()})


def run_tune_worker(cfg: SearchConfig) -> int:
    """``tuner worker``: join a study that ``tuner search`` screened and composed, and add tune trials
    (several hosts on one PostgreSQL study share the expensive part: builds of compile-time rows).
    Returns the number of trials the study holds afterwards."""
    from tuner.plan.space import load_space

    budget = cfg.budget
    refuse_linked_folder(cfg.run_dir, "--run-dir").mkdir(parents=True, exist_ok=True)
    study, storage = _open_study(cfg)
    st = StudyState(study)
    composed = st.compose
    if not composed:
        raise UsageError(
            f"study {cfg.study!r} in {redact(cfg.storage_url)} has no composed rules yet: run `tuner search` with the "
            "same --storage and --study first (it screens and composes; workers then add tune trials)."
        )
    source = cfg.source
    space, legal = _resolved_space(cfg, load_space(cfg.arch, source.era))
    fixed = coerce_pins(space, cfg.fixed)
    shape_d = _model_shape(cfg.model)
    _record_attrs(st, cfg, source, shape_d, legal)
    base_env, base_args = pinned_runtime(space, fixed)
    with _timed(st, "tune"):
        _tune(
            cfg,
            st,
            study,
            storage,
            space,
            shape_d,
            fixed,
            rules_from_texts(composed["rules"]),
            base_env,
            base_args,
            _counted(st, device_checked(st, lambda b: _live(cfg, b))),
            budget,
            _Builds(cfg, space, budget),
        )
    return len(study.get_trials(deepcopy=False))


# ------------------------------------------------------------------------------------------------
# stages


def _tune(
    cfg: SearchConfig,
    st: StudyState,
    study: Any,
    storage: Any,
    space: Any,
    shape_d: Mapping[str, int],
    fixed: Mapping[str, Any],
    rules: Sequence[FaRule],
    base_env: Mapping[str, str],
    base_args: Sequence[str],
    factory: Any,
    budget: Budget,
    builds: _Builds,
) -> dict[str, Any] | None:
    """Optuna trials over compile-time rows and process knobs; returns the proposal to confirm (or None)."""
    import optuna

    cfg = tn.tune_focus(cfg, st, study)
    knobs = tn.tunable_knobs(space, fixed, head_dim=shape_d.get("head_dim"), patterns=cfg.tune_knobs)
    variants = [v for v in space.variants if cfg.variants is None or v in cfg.variants]
    dists = {k.name: k.to_optuna_distribution() for k in knobs}
    if len(variants) > 1 and "variant" not in fixed and tn.wanted("variant", cfg.tune_knobs):
        dists["variant"] = optuna.distributions.CategoricalDistribution(variants)
    base_variant = str(fixed.get("variant", variants[0]))
    want = cfg.trials
    if not dists or want <= 0:
        log.info("Tune: nothing to sample (no compile-time rows or process knobs left, or --trials 0)")
        return None
    rule_env = {"GGML_TUNER_FA_RULES": rules_env(rules)} if rules else {}
    ref = Candidate(name="composed", env={**base_env, **rule_env}, args=tuple(base_args))
    factory = tn.trial_factory(
        st,
        study,
        knobs if "variant" not in dists else [],
        factory,
        lambda: _kernel_factory(cfg, st, shape_d, base_args),
    )
    reaped = tn.fail_interrupted(study, storage)
    if reaped:
        log.notice(
            f"tune trial(s) {', '.join(map(str, reaped))} were cut off by an interrupted search or worker; "
            "they are marked failed and run again"
        )
    with log.step(f"Tune: {want} Optuna trial(s) over {len(dists)} knob(s), each paired with the composed rules"):
        while (n_done := tn.count_done(study)) < want:
            budget.check(f"tune (after {n_done} trial(s))")
            with tn.asked_trial(study, storage, dists) as trial:
                _run_trial(
                    cfg,
                    st,
                    study,
                    space,
                    shape_d,
                    fixed,
                    knobs,
                    variants,
                    base_variant,
                    rule_env,
                    ref,
                    factory,
                    builds,
                    trial,
                )
    best = tn.pick([t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE])
    if best is None:
        log.info(
            "Tune: no trial beat the composed rules by 2% without costing a phase 1%: process knobs stay upstream's"
        )
        return None
    log.info(f"Tune: trial {best.number} goes to confirm ({best.params})")
    return {"trial": best.number, "values": dict(trial_attr(best, "values", {})), "params": dict(best.params)}


def _run_trial(
    cfg: SearchConfig,
    st: StudyState,
    study: Any,
    space: Any,
    shape_d: Mapping[str, int],
    fixed: Mapping[str, Any],
    knobs: Sequence[Any],
    variants: Sequence[str],
    base_variant: str,
    rule_env: Mapping[str, str],
    ref: Candidate,
    factory: Any,
    builds: _Builds,
    trial: Any,
) -> None:
    """One tune trial, told to the study however it ends (an interruption is recorded by :func:`tn.asked_trial`)."""
    import optuna

    from tuner.plan.space import check_constraints, compile_values_of, runtime_env_and_args

    write_trial(trial, worker=f"{platform.node()}:{os.getpid()}")
    vals = {**{k.name: k.default for k in knobs}, **fixed, **trial.params}
    variant = str(vals.get("variant", fixed.get("variant", variants[0])))
    compile_values = compile_values_of(space, vals)
    changed = [k for k in knobs if vals.get(k.name) != k.default] + ([] if variant == variants[0] else ["variant"])
    phases = sorted({p for k in changed for p in (tn.knob_phases(k) if k != "variant" else ("pp", "tg"))})
    write_trial(trial, values={k: vals[k] for k in sorted(vals)}, phases=phases)
    # The trial's one constraint check: the tree's rows with the sampled fields, at the model's shape
    # (the build renders these values as checked).
    viol = check_constraints(
        cfg.arch,
        cfg.source.era,
        compile_values,
        model_shape=dict(shape_d) or None,
        space=space,
        source_root=Path(cfg.source.root),
    )
    if viol:
        why = "; ".join(str(v) for v in viol)
        write_trial(trial, status="infeasible", reason=why)
        trial.set_constraint("constraint_check", 1.0)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        log.info(f"  [trial {trial.number}] infeasible: {why[:120]}")
        return
    trial.set_constraint("constraint_check", 0.0)
    try:
        b = builds.get(variant, compile_values)
        g = _gate(st, cfg, cfg.target.arch, b, shape_d, tn.gate_kernels(changed))
        if g["status"] == "fail":
            raise TunerError(f"test-backend-ops failed: {g.get('failing')}; log {g.get('log')}")
        env, args = runtime_env_and_args(space, vals)
        cand = Candidate(name="candidate", env={**env, **rule_env}, args=tuple(args))
        objs, ratios, cpu = tn.paired_objectives(
            factory(builds.get(base_variant, {})),
            ref,
            factory(b),
            cand,
            phases,
            cfg.tune_depths or cfg.depths,
            label=f"tune-t{trial.number}",
            flip=bool(trial.number % 2),
        )
        write_trial(trial, ratios=ratios, cpu=cpu)
        rejected = tn.cpu_rejection(objs, cpu, *tn.screen_noise(st.screen("tg")))
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
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        log.warning(f"  [trial {trial.number}] failed: {str(err)[:200]}")


def _resolved_space(cfg: SearchConfig, space: Any) -> tuple[Any, dict[str, Any]]:
    """The space with threads/-ngl legal values for this machine, the --cpu-mask and the model
    (and those values, which the study records so the export resolves the same space)."""
    from tuner.plan.derive import space_for_run

    tokens = max(cfg.depths) + max(cfg.pp, cfg.tg)
    resolved, legal = space_for_run(
        space, cpu_mask=cfg.cpu_mask, model=Path(cfg.model), gpu=not cfg.target.is_cpu, tokens=tokens
    )
    pinned = getattr(cfg, "fixed", {}) or {}
    for name, lg in legal.items():  # a --set pin replaces what would be sampled: say so beside the derivation
        log.info(
            f"  {lg.why}" + (f"; pinned here at {pinned[name]} (--set {name}={pinned[name]})" if name in pinned else "")
        )
    return resolved, legal


def _kv_type(bench_args: Sequence[str]) -> str:
    """The K-cache type the runs use: llama-bench's -ctk when a pinned knob sets it, else its f16 default."""
    args = list(bench_args)
    return str(args[args.index("-ctk") + 1]) if "-ctk" in args[:-1] else "f16"


def _model_shape(model: Path) -> dict[str, int]:
    from tuner.targets.models import read_shape

    return dict(read_shape(Path(model)))  # an unreadable or non-llama GGUF is a UsageError there


def _check_depths(depths: Sequence[int], shape: Mapping[str, int]) -> None:
    ctx = shape.get("context_length")
    too_deep = [d for d in depths if ctx and d > ctx]
    if too_deep:
        raise UsageError(
            f"--depths {too_deep} exceed the model's context length {ctx} (n_ctx_train in the GGUF). "
            f"Use depths up to {ctx}, e.g. --depths {','.join(str(d) for d in depths if ctx and d <= ctx)}."
        )


def _record_attrs(
    st: StudyState, cfg: SearchConfig, source: Any, shape: Mapping[str, int], legal: Mapping[str, Any]
) -> None:
    import dataclasses

    from tuner.study.record import StudyHeader

    mine = StudyHeader(
        name=cfg.study,
        pipeline=PIPELINE_VERSION,
        arch=cfg.arch,
        source_spec=source.spec,
        source_id=source.source_id,
        commit=source.commit,
        era=source.era,
        model=str(cfg.model),
        depths=tuple(cfg.depths),
        pp=cfg.pp,
        tg=cfg.tg,
        shape=dict(shape),
        profile="per-phase",
        cpu_mask=tuple(cfg.cpu_mask or ()),
    ).stored()
    if st.arch is not None:
        for k in RESUME_CHECKED:
            if (
                st.header_value(k, [] if k == "cpu_mask" else None) != mine[k]
            ):  # a study from before --cpu-mask: unpinned
                raise UsageError(
                    f"study {cfg.study!r} in {redact(cfg.storage_url)} was created with {k}={st.header_value(k)!r} but this run "
                    f"has {k}={mine[k]!r}. Use another --study name, or the same settings."
                )
    st.record_header(
        mine
    )  # a study seeded from another one (results/sm_90/llama-3.2-1b-q4_k_m/evidence) lacks some, e.g. the model
    # threads/-ngl legal values on this machine: the export resolves the same space from them
    st.set_derived_knobs({k: dataclasses.asdict(v) for k, v in legal.items()})


class _Builds:
    """The builds of one process, looked up once per (variant, compile values): a cached build still
    costs a render and a no-op ninja run, which the tune and confirm stages must not pay per trial.
    Compile values reach it from tune trials, whose constraint check already passed: the render does
    not check them again."""

    def __init__(self, cfg: SearchConfig, space: Any, budget: Budget) -> None:
        self.cfg, self.space, self.budget = cfg, space, budget
        self._known: dict[str, Any] = {}
        from tuner.builder.cmake import search_targets

        self.targets = search_targets(cfg.target.is_cpu)

    def get(self, variant: str, compile_values: Mapping[str, Any]) -> Any:
        key = stable_hash(variant, dict(compile_values))
        if key not in self._known:
            from tuner.builder.cmake import build_variant
            from tuner.plan.render import render_variant

            rv = render_variant(
                self.cfg.source,
                self.cfg.arch,
                variant,
                compile_values=compile_values,
                local_archs=list(self.cfg.target.local_archs),
                space=self.space,
                checked=True,
            )
            from tuner.builder.cmake import is_built

            if not is_built(rv, self.targets):  # a build cut off by the limit is lost whole
                self.budget.fits(full_build_seconds(), f"the build of {rv.short}")
            self._known[key] = build_variant(rv, targets=self.targets, jobs=self.cfg.jobs)
        return self._known[key]


def _gate(
    st: StudyState,
    cfg: SearchConfig,
    arch: Any,
    build: Any,
    shape: Mapping[str, int],
    kernels: Sequence[str] = tn.ALL_KERNELS,
) -> dict[str, Any]:
    """test-backend-ops FLASH_ATTN_EXT with each of ``kernels`` forced, once per build (recorded in the study
    with the kernels it forced; a tune trial forces only those its rows change, :func:`tn.gate_kernels`)."""
    gates = st.gates
    if build.build_id in gates:
        return dict(gates[build.build_id])
    res: dict[str, Any]
    if not cfg.gate or arch.vendor == "cpu":
        res = {
            "status": "skipped",
            "why": "CPU backend is the reference test-backend-ops compares against"
            if arch.vendor == "cpu"
            else "--no-gate",
        }
    else:
        from tuner.measure.gate import params_for_model, run_gate

        t0 = time.monotonic()
        with log.step(
            f"Gate: test-backend-ops FLASH_ATTN_EXT with {'each kernel' if len(kernels) == len(tn.ALL_KERNELS) else '/'.join(kernels)} forced (head size {shape.get('head_dim', 64)})"
        ):
            g = run_gate(
                build.bin_dir,
                kernels=list(kernels),
                backend=f"{arch.backend}0",
                params=params_for_model(shape.get("head_dim", 64), "f16"),
                log_dir=cfg.run_dir / "logs",
            )
        st.add_seconds("gate", time.monotonic() - t0)
        res = {
            "status": "pass" if g.passed else "fail",
            "summary": g.summary,
            "failing": list(g.failing)[:20],
            "log": str(g.log_file),
            "kernels": list(kernels),
        }
    gates[build.build_id] = res
    st.set_gates(gates)
    if not st.has_toolchain():
        st.set_toolchain(dict(build.meta.get("toolchain", {})))
    return res


def _refine_steps(cfg: SearchConfig, method: str) -> int:
    """Bisection steps for the screen: ``--refine`` with llama-bench, none at the op level.

    The op level places a rule's boundary several times too shallow (docs/llama-bench-cost.md: MMA beat
    VEC at the op from d6144 on the 1B, end to end only from d32768), so a bisection there buys a boundary
    the confirm moves anyway (:func:`tuner.search.confirm.narrowed_rule`); its rounds cost about a minute."""
    if method == METHOD_BENCH or cfg.refine == 0:
        return cfg.refine
    log.info(
        f"Screen: no boundary refinement at the op level (--refine {cfg.refine} applies to the llama-bench "
        "screen); the confirm measures the rules end to end and narrows them to where they pay"
    )
    return 0


def _screen_method(
    st: StudyState,
    cfg: SearchConfig,
    kernels: Mapping[str, Sequence[str]],
    base_args: Sequence[str],
    *,
    custom_measure: bool,
    n_layers: int | None = None,
) -> str:
    """The screen's measuring tool (``--screen``; docs/llama-bench-cost.md): the one the study was screened
    with if it holds rounds, else :func:`tuner.search.screen_choice.screen_method` (the rule the dry run
    plans with): the asked one, else (``auto``) the kernel level where it stands for what llama-bench
    would time: an NVIDIA GPU with kernels to force, the whole model on the GPU (``base_args``, the pinned
    runtime knobs' arguments, offload every layer and the KV cache; no CPU mask, where the host paces a
    step) and the live llama-bench (not a test's fake)."""
    asked = cfg.screen_method
    recorded = st.screen_method
    if recorded is None and st.screen_rounds:
        recorded = METHOD_BENCH  # studies screened before the kernel-level screen existed
    if recorded is not None:
        if asked not in (None, recorded):
            raise UsageError(
                f"The study {cfg.study!r} was screened with {recorded}; its rounds cannot be mixed with {asked}'s "
                f"(another unit). Rerun with --screen {recorded}, or start a new study (--study NAME) to screen with {asked}."
            )
        return recorded
    asked = screen_method(
        asked,
        arch=cfg.arch,
        vendor=cfg.target.arch.vendor,
        gpu=not cfg.target.is_cpu,
        has_kernels=any(kernels.values()),
        base_args=base_args,
        n_layers=n_layers,
        cpu_mask=cfg.cpu_mask,
        custom_measure=custom_measure,
    )
    st.set_screen_method(asked)
    return asked


def _confirm_factory(
    cfg: SearchConfig, st: StudyState, factory: Any, measure_factory: Any, rules: Sequence[FaRule], tuned: Any
) -> Any:
    """The confirm stage's measure factory. Prefill rides along in the confirm's shared calls only to show it
    did not move where nothing changes it: it then gets decode's repetitions, not the -r its own claims would
    need (a call's -r is the larger of its phases')."""
    if measure_factory is not None or tuned or any(r.phase is Phase.PREFILL for r in rules):
        return factory
    ride = dataclasses.replace(cfg, reps_pp=min(cfg.reps_pp, cfg.reps_tg))
    return _counted(st, device_checked(st, lambda b: _live(ride, b)))


def _kernel_factory(cfg: SearchConfig, st: StudyState, shape: Mapping[str, int], base_args: Sequence[str]) -> Any:
    """build -> the op-level measure (test-backend-ops FLASH_ATTN_EXT at the model's shape), held to the
    study's device: the screen's, and the tune's where its trials run at the op level."""
    from tuner.search.kernel_screen import make_kernel_measure

    def make(b: Any) -> Any:
        return make_kernel_measure(
            b.bin_dir,
            shape,
            pp=cfg.pp,
            tg=cfg.tg,
            kv_type=_kv_type(base_args),
            bench_args=base_args,
            log_dir=cfg.run_dir / "logs" / "kernel-screen",
        )

    return device_checked(st, make)


def _live(cfg: SearchConfig, build: Any) -> Any:
    from tuner.rounds.live import make_live_measure

    return make_live_measure(
        build.bin_dir,
        cfg.model,
        pp=cfg.pp,
        tg=cfg.tg,
        reps={"pp": cfg.reps_pp, "tg": cfg.reps_tg},
        log_dir=cfg.run_dir / "logs",
        era=cfg.source.era,
        arch=cfg.arch,
        cpus=cfg.cpu_mask,
    )
