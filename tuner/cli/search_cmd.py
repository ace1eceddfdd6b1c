"""``tuner search`` and ``tuner worker``."""

from __future__ import annotations

__all__ = ["search", "worker"]

from pathlib import Path

import click

from tuner import interrupts, log
from tuner.cli._params import CPU_MASK_HELP, cpu_mask_option, depths_option, output_option
from tuner.errors import TunerError, UsageError
from tuner.pairs import parse_pairs
from tuner.redact import redact
from tuner.source.spec import DEFAULT_SPEC

# The embedded default: what `tuner search` does with no arguments on a machine without a GPU.
# Small enough to finish in minutes on 2 cores, real enough to exercise every stage.
# One build variant by default (a second CPU build costs ~6 more minutes on 2 cores); pass
# --variant cpu --variant cpu-no-native to search both.
CPU_DEFAULTS = {
    "like": "tiny",
    "depths": (0, 1024, 4096),
    "pp": 128,
    "tg": 32,
    "trials": 3,
    "variants": ("cpu",),
    "max_rounds": 3,
    "refine": 0,
}
# The depth ladder of issue 15, capped by the model's context length.
GPU_DEFAULTS = {
    "like": "llama-3.2-1b",
    "depths": (0, 4096, 8192, 16384, 32768, 65536),
    "pp": 512,
    "tg": 128,
    "trials": 6,
    "max_rounds": 6,
    "refine": 1,
}


def _sets(values: tuple[str, ...]) -> dict[str, str]:
    return parse_pairs(values, "--set", "variant=cuda-no-graphs", what="KNOB")


def _common(f):  # type: ignore[no-untyped-def]
    opts = [
        click.option("--arch", help="Target arch (default: the local GPU, else cpu). See `tuner archs`."),
        click.option("--source", "source_spec", default=None, help=f"llama.cpp SPEC (default {DEFAULT_SPEC})."),
        click.option("--model", type=click.Path(dir_okay=False, path_type=Path), help="GGUF model to benchmark."),
        click.option("--like", help="Synthesize a random-weight model of this shape (see `tuner model synth`)."),
        click.option(
            "--quant", default=None, help="Quantize the synthesized model (e.g. Q4_K_M) with the built llama-quantize."
        ),
        click.option("--depths", callback=depths_option, help="Comma-separated KV depths, e.g. 0,4096,16384,32768."),
        click.option("--pp", type=click.IntRange(1, 16384), default=None, help="Prompt tokens per pp test."),
        click.option("--tg", type=click.IntRange(1, 4096), default=None, help="Generated tokens per tg test."),
        click.option(
            "--trials",
            type=click.IntRange(0, 100000),
            default=None,
            envvar="TUNER_TRIALS",
            show_envvar=True,
            help="Tune trials the study should reach (0 skips the tune stage; CI sets TUNER_TRIALS for a small budget).",
        ),
        click.option(
            "--time-budget", type=click.FloatRange(1), default=None, help="Seconds; no new trial starts after this."
        ),
        click.option(
            "--storage",
            default=None,
            help="Optuna storage URL (default: SQLite in the run dir); postgresql://... to share a study.",
        ),
        click.option("--study", default=None, help="Study name (default: <arch>-<model>-<era>)."),
        click.option(
            "--run-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="Default ./tuner-runs/<study>.",
        ),
        click.option("--jobs", type=click.IntRange(1, 1024), default=None, help="Parallel compile jobs."),
        click.option("--variant", "variants", multiple=True, help="Restrict to these variants (repeatable)."),
        click.option("--set", "sets", multiple=True, help="Pin a knob: --set KNOB=VALUE (repeatable)."),
        click.option("--no-gate", is_flag=True, help="Skip the test-backend-ops correctness gate (not recommended)."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option(
            "--min-rounds",
            type=click.IntRange(2, 100),
            default=3,
            show_default=True,
            help="Paired, interleaved rounds at least (screen and confirm).",
        ),
        click.option(
            "--max-rounds",
            type=click.IntRange(2, 100),
            default=None,
            help="Rounds at most (default 6 on a GPU, 4 on the CPU).",
        ),
        click.option(
            "--ci-target",
            type=click.FloatRange(0.1, 50),
            default=1.0,
            show_default=True,
            help="Stop adding rounds when every paired 95% CI half-width is within this many percent.",
        ),
        click.option(
            "--reps-pp",
            type=click.IntRange(1, 100),
            default=None,
            help="llama-bench repetitions of a prefill test per call (default 8). Calls shared by both phases use the larger of the two.",
        ),
        click.option(
            "--reps-tg",
            type=click.IntRange(1, 100),
            default=None,
            help="Repetitions of a decode test per call (default 3).",
        ),
        click.option(
            "--confirm-extra",
            type=click.IntRange(0, 8),
            default=None,
            help="Depths the confirm stage adds between the ladder's (default 2; each costs a depth fill per call).",
        ),
        click.option(
            "--refine",
            type=click.IntRange(0, 10),
            default=None,
            help="Bisection steps where the winning kernel changes between depths (default 1 on a GPU, 0 on the CPU).",
        ),
        click.option("--cpu-mask", callback=cpu_mask_option, help=CPU_MASK_HELP),
        click.option(
            "--ptx-jit",
            is_flag=True,
            help="Run an older NVIDIA target's kernels on this newer NVIDIA GPU (e.g. sm_89 as 89-virtual on an H100).",
        ),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.command()
@_common
@click.option(
    "--dry-run", is_flag=True, help="Render, constraint-check and compile-check the space; benchmark nothing."
)
@click.option(
    "--replay",
    "replay_mode",
    is_flag=True,
    help="Run the search logic on recorded llama-bench results (FILES: <pp|tg>-<KERNEL>.jsonl) instead of live runs.",
)
@click.argument("replay", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@output_option(
    "export_dir",
    old=("--export",),
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder to export the winner into (default: <run-dir>/export).",
)
@click.option("--json", "as_json", is_flag=True, help="With --dry-run or --replay: print the report as JSON on stdout.")
def search(
    dry_run: bool, replay_mode: bool, replay: tuple[Path, ...], export_dir: Path | None, as_json: bool, **kw: object
) -> None:
    """Search build, compile-time and runtime knobs for the fastest llama.cpp on this machine.

    With no arguments: tune for the local GPU, or the CPU backend when there is none, with a small
    synthetic model and a SQLite study in ./tuner-runs/. Rerunning the same command resumes the study.
    """
    from tuner.search.study import resolve_arch

    if bool(replay) != replay_mode:
        raise UsageError(
            "--replay takes the recorded files as arguments: tuner search --replay pp-default.jsonl tg-default.jsonl ..."
        )
    if as_json and not (dry_run or replay):
        raise UsageError(
            "--json prints the report of --dry-run or --replay; add one of them, or drop --json "
            "(a live search writes its result with -o/--output)."
        )
    arch = resolve_arch(kw.pop("arch"), dry_run=dry_run, replay=bool(replay), ptx_jit=bool(kw.pop("ptx_jit")))  # type: ignore[arg-type]
    if dry_run:
        from tuner.search.dryrun import PlanInputs, run_dry_run

        # The plan uses the flags the real run would get, with the GPU defaults where not given.
        d = GPU_DEFAULTS
        if kw.get("model") and kw.get("like"):
            raise UsageError("give either --model GGUF or --like NAME, not both.")
        inputs = PlanInputs(
            like=str(kw.get("like") or d["like"]),
            model=kw.get("model"),
            depths=tuple(kw.get("depths") or d["depths"]),  # type: ignore[arg-type]
            trials=int(kw["trials"] if kw.get("trials") is not None else d["trials"]),  # type: ignore[call-overload]
            min_rounds=int(kw["min_rounds"]),  # type: ignore[call-overload]
            max_rounds=int(kw.get("max_rounds") or d["max_rounds"]),  # type: ignore[call-overload]
            refine=int(kw["refine"] if kw.get("refine") is not None else d["refine"]),  # type: ignore[call-overload]
            confirm_extra=int(kw["confirm_extra"] if kw.get("confirm_extra") is not None else 2),
        )  # type: ignore[call-overload]
        run_dry_run(
            arch=arch,
            source_spec=kw.get("source_spec"),
            sets=_sets(kw["sets"]),
            variants=kw["variants"],  # type: ignore[arg-type]
            inputs=inputs,
            as_json=as_json,
        )
        return
    if replay:
        from tuner.search.replay import replay_screen

        replay_screen(
            list(replay),
            min_rounds=int(kw["min_rounds"]),
            max_rounds=int(kw.get("max_rounds") or 5),  # type: ignore[arg-type]
            ci_target=float(kw["ci_target"]),
            as_json=as_json,
        )  # type: ignore[arg-type]
        return
    _run(arch, worker=False, export_dir=export_dir, **kw)


@click.command()
@_common
def worker(**kw: object) -> None:
    """Join a study that `tuner search` screened and composed (``--storage postgresql://... --study NAME``)
    and add tune trials until --trials or the budget; `tuner search` again confirms and exports."""
    from tuner.search.study import resolve_arch

    if not kw.get("storage") or not kw.get("study"):
        raise UsageError("tuner worker needs --storage URL and --study NAME of a study that `tuner search` created.")
    arch = resolve_arch(kw.pop("arch"), ptx_jit=bool(kw.pop("ptx_jit")))  # type: ignore[arg-type]
    _run(arch, worker=True, export_dir=None, **kw)


def _baseline_build(arch: str, source: object) -> object:
    """The upstream-default variant's build (for llama-quantize); cached like every build."""
    from tuner.builder.cmake import build_variant
    from tuner.plan.render import render_variant
    from tuner.plan.space import load_space
    from tuner.targets.archs import detect_local_archs

    space = load_space(arch, source.era)  # type: ignore[attr-defined]
    rv = render_variant(source, arch, space.variants[0], local_archs=detect_local_archs())  # type: ignore[arg-type]
    return build_variant(rv)


def _run(arch: str, *, worker: bool, export_dir: Path | None, **kw: object) -> None:
    import time

    from tuner.search.study import SearchConfig, default_run_dir
    from tuner.source import fetch_source

    defaults = CPU_DEFAULTS if arch == "cpu" else GPU_DEFAULTS
    if kw.get("storage") is not None:  # refused before anything is fetched, built or created
        from tuner.search.study import check_storage_url

        check_storage_url(str(kw["storage"]))
    if not worker:
        log.info(_intro(arch, kw, defaults))
    spec = str(kw.get("source_spec") or DEFAULT_SPEC)
    source = fetch_source(spec)
    t_model = time.monotonic()
    model = _model(arch, source, kw, defaults)
    model_seconds = time.monotonic() - t_model if not kw.get("model") else None  # --like: synthesized (cached) here
    study = str(kw.get("study") or f"{arch}-{model.stem}-{source.era}")
    run_dir = Path(kw.get("run_dir") or default_run_dir(study))  # type: ignore[arg-type]
    sets = _sets(kw["sets"])  # type: ignore[arg-type]
    ctx = _context_length(model)
    depths = tuple(kw.get("depths") or [d for d in defaults["depths"] if not ctx or d <= ctx])  # type: ignore[union-attr]
    _check_pins(arch, source, model, sets, kw.get("cpu_mask"))  # type: ignore[arg-type]
    cfg = SearchConfig(
        arch=arch,
        source_spec=spec,
        model=model.resolve(),
        depths=depths,
        pp=int(kw.get("pp") or defaults["pp"]),  # type: ignore[arg-type]
        tg=int(kw.get("tg") or defaults["tg"]),  # type: ignore[arg-type]
        trials=kw.get("trials") if kw.get("trials") is not None else defaults["trials"],  # type: ignore[arg-type]
        time_budget=kw.get("time_budget"),  # type: ignore[arg-type]
        storage=kw.get("storage"),  # type: ignore[arg-type]
        study=study,
        run_dir=run_dir,
        jobs=kw.get("jobs"),  # type: ignore[arg-type]
        seed=int(kw["seed"]),  # type: ignore[arg-type]
        gate=not kw.get("no_gate"),
        variants=tuple(kw["variants"]) or defaults.get("variants"),  # type: ignore[arg-type]
        fixed=sets,
        worker=worker,
        min_rounds=int(kw["min_rounds"]),  # type: ignore[arg-type]
        max_rounds=max(int(kw["min_rounds"]), int(kw.get("max_rounds") or defaults["max_rounds"])),  # type: ignore[arg-type]
        ci_target=float(kw["ci_target"]),  # type: ignore[arg-type]
        refine=int(kw["refine"] if kw.get("refine") is not None else defaults["refine"]),  # type: ignore[arg-type]
        cpu_mask=kw.get("cpu_mask"),  # type: ignore[arg-type]
        model_seconds=model_seconds,
        **{k: int(kw[k]) for k in ("reps_pp", "reps_tg", "confirm_extra") if kw.get(k) is not None},  # type: ignore[arg-type]
    )

    shown = redact(cfg.storage_url)  # a password in --storage never reaches the screen or a log
    log.info(
        f"tuner search: arch {arch}, source {spec} (era {source.era}), model {model.name}, "
        f"depths {list(cfg.depths)}, pp{cfg.pp}/tg{cfg.tg}\n"
        f"  study {study!r} in {shown}; run dir {run_dir}\n"
        f"  {_dashboard_hint(cfg.storage_url)}"
    )
    from tuner.search.pipeline import BudgetReached, run_tune_worker

    if worker:
        try:
            with interrupts.sigterm_interrupts():
                n = run_tune_worker(cfg)
        except BudgetReached as stop:
            log.notice(f"time budget reached during {stop}; the trials so far are in {shown}.")
            return
        log.info(
            f"\nDone: the study holds {n} tune trials. `tuner search` with the same --storage/--study confirms and exports."
        )
        return

    _search_and_export(cfg, export_dir or (run_dir / "export"), shown)


def _search_and_export(cfg: object, out: Path, shown: str) -> None:
    """Run (or resume) the pipeline and export its result; an interruption says how to go on."""
    import time

    from tuner.cli.export_cmd import export_study
    from tuner.result.pipeline_export import summary_line
    from tuner.search.pipeline import BudgetReached, run_pipeline

    def export(result: object) -> None:  # inside the run dir's lock: no second search exports here meanwhile
        log.info(f"\nSearch done in {time.monotonic() - t0:.0f} s.")
        export_study(cfg.study, storage=cfg.storage_url, out_dir=out)  # type: ignore[attr-defined]
        log.info(
            f"\nExported the result to {out}/ (config.toml, CMakeUserPresets.json, run.env, report.md; tuned.patch where the kernels differ from upstream's)."
        )

    t0 = time.monotonic()
    try:
        with interrupts.sigterm_interrupts():
            result = run_pipeline(cfg, then=export)  # type: ignore[arg-type]
    except BudgetReached as stop:
        log.notice(
            f"time budget reached during {stop} after {time.monotonic() - t0:.0f} s; everything measured so far is "
            f"in {shown}. Rerun the same command to resume; nothing was exported yet."
        )
        return
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: say how to go on before `tuner: aborted`
        log.notice(
            f"interrupted after {time.monotonic() - t0:.0f} s; every finished round and trial is in {shown} "
            "(a trial cut off is run again). Rerun the same command to resume."
        )
        raise
    click.echo(summary_line(result))


def _dashboard_hint(storage_url: str) -> str:
    """How to watch the study live: the command when optuna-dashboard is installed, else how to get it.
    The command carries no password (PGPASSWORD or ~/.pgpass supplies it)."""
    import importlib.util

    from tuner.result.report import dashboard_command

    if importlib.util.find_spec("optuna_dashboard") is not None:
        return f"open it live with: {dashboard_command(storage_url)}"
    return "to watch it live, install the dashboard extra: pip install -e '.[dashboard]' (then optuna-dashboard <storage URL>)"


def _check_pins(arch: str, source: object, model: Path, sets: dict[str, str], cpu_mask: tuple[int, ...] | None) -> None:
    """--set values checked against the space resolved for this machine, mask and model (threads within
    the CPUs, -ngl within the layers), so a bad pin is refused before any build or measurement."""
    from tuner.plan.derive import space_for_run
    from tuner.plan.space import load_space, set_values

    space, _ = space_for_run(load_space(arch, source.era), cpu_mask=cpu_mask, model=model, gpu=False)  # type: ignore[attr-defined]
    set_values(space, {k: v for k, v in sets.items() if k != "variant"})
    if "variant" in sets and sets["variant"] not in space.variants:
        from tuner.errors import close_matches

        raise UsageError(
            f"--set variant={sets['variant']} is not a variant of the {arch} space; it has "
            f"{', '.join(space.variants)}.{close_matches(sets['variant'], space.variants)} Pin one of those, "
            "or leave variant unpinned."
        )


def _model(arch: str, source: object, kw: dict, defaults: dict) -> Path:
    """--model as given, or a synthesized (and optionally quantized) model of --like's shape."""
    model = kw.get("model")
    like = kw.get("like") or (None if model else defaults["like"])
    if model is not None and kw.get("like"):
        raise UsageError("give either --model GGUF or --like NAME, not both.")
    if model is None:
        from tuner.targets.models import synth_cached

        quant = kw.get("quant")
        qbin = _baseline_build(arch, source).exe("llama-quantize") if quant else None
        model = synth_cached(str(like), source=source, quant=quant, quantize_bin=qbin)  # type: ignore[arg-type]
    elif not Path(model).is_file():
        raise UsageError(f"--model {model} does not exist. Pass a GGUF file or use --like NAME to synthesize one.")
    return Path(model)


def _context_length(model: Path) -> int | None:
    from tuner.targets.models import load_gguf_shape

    try:
        return int(load_gguf_shape(model).context_length)
    except TunerError:
        return None


def _intro(arch: str, kw: dict, defaults: dict) -> str:
    """What the run will do and roughly how long, before anything starts (measured on this project's
    machines: a CPU build ~5-8 min on 2 cores, an sm_90 build ~4.5 min on 16; the CPU default's
    measuring a few minutes on 2 cores)."""
    trials = kw.get("trials") if kw.get("trials") is not None else defaults["trials"]
    what = "llama.cpp's CPU backend (no GPU found)" if arch == "cpu" else f"{arch}"
    build = "about 5-8 minutes on 2 cores" if arch == "cpu" else "about 5 minutes on 16 cores for one CUDA arch"
    if arch == "cpu":  # the H100 figure says nothing about a CPU run
        measure = (
            "a few minutes on 2 cores"
            if not kw.get("model")
            else "a time that grows with the model's size and the depths; the ETAs after the first round say"
        )
    else:
        measure = "15-25 minutes on an H100 for a 1B-8B model at depths up to 65536"
    return (
        f"tuner search: tunes {what}. Once per machine: fetch the pinned llama.cpp (10 MB) and build it "
        f"({build}); then screen the kernels per phase and depth, compose rules, tune {trials} Optuna trial(s) and "
        f"confirm against upstream ({measure}). Progress and ETAs follow; rerunning the same command resumes."
    )
