"""``tuner search``: gate -> screen -> compose -> tune -> confirm -> residency and output gates, on one build.

Every stage writes what it measured into the Optuna study, so rerunning the same command resumes where a call
stopped (a time budget, a lost machine), and ``tuner export`` works from the study database alone.

Whether upstream's own llama-bench runs on this host is found out before any round is spent on it
(:func:`repack_probe`). On some AMX hosts (virtual machines among them) llama.cpp's AMX kernels die of SIGILL or
SIGSEGV (llama.cpp issue 20824) and only ``--repack 0`` runs the model. One short llama-bench call finds out;
where upstream dies and ``--repack 0`` runs, every config of the study is measured with it, and the export's
commands carry it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import optuna

from tuner import _run, log
from tuner.errors import TunerError, UsageError
from tuner.paths import refuse_linked_folder
from tuner.plan import space as sp
from tuner.plan.derive import Legal, space_for_run
from tuner.plan.fa_rules import FaRule, rules_from_texts
from tuner.plan.variant import Build
from tuner.redact import redact
from tuner.rounds import compose as comp
from tuner.rounds.budget import Budget
from tuner.rounds.joint import (
    AllCallsFailed,
    Measure,
    SharedMeasure,
    candidates_for,
    depths_to_measure,
    run_joint_rounds,
    run_phase_rounds,
)
from tuner.rounds.stats import summarize_phase
from tuner.sanity import require_finite
from tuner.search import context as cx
from tuner.search import lock
from tuner.search.confirm import confirm_depths, run_confirm
from tuner.search.context import PHASES, GateResult, SearchRun, gate
from tuner.search.cost import past_cost_line, priced_screen_call
from tuner.search.device_guard import counted, device_checked
from tuner.search.final_gates import run_output_gate, run_residency_gate
from tuner.search.kernel_screen import METHOD_BENCH, METHOD_KERNEL, coerce_pins, pinned_runtime, screen_method
from tuner.search.request import check_depths, check_variants
from tuner.search.study import SearchConfig
from tuner.search.tune import tune_stage
from tuner.study.record import SearchOutcome, StudyHeader, load_outcome
from tuner.study.state import RESUME_CHECKED, StudyState
from tuner.study.storage import make_storage
from tuner.targets.host import host_has_amx
from tuner.targets.models import ModelShape, load_gguf_shape, shape_ints

PIPELINE_VERSION = 2


@contextlib.contextmanager
def _timed(st: StudyState, stage: str) -> Iterator[None]:
    """Wall time per stage, recorded even when the budget stops the stage (resumed calls add up)."""
    t0 = time.monotonic()
    try:
        yield
    except BaseException:
        # a storage busy meanwhile (SQLite "database is locked") must not replace the error being unwound
        with contextlib.suppress(Exception):
            st.add_seconds(stage, time.monotonic() - t0)
        raise
    st.add_seconds(stage, time.monotonic() - t0)


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


def _open_study(cfg: SearchConfig) -> tuple[optuna.Study, optuna.storages.RDBStorage]:
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Checked:
    """What :func:`run_pipeline` checks before the run dir appears."""

    space: sp.SearchSpace
    legal: Mapping[str, Legal]
    variants: tuple[str, ...]
    fixed: Mapping[str, object]
    shape: ModelShape


def _checked(cfg: SearchConfig) -> _Checked:
    source = cfg.source
    space, legal = _resolved_space(cfg, sp.load_space(cfg.arch, source.era))
    variants = tuple(check_variants(space.variants, cfg.variants, cfg.arch, source.era))
    fixed = coerce_pins(space, cfg.fixed)
    shape = load_gguf_shape(Path(cfg.model))  # an unreadable or non-llama GGUF is a UsageError there
    check_depths(cfg.depths, shape.context_length)
    return _Checked(space=space, legal=legal, variants=variants, fixed=fixed, shape=shape)


def run_pipeline(
    cfg: SearchConfig,
    *,
    measure_factory: cx.MeasureFactory | None = None,
    equivalence: cx.Equivalence | None = None,
    then: Callable[[SearchOutcome], None] | None = None,
) -> SearchOutcome:
    """Run (or resume) the whole pipeline; returns its outcome as the study records it (:func:`tuner.study.load_outcome`).

    The run dir's and the study's locks (:mod:`tuner.search.lock`) are held throughout and through ``then(result)`` (the
    CLI's export). ``measure_factory(build) -> Measure`` replaces llama-bench and ``equivalence`` the output gate's
    llama-perplexity runs (:func:`tuner.rounds.output_gate.run_gate_check`), for tests and replay.
    """
    budget = cfg.budget  # counted from the command's start: the build and the model made before count too
    checked = _checked(cfg)
    # Everything the user gave is checked (--storage by the CLI first): only now does the run dir appear.
    refuse_linked_folder(cfg.run_dir, "--run-dir").mkdir(parents=True, exist_ok=True)  # the default one too
    # The study's lock too: a second search on it from another run dir (or host) would measure its rounds
    # at the same time and add trials beyond --trials. `tuner worker` takes neither, on purpose.
    with lock.run_dir_lock(cfg.run_dir), lock.study_lock(cfg.storage_url, cfg.study):
        try:
            result = _run_locked(cfg, checked, budget, measure_factory, equivalence)
        except AllCallsFailed as err:
            why = err.crash or (
                "A model that fails to load is usually truncated or corrupt (an interrupted download or copy): "
                "check its size and checksum, or pass another --model."
            )
            raise TunerError(
                f"llama-bench cannot run the model {cfg.model}: {err} {why} Nothing of the failed round was "
                "stored; rerun the same command after the fix."
            ) from None
        if then is not None:
            then(result)
        return result


def _search_run(
    cfg: SearchConfig,
    checked: _Checked,
    budget: Budget,
    *,
    measure_factory: cx.MeasureFactory | None = None,
    equivalence: cx.Equivalence | None = None,
    opened: tuple[optuna.Study, optuna.storages.RDBStorage] | None = None,
) -> SearchRun:
    """The run record: the study opened (unless ``opened``), its header recorded (checked against a resumed
    study's), and every value the stages share resolved once."""
    study, storage = opened or _open_study(cfg)
    st = StudyState(study)
    header = _record_attrs(st, cfg, shape_ints(checked.shape), checked.legal)
    base_env, base_args = pinned_runtime(checked.space, checked.fixed)
    return SearchRun(
        cfg=cfg,
        study=study,
        storage=storage,
        st=st,
        header=header,
        space=checked.space,
        variants=checked.variants,
        fixed=checked.fixed,
        shape=checked.shape,
        base_env=base_env,
        base_args=tuple(base_args),
        builds=cx.Builds(cfg, checked.space, budget),
        budget=budget,
        factory=counted(st, device_checked(st, measure_factory or functools.partial(cx.live_measure, cfg))),
        custom=measure_factory,
        equivalence=equivalence,
    )


def _run_locked(
    cfg: SearchConfig,
    checked: _Checked,
    budget: Budget,
    measure_factory: cx.MeasureFactory | None,
    equivalence: cx.Equivalence | None,
) -> SearchOutcome:
    """:func:`run_pipeline` past its checks, with the run dir's lock held."""
    run = _search_run(cfg, checked, budget, measure_factory=measure_factory, equivalence=equivalence)
    st = run.st
    # the CLI made the model (and built upstream's variant for llama-quantize) before the study opened
    for stage, seconds in (("model", cfg.model_seconds), ("build", cfg.prebuild_seconds)):
        if seconds:
            st.add_seconds(stage, seconds)
            st.add_seconds("total", seconds)
    with _timed(st, "total"):
        with _timed(st, "build"):
            build = run.builds.get(run.base_variant, {})
        upstream_gate(run, build)
        run = repack_probe(run, build)  # upstream dies of llama.cpp's AMX kernels on some hosts: --repack 0 there
        method = _screen_method(
            run.st, cfg, run.kernels, run.base_args, custom_measure=run.custom is not None, n_layers=run.shape.n_layers
        )
        measure = run.factory(build) if method == METHOD_BENCH else cx.kernel_factory(run)(build)
        log.info(
            plan_text(
                phases=PHASES,
                depths=cfg.depths,
                n_cands={p: len(ks) + 1 + (0 if ks else 1) for p, ks in run.kernels.items()},
                rounds=(cfg.min_rounds, cfg.max_rounds),
                trials=cfg.trials,
                confirm_depths=len(confirm_depths(run)),
                shared=isinstance(measure, SharedMeasure),
                method=method,
            )
        )
        if (past := past_cost_line(cfg.arch, trials=cfg.trials, shape=run.header.shape)) is not None:
            log.info(past)
        with _timed(st, "screen"):
            decisions = screen_stage(run, method, measure)
        rules = compose_stage(run, decisions)
        with _timed(st, "tune"):
            proposal = tune_stage(run, rules)
        with _timed(st, "confirm"):
            outcome = run_confirm(run, proposal)
        with _timed(st, "residency"):
            outcome = run_residency_gate(run, outcome)
        with _timed(st, "equivalence"):
            outcome = run_output_gate(run, outcome)
        result = outcome.result_json()
        require_finite(result, f"the search's result for {cfg.model}")  # never store (or export) a NaN t/s
        st.set_result(result)
        return load_outcome(run.study)


_CRASH = (-4, -11)  # SIGILL, SIGSEGV


def _runs(bin_dir: Path, model: Path, args: list[str], env: Mapping[str, str], log_file: Path) -> int:
    """llama-bench's exit status on a 32-token prompt (1 where it could not start or timed out: no signal)."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-p", "32", "-n", "0", "-r", "1", *args]
    try:
        res = _run.run(
            cmd, env={**os.environ, **env}, check=False, timeout=300, log_file=log_file, what="llama-bench probe"
        )
        return res.returncode
    except TunerError:
        return 1


def repack_probe(run: SearchRun, build: Build) -> SearchRun:
    """``run`` with ``--repack 0`` in every config's arguments where needed (module doc); decided once per study."""
    if run.cfg.target.arch.name != "cpu" or run.custom is not None or "--repack" in run.base_args or not host_has_amx():
        return run
    if not (Path(build.bin_dir) / "llama-bench").is_file():
        return run  # no llama-bench to probe (a test's fake build): the rounds say what is wrong
    extra = run.st.host_args
    if extra is None:
        # priced as the residency check's two probes: short llama-bench runs, model load included
        run.budget.fits(run.price("residency_s"), "the llama-bench probe of llama.cpp's AMX kernels")
        logs, bin_dir, env = run.cfg.run_dir / "logs", Path(build.bin_dir), run.base_env  # upstream's runtime
        rc = _runs(bin_dir, run.cfg.model, list(run.base_args), env, logs / "probe-upstream.log")
        extra = []
        if rc in _CRASH:
            fixed = ["--repack", "0"]
            if _runs(bin_dir, run.cfg.model, [*run.base_args, *fixed], env, logs / "probe-repack-0.log") == 0:
                extra = fixed
                log.notice(
                    f"upstream's llama-bench died of {'SIGILL' if rc == -4 else 'SIGSEGV'} on this CPU in llama.cpp's "
                    "AMX kernels (the weights repacked for AMX tiles; log "
                    f"{logs / 'probe-upstream.log'}) and runs with --repack 0: every config of this study, upstream "
                    "included, is measured with --repack 0, and the export's commands carry it."
                )
        run.st.set_host_args(extra)
    if not extra:
        return run
    return dataclasses.replace(run, base_args=(*run.base_args, *extra), host_args=tuple(extra))


def upstream_gate(run: SearchRun, build: Build) -> GateResult:
    """The gate stage: test-backend-ops on upstream's build; a failure stops the search before anything is measured."""
    res = gate(run, build)
    if res.status == "fail":
        raise TunerError(
            f"the upstream build {build.bin_dir} fails test-backend-ops FLASH_ATTN_EXT ({list(res.failing)}); "
            f"log: {res.log}. Nothing was measured."
        )
    return res


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
        if depths_to_measure(p, mine, depths, rounds[0], rounds[1], target_ci, settle=comp.open_depths):
            log.info(
                f"Screen {p}: {len(mine)} round(s) recorded, CI wider than ±{target_ci:g}%, and this run allows "
                f"{rounds[1]}: screening on"
            )
            st.set_screen_done(p, False)
            reopened.append(p)
    return reopened


def screen_stage(run: SearchRun, method: str, measure: Measure) -> dict[str, list[comp.Decision]]:
    """The screen and compose of each phase (resumable), with boundaries refined (:func:`_refine_steps`):
    ``measure`` times upstream's build by ``method`` (:func:`_screen_method`).

    Phases not yet done are first screened together in shared llama-bench calls where the measure can; each
    phase then refines its own boundaries alone. A round that would end past the budget is not started, judged
    by the measured rounds or else by a screen call's price (:func:`tuner.search.cost.priced_screen_call`)."""
    cfg, st, budget = run.cfg, run.st, run.budget
    rounds = (cfg.min_rounds, cfg.max_rounds)
    priced = priced_screen_call(run.shape.d_model, cfg.depths, kernel=method == METHOD_KERNEL)
    cands = {p: candidates_for(p, ks, base_env=run.base_env, base_args=run.base_args) for p, ks in run.kernels.items()}
    decisions: dict[str, list[comp.Decision]] = {}
    reopen_raised_caps(st, cfg.depths, rounds, cfg.ci_target)
    refine = _refine_steps(cfg, method)
    todo = [p for p in PHASES if not st.screen_done(p)]
    if isinstance(measure, SharedMeasure) and len(todo) > 1:
        with log.step(
            f"Screen {' and '.join(todo)} in shared calls (one depth fill per depth and call) at depths {list(cfg.depths)}"
        ):
            run_joint_rounds(
                measure.joint,
                {p: cands[p] for p in todo},
                list(cfg.depths),
                st.screen_rounds,
                pp_tokens=cfg.pp,
                min_rounds=rounds[0],
                max_rounds=rounds[1],
                target_ci=cfg.ci_target,
                budget=budget,
                on_round=st.append_screen_round,
                prior=st.screen_rounds or [priced],
                settle=comp.open_depths,
            )
        budget.check("screen")
    for phase in PHASES:
        recs = st.screen_rounds
        depths = sorted(set(cfg.depths) | {int(d) for d in st.refined(phase)})
        if not st.screen_done(phase):
            names = ", ".join(c.name for c in cands[phase][1:])
            with log.step(f"Screen {phase}: upstream vs {names} at depths {depths}"):
                screen = functools.partial(
                    run_phase_rounds,
                    measure,
                    phase,
                    cands[phase],
                    min_rounds=rounds[0],
                    max_rounds=rounds[1],
                    target_ci=cfg.ci_target,
                    budget=budget,
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
    return decisions


def compose_stage(run: SearchRun, decisions: Mapping[str, Sequence[comp.Decision]]) -> tuple[FaRule, ...]:
    """The rules the screen's decisions compose into, keyed by the model's shape (stored as the study's compose)."""
    shape = comp.Shape(D=run.shape.head_dim, gqa=run.shape.gqa, kv=cx.kv_type(run.base_args))
    rules = tuple(r for p in PHASES for r in comp.rules_from(decisions[p], shape))
    run.st.set_compose(
        {"rules": rules, "decisions": [d.as_dict() for p in PHASES for d in decisions[p]], "shape": shape.key()}
    )
    log.info(
        "Composed rules: " + (", ".join(map(str, rules)) if rules else "none (upstream's selection stays everywhere)")
    )
    return rules


def run_tune_worker(cfg: SearchConfig) -> int:
    """``tuner worker``: add tune trials to a study that ``tuner search`` screened and composed (several hosts on
    one PostgreSQL study share the builds of compile-time rows); returns the study's trial count afterwards."""
    budget = cfg.budget
    refuse_linked_folder(cfg.run_dir, "--run-dir").mkdir(parents=True, exist_ok=True)
    opened = _open_study(cfg)
    composed = StudyState(opened[0]).compose
    if not composed:
        raise UsageError(
            f"study {cfg.study!r} in {redact(cfg.storage_url)} has no composed rules yet: run `tuner search` with the "
            "same --storage and --study first (it screens and composes; workers then add tune trials)."
        )
    run = _search_run(cfg, _checked(cfg), budget, opened=opened)
    with _timed(run.st, "tune"):
        tune_stage(run, rules_from_texts(composed["rules"]))
    return len(run.study.get_trials(deepcopy=False))


def _resolved_space(cfg: SearchConfig, space: sp.SearchSpace) -> tuple[sp.SearchSpace, dict[str, Legal]]:
    """The space with threads/-ngl legal values for this machine, --cpu-mask and the model, and those values."""
    tokens = max(cfg.depths) + max(cfg.pp, cfg.tg)
    resolved, legal = space_for_run(
        space, cpu_mask=cfg.cpu_mask, model=Path(cfg.model), gpu=not cfg.target.is_cpu, tokens=tokens
    )
    pinned = cfg.fixed
    for name, lg in legal.items():  # a --set pin replaces what would be sampled: say so beside the derivation
        log.info(
            f"  {lg.why}" + (f"; pinned here at {pinned[name]} (--set {name}={pinned[name]})" if name in pinned else "")
        )
    return resolved, legal


def _record_attrs(
    st: StudyState, cfg: SearchConfig, shape: Mapping[str, int], legal: Mapping[str, Legal]
) -> StudyHeader:
    """The study's header for this run, recorded (a resumed study's checked against it, :data:`RESUME_CHECKED`)."""
    source = cfg.source
    header = StudyHeader(
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
    )
    mine = header.stored()
    if st.arch is not None:
        for k in RESUME_CHECKED:
            if st.header_value(k, [] if k == "cpu_mask" else None) != mine[k]:  # before --cpu-mask: unpinned
                raise UsageError(
                    f"study {cfg.study!r} in {redact(cfg.storage_url)} was created with {k}={st.header_value(k)!r} but this run "
                    f"has {k}={mine[k]!r}. Use another --study name, or the same settings."
                )
    # a study seeded from another one (results/sm_90/llama-3.2-1b-q4_k_m/evidence) lacks some, e.g. the model
    st.record_header(mine)
    # the export resolves the same space from this machine's threads/-ngl legal values
    st.set_derived_knobs({k: dataclasses.asdict(v) for k, v in legal.items()})
    return header


def _refine_steps(cfg: SearchConfig, method: str) -> int:
    """Bisection steps for the screen: ``--refine`` with llama-bench, none at the op level.

    The op level places a rule's boundary several times too shallow (docs/llama-bench-cost.md), so a bisection
    there buys a boundary the confirm moves anyway (:func:`tuner.search.confirm.narrowed_rule`)."""
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
    """The screen's tool: the one the study was screened with if it holds rounds, else
    :func:`tuner.search.kernel_screen.screen_method`'s (the dry run's rule)."""
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
        target=cfg.target,
        has_kernels=any(kernels.values()),
        base_args=base_args,
        n_layers=n_layers,
        cpu_mask=cfg.cpu_mask,
        custom_measure=custom_measure,
    )
    st.set_screen_method(asked)
    return asked
