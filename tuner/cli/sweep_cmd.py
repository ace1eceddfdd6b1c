"""``tuner sweep``: the shape-wide sweep of FlashAttention kernel and MMQ-vs-cuBLAS choices, the sweep's table
confirmed end to end on model shapes (``sweep confirm``), exported as a result folder (``sweep export``) and
exported tables joined into one (``sweep merge``) (docs/sweep.md)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tuner.cli._params import (
    DIR,
    EXISTING_DIR,
    FILE,
    PATH,
    F,
    SuggestingGroup,
    build_option,
    depths_option,
    number_option,
    output_option,
    round_limits,
    rounds_option,
    stacked,
    stamped_run_dir,
)
from tuner.targets.defaults import DEFAULT_QUANT

if TYPE_CHECKING:
    from tuner.sweep.run_stage import FaRequest, MmqRequest

_Req = TypeVar("_Req", "FaRequest", "MmqRequest")


@click.group(cls=SuggestingGroup)
def sweep() -> None:
    """Sweep llama.cpp's FlashAttention kernel choice and MMQ-vs-cuBLAS choice over a grid of shapes.

    Each cell times single ops at an exact shape, every legal kernel forced, in paired rounds with an
    A/A pair; the verdicts compose into one table per arch, emitted as a change to upstream's selection
    functions. See docs/sweep.md.
    """


_grid_options = stacked(
    click.option("--arch", default="sm_90", show_default=True, help="Target arch (see `tuner archs`)."),
    click.option(
        "--head-size",
        "head_sizes",
        type=click.IntRange(1, 4096),
        multiple=True,
        help="Head sizes (default: all of the grid).",
    ),
    click.option("--gqa", "gqa_ratios", type=click.IntRange(1, 256), multiple=True, help="GQA ratios (default: all)."),
    click.option(
        "--kv", "kv_types", type=click.Choice(["f16", "q8_0"]), multiple=True, help="K/V types (default: all)."
    ),
    click.option(
        "--ne1",
        "query_batches",
        type=click.IntRange(1, 4096),
        multiple=True,
        help="Query columns Q->ne[1] (default: 1, decode; 2, 4, 8: parallel and speculative decoding, "
        "measured when asked and checked end to end by the confirm's small-batch passes, llama-bench ppN).",
    ),
    click.option(
        "--n-kv",
        callback=depths_option,
        help="Comma-separated n_kv points, multiples of 256 (default: octaves 256..131072; half-octaves "
        "add 768,1536,...,98304 for boundaries within a factor of 1.5).",
    ),
)
_round_options = stacked(
    rounds_option("every cell (MMQ: point)"),
    # default 3: tuner.measure.decide.DEFAULT_LIMITS (the search's; not imported: scipy)
    number_option("--min-rounds", click.IntRange(2, 100), "Paired rounds every cell (MMQ: point) gets.", default=3),
    number_option(
        "--max-rounds",
        click.IntRange(2, 100),
        "Further rounds, up to this many, go only to the cells (MMQ: points) whose verdict is still "
        "open; a rerun with a higher value adds rounds to the ones still open.",
        default=6,
    ),
)
"""--rounds (fixed), --min-rounds and --max-rounds (sequential: the search's screen's stop rule)."""


def measure_options(*, build_help: str, backend_help: str, storage: str) -> Callable[[F], F]:
    """--build, --backend, --source and --storage, as `sweep run`, `sweep mmq` and `sweep confirm` take them."""
    return stacked(
        build_option(build_help),
        click.option("--backend", default="CUDA0", show_default=True, help=backend_help),
        click.option("--source", "spec", help="llama.cpp source SPEC to build and patch (default: the pinned tree)."),
        click.option(
            "--storage",
            type=FILE,
            help=f"SQLite file of the samples; a rerun with the same file resumes (default: OUTPUT/{storage}).",
        ),
    )


def run_options(unit: str, dry_help: str, out_help: str) -> Callable[[F], F]:
    """--time-budget (``unit``: what does not start), --dry-run and -o (written in place), as `sweep run`,
    `sweep mmq` and `sweep confirm` take them."""
    return stacked(
        click.option(
            "--time-budget",
            type=click.FloatRange(1),
            help=f"Seconds from now: no {unit} starts that would end past this. What was measured is stored and the "
            "same command goes on from there; exit status 3 where the budget stopped it.",
        ),
        click.option("--dry-run", is_flag=True, help=dry_help),
        output_option("out_dir", type=DIR, default=None, help=out_help, in_place=True),
    )


@contextlib.contextmanager
def budget_stop(storage: Path, emitted: str) -> Iterator[None]:
    """A sweep stopped by its --time-budget: what is stored, how to go on, exit status 3 (``emitted``: what
    the command would have written, and has not)."""
    from tuner import log
    from tuner.rounds.budget import BudgetReached

    try:
        yield
    except BudgetReached as stop:
        log.notice(
            f"time budget reached before {stop}: everything measured so far is stored in {storage}. Run the same "
            f"command again to go on; {emitted} not written yet."
        )
        sys.exit(3)  # SystemExit: click.main(standalone_mode=False) would swallow an Exit


def _output_of(name: str, dest: str, help_text: str) -> Callable[[F], F]:
    """An optional existing folder another sweep command wrote."""
    return click.option(name, dest, type=EXISTING_DIR, default=None, help=help_text)


def _result_folder(help_text: str) -> Callable[[F], F]:
    """-o of `sweep export` and `sweep merge`: the result folder written (replaced whole)."""
    return output_option("out_dir", type=PATH, required=True, help=help_text)


def _limits(rounds: int | None, min_rounds: int, max_rounds: int) -> tuple[int, int]:
    low, high = round_limits(click.get_current_context(), rounds, min_rounds, max_rounds)
    return low, high if high is not None else max_rounds


_GRID = ("head_sizes", "gqa_ratios", "kv_types", "query_batches", "n_kv")
"""The grid's flags (:class:`tuner.sweep.run_stage.Grid`'s fields)."""


def _dry_or_run(request: _Req, dry_run: bool, dry: Callable[[_Req], str], run: Callable[[_Req], str]) -> None:
    """Print the dry run, or run the stage (a --time-budget stop: exit status 3) and print its summary."""
    if dry_run:
        click.echo(dry(request), nl=False)
        return
    with budget_stop(request.storage_path, "report.md and upstream.patch are"):
        summary = run(request)
    click.echo(summary)


@sweep.command("plan")
@_grid_options
@_round_options
@number_option(
    "--per-call-s",
    click.FloatRange(min=0, min_open=True),
    "Also print the time at this many seconds per timer call (one config of one cell in one round): "
    "a what-if; the `sweep run` line's estimate is the one from recorded costs.",
)
@number_option(
    "--target-ms",
    click.IntRange(0, 60_000),
    "fa-bench's --target-ms that the `sweep run` estimate assumes (its value on a GPU backend).",
    default=20,
)
def plan_cmd(
    arch: str,
    rounds: int | None,
    min_rounds: int,
    max_rounds: int,
    per_call_s: float | None,
    target_ms: int,
    **grid_opts: Any,
) -> None:
    """Print the sweep's grid, its timer calls and the estimated GPU time (nothing runs).

    Both sweeps' rounds are sequential (--min-rounds for every cell or point, up to --max-rounds for the
    ones still open) unless --rounds fixes them."""
    from tuner.sweep import grid, live, mmq
    from tuner.sweep.run_stage import Grid
    from tuner.targets.archs import load_arch

    a = load_arch(arch)
    limits = _limits(rounds, min_rounds, max_rounds)
    cells = Grid(**grid_opts).cells(a)
    click.echo(grid.dry_run_text(cells, rounds=limits[0], per_call_s=per_call_s, max_rounds=limits[1]), nl=False)
    click.echo(live.estimate_text(cells, limits=limits, chunk_size=72, target_ms=target_ms), nl=False)
    if a.vendor == "amd":
        click.echo(f"No {a.name} GPU was timed here: the times above are estimated from an H100's processes.")
    click.echo(mmq.mmq_plan_text(a, limits=limits, per_call_s=per_call_s), nl=False)


@sweep.command("run")
@_grid_options
@_round_options
@measure_options(
    build_help="Build (or bin) directory with test-backend-ops, a tuner-patched build (`tuner build` prints it). "
    "Default: build the arch's default variant.",
    backend_help="test-backend-ops backend (CPU times upstream's kernel only: it has no tuner hook to force one).",
    storage="sweep.sqlite3",
)
@number_option(
    "--chunk-cells",
    click.IntRange(1, 100000),
    "Cells per test-backend-ops process (whole shapes at a time).",
    default=72,
)
@click.option(
    "--timer",
    type=click.Choice(["fa-bench", "test-backend-ops"]),
    default=None,
    help="What times the op: fa-bench (a small ggml program tuner compiles against the build; cold K/V, "
    "at least 50 ops a case, see --target-ms) or test-backend-ops perf (at least 1 s a case, one K/V buffer). "
    "Default: fa-bench, or test-backend-ops where fa-bench does not compile.",
)
@number_option(
    "--target-ms",
    click.IntRange(0, 60_000),
    "fa-bench: time at least this many ms of ops per case; a case of short ops times more than 50 "
    "(fa-bench calibrates per case). 0: 50 ops a case. Default: 20 on a GPU backend, 0 on CPU.",
)
@run_options(
    "round of a chunk (its configs' timer processes, priced at the H100 sweep's rates)",
    "Print the grid, the timer calls and the estimated time, and stop.",
    "Where the logs, report.md and upstream.patch go (default $TUNER_HOME/runs/sweep-<time>).",
)
def run_cmd(
    rounds: int | None, min_rounds: int, max_rounds: int, dry_run: bool, out_dir: Path | None, **opts: Any
) -> None:
    """Measure the sweep with fa-bench (or test-backend-ops) and compose the table (resumable).

    Per chunk of cells and round, one process per config: upstream's choice, its A/A twin and each
    forced kernel over the cells where it is a candidate. Samples go to --storage as they come; a rerun
    skips what is recorded. A sample whose kernel is not the one asked for (FA log) or that failed leaves
    its cell without a verdict. Writes report.md and, where a rule was found, upstream.patch to -o.

    Example: tuner sweep run --head-size 128 --gqa 4 -o sweep-h100
    """
    from tuner.sweep.run_stage import FaRequest, Grid, dry_run_fa, run_fa

    grid = Grid(**{k: opts.pop(k) for k in _GRID})
    request = FaRequest(
        grid=grid, limits=_limits(rounds, min_rounds, max_rounds), out=out_dir or stamped_run_dir("sweep"), **opts
    )
    _dry_or_run(request, dry_run, dry_run_fa, run_fa)


@sweep.command("mmq")
@click.option("--arch", default="sm_90", show_default=True, help="Target arch (see `tuner archs`).")
@click.option(
    "--type", "types", multiple=True, help="Quant types, repeatable (default: q4_0 q4_K q5_K q6_K q8_0 iq4_xs)."
)
@click.option(
    "--ne11",
    "batches",
    type=click.IntRange(1, 1 << 20),
    multiple=True,
    help="Batch sizes, repeatable (default: 16..4096 in octaves).",
)
@click.option(
    "--like",
    multiple=True,
    help="Models whose dense projection sizes (m x k) are timed, repeatable (default: llama-3.2-1b, llama-3.1-8b, qwen2.5-0.5b).",
)
@click.option(
    "--size",
    "sizes",
    multiple=True,
    hidden=True,
    help="Weight sizes MxK instead of the --like models' (advanced, e.g. tests).",
)
@_round_options
@measure_options(
    build_help="Build (or bin) directory with libggml*.so, a tuner build with the MMQ hook. Default: build the arch's default variant.",
    backend_help="ggml backend to time on (CPU has no MMQ/cuBLAS choice: both configs time the same code there, and nothing is composed).",
    storage="mmq.sqlite3",
)
@number_option(
    "--iters", click.IntRange(1, 1_000_000), "Ops timed per case (at least one per copy of the weights).", default=50
)
@number_option(
    "--cache-mb",
    click.IntRange(0, 1 << 20),
    "The weights' copies together exceed this many MiB, so every op reads cold weights.",
    default=128,
)
@number_option(
    "--target-ms",
    click.IntRange(0, 60_000),
    "Time at least this many ms of ops a case (mm-bench's -m; default 20 on a GPU backend, 0 on the CPU: "
    "--iters ops). Without it a microsecond op is timed over a fraction of a millisecond, and its A/A noise "
    "(over 20% on the H100) leaves its type and size without a verdict.",
)
@click.option(
    "--cuda-graphs/--no-cuda-graphs",
    default=True,
    show_default=True,
    help="Let ggml's CUDA backend capture each case's graph as a CUDA graph, as it does for any graph llama.cpp "
    "repeats (llama-bench's prompt tests included); --no-cuda-graphs runs every config with "
    "GGML_CUDA_DISABLE_GRAPHS=1. Recorded in the storage and report.md.",
)
@run_options(
    "round (its configs' mm-bench processes, priced at the H100 sweep's rates)",
    "Print the points, the mm-bench calls and the estimated time, and stop.",
    "Where the logs, report.md and upstream.patch go (default $TUNER_HOME/runs/sweep-mmq-<time>).",
)
def mmq_cmd(
    rounds: int | None, min_rounds: int, max_rounds: int, dry_run: bool, out_dir: Path | None, **opts: Any
) -> None:
    """Measure MMQ against cuBLAS per quant type, weight size and batch size with mm-bench, and compose
    the batch sizes where cuBLAS is faster (resumable).

    Per round, one mm-bench process per config over the points that get the round: upstream's choice, its
    A/A twin and cuBLAS forced through the build's MMQ hook. Every point gets --min-rounds rounds, then only
    the points whose verdict is still open get more, up to --max-rounds (--rounds N: N for every point).
    Samples go to --storage as they come; a rerun skips what is recorded, and a higher --max-rounds adds
    rounds to the points still open. A batch size goes to cuBLAS for a type only where cuBLAS was faster at
    every size. Writes report.md and, where a choice was composed, upstream.patch to -o.

    Example: tuner sweep mmq --build BUILD -o sweep-mmq-h100
    """
    from tuner.sweep.run_stage import MmqRequest, dry_run_mmq, run_mmq

    request = MmqRequest(
        limits=_limits(rounds, min_rounds, max_rounds), out=out_dir or stamped_run_dir("sweep-mmq"), **opts
    )
    _dry_or_run(request, dry_run, dry_run_mmq, run_mmq)


@sweep.command("confirm")
@click.argument("sweep_dir", type=EXISTING_DIR)
@_output_of(
    "--mmq",
    "mmq_dir",
    "Output directory of `tuner sweep mmq`: its MMQ choices are confirmed too (GGML_TUNER_MMQ_CHOICES).",
)
@click.option(
    "--like",
    "likes",
    multiple=True,
    help="Model shapes, repeatable (default: llama-3.2-1b, llama-3.1-8b, qwen2.5-3b, qwen2.5-7b, gemma-3-4b-shape: "
    "head sizes 64, 128 with GQA 4, 8 and 7, and 256 with GQA 2).",
)
@click.option(
    "--quant",
    default=DEFAULT_QUANT,
    show_default=True,
    help="Type of the random-weight models (the default is `tuner search`'s): Q4_K_M is written directly as random blocks of llama-quantize's "
    "per-tensor types (no llama-quantize); other types are quantized from f16 with llama-quantize (f16: as "
    "synthesized, not quantized).",
)
@click.option(
    "--depths",
    default="0,4096,16384,32768,65536",
    show_default=True,
    callback=depths_option,
    help="KV depths (llama-bench -d): 0 as every short prompt, 4096 below upstream's VEC-to-MMA switch at 8192, "
    "16384 and 32768 where the Hopper decode rules act, 65536 long context; 131072 costs minutes a call on "
    "an 8-12B model. Depths past a model's context length are left out for it.",
)
@click.option(
    "--mmq-like",
    default="llama-3.1-8b",
    show_default=True,
    help="Model shape of the MMQ passes: for each MMQ choice no --like model's weights or pp512 exercise, this "
    "shape quantized to the choice's type (q5_K: Q5_K_M, iq4_xs: IQ4_XS, ...) with llama-quantize, its prompt "
    "one micro-batch at the choice's lowest batch size, at depth 0. 'none': no passes.",
)
@rounds_option()
@number_option("--min-rounds", click.IntRange(2, 100), "Paired rounds every depth gets.", default=3)
@number_option(
    "--max-rounds",
    click.IntRange(2, 100),
    "Further rounds, up to this many, go only to the depths still open: a decode rule changes the kernel "
    "there and its verdict is neither claimed nor settled (the search confirm's rule); an MMQ pass's one depth "
    "takes them all. Default: --min-rounds (fixed). A rerun with a higher value adds rounds to what is still open.",
)
@number_option("--reps", click.IntRange(1, 1000), "llama-bench repetitions per call.", default=3)
@measure_options(
    build_help="Build (or bin) directory of a tuner build with the FA rules hook (and the MMQ hook for --mmq). "
    "Default: the sweeps' default build of the sweep's arch.",
    backend_help="Backend test-backend-ops checks the kept table on.",
    storage="confirm.sqlite3",
)
@run_options(
    "model is made, no round (a model's first priced as --dry-run prices it, later ones by its longest so far), "
    "no output-equivalence check and no test-backend-ops run (priced at recorded runs)",
    "Print the plan (models, calls, estimated GPU time) and stop.",
    "Where e2e.md, PR.md, upstream.patch, the logs and the storage go (default: SWEEP_DIR/confirm).",
)
def confirm_cmd(rounds: int | None, min_rounds: int, max_rounds: int | None, dry_run: bool, **opts: Any) -> None:
    """Confirm the sweep's table end to end with llama-bench on model shapes, and write PR.md (resumable).

    Per model: a random-weight model of the shape, quantized; paired interleaved rounds of upstream, its A/A
    twin and the table (the model shape's entries through GGML_TUNER_FA_RULES, MMQ choices through
    GGML_TUNER_MMQ_CHOICES), pp512 and tg128 at each depth; the output-equivalence gate. An entry is kept
    only where its model points are faster beyond noise and none slower; the rest are reported. Writes
    e2e.md, PR.md and upstream.patch (kept entries only) to -o. See docs/sweep.md.

    Example: tuner sweep confirm sweep-sm90 --mmq sweep-mmq-sm90 --rounds 3
    """
    from tuner.sweep.confirm_stage import ConfirmRequest, outcome_text, plan_confirm, run_confirm

    rounds, max_rounds = round_limits(click.get_current_context(), rounds, min_rounds, max_rounds)
    plan = plan_confirm(ConfirmRequest(rounds=rounds, max_rounds=max_rounds, **opts))
    click.echo(plan.text, nl=False)
    if dry_run:
        return
    with budget_stop(plan.request.storage_path, "PR.md, e2e.md and upstream.patch are"):
        outcome = run_confirm(plan)
    click.echo(outcome_text(outcome))


@sweep.command("export")
@click.argument("confirm_dir", type=EXISTING_DIR)
@_output_of(
    "--sweep",
    "sweep_dir",
    "Output directory of `tuner sweep run` the confirmation was run on (default: CONFIRM_DIR's parent).",
)
@_output_of("--mmq", "mmq_dir", "Output directory of `tuner sweep mmq`, where the confirmation was run with --mmq.")
@click.option(
    "--source", "spec", default=None, help="llama.cpp source SPEC the patch is rendered on (default: pinned)."
)
@click.option("--measured-on", default=None, help="The device the sweeps ran on, e.g. 'NVIDIA H100 80GB HBM3'.")
@_result_folder("Result folder, e.g. results/sm_90/fattn-mmq-table (new, empty or an earlier export; replaced whole).")
def export_cmd(
    confirm_dir: Path,
    sweep_dir: Path | None,
    mmq_dir: Path | None,
    spec: str | None,
    measured_on: str | None,
    out_dir: Path,
) -> None:
    """Export a confirmed sweep table as a result folder that `tuner validate` checks.

    Writes upstream.patch (the kept entries), PR.md, e2e.md, report.md, plots/, table.toml (the manifest)
    and evidence/ (the three stores, xz-compressed) to -o, and nothing outside it. See docs/sweep.md.

    Example: tuner sweep export sweep-sm90/confirm --mmq sweep-mmq-sm90 -o results/sm_90/fattn-mmq-table
    """
    from tuner.sweep.export import export_table

    m = export_table(confirm_dir, out_dir, sweep_dir=sweep_dir, mmq_dir=mmq_dir, spec=spec, measured_on=measured_on)
    _echo_kept(m, out_dir)


def _echo_kept(m: Mapping[str, Any], out_dir: Path, head: str = "") -> None:
    """What an export or a merge kept (its manifest ``m``), then the folder it wrote."""
    t = m["table"]
    click.echo(
        f"{head}{len(t['fa_rules'])} FlashAttention entr(ies) and {len(t['mmq_choices'])} MMQ choice(s) kept, "
        f"{len(t['reported'])} reported" + ("" if m["hashes"]["patch_sha256"] else "; no upstream.patch (nothing kept)")
    )
    click.echo(str(out_dir))


@sweep.command("merge")
@click.argument("tables", nargs=-1, required=True, type=EXISTING_DIR)
@click.option(
    "--source", "spec", default=None, help="llama.cpp source SPEC the patch is rendered on (default: the tables')."
)
@click.option(
    "--gpu",
    "gpu_dirs",
    multiple=True,
    type=EXISTING_DIR,
    help="The -o folder of a `tuner sweep confirm` of one of the tables run on another GPU model of the arch "
    "(repeatable): kept as gpus/<model>/<name>/, and every entry decided over all models.",
)
@_result_folder("Result folder, e.g. results/sm_90/hopper-table (new, empty or an earlier merge; replaced whole).")
def merge_cmd(tables: tuple[Path, ...], spec: str | None, gpu_dirs: tuple[Path, ...], out_dir: Path) -> None:
    """Merge exported sweep tables into one result folder with one upstream.patch.

    TABLES are folders written by `tuner sweep export`, measured on the same source, arch and device over
    disjoint cells (e.g. a decode sweep and a sweep of query batches 2-8). Writes parts/<name>/ (each table
    whole), upstream.patch (every table's kept entries together), PR.md, report.md and table.toml to -o.
    With --gpu, the tables' confirmations on other GPU models of the arch join in: an entry is patched where
    some model is faster end to end and none slower, dropped where they disagree. See docs/sweep.md.

    Example: tuner sweep merge results/sm_90/fattn-mmq-table results/sm_90/fattn-ne1-table -o results/sm_90/hopper-table
    """
    from tuner.sweep.merge import merge_tables

    m = merge_tables(tables, out_dir, spec=spec, gpu_dirs=gpu_dirs)
    _echo_kept(m, out_dir, head=f"{len(m['parts'])} tables merged: ")
