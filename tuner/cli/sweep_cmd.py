"""``tuner sweep``: the shape-wide sweep of FlashAttention kernel and MMQ-vs-cuBLAS choices (docs/sweep.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tuner.cli._params import (
    SuggestingGroup,
    depths_option,
    number_option,
    round_limits,
    rounds_option,
    stacked,
    stamped_run_dir,
)
from tuner.cli.sweep_confirm_cmd import budget_stop, confirm_cmd, export_cmd, measure_options, merge_cmd, run_options

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


sweep.add_command(confirm_cmd)
sweep.add_command(export_cmd)
sweep.add_command(merge_cmd)
