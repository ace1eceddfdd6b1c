"""``tuner search --dry-run``: everything short of timing, for a GPU that is not here.

Renders every variant (an unsupported one is reported with the reason); constraint-checks the compile-time space
per kernel-config row (rows are independent, so the legal count is the product of the rows'); compile-checks the
upstream row plus the first legal non-default candidate of each row; and prints the stages
:func:`tuner.search.pipeline.run_pipeline` runs on the target with their counts and an *estimated* time from
recorded per-step costs (``tuner/data/step_costs.toml``). The report goes to stdout (Markdown, or JSON with
``--json``), progress to stderr.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import click

import tuner.source
from tuner import log
from tuner.builder import cmake, hip
from tuner.errors import TunerError, UsageError
from tuner.plan.derive import Legal, legal_values, resolve_space
from tuner.plan.render import render_variant
from tuner.plan.space import BENCH_DEFAULT, Knob, SearchSpace, check_constraints, load_space, set_pins
from tuner.rounds.budget import load_step_costs
from tuner.search import tune as tn
from tuner.search.confirm import extra_depths
from tuner.search.context import ALL_KERNELS, PHASES, kernels_for
from tuner.search.cost import full_build_seconds, nearest_recording, past_cost_line, screen_round_seconds
from tuner.search.kernel_screen import coerce_pins, pinned_runtime, screen_method
from tuner.search.plan_here import CPU_CHECK_OBJECTS, Here, Stage, check_objects, here_for
from tuner.search.request import PlannedSearch, SearchRequest, check_variants, plan_search
from tuner.source import DEFAULT_SPEC, Source
from tuner.targets.host import host_cpus
from tuner.targets.models import ModelShape, load_gguf_shape, load_model_shape
from tuner.targets.target import Target


class SpaceRow(TypedDict):
    """One kernel-config row of the compile-time space, constraint-checked (:func:`count_space`)."""

    row: str
    knobs: list[str]
    candidates: int
    legal: int
    illegal_rules: dict[str, int]
    sample_legal: dict[str, Any] | None
    example_illegal: dict[str, object] | None


class _Checked(TypedDict):
    variant: str
    status: str
    objects: list[str]


class CompileCheck(_Checked, total=False):
    """One variant's compile check (:func:`_compile_checks`): ``why`` where it did not pass, else its time."""

    why: str
    seconds: float
    values: dict[str, Any]
    offload: dict[str, list[str]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DryRunReport:
    arch: str
    era: str
    variants: Mapping[str, str]
    """variant -> 'ok' or the reason it cannot be rendered."""
    rows: tuple[SpaceRow, ...]
    legal: int
    total: int
    compile_checks: tuple[CompileCheck, ...]
    plan: Mapping[str, Any]

    @property
    def ok(self) -> bool:
        return all(c["status"] in ("ok", "skipped", "not applicable") for c in self.compile_checks)


def _row_key(k: Knob) -> tuple[object, ...]:
    m = k.meta
    if k.kind == "wmma":
        return ("wmma",)
    return (k.kind, m["table"], int(m["dkq"]), int(m["dv"]), int(m["ncols"]), int(m.get("ncols2", 0)))


def _choices(k: Knob) -> list[Any]:
    if k.choices is not None:
        return list(k.choices)
    assert k.low is not None and k.high is not None  # a knob without choices has a range
    return list(range(k.low, k.high + 1, k.step))


def count_space(arch: str, era: str, space: SearchSpace) -> tuple[list[SpaceRow], int, int]:
    """Constraint-check every candidate of every kernel-config row: ``(rows, legal, total)``."""
    groups: dict[tuple[object, ...], list[Knob]] = collections.defaultdict(list)
    for k in space.compile_knobs:
        groups[_row_key(k)].append(k)
    rows: list[SpaceRow] = []
    legal_total, total = 1, 1
    for key, knobs in groups.items():
        names = [k.name for k in knobs]
        combos = [dict(zip(names, combo)) for combo in itertools.product(*(_choices(k) for k in knobs))]
        checked = [(vals, check_constraints(arch, era, vals, space=space)) for vals in combos]
        ok = [vals for vals, v in checked if not v]
        bad = [(vals, v) for vals, v in checked if v]
        reasons = collections.Counter(getattr(x, "rule", str(x)) for _, v in bad for x in v)
        rows.append(
            {
                "row": "/".join(str(x) for x in key),
                "knobs": names,
                "candidates": len(combos),
                "legal": len(ok),
                "illegal_rules": dict(reasons.most_common()),
                "sample_legal": next((x for x in ok if any(x[k.name] != k.default for k in knobs)), None),
                "example_illegal": {"values": bad[0][0], "why": "; ".join(map(str, bad[0][1]))} if bad else None,
            }
        )
        legal_total *= len(ok)
        total *= len(combos)
    return rows, legal_total, total


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """What the real search on the target would be run with (the CLI's flags and their defaults)."""

    like: str = "llama-3.2-1b"
    model: Path | None = None
    """A GGUF the real run would benchmark (``--model``); its shape replaces ``like``'s."""
    depths: tuple[int, ...] = (0, 4096, 8192, 16384, 32768, 65536)
    trials: int = 6
    min_rounds: int = 3
    max_rounds: int = 6
    refine: int = 1
    confirm_extra: int = 1
    tune_knobs: tuple[str, ...] = ()
    tune_depths: tuple[int, ...] | None = None
    screen: str = "auto"
    cpu_mask: tuple[int, ...] | None = None
    pp: int = 512
    tg: int = 128
    quant: str | None = None
    direct: bool = False

    @classmethod
    def of(cls, p: PlannedSearch, cpu_mask: tuple[int, ...] | None) -> PlanInputs:
        """The inputs of the search :func:`tuner.search.request.plan_search` resolved (the real run's settings)."""
        same = {
            f.name: getattr(p, f.name) for f in dataclasses.fields(cls) if f.name not in ("like", "screen", "cpu_mask")
        }
        return cls(like=p.like or "", screen=p.screen_method or "auto", cpu_mask=cpu_mask, **same)


def _stage(
    name: str,
    what: str,
    *,
    calls: tuple[int, int] = (0, 0),
    seconds: tuple[float, float] | None = (0.0, 0.0),
    cost: str = "",
) -> Stage:
    return {
        "stage": name,
        "what": what,
        "llama_bench_calls": list(calls),
        "seconds": None if seconds is None else [round(seconds[0], 1), round(seconds[1], 1)],
        "cost": cost,
    }


def _builds_stage(
    costs: Mapping[str, Any],
    rec: Mapping[str, Any],
    *,
    trials: int,
    n_compile: int,
    n_variants: int,
    rebuild_s: float | None,
    trial_gate_share: float = 1.0,
    here: Here | None = None,
) -> Stage:
    """Builds and their gate (``trial_gate_share``: the share of the kernels a trial's gate forces)."""
    here = here or Here()
    price = here.prices.get("full_build")
    full = price.seconds if price is not None else full_build_seconds(costs)
    gate_s = float(rec["gate_s"]) if here.gate else 0.0
    first = 0.0 if here.built else full  # a cached build costs a no-op ninja run
    tune_builds = trials if n_compile else 0
    # The tune stage samples the variant too when several are renderable (tune.tune_stage): each other
    # variant it tries is one more full build.
    more_full = min(n_variants - 1, trials) if n_variants > 1 else 0
    rebuilds = tune_builds * (rebuild_s or 0.0)
    gated = (
        "each build gated by test-backend-ops FLASH_ATTN_EXT with every kernel forced"
        + ("" if trial_gate_share >= 1 else " (a trial's build: its rows' kernels)")
        if here.gate
        else "no test-backend-ops gate (the CPU backend is its reference)"
    )
    where = "this machine" if price is not None and price.here else f"recorded on {costs['machine']['name']}"
    if not tune_builds:
        rebuild = ""
    elif rebuild_s is not None:
        rebuild = (
            f", {rebuild_s:g} s a rebuild (this dry run's compile check of every row's TUs, on this machine: "
            "an upper bound per trial)"
        )
    else:
        rebuild = "; rebuilds not counted: their time is not measured here (compile check skipped)"
    return _stage(
        "builds + test-backend-ops",
        ("upstream's variant: built already (cached)" if here.built else "1 full build of upstream's variant")
        + f" (cached after the first run), up to {more_full} more if the tune stage samples another of the "
        f"{n_variants} variants, up to {tune_builds} rebuild(s) of the changed translation units for compile-time "
        f"trials; {gated}",
        seconds=(
            first + gate_s,
            first + gate_s + more_full * (full + gate_s) + rebuilds + tune_builds * gate_s * trial_gate_share,
        ),
        cost=f"{full:g} s a full build ({where})" + (f", {gate_s:g} s a gate" if here.gate else "") + rebuild,
    )


def _screen_stages(
    kernels: Mapping[str, Sequence[str]],
    inputs: PlanInputs,
    depths: Sequence[int],
    rec: Mapping[str, Any],
    rounds: tuple[int, int],
    kernel: bool = False,
) -> list[Stage]:
    """The plan's screen, refine and compose stages, priced from the recording ``rec``: with ``kernel`` a
    test-backend-ops call per candidate and round, else llama-bench calls both phases share."""
    rmin, rmax = rounds
    nd = len(depths)
    # upstream + each forcible kernel per phase (or an A/A twin where none can be forced): a round is as many
    # calls as the larger phase has candidates
    n_cands = {p: len(kernels[p]) + 1 + (0 if kernels[p] else 1) for p in ("tg", "pp")}
    per_round = max(n_cands.values())
    round_s = screen_round_seconds(rec, per_round, nd, kernel=kernel)
    calls, seconds = (per_round * rmin, per_round * rmax), (rmin * round_s, rmax * round_s)
    legal = "; ".join(
        f"{'decode' if p == 'tg' else 'prefill'}: upstream vs {', '.join(kernels[p]) or 'itself (A/A)'}"
        for p in ("tg", "pp")
    )
    compose = (
        "FlashAttention rules per depth interval, keyed by head size, GQA ratio and K/V type, "
        "only where a kernel beat upstream by the decision rule (A/A-controlled, Holm over the phase's points); "
        "nothing is run"
    )
    if kernel:  # no refinement at the op level (pipeline._refine_steps): the confirm places the boundaries
        return [
            _stage(
                "screen",
                f"{legal}; FLASH_ATTN_EXT alone at the model's shape: {per_round} test-backend-ops calls a round "
                f"({2 * nd} cases each: pp and tg at {nd} depths {list(depths)}) × {rmin}-{rmax} rounds",
                calls=calls,
                seconds=seconds,
                cost=f"{float(rec['kernel_case_s']):g} s per candidate and case",
            ),
            _stage(
                "compose",
                compose + ". No boundary refinement at the op level: the confirm stage judges the rules end to end "
                "and narrows each to where it pays",
            ),
        ]
    per_depth = float(rec.get("screen_call_depth_s", rec["bench_call_depth_s"]))
    ref_calls = sum(n_cands.values())
    return [
        _stage(
            "screen",
            f"{legal}; {per_round} shared llama-bench calls (pp+tg) a round × {rmin}-{rmax} rounds × "
            f"{nd} depths {list(depths)}",
            calls=calls,
            seconds=seconds,
            cost=f"{per_depth:g} s per call and depth",
        ),
        _stage(
            "screen: refine",
            f"up to {inputs.refine} bisection step(s) per phase where the winning kernel changes between "
            "depths; each new depth is screened alone for that phase (counted here as one depth per step)",
            calls=(0, inputs.refine * ref_calls * rmax),
            seconds=(0.0, inputs.refine * ref_calls * rmax * per_depth),
            cost=f"{per_depth:g} s per call and depth",
        ),
        _stage("compose", compose),
    ]


def _gate_stages(kernels: Mapping[str, Sequence[str]], rec: Mapping[str, Any]) -> list[Stage]:
    n_band = sum(len(kernels[p]) for p in ("tg", "pp"))
    return [
        _stage(
            "output gate",
            f"llama-perplexity: the final config's log-probs vs upstream's, one check per changed mode plus "
            f"{n_band} band check(s) (each forcible kernel vs upstream's pick); none when the final config is upstream's",
            seconds=(0.0, (2 + n_band) * float(rec["equivalence_check_s"])),
            cost=f"{rec['equivalence_check_s']:g} s a check",
        ),
        _stage(
            "residency",
            "one verbose llama-bench probe of upstream's config and one of the final config",
            seconds=(float(rec["residency_s"]) / 2, float(rec["residency_s"])),
            cost=f"{rec['residency_s']:g} s for both probes",
        ),
    ]


def _tune_stage(
    knobs: Sequence[Knob], trials: int, n_compile: int, nt: int, per_depth: float, case_s: float | None
) -> Stage:
    """The tune stage's plan: ``nt`` depths a trial; ``case_s`` set where the screen runs at the op level."""
    n_phases = len({p for k in knobs for p in tn.knob_phases(k)}) or 2  # calls: 2 per phase a trial measures
    # op-level trials (tn.trial_method): two test-backend-ops processes a phase, gated with their rows' kernels only
    op_trials = case_s is not None and tn.trial_method(knobs, screen_method="kernel", recorded=None) == "kernel"
    trial_s = nt * (case_s if op_trials and case_s is not None else per_depth)
    return _stage(
        "tune",
        f"{trials} Optuna trial(s) over {len(knobs)} knob(s) ({n_compile} compile-time, "
        f"{len(knobs) - n_compile} process-wide); each trial is one paired round vs the composed rules "
        + (
            f"timed at the op level (2 test-backend-ops calls per phase it can affect, {nt} cases each)"
            if op_trials
            else f"(2 calls per phase it can affect, at {nt} depths)"
        ),
        calls=(0 if op_trials else 2 * trials if trials else 0, 0 if op_trials else 2 * n_phases * trials),
        seconds=(2 * trials * trial_s, 2 * n_phases * trials * trial_s),
        cost=f"{case_s:g} s a test-backend-ops case" if op_trials else f"{per_depth:g} s per call and depth",
    )


def plan_stages(
    space: SearchSpace,
    *,
    kernels: Mapping[str, Sequence[str]],
    inputs: PlanInputs,
    shape: ModelShape,
    rebuild_s: float | None,
    n_variants: int,
    pinned: Sequence[str] = (),
    screen_method: str = "llama-bench",
    here: Here | None = None,
) -> dict[str, Any]:
    """The stages :func:`tuner.search.pipeline.run_pipeline` runs on the target, with counts from the
    space, ``inputs`` and the model's ``shape``, and a time range (fewest rounds .. most rounds) from the recorded step costs.

    ``rebuild_s``: a compile-time candidate's rebuild from this dry run's compile check (None: tune builds are
    left out of the time). ``here``: this machine's recorded costs and caches (None: nothing cached).
    """
    costs = load_step_costs()
    rec = nearest_recording(costs, shape.d_model)
    here = here or Here()
    if (local := here.prices.get("call_depth")) is not None:  # this machine's own figure replaces the recording's
        rec = {**rec, "bench_call_depth_s": local.seconds, "screen_call_depth_s": local.seconds}
        rec |= {"bench_source": local.source, "screen_source": local.source}
    per_depth = float(rec["bench_call_depth_s"])
    context_length = shape.context_length
    depths = [d for d in inputs.depths if not context_length or d <= context_length]
    if len(depths) < len(inputs.depths):
        log.warning(
            f"depths {[d for d in inputs.depths if d not in depths]} exceed {inputs.like}'s context length "
            f"{context_length}: the real search refuses them; the plan leaves them out."
        )
    rmin, rmax = inputs.min_rounds, max(inputs.min_rounds, inputs.max_rounds)

    # the screen's shared calls repeat each test reps_pp + 1 times (-r 9), the confirm's and tune's
    # recorded calls -r 4: a screen call costs more per depth where its own figure is recorded
    use_kernel = screen_method == "kernel" and any(kernels.values()) and "kernel_case_s" in rec
    case_s = float(rec["kernel_case_s"]) if use_kernel else None
    stages = [here.model_stage.copy()] if here.model_stage else []
    stages += _screen_stages(kernels, inputs, depths, rec, (rmin, rmax), use_kernel)
    knobs = tn.tunable_knobs(space, {k: True for k in pinned}, head_dim=shape.head_dim, patterns=inputs.tune_knobs)
    n_compile = sum(1 for k in knobs if k in space.compile_knobs)
    trials = inputs.trials if knobs else 0
    stages.append(_tune_stage(knobs, trials, n_compile, len(inputs.tune_depths or depths), per_depth, case_s))
    cdepths = sorted(set(depths) | set(extra_depths(depths, limit=inputs.confirm_extra, max_depth=context_length)))
    stages.append(
        _stage(
            "confirm",
            f"the final config vs upstream and upstream vs itself (3 calls a round, pp+tg shared) × {rmin}-{rmax} "
            f"rounds × {len(cdepths)} depths {cdepths}; nothing to confirm (0 calls) when no rule or knob survived",
            calls=(0, 3 * rmax),
            seconds=(0.0, 3 * rmax * len(cdepths) * per_depth),
            cost=f"{per_depth:g} s per call and depth",
        )
    )
    stages += _gate_stages(kernels, rec)
    stages.append(
        _builds_stage(
            costs,
            rec,
            trials=trials,
            n_compile=n_compile,
            n_variants=1 if "variant" in pinned else n_variants,
            rebuild_s=rebuild_s,
            trial_gate_share=len(tn.gate_kernels(knobs)) / len(ALL_KERNELS),
            here=here,
        )
    )
    timed = [s["seconds"] for s in stages if s["seconds"] is not None]
    return {
        "stages": stages,
        "tune_trials": trials,
        "estimated_minutes": [round(sum(t[0] for t in timed) / 60.0, 1), round(sum(t[1] for t in timed) / 60.0, 1)],
        "estimate_from": {
            "machine": costs["machine"]["name"],
            "model": rec["like"],
            "sources": sorted(
                {
                    rec["bench_source"],
                    *([rec["screen_source"]] if "screen_source" in rec and not use_kernel else []),
                    *([rec["kernel_source"]] if use_kernel and "kernel_source" in rec else []),
                    rec["gate_source"],
                    rec["equivalence_source"],
                    rec["residency_source"],
                    *(p.source for k, p in here.prices.items() if k != "call_depth"),
                    *([] if "full_build" in here.prices else [costs["full_build"]["source"]]),
                }
            ),
        },
        "note": (
            "ESTIMATE, not a measurement: per-step costs recorded on this machine where tuner has them ("
            + (", ".join(k for k, p in here.prices.items() if p.here) or "none")
            + f"), else recorded by tuner on an {costs['machine']['name']} with {rec['like']} at pp512/tg128 "
            "(tuner/data/step_costs.toml), times the counts above; another machine's speed and core count change "
            "every figure it gives"
            + ("; the rebuild time is this machine's compile check" if rebuild_s is not None and n_compile else "")
        ),
    }


def _compile_checks(
    source: Source, target: Target, rows: Sequence[SpaceRow], renderable: Sequence[str]
) -> list[CompileCheck]:
    samples = {k: x for r in rows for k, x in (r["sample_legal"] or {}).items()}
    skip, cpu = _skip_reason(target.arch.vendor), target.is_cpu
    out: list[CompileCheck] = []
    for i, variant in enumerate(renderable):
        # The first variant compiles the sample candidates' TUs too; the others differ only in
        # global defines, so their selector TU (fattn.cu, which holds the hook) is the sample.
        sample = samples if i == 0 else {}
        if cpu:
            what = "the CPU backend's FLASH_ATTN_EXT TU"
        else:
            what = "upstream + one legal candidate per row" if i == 0 else "the patched selector TU"
        rv = render_variant(source, target.arch.name, variant, compile_values=dict(sample), local_archs=[])
        objs = check_objects(rv, source.root, cpu=cpu)
        if objs is None:  # a check that cannot apply is not a failure
            why = f"this tree has none of the CPU backend's TUs {', '.join(CPU_CHECK_OBJECTS)}"
            log.info(f"Compile check of {variant}: not applicable: {why}")
            out.append({"variant": variant, "status": "not applicable", "objects": [], "why": why})
            continue
        if i > 0 and not cpu:
            # era rocwmma's fattn.cu is host code only; add the first TU with device code so the
            # check proves something was compiled for the target.
            objs = objs[:1] if rv.era == "mma" else objs[:2]
        if skip is not None:  # say skipped: a ✓ would claim a check that did not run
            log.info(f"Compile check of {variant} ({what}): skipped: {skip}")
            out.append({"variant": variant, "status": "skipped", "objects": objs, "why": skip})
            continue
        try:
            with log.step(f"Compile-checking {variant} ({what})"):  # a failure shows ✕, never ✓
                b = cmake.build_variant(rv, compile_only=True, objects=objs)
        except TunerError as err:
            out.append({"variant": variant, "status": "failed", "objects": objs, "why": str(err)[:1500]})
            continue
        out.append(
            {
                "variant": variant,
                "status": "ok",
                "objects": objs,
                "seconds": round(b.seconds, 1),
                "values": dict(sample),
                "offload": dict(b.meta.get("offload_targets", {})),
            }
        )
    return out


def _skip_reason(vendor: str) -> str | None:
    """Why the compile check cannot run on this machine (None: it can)."""
    if vendor == "amd":
        if hip.find_hip_toolchain() is None:
            return "HIP compile-check toolchain not set up; run `tuner toolchain hip` (root, about a minute)"
    elif vendor == "nvidia":
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            return "nvcc not on PATH"
        root = Path(nvcc).resolve().parent.parent
        incs = [root / "include", *sorted(root.glob("targets/*/include")), Path("/usr/local/cuda/include")]
        if not any((inc / "cublas_v2.h").is_file() for inc in incs):
            # ggml-cuda links CUDA::cublas: CMake's configure fails without it, before anything compiles
            return (
                f"the CUDA toolkit of {nvcc} has no cuBLAS headers (cublas_v2.h), which ggml-cuda needs; install "
                "the toolkit's cuBLAS development files (e.g. Debian's libcublas-dev) to compile-check"
            )
    return None


def _space_for_plan(space: SearchSpace, n_layers: int) -> SearchSpace:
    """``space`` with its derived knobs' pin ranges for the planned model on a target that is not here: ``-ngl``
    0..n_layers + 1 and any thread count (its memory and CPUs are unknown)."""
    legal = legal_values(space, cpus=host_cpus(), shape={"n_layers": n_layers})
    for k in space.runtime_knobs:
        if k.meta.get("derive") == "threads":
            why = "threads: the target's CPU count is unknown here, so any pinned count is taken"
            legal[k.name] = Legal(choices=(BENCH_DEFAULT,), low=1, high=1 << 20, why=why)
    return resolve_space(space, legal)


def _check_pins(arch: str, era: str, space: SearchSpace, sets: Mapping[str, str]) -> None:
    """UsageError for ``--set`` pins the search refuses: out of range, no variant of the space, illegal values."""
    if not sets:
        return
    compile_pins, _ = set_pins(space, sets)
    bad = check_constraints(arch, era, compile_pins, space=space)
    if bad:
        raise UsageError(
            f"the pinned values are illegal for {arch}: {'; '.join(map(str, bad))}. Nothing was compiled. Pick values "
            f"the constraint check accepts (see the rows below with `tuner search --arch {arch} --dry-run`)."
        )


def run_dry_run(
    *,
    target: Target,
    source_spec: str | None,
    sets: Mapping[str, str] | None = None,
    variants: Sequence[str] = (),
    compile_check: bool = True,
    inputs: PlanInputs | None = None,
    as_json: bool = False,
    request: SearchRequest | None = None,
) -> DryRunReport:
    """Render, constraint-check and compile-check the ``target`` arch's space; print the plan on stdout.
    ``request`` (replacing the other arguments): the search it runs, resolved and refused as the real run does,
    priced with this machine's recorded costs. Raises UsageError where the real run refuses, TunerError where a
    compile check failed (after the report)."""
    planned = None
    if request is not None:
        planned = plan_search(request)  # the real run's settings, and its refusals
        target, source_spec, sets = request.target, request.source_spec, request.sets
        inputs, variants = PlanInputs.of(planned, request.cpu_mask), planned.variants or ()
    inputs = inputs or PlanInputs()
    a = target.arch
    shape = load_gguf_shape(inputs.model) if inputs.model is not None else load_model_shape(inputs.like)
    if inputs.model is not None:
        inputs = dataclasses.replace(inputs, like=inputs.model.name)
    source = tuner.source.fetch_source(source_spec or DEFAULT_SPEC)  # through the module: tests replace it
    space = _space_for_plan(load_space(a.name, source.era), shape.n_layers)
    log.info(
        f"tuner search --dry-run: {a.name} ({a.vendor} {a.family}), source {source.spec} era {source.era}. "
        "Nothing is benchmarked."
    )
    _check_pins(a.name, source.era, space, sets or {})  # before anything compiles
    if planned is not None:
        check_variants(space.variants, planned.variants, a.name, source.era)
    tn.check_patterns(space, inputs.tune_knobs)  # the search refuses a glob that matches nothing; so does its plan
    kernels = {p: kernels_for(space, p) for p in PHASES}
    # the screen's tool the search would pick; UsageError for `--screen kernel` where the search refuses it
    _, base_args = pinned_runtime(space, coerce_pins(space, sets or {}))
    method = screen_method(
        inputs.screen,
        target=target,
        has_kernels=any(kernels.values()),
        base_args=base_args,
        n_layers=shape.n_layers,
        cpu_mask=inputs.cpu_mask,
    )
    log.info(
        f"Screen: {method}"
        + (f" (pinned llama-bench arguments: {' '.join(base_args)})" if base_args else "")
        + (f", --cpu-mask {','.join(map(str, inputs.cpu_mask))}" if inputs.cpu_mask is not None else "")
    )
    wanted = [v for v in space.variants if not variants or v in variants]
    vstatus: dict[str, str] = {}
    for v in wanted:
        try:
            render_variant(source, a.name, v, local_archs=[])
            vstatus[v] = "ok"
        except TunerError as err:
            vstatus[v] = f"not renderable: {err}"
    with log.step(f"Constraint-checking the compile-time space ({len(space.compile_knobs)} knobs)"):
        rows, legal, total = count_space(a.name, source.era, space)
    renderable = [v for v, s in vstatus.items() if s == "ok"]
    checks = _compile_checks(source, target, rows, renderable) if compile_check else []
    plan = plan_stages(
        space,
        kernels=kernels,
        inputs=inputs,
        shape=shape,
        rebuild_s=next((c["seconds"] for c in checks if c["status"] == "ok" and c.get("values")), None),
        n_variants=len(renderable),
        pinned=tuple(sets or {}),
        screen_method=method,
        here=None if planned is None else here_for(target, source, inputs, shape, renderable),
    )
    keys = ("head_dim", "n_layers", "d_model", "n_heads", "n_kv_heads")
    plan = {"model": inputs.like, "model_shape": {k: getattr(shape, k) for k in keys}, "screen_method": method, **plan}
    if planned is not None:  # what the real run resolves, for a reader and for the test that compares both
        plan["request"] = json.loads(json.dumps(dataclasses.asdict(planned), default=str))
    rep = DryRunReport(
        arch=a.name,
        era=source.era,
        variants=vstatus,
        rows=tuple(rows),
        legal=legal,
        total=total,
        compile_checks=tuple(checks),
        plan=plan,
    )
    click.echo(json.dumps(dataclasses.asdict(rep), indent=2) if as_json else render(rep))
    if not rep.ok:  # the real run's build would fail the same way: a plan that cannot run is not exit 0
        bad = [c["variant"] for c in rep.compile_checks if c["status"] == "failed"]
        raise TunerError(
            f"the compile check of {', '.join(bad)} failed (the report above has the error): the real search's build "
            "would fail the same way. Fix the toolchain or the source, or search another variant (--variant)."
        )
    return rep


def _detail(c: CompileCheck) -> str:
    if c.get("why"):
        return " ".join(str(c["why"]).split())[:200]
    targets = c.get("offload") or {}
    # object -> the GPU archs its device code is for (empty: host code only), summarized per arch set
    per = collections.Counter(", ".join(map(str, v)) for v in targets.values())
    code = "; ".join(
        f"{n} object(s) with {what} device code" if what else f"{n} object(s) of host code only"
        for what, n in sorted(per.items())
    )
    vals = c.get("values") or {}
    listed = f"; with one legal non-default candidate per row ({len(vals)} knob values, listed by --json)"
    return f"{c.get('seconds')} s" + (f"; {code}" if code else "") + (listed if vals else "")


def _secs(s: Stage) -> str:
    if s["seconds"] is None:
        return "not estimated"
    a, b = s["seconds"]
    return f"{a:g}" if a == b else f"{a:g}-{b:g}"


def _calls(s: Stage) -> str:
    n = s["llama_bench_calls"]
    return "-" if n == [0, 0] else "-".join(str(x) for x in dict.fromkeys(n))


def render(rep: DryRunReport) -> str:
    """The dry run's report as Markdown."""
    out = [f"# Dry run: {rep.arch}, era {rep.era} (nothing was benchmarked)", "", "## Variants", ""]
    out.append(log.table(["variant", "status"], [[v, s.splitlines()[0][:140]] for v, s in rep.variants.items()]))
    out += ["", f"## Compile-time space: {rep.legal} legal of {rep.total} candidates", ""]
    why = ["; ".join(f"{k} ×{n}" for k, n in r["illegal_rules"].items())[:160] or "-" for r in rep.rows]
    rows = [[r["row"], r["candidates"], r["legal"], w] for r, w in zip(rep.rows, why)]
    out.append(log.table(["row", "candidates", "legal", "why the others are illegal"], rows))
    if rep.compile_checks:
        out += ["", "## Compile checks (object files only; nothing runs)", ""]
        checks = [[c["variant"], c["status"], len(c["objects"]) or "-", _detail(c)] for c in rep.compile_checks]
        out.append(log.table(["variant", "status", "TUs", "detail"], checks))
    p = rep.plan
    lo, hi = p["estimated_minutes"]
    out += ["", f"## Plan on the target ({p['model']}): the stages `tuner search --arch {rep.arch}` runs", ""]
    head = ["stage", "what it runs", "calls (llama-bench or test-backend-ops)", "seconds (estimate)", "per-step cost"]
    stages = [[s["stage"], s["what"], _calls(s), _secs(s), s["cost"] or "-"] for s in p["stages"]]
    out.append(log.table(head, stages))
    out += [
        "",
        f"Estimated total: about {lo:g}-{hi:g} min (fewest rounds .. round cap on every stage). {p['note']}.",
        "Recorded in: " + "; ".join(p["estimate_from"]["sources"]) + ".",
    ]
    past = past_cost_line(rep.arch, trials=p.get("tune_trials"), shape=p.get("model_shape"))
    if past:  # a measured run of this arch: the figures a real search took, beside the estimate
        out += ["", past]
    return "\n".join(out)
