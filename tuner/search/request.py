"""What ``tuner search`` and ``tuner worker`` were asked (:class:`SearchRequest`) and :func:`resolve_search`,
which turns it into the frozen :class:`~tuner.search.study.SearchConfig` a search runs on: storage URL checked,
source fetched, model found or synthesized, depths cut at its context length and pins checked, before anything
is built, measured or stored.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import tuner.source
from tuner import log
from tuner.builder import cmake
from tuner.errors import TunerError, UsageError, close_matches
from tuner.plan import render
from tuner.plan import space as sp
from tuner.plan.derive import space_for_run
from tuner.rounds.budget import Budget
from tuner.search.cost import full_build_seconds
from tuner.search.plan_here import model_stage
from tuner.search.study import SearchConfig, default_run_dir
from tuner.search.tune import check_patterns
from tuner.source.spec import DEFAULT_SPEC, Source
from tuner.study.storage import check_storage_url
from tuner.targets import models
from tuner.targets.defaults import DEFAULT_QUANT
from tuner.targets.quant_types import QUANT_TYPES
from tuner.targets.target import Target


@dataclasses.dataclass(frozen=True, kw_only=True)
class Defaults:
    """What a search does where a flag is not given: one set for the CPU backend, one for a GPU."""

    like: str
    depths: tuple[int, ...]
    pp: int
    tg: int
    trials: int
    max_rounds: int
    refine: int
    reps_pp: int
    """llama-bench repetitions a prefill call makes, the discarded first one not counted."""
    reps_tg: int
    confirm_extra: int
    """Depths the confirm adds between the ladder's (:func:`tuner.search.confirm.extra_depths`)."""
    variants: tuple[str, ...] | None = None
    """Variants searched (None: every variant of the space)."""
    quant: str | None = None
    """The synthesized model's weight type when --quant is not given (None: f16, as synthesized)."""
    direct: bool = False
    """Write ``quant``'s blocks directly when synth can (:data:`tuner.targets.models.DIRECT_QUANTS`): llama-quantize's
    tensors, with no build before the model."""


# Without a GPU: sized to finish cold in about 10 minutes on 2 cores with A/A noise under the ceiling.
# SmolLM2-135M in Q4_K_M (what CPU users run), written quantized so the one build is llama-bench's. Two
# llama-bench calls of one build differ by about 12% on a 2-core VM whatever their length
# (docs/noise-floors.md), so the noise is beaten with rounds of short calls, not repetitions: 7 rounds put
# the A/A CI's reach near 13%. Depth 512 is where FlashAttention on/off shows on a CPU. One variant: a
# second costs ~5 more minutes (--variant cpu --variant cpu-no-native searches both).
CPU_DEFAULTS = Defaults(
    like="smollm2-135m",
    depths=(0, 512),
    pp=256,
    tg=32,
    trials=2,
    max_rounds=7,
    refine=0,
    variants=("cpu",),
    quant="Q4_K_M",
    direct=True,
    reps_pp=1,
    reps_tg=1,
    confirm_extra=1,
)
# On a GPU: llama-3.2-1b in Q4_K_M (an f16 model measures another decode balance) at the depths users
# compare with llama-bench -d. No compile-time trials by default: each is a rebuild plus a measurement
# (about a minute on an H100), and the kernel rules come from the screen; --trials N adds them.
GPU_DEFAULTS = Defaults(
    like="llama-3.2-1b",
    depths=(0, 4096, 8192, 16384, 32768, 65536),
    pp=512,
    tg=128,
    trials=0,
    max_rounds=6,
    refine=1,
    quant=DEFAULT_QUANT,
    reps_pp=8,
    reps_tg=3,
    confirm_extra=1,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """A search as the command line asked for it; None where a flag was not given (a default applies)."""

    target: Target
    source_spec: str | None = None
    model: Path | None = None
    like: str | None = None
    quant: str | None = None
    depths: tuple[int, ...] | None = None
    pp: int | None = None
    tg: int | None = None
    trials: int | None = None
    time_budget: float | None = None
    started: float | None = None
    """``time.monotonic()`` when the command started: ``time_budget`` counts from it (None: from resolving)."""
    storage: str | None = None
    study: str | None = None
    run_dir: Path | None = None
    jobs: int | None = None
    variants: tuple[str, ...] = ()
    sets: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """``--set`` pins, parsed (:func:`tuner.pairs.parse_pairs`), not yet checked against the space."""
    gate: bool = True
    seed: int = 0
    min_rounds: int = 3
    max_rounds: int | None = None
    ci_target: float = 1.0
    reps_pp: int | None = None
    reps_tg: int | None = None
    screen: str = "auto"
    """``--screen``: ``auto``, ``kernel`` or ``llama-bench``."""
    confirm_extra: int | None = None
    refine: int | None = None
    tune_knobs: tuple[str, ...] = ()
    tune_depths: tuple[int, ...] | None = None
    cpu_mask: tuple[int, ...] | None = None

    @property
    def defaults(self) -> Defaults:
        return CPU_DEFAULTS if self.target.is_cpu else GPU_DEFAULTS


def resolve_search(request: SearchRequest, *, worker: bool = False) -> SearchConfig:
    """The frozen configuration of the search ``request`` asks for (``worker``: for ``tuner worker``).

    UsageError for what :func:`plan_search` refuses (before anything is fetched or built), a --variant the space
    does not have (before the model is made), or a --set pin the space resolved for this machine refuses."""
    planned = plan_search(request)  # every refusal that needs no source or model file, before either is made
    if not worker:
        log.info(intro(request))
    started = request.started if request.started is not None else time.monotonic()
    source = tuner.source.fetch_source(request.source_spec or DEFAULT_SPEC)
    check_variants(
        sp.load_space(request.target.name, source.era).variants, planned.variants, request.target.name, source.era
    )
    t_model = time.monotonic()
    model, build_seconds = _model(request, planned, source, Budget.counted_from(started, request.time_budget))
    # --like: synthesized (cached) here; the quantizing build it may need first is the search's build, not the model's
    model_seconds = time.monotonic() - t_model - build_seconds if request.model is None else None
    study = request.study or f"{request.target.name}-{model.stem}-{source.era}"
    _check_pins(request, source, model)
    return SearchConfig(
        target=request.target,
        source=source,
        model=model.resolve(),
        depths=planned.depths,
        pp=planned.pp,
        tg=planned.tg,
        trials=planned.trials,
        time_budget=request.time_budget,
        started=started,
        storage=request.storage,
        study=study,
        run_dir=request.run_dir or default_run_dir(study),
        jobs=request.jobs,
        seed=request.seed,
        gate=request.gate,
        variants=planned.variants,
        fixed=dict(request.sets),
        worker=worker,
        min_rounds=planned.min_rounds,
        max_rounds=planned.max_rounds,
        ci_target=request.ci_target,
        refine=planned.refine,
        cpu_mask=request.cpu_mask,
        model_seconds=model_seconds,
        prebuild_seconds=build_seconds or None,
        reps_pp=planned.reps_pp,
        reps_tg=planned.reps_tg,
        confirm_extra=planned.confirm_extra,
        screen_method=planned.screen_method,
        tune_knobs=planned.tune_knobs,
        tune_depths=planned.tune_depths,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannedSearch:
    """What a request resolves to before anything is fetched, built or synthesized: the settings
    :func:`resolve_search` gives the search and ``tuner search --dry-run`` plans (one code path for both)."""

    like: str | None
    """The synthesized model's shape (None with --model)."""
    model: Path | None
    quant: str | None
    """The llama-quantize type the synthesized model is made in (None: f16)."""
    direct: bool
    context_length: int | None
    depths: tuple[int, ...]
    pp: int
    tg: int
    trials: int
    min_rounds: int
    max_rounds: int
    refine: int
    variants: tuple[str, ...] | None
    confirm_extra: int
    reps_pp: int
    reps_tg: int
    screen_method: str | None
    """``--screen`` as asked (None: ``auto``, the search's rule picks)."""
    tune_knobs: tuple[str, ...]
    tune_depths: tuple[int, ...] | None


def plan_search(request: SearchRequest) -> PlannedSearch:
    """The settings of the search ``request`` asks for. UsageError for every refusal that needs neither the
    source nor a model file: a bad --storage URL, both --model and --like, a --model that does not exist, an
    unknown --like shape or --quant type, --depths or --tune-depths past the model's context length."""
    d = request.defaults
    if request.storage is not None:  # refused before anything is fetched, built or created
        check_storage_url(request.storage)
    if request.model is not None and request.like:
        raise UsageError("give either --model GGUF or --like NAME, not both.")
    if request.model is not None and not request.model.is_file():
        raise UsageError(
            f"--model {request.model} does not exist. Pass a GGUF file or use --like NAME to synthesize one."
        )
    like = None if request.model is not None else request.like or d.like
    quant = None if like is None else _quant(request.quant if request.quant is not None else d.quant)
    # with --like, the synthesized GGUF's n_ctx_train
    ctx = int(models.load_model_shape(like).context_length) if like else _context_length(Path(str(request.model)))
    depths = request.depths or tuple(x for x in d.depths if not ctx or x <= ctx)
    check_depths(depths, ctx)
    if request.tune_depths and ctx and max(request.tune_depths) > ctx:
        raise UsageError(
            f"--tune-depths {list(request.tune_depths)} go past the model's context length {ctx} (n_ctx_train in the "
            f"GGUF). Use depths up to {ctx}."
        )
    return PlannedSearch(
        like=like,
        model=request.model,
        quant=quant,
        direct=bool(quant) and d.direct and str(quant).upper() in models.DIRECT_QUANTS,
        context_length=ctx,
        depths=tuple(depths),
        pp=request.pp or d.pp,
        tg=request.tg or d.tg,
        trials=request.trials if request.trials is not None else d.trials,
        min_rounds=request.min_rounds,
        max_rounds=max(request.min_rounds, request.max_rounds or d.max_rounds),
        refine=request.refine if request.refine is not None else d.refine,
        variants=request.variants or d.variants,
        confirm_extra=d.confirm_extra if request.confirm_extra is None else request.confirm_extra,
        reps_pp=d.reps_pp if request.reps_pp is None else request.reps_pp,
        reps_tg=d.reps_tg if request.reps_tg is None else request.reps_tg,
        screen_method=None if request.screen == "auto" else request.screen,
        tune_knobs=request.tune_knobs,
        tune_depths=request.tune_depths,
    )


def check_depths(depths: Sequence[int], ctx: int | None) -> None:
    """UsageError for ``--depths`` past the model's context length ``ctx`` (None or 0: unknown)."""
    too_deep = [x for x in depths if ctx and x > ctx]
    if too_deep:
        raise UsageError(
            f"--depths {too_deep} exceed the model's context length {ctx} (n_ctx_train in the GGUF). "
            f"Use depths up to {ctx}, e.g. --depths {','.join(str(x) for x in depths if x <= (ctx or 0))}."
        )


def check_variants(space_variants: Sequence[str], variants: Sequence[str] | None, arch: str, era: str) -> list[str]:
    """``variants`` (None: every one) of the space's, in its order; UsageError where none of them is in it."""
    kept = [v for v in space_variants if variants is None or v in variants]
    if not kept:
        raise UsageError(
            f"none of the requested variants {list(variants or [])} is in the {arch} space "
            f"for era {era}; it has {list(space_variants)}."
        )
    return kept


def _baseline_build(target: Target, source: Source, budget: Budget) -> Path:
    """The upstream-default variant's ``llama-quantize``; a build not cached starts only where its price fits."""
    space = sp.load_space(target.name, source.era)
    rv = render.render_variant(
        source, target.name, space.variants[0], local_archs=list(target.local_archs), space=space
    )
    if not cmake.is_built(rv):
        budget.fits(full_build_seconds(), f"the build of {rv.short} (for llama-quantize)")
    return Path(cmake.build_variant(rv).exe("llama-quantize"))


def _model(request: SearchRequest, planned: PlannedSearch, source: Source, budget: Budget) -> tuple[Path, float]:
    """--model, or a synthesized (maybe quantized) model of --like's shape made only where its price fits the
    ``budget``; and the seconds spent building upstream's variant for llama-quantize (0.0: none built here)."""
    if planned.like is None:
        return Path(str(planned.model)), 0.0
    t0 = time.monotonic()
    qbin = _baseline_build(request.target, source, budget) if planned.quant and not planned.direct else None
    built = time.monotonic() - t0 if qbin else 0.0
    seconds = model_stage(planned, models.load_model_shape(planned.like), source, {})["seconds"]
    budget.fits(seconds[0] if seconds else 0.0, f"making the {planned.like} model")
    model = models.synth_cached(
        planned.like, source=source, quant=planned.quant, quantize_bin=qbin, direct=planned.direct
    )
    return Path(model), built


def _quant(value: str | None) -> str | None:
    """The llama-quantize type to make (None: f16); UsageError, before the build it needs, for an unknown type."""
    if value is None or value.lower() in ("f16", "none"):
        return None
    if value.upper() not in QUANT_TYPES:
        raise UsageError(
            f"--quant {value} is not a type llama-quantize makes.{close_matches(value.upper(), QUANT_TYPES)} Use f16 "
            f"(the synthesized model as it is) or one of {', '.join(QUANT_TYPES)}."
        )
    return value


def _context_length(model: Path) -> int | None:
    try:
        return int(models.load_gguf_shape(model).context_length)
    except TunerError:
        return None


def _check_pins(request: SearchRequest, source: Source, model: Path) -> None:
    """The request's --set values and --tune-knobs globs checked against the space resolved for this machine, mask
    and model, so a bad pin or glob is refused before any build or measurement."""
    target, sets = request.target, request.sets
    space, _ = space_for_run(sp.load_space(target.name, source.era), cpu_mask=request.cpu_mask, model=model, gpu=False)
    check_patterns(space, request.tune_knobs)
    sp.set_pins(space, sets)


def intro(request: SearchRequest) -> str:
    """What the run will do and roughly how long (measured: the CPU default's build 280 s and its measuring
    2-4 minutes on an idle 2-core VM; an sm_90 build ~4.5 min on 16 cores)."""
    cpu = request.target.is_cpu
    trials = request.trials if request.trials is not None else request.defaults.trials
    what = "llama.cpp's CPU backend (no GPU found)" if cpu else f"{request.target.name}"
    tune = f"tune {trials} Optuna trial(s)" if trials else "no compile-time trials (--trials N adds them)"
    build = "about 5 minutes on 2 idle cores" if cpu else "about 5 minutes on 16 cores for one CUDA arch"
    measure = (  # on a CPU: the H100 figure says nothing about a CPU run
        "a time that grows with the model and the depths; `--dry-run` estimates it stage by stage, and ETAs "
        "follow the first round"
        if not cpu
        else "2-4 minutes on 2 idle cores"
        if not request.model
        else "a time that grows with the model's size and the depths; the ETAs after the first round say"
    )
    screen = (
        "measure upstream against itself (the noise)"
        if cpu
        else "screen the kernels per phase and depth, compose rules"
    )
    return (
        f"tuner search: tunes {what}. Once per machine: fetch the pinned llama.cpp (a 77 MB sdist from PyPI) and "
        f"build it ({build}); then {screen}, {tune} and "
        f"confirm against upstream ({measure}). Progress and ETAs follow; rerunning the same command resumes."
    )
