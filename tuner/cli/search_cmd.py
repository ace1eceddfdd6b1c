"""``tuner search`` and ``tuner worker``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tuner.cli._params import (
    CPU_MASK_HELP,
    DIR,
    EXISTING_FILE,
    FILE,
    cpu_mask_option,
    depths_option,
    number_option,
    output_option,
    round_limits,
    rounds_option,
    stacked,
)
from tuner.errors import UsageError
from tuner.pairs import parse_pairs
from tuner.source.spec import DEFAULT_SPEC
from tuner.targets.defaults import DEFAULT_QUANT

if TYPE_CHECKING:
    from tuner.search.request import SearchRequest
    from tuner.targets.target import Target


# the options `tuner search` and `tuner worker` share
_COMMON_OPTIONS = [
    click.option("--arch", help="Target arch (default: the local GPU, else cpu). See `tuner archs`."),
    click.option("--source", "source_spec", default=None, help=f"llama.cpp SPEC (default {DEFAULT_SPEC})."),
    click.option("--model", type=FILE, help="GGUF model to benchmark."),
    click.option("--like", help="Synthesize a random-weight model of this shape (see `tuner model synth`)."),
    click.option(
        "--quant",
        default=None,
        help=f"Weight type of the synthesized model (default {DEFAULT_QUANT}, as `tuner estimate` assumes; the CPU's "
        "default is written directly, others by the built llama-quantize); f16: the synthesized model as it is.",
    ),
    click.option("--depths", callback=depths_option, help="Comma-separated KV depths, e.g. 0,4096,16384,32768."),
    number_option("--pp", click.IntRange(1, 16384), "Prompt tokens per pp test."),
    number_option("--tg", click.IntRange(1, 4096), "Generated tokens per tg test."),
    click.option(
        "--trials",
        type=click.IntRange(0, 100000),
        default=None,
        envvar="TUNER_TRIALS",
        show_envvar=True,
        help="Tune trials the study should reach (0 skips the tune stage; CI sets TUNER_TRIALS for a small budget).",
    ),
    number_option(
        "--time-budget",
        click.FloatRange(1),
        "Seconds from the command's start (the build and the model count); no build, round or trial starts "
        "that would end past it. The same command resumes from the study; exit 3 where it stopped.",
    ),
    click.option(
        "--storage",
        default=None,
        help="Optuna storage URL (default: SQLite in the run dir); postgresql://... to share a study.",
    ),
    click.option("--study", default=None, help="Study name (default: <arch>-<model>-<era>)."),
    click.option("--run-dir", type=DIR, default=None, help="Default ./tuner-runs/<study>."),
    number_option("--jobs", click.IntRange(1, 1024), "Parallel compile jobs."),
    click.option("--variant", "variants", multiple=True, help="Restrict to these variants (repeatable)."),
    click.option("--set", "sets", multiple=True, help="Pin a knob: --set KNOB=VALUE (repeatable)."),
    click.option("--no-gate", is_flag=True, help="Skip the test-backend-ops correctness gate (not recommended)."),
    click.option("--seed", type=int, default=0, show_default=True),
    number_option(
        "--min-rounds", click.IntRange(2, 100), "Paired, interleaved rounds at least (screen and confirm).", default=3
    ),
    number_option("--max-rounds", click.IntRange(2, 100), "Rounds at most (default 6 on a GPU, 7 on the CPU)."),
    number_option(
        "--ci-target",
        click.FloatRange(0.1, 50),
        "Stop adding rounds when every paired 95% CI half-width is within this many percent.",
        default=1.0,
    ),
    number_option(
        "--reps-pp",
        click.IntRange(1, 100),
        "Kept repetitions of a prefill test per call (default 8 on a GPU, 1 on the CPU; a discarded one is added). Calls shared by both phases use the larger.",
    ),
    number_option(
        "--reps-tg",
        click.IntRange(1, 100),
        "Kept repetitions of a decode test per call (default 3 on a GPU, 1 on the CPU).",
    ),
    click.option(
        "--screen",
        type=click.Choice(["auto", "kernel", "llama-bench"]),
        default="auto",
        show_default=True,
        help="What times the kernel screen: kernel = test-backend-ops FLASH_ATTN_EXT at the model's shape "
        "(seconds a round; auto picks it on an NVIDIA GPU with the whole model offloaded), llama-bench = end to end. "
        "The confirm stage always uses llama-bench.",
    ),
    number_option(
        "--confirm-extra",
        click.IntRange(0, 8),
        "Depths the confirm stage adds between the ladder's, shallowest first from 8192 (default 1; each costs a depth fill per call).",
    ),
    number_option(
        "--refine",
        click.IntRange(0, 10),
        "Bisection steps where the winning kernel changes between depths (default 1 on a GPU, 0 on the CPU; llama-bench screen only: the op-level screen does not refine, the confirm places boundaries).",
    ),
    click.option("--cpu-mask", callback=cpu_mask_option, help=CPU_MASK_HELP),
    click.option(
        "--ptx-jit",
        is_flag=True,
        help="Run an older NVIDIA target's kernels on this newer NVIDIA GPU (e.g. sm_89 as 89-virtual on an H100).",
    ),
    # the spellings ab, bench and sweep take for their rounds and repetitions (folded in by _shorthands)
    rounds_option("the screen and the confirm"),
    number_option(
        "--reps",
        click.IntRange(1, 100),
        "llama-bench repetitions per call for both phases, as `tuner bench`/`ab` take it; --reps-pp and "
        "--reps-tg set one phase's.",
    ),
    click.option(
        "--tune-knobs",
        default=None,
        help="Comma-separated globs: the tune samples only the knobs they match, e.g. 'mma.ampere.d64.c8.*' "
        "(the MMA rows of a head-64 decode step); 'variant' matches the build variant. Default: every tunable "
        "knob (rows of other head sizes than the model's are never sampled).",
    ),
    click.option(
        "--tune-depths",
        callback=depths_option,
        default=None,
        help="Depths a tune trial measures, e.g. 32768,65536 (default: --depths). The confirm still measures "
        "every depth.",
    ),
]


@click.command()
@stacked(*_COMMON_OPTIONS)
@click.option(
    "--dry-run", is_flag=True, help="Render, constraint-check and compile-check the space; benchmark nothing."
)
@click.option(
    "--replay",
    "replay_mode",
    is_flag=True,
    help="Run the search logic on recorded llama-bench results (FILES: <pp|tg>-<KERNEL>.jsonl) instead of live runs.",
)
@click.argument("replay", nargs=-1, type=EXISTING_FILE)
@output_option(
    "export_dir",
    old=("--export",),
    type=DIR,
    default=None,
    help="Folder to export the winner into (default: <run-dir>/export).",
)
@click.option("--json", "as_json", is_flag=True, help="With --dry-run or --replay: print the report as JSON on stdout.")
def search(
    dry_run: bool, replay_mode: bool, replay: tuple[Path, ...], export_dir: Path | None, as_json: bool, **kw: Any
) -> None:
    """Search build, compile-time and runtime knobs for the fastest llama.cpp on this machine.

    With no arguments: tune for the local GPU, or the CPU backend when there is none, with a small
    synthetic model and a SQLite study in ./tuner-runs/. Rerunning the same command resumes the study.
    """
    from tuner.targets.target import resolve_target

    _shorthands(kw)
    if bool(replay) != replay_mode:
        raise UsageError(
            "--replay takes the recorded files as arguments: tuner search --replay pp-default.jsonl tg-default.jsonl ..."
        )
    if as_json and not (dry_run or replay):
        raise UsageError(
            "--json prints the report of --dry-run or --replay; add one of them, or drop --json "
            "(a live search writes its result with -o/--output)."
        )
    if replay and not dry_run:  # the recorded files say what was measured: the arch is only checked, when given
        from tuner.search.replay import replay_screen

        if kw["arch"] is not None:
            resolve_target(kw["arch"], replay=True, ptx_jit=kw["ptx_jit"])
        replay_screen(
            list(replay),
            min_rounds=kw["min_rounds"],
            max_rounds=kw["max_rounds"] or 5,
            ci_target=kw["ci_target"],
            as_json=as_json,
        )
        return
    target = resolve_target(kw["arch"], dry_run=dry_run, replay=bool(replay), ptx_jit=kw["ptx_jit"])
    from tuner.study.storage import check_storage, storage_guard

    if kw["storage"] is not None:  # the shared storage check, before minutes of fetching and building (or a plan)
        check_storage(kw["storage"])
    if dry_run:
        from tuner.search.dryrun import run_dry_run

        run_dry_run(target=target, source_spec=kw["source_spec"], request=_request(target, kw), as_json=as_json)
        return
    from tuner.cli.export_cmd import search_and_export

    with storage_guard(kw["storage"]):  # a --time-budget stop exits 3 (tuner.cli.main): not a finished search
        search_and_export(_request(target, kw), export_dir)


@click.command()
@stacked(*_COMMON_OPTIONS)
def worker(**kw: Any) -> None:
    """Join a study that `tuner search` screened and composed (``--storage postgresql://... --study NAME``)
    and add tune trials until --trials or the budget; `tuner search` again confirms and exports."""
    from tuner.cli.export_cmd import tune_worker
    from tuner.study.storage import check_storage, storage_guard
    from tuner.targets.target import resolve_target

    _shorthands(kw)
    if not kw["storage"] or not kw["study"]:
        raise UsageError("tuner worker needs --storage URL and --study NAME of a study that `tuner search` created.")
    target = resolve_target(kw["arch"], ptx_jit=kw["ptx_jit"])
    check_storage(kw["storage"], existing=True)  # a worker joins a study: a mistyped SQLite path is not created
    with storage_guard(kw["storage"]):
        tune_worker(_request(target, kw))


def _shorthands(kw: dict[str, Any]) -> None:
    """--rounds N (--min-rounds N --max-rounds N) and --reps N (both phases' reps), as every command reads them;
    the start of the --time-budget clock: detection, build and model included."""
    kw["started"] = time.monotonic()
    ctx = click.get_current_context()
    kw["min_rounds"], kw["max_rounds"] = round_limits(ctx, kw.pop("rounds"), kw["min_rounds"], kw["max_rounds"])
    reps = kw.pop("reps")
    for phase in ("reps_pp", "reps_tg"):
        kw[phase] = reps if kw[phase] is None else kw[phase]


def _request(target: Target, kw: Mapping[str, Any]) -> SearchRequest:
    """The flags of a search (click has checked each one's type and range) as a :class:`SearchRequest`;
    ``--run-dir`` is refused before anything is fetched or built where it is or holds a symbolic link."""
    from tuner.paths import refuse_linked_folder
    from tuner.search.request import SearchRequest

    # every other flag as click parsed it, by the name of the SearchRequest field it fills
    as_given = {f.name for f in dataclasses.fields(SearchRequest)} & kw.keys()
    return SearchRequest(
        target=target,
        started=kw.get("started"),
        run_dir=None if kw["run_dir"] is None else refuse_linked_folder(kw["run_dir"], "--run-dir"),
        variants=tuple(kw["variants"]),
        sets=parse_pairs(kw["sets"], "--set", "variant=cuda-no-graphs", what="KNOB"),
        gate=not kw["no_gate"],
        tune_knobs=tuple(x.strip() for x in (kw["tune_knobs"] or "").split(",") if x.strip()),
        **{name: kw[name] for name in as_given - {"started", "run_dir", "variants", "sets", "tune_knobs"}},
    )
