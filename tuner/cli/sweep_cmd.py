"""``tuner sweep``: the shape-wide sweep of FlashAttention kernel and MMQ-vs-cuBLAS choices (docs/sweep.md)."""

from __future__ import annotations

__all__ = ["sweep"]

from pathlib import Path
from typing import Any

import click

from tuner.cli._params import (
    SuggestingGroup,
    depths_option,
    find_bin_dir,
    output_option,
    round_limits,
    rounds_option,
    stamped_run_dir,
)
from tuner.cli.sweep_common import budget_stop, default_build, measure_options, time_budget_option
from tuner.cli.sweep_confirm_cmd import confirm_cmd, export_cmd, merge_cmd
from tuner.errors import UsageError


@click.group(cls=SuggestingGroup)
def sweep() -> None:
    """Sweep llama.cpp's FlashAttention kernel choice and MMQ-vs-cuBLAS choice over a grid of shapes.

    Each cell times single ops at an exact shape, every legal kernel forced, in paired rounds with an
    A/A pair; the verdicts compose into one table per arch, emitted as a change to upstream's selection
    functions. See docs/sweep.md.
    """


def _cells(
    a: Any,
    head_sizes: tuple[int, ...],
    gqa_ratios: tuple[int, ...],
    kv_types: tuple[str, ...],
    query_batches: tuple[int, ...],
    n_kv: tuple[int, ...] | None,
) -> list[Any]:
    from tuner.sweep import grid

    return grid.plan(
        a,
        head_sizes=head_sizes or grid.HEAD_SIZES,
        gqa_ratios=gqa_ratios or grid.GQA_RATIOS,
        kv_types=kv_types or grid.KV_TYPES,
        query_batches=query_batches or grid.DEFAULT_QUERY_BATCHES,
        n_kv=n_kv or grid.DEFAULT_N_KV,
    )


def _grid_options(f: Any) -> Any:
    for opt in reversed(
        (
            click.option("--arch", default="sm_90", show_default=True, help="Target arch (see `tuner archs`)."),
            click.option(
                "--head-size",
                "head_sizes",
                type=click.IntRange(1, 4096),
                multiple=True,
                help="Head sizes (default: all of the grid).",
            ),
            click.option(
                "--gqa", "gqa_ratios", type=click.IntRange(1, 256), multiple=True, help="GQA ratios (default: all)."
            ),
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
                "n_kv",
                callback=depths_option,
                help="Comma-separated n_kv points, multiples of 256 (default: octaves 256..131072; half-octaves "
                "add 768,1536,...,98304 for boundaries within a factor of 1.5).",
            ),
        )
    ):
        f = opt(f)
    return f


def _round_options(f: Any) -> Any:
    """--rounds (fixed), --min-rounds and --max-rounds (sequential: the search's screen's stop rule)."""
    for opt in reversed(
        (
            rounds_option("every cell (MMQ: point)"),
            click.option(
                "--min-rounds",
                type=click.IntRange(2, 100),
                default=3,  # tuner.measure.decide.DEFAULT_LIMITS (the search's; not imported: scipy)
                show_default=True,
                help="Paired rounds every cell (MMQ: point) gets.",
            ),
            click.option(
                "--max-rounds",
                type=click.IntRange(2, 100),
                default=6,
                show_default=True,
                help="Further rounds, up to this many, go only to the cells (MMQ: points) whose verdict is still "
                "open; a rerun with a higher value adds rounds to the ones still open.",
            ),
        )
    ):
        f = opt(f)
    return f


def _limits(rounds: int | None, min_rounds: int, max_rounds: int) -> tuple[int, int]:
    low, high = round_limits(click.get_current_context(), rounds, min_rounds, max_rounds)
    return low, high if high is not None else max_rounds


@sweep.command("plan")
@_grid_options
@_round_options
@click.option(
    "--per-call-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Also print the time at this many seconds per timer call (one config of one cell in one round): "
    "a what-if; the `sweep run` line's estimate is the one from recorded costs.",
)
@click.option(
    "--target-ms",
    type=click.IntRange(0, 60_000),
    default=20,
    show_default=True,
    help="fa-bench's --target-ms that the `sweep run` estimate assumes (its value on a GPU backend).",
)
def plan_cmd(
    arch: str,
    head_sizes: tuple[int, ...],
    gqa_ratios: tuple[int, ...],
    kv_types: tuple[str, ...],
    query_batches: tuple[int, ...],
    n_kv: tuple[int, ...] | None,
    rounds: int | None,
    min_rounds: int,
    max_rounds: int,
    per_call_s: float | None,
    target_ms: int,
) -> None:
    """Print the sweep's grid, its timer calls and the estimated GPU time (nothing runs).

    Both sweeps' rounds are sequential (--min-rounds for every cell or point, up to --max-rounds for the
    ones still open) unless --rounds fixes them."""
    from tuner.sweep import grid, live
    from tuner.targets.archs import load_arch

    a = load_arch(arch)
    limits = _limits(rounds, min_rounds, max_rounds)
    cells = _cells(a, head_sizes, gqa_ratios, kv_types, query_batches, n_kv)
    click.echo(grid.dry_run_text(cells, rounds=limits[0], per_call_s=per_call_s, max_rounds=limits[1]), nl=False)
    click.echo(live.estimate_text(cells, limits=limits, chunk_size=72, target_ms=target_ms), nl=False)
    click.echo(_mmq_plan_text(a, limits=limits, per_call_s=per_call_s), nl=False)


def _mmq_plan_text(
    a: Any,
    *,
    limits: tuple[int, int],
    types: tuple[str, ...] = (),
    batches: tuple[int, ...] = (),
    sizes: tuple[str, ...] = (),
    like: tuple[str, ...] = (),
    per_call_s: float | None = None,
) -> str:
    """`tuner sweep mmq`'s plan: its points at the sizes of ``--size`` or the ``--like`` models."""
    from tuner.rounds.engine import pack_groups
    from tuner.sweep import mmq

    cells = mmq.plan_mmq(a, types or mmq.MMQ_TYPES, batches or mmq.MMQ_BATCHES)
    mk = [mmq.parse_size(t) for t in sizes] if sizes else mmq.like_sizes(like or mmq.DEFAULT_LIKE)
    points, _ = mmq.plan_points(cells, mk)
    chunks = len(pack_groups(points, mmq.MMQ.group, mmq.MAX_CASES))
    return mmq.mmq_dry_run_text(cells, limits=limits, sizes=sorted(set(mk)), chunks=chunks, per_call_s=per_call_s)


def _pick_timer(timer: str | None, bin_dir: Path, target_ms: int = 0) -> tuple[Any, str]:
    """(the run_round to use, its name): fa-bench compiled against ``bin_dir`` (with ``-m target_ms`` where
    it is not 0) unless test-backend-ops is asked for; the default falls back to test-backend-ops, with a
    warning, where fa-bench does not compile."""
    import functools

    from tuner import log
    from tuner.errors import TunerError
    from tuner.measure import fa_bench
    from tuner.measure import kernel_bench as kb

    if timer == "test-backend-ops":
        return kb.run_round, timer
    try:
        fa_bench.build_fa_bench(bin_dir)
    except TunerError as err:  # UsageError included: no shared libraries, headers or compiler
        if timer == "fa-bench":
            raise
        log.warning(f"fa-bench is not usable with this build: {err} Timing with test-backend-ops instead.")
        return kb.run_round, "test-backend-ops"
    if target_ms:
        return functools.partial(fa_bench.run_round_fast, target_ms=target_ms), "fa-bench"
    return fa_bench.run_round_fast, "fa-bench"


@sweep.command("run")
@_grid_options
@_round_options
@measure_options(
    build_help="Build (or bin) directory with test-backend-ops, a tuner-patched build (`tuner build` prints it). "
    "Default: build the arch's default variant.",
    backend_help="test-backend-ops backend (CPU times upstream's kernel only: it has no tuner hook to force one).",
    storage="sweep.sqlite3",
)
@click.option(
    "--chunk-cells",
    type=click.IntRange(1, 100000),
    default=72,
    show_default=True,
    help="Cells per test-backend-ops process (whole shapes at a time).",
)
@click.option(
    "--timer",
    type=click.Choice(["fa-bench", "test-backend-ops"]),
    default=None,
    help="What times the op: fa-bench (a small ggml program tuner compiles against the build; cold K/V, "
    "at least 50 ops a case, see --target-ms) or test-backend-ops perf (at least 1 s a case, one K/V buffer). "
    "Default: fa-bench, or test-backend-ops where fa-bench does not compile.",
)
@click.option(
    "--target-ms",
    type=click.IntRange(0, 60_000),
    default=None,
    help="fa-bench: time at least this many ms of ops per case; a case of short ops times more than 50 "
    "(fa-bench calibrates per case). 0: 50 ops a case. Default: 20 on a GPU backend, 0 on CPU.",
)
@time_budget_option("round of a chunk (its configs' timer processes, priced at the H100 sweep's rates)")
@output_option(
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the logs, report.md and upstream.patch go (default $TUNER_HOME/runs/sweep-<time>).",
    in_place=True,
)
def run_cmd(
    arch: str,
    head_sizes: tuple[int, ...],
    gqa_ratios: tuple[int, ...],
    kv_types: tuple[str, ...],
    query_batches: tuple[int, ...],
    n_kv: tuple[int, ...] | None,
    rounds: int | None,
    min_rounds: int,
    max_rounds: int,
    build_dir: Path | None,
    backend: str,
    spec: str | None,
    storage: Path | None,
    chunk_cells: int,
    timer: str | None,
    target_ms: int | None,
    time_budget: float | None,
    out_dir: Path | None,
) -> None:
    """Measure the sweep with fa-bench (or test-backend-ops) and compose the table (resumable).

    Per chunk of cells and round, one process per config: upstream's choice, its A/A twin and each
    forced kernel over the cells where it is a candidate. Samples go to --storage as they come; a rerun
    skips what is recorded. A sample whose kernel is not the one asked for (FA log) or that failed leaves
    its cell without a verdict. Writes report.md and, where a rule was found, upstream.patch to -o.

    Example: tuner sweep run --head-size 128 --gqa 4 -o sweep-h100
    """
    from tuner.measure.fa_bench import TARGET_MS
    from tuner.rounds.budget import SweepBudget
    from tuner.rounds.engine import rounds_text
    from tuner.rounds.store import SampleStore, device_identity
    from tuner.sweep import live
    from tuner.sweep.table import render_table_patch
    from tuner.targets.archs import load_arch

    budget = SweepBudget.from_now(time_budget) if time_budget else None  # the clock starts with the command
    a = load_arch(arch)
    limits = _limits(rounds, min_rounds, max_rounds)
    cells = _cells(a, head_sizes, gqa_ratios, kv_types, query_batches, n_kv)
    out = out_dir or stamped_run_dir("sweep")
    bin_dir = find_bin_dir(build_dir, "test-backend-ops") if build_dir is not None else default_build(arch, spec)
    # the target only where the ops are a GPU's: the CPU backend (the tests' build) times 50 ops a case
    if target_ms is None:
        target_ms = 0 if backend.upper().startswith("CPU") else TARGET_MS
    run_round, timer = _pick_timer(timer, Path(bin_dir), target_ms)
    identity: dict[str, Any] = {
        "arch": a.name,
        "backend": backend,
        "build": str(Path(bin_dir).resolve()),
        "n_head_kv": live.N_HEAD_KV,
        "timer": timer,
        **device_identity(bin_dir, backend),
    }
    fa = timer == "fa-bench"
    if fa:
        identity["target_ms"] = target_ms
    store = SampleStore(live.TABLE, storage or out / "sweep.sqlite3", {k: str(v) for k, v in identity.items()})
    try:
        with budget_stop(store.path, "report.md and upstream.patch are"):
            live.run_sweep(
                cells,
                limits=limits,
                store=store,
                bin_dir=bin_dir,
                backend=backend,
                log_dir=out / "logs",
                chunk_size=chunk_cells,
                run_round=run_round,
                case_s=live.fa_bench_case_s(target_ms) if fa else live.CASE_S,
                process_s=live.FA_BENCH_PROCESS_S if fa else live.PROCESS_S,
                expect_log=not backend.upper().startswith("CPU"),
                budget=budget,
            )
        outcome = live.compose(cells, store.samples(), limits=limits)
    finally:
        store.close()
    patch = None
    if outcome.rules:
        from tuner import source

        src = source.fetch_source(spec) if spec else source.fetch_source()
        note = (
            f"Kernel choices measured on {a.name}: FLASH_ATTN_EXT per forced kernel, "
            f"{rounds_text(limits)} (paired)."
        )
        patch = render_table_patch(src.root, outcome.rules, a, note=note)
    out.mkdir(parents=True, exist_ok=True)
    (out / "upstream.patch").unlink(missing_ok=True)
    if patch:
        (out / "upstream.patch").write_text(patch)
    (out / "report.md").write_text(
        live.report_text(
            outcome, cells, limits=limits, identity={k: str(v) for k, v in identity.items()}, patch=bool(patch)
        )
    )
    n_gap = sum(len(v) for v in outcome.no_verdict.values())
    click.echo(f"rules ({len(outcome.rules)}):")
    for r in outcome.rules:
        click.echo(f"  {r.text}")
    if not outcome.rules:
        click.echo(f"  none: {live.no_rules_text(outcome)}")
    click.echo(f"cells with a verdict: {len(cells) - n_gap} of {len(cells)}")
    if n_gap:
        click.echo(f"cells without a verdict: {n_gap} (a failed or mismatched sample; report.md lists each and why)")
    click.echo(f"report: {out / 'report.md'}" + (f"\npatch: {out / 'upstream.patch'}" if patch else ""))


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
    "like",
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
@click.option(
    "--iters",
    type=click.IntRange(1, 1_000_000),
    default=50,
    show_default=True,
    help="Ops timed per case (at least one per copy of the weights).",
)
@click.option(
    "--cache-mb",
    type=click.IntRange(0, 1 << 20),
    default=128,
    show_default=True,
    help="The weights' copies together exceed this many MiB, so every op reads cold weights.",
)
@click.option(
    "--target-ms",
    type=click.IntRange(0, 60_000),
    default=None,
    help="Time at least this many ms of ops a case (mm-bench's -m; default 20 on a GPU backend, 0 on the CPU: "
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
@time_budget_option("round (its configs' mm-bench processes, priced at the H100 sweep's rates)")
@output_option(
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the logs, report.md and upstream.patch go (default $TUNER_HOME/runs/sweep-mmq-<time>).",
    in_place=True,
)
def mmq_cmd(
    arch: str,
    types: tuple[str, ...],
    batches: tuple[int, ...],
    like: tuple[str, ...],
    sizes: tuple[str, ...],
    rounds: int | None,
    min_rounds: int,
    max_rounds: int,
    build_dir: Path | None,
    backend: str,
    spec: str | None,
    storage: Path | None,
    iters: int,
    cache_mb: int,
    target_ms: int | None,
    cuda_graphs: bool,
    time_budget: float | None,
    out_dir: Path | None,
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
    from tuner.rounds.budget import SweepBudget
    from tuner.rounds.store import SampleStore, device_identity
    from tuner.sweep import mmq
    from tuner.targets.archs import load_arch

    budget = SweepBudget.from_now(time_budget) if time_budget else None  # the clock starts with the command
    a = load_arch(arch)
    limits = _limits(rounds, min_rounds, max_rounds)
    cells = mmq.plan_mmq(a, types or mmq.MMQ_TYPES, batches or mmq.MMQ_BATCHES)
    mk = [mmq.parse_size(t) for t in sizes] if sizes else mmq.like_sizes(like or mmq.DEFAULT_LIKE)
    points, skipped = mmq.plan_points(cells, mk)
    if not points:
        raise UsageError(
            f"No point to time: every size's k ({sorted({k for _, k in mk})}) is a multiple of none of the types' "
            "blocks (32 or 256 values). Pass other --size or --type values."
        )
    out = out_dir or stamped_run_dir("sweep-mmq")
    bin_dir = find_bin_dir(build_dir, "libggml.so") if build_dir is not None else default_build(arch, spec)
    cuda = backend.upper().startswith("CUDA")
    if target_ms is None:  # as `sweep run`: the target where the ops are a GPU's
        from tuner.measure.fa_bench import TARGET_MS

        target_ms = 0 if backend.upper().startswith("CPU") else TARGET_MS
    identity = {
        "arch": a.name, "backend": backend, "build": str(Path(bin_dir).resolve()), "timer": "mm-bench",
        "iters": iters, "target_ms": target_ms, "cache_mb": cache_mb, "cuda_graphs": "on" if cuda_graphs else "off",
        **device_identity(bin_dir, backend),
    }  # fmt: skip
    store = SampleStore(mmq.MMQ_TABLE, storage or out / "mmq.sqlite3", {k: str(v) for k, v in identity.items()})
    try:
        with budget_stop(store.path, "report.md and upstream.patch are"):
            forced_reason = _mmq_hook_reason(bin_dir, backend, out / "logs" / "hook-probe") if cuda else ""
            mmq.run_mmq(
                points, limits=limits, store=store, bin_dir=bin_dir, backend=backend, log_dir=out / "logs",
                iters=iters, cache_mb=cache_mb, forced_reason=forced_reason, cuda_graphs=cuda_graphs,
                target_ms=target_ms, budget=budget,
            )  # fmt: skip
        withhold = "" if cuda else f"the {backend} backend has no MMQ-vs-cuBLAS choice (both configs ran the same code)"
        outcome = mmq.compose_mmq(points, store.samples(), limits=limits, withhold=withhold)
    finally:
        store.close()
    _mmq_emit(outcome, points, skipped, a, limits=limits, identity=identity, spec=spec, out=out)


def _mmq_hook_reason(bin_dir: Path, backend: str, log_dir: Path) -> str:
    """Empty where the build reads GGML_TUNER_MMQ_CHOICES; else why the forced config cannot run."""
    from tuner import log
    from tuner.measure import mm_bench

    if mm_bench.mmq_hook_present(bin_dir, log_dir=log_dir, backend=backend):
        return ""
    log.warning(
        f"The build in {bin_dir} ignores GGML_TUNER_MMQ_CHOICES on {backend} (no MMQ hook in its mmq.cu; "
        f"probe log in {log_dir}): cuBLAS cannot be forced, so only upstream's config and its A/A twin run and no "
        "point gets a verdict. Build a variant with the hook and pass it to --build."
    )
    return "not run: the build has no MMQ hook (GGML_TUNER_MMQ_CHOICES is ignored), so cuBLAS cannot be forced"


def _mmq_emit(
    outcome: Any,
    points: Any,
    skipped: Any,
    a: Any,
    *,
    limits: tuple[int, int],
    identity: dict[str, Any],
    spec: str | None,
    out: Path,
) -> None:
    """upstream.patch (where a cuBLAS choice was composed) and report.md in ``out``; the summary on stdout."""
    from tuner import source
    from tuner.rounds.engine import rounds_text
    from tuner.sweep import mmq

    patch = None
    if outcome.choices:
        src = source.fetch_source(spec) if spec else source.fetch_source()
        note = (
            f"cuBLAS is faster than MMQ for these types and batch sizes on {a.name}: mm-bench, "
            f"{rounds_text(limits, 'point')} (paired), at every swept weight size."
        )
        patch = mmq.render_mmq_patch(src.root, outcome.choices, a, note=note)
    out.mkdir(parents=True, exist_ok=True)
    (out / "upstream.patch").unlink(missing_ok=True)
    if patch:
        (out / "upstream.patch").write_text(patch)
    identity = {k: str(v) for k, v in identity.items()}
    report = mmq.mmq_report_text(outcome, points, limits=limits, identity=identity, skipped=skipped, patch=bool(patch))
    (out / "report.md").write_text(report)
    n_gap = outcome.n_gaps
    click.echo(f"choices ({len(outcome.choices)}):")
    for c in outcome.choices:
        click.echo(f"  {c.text}")
    if not outcome.choices:
        click.echo(f"  none: {mmq.no_choice_text(outcome)}")
    click.echo(f"points with a verdict: {len(points) - n_gap} of {len(points)}")
    if n_gap:
        click.echo(f"points without a verdict: {n_gap} (a failed or missing sample; report.md lists each and why)")
    if skipped:
        click.echo(f"type/size pairs not swept (k not a multiple of the type's block): {len(skipped)}")
    click.echo(f"report: {out / 'report.md'}" + (f"\npatch: {out / 'upstream.patch'}" if patch else ""))


sweep.add_command(confirm_cmd)
sweep.add_command(export_cmd)
sweep.add_command(merge_cmd)
