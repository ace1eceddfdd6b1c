"""``tuner sweep``: the shape-wide sweep of FlashAttention kernel and MMQ-vs-cuBLAS choices (docs/sweep.md)."""

from __future__ import annotations

__all__ = ["sweep"]

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import click

from tuner.cli._params import depths_option, find_bin_dir, output_option, stamped_run_dir
from tuner.errors import UsageError


@click.group()
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
                help="Query columns Q->ne[1] (default: 1, the decode calls the end-to-end confirm checks; "
                "2, 4, 8 (parallel and speculative decoding) are measured when asked and reported, not patched).",
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
            click.option(
                "--rounds",
                type=click.IntRange(2, 100),
                default=None,
                help="A fixed number of paired rounds for every cell (MMQ: point); sets --min-rounds and --max-rounds.",
            ),
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
    if rounds is not None:
        return rounds, rounds
    if max_rounds < min_rounds:
        raise UsageError(f"--max-rounds {max_rounds} is below --min-rounds {min_rounds}.")
    return min_rounds, max_rounds


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
    from tuner.sweep import mmq, mmq_live

    cells = mmq.plan_mmq(a, types or mmq.MMQ_TYPES, batches or mmq.MMQ_BATCHES)
    mk = [mmq_live.parse_size(t) for t in sizes] if sizes else mmq_live.like_sizes(like or mmq_live.DEFAULT_LIKE)
    points, _ = mmq_live.plan_points(cells, mk)
    chunks = len(mmq_live.chunk_points(points))
    return mmq.mmq_dry_run_text(cells, limits=limits, sizes=sorted(set(mk)), chunks=chunks, per_call_s=per_call_s)


def _default_build(arch: str, spec: str | None, extra: tuple[str, ...] = ()) -> Path:
    """The bin dir of the arch's default ``cuda`` variant of ``spec`` (default: the pinned tree) with the
    opt-in MMQ hook (``templates/patches/mma/mmq-hook.toml``), so one build serves both sweeps; built (or
    taken from the build cache) as ``tuner build`` would; ``extra`` tools (``llama-perplexity``) added on
    demand without changing its build id."""
    from tuner import log, source
    from tuner.builder.cmake import build_variant
    from tuner.plan.render import render_variant
    from tuner.targets.archs import detect_local_archs

    src = source.fetch_source(spec) if spec else source.fetch_source()
    rv = render_variant(src, arch, "cuda", local_archs=detect_local_archs(), hooks=("mmq",))
    with log.step(f"Building {rv.short} from {src.spec}"):
        b = build_variant(rv)
    if extra:
        from tuner.builder.extra import ensure_targets

        b = ensure_targets(b, list(extra))
    return Path(b.bin_dir)


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


def _measure_options(*, build_help: str, backend_help: str, storage: str) -> Callable[[Any], Any]:
    """--build, --backend, --source and --storage, as `sweep run` and `sweep mmq` both take them."""

    def wrap(f: Any) -> Any:
        for opt in reversed(
            (
                click.option(
                    "--build",
                    "build_dir",
                    type=click.Path(exists=True, file_okay=False, path_type=Path),
                    default=None,
                    help=build_help,
                ),
                click.option("--backend", default="CUDA0", show_default=True, help=backend_help),
                click.option(
                    "--source",
                    "spec",
                    default=None,
                    help="llama.cpp source SPEC to build and patch (default: the pinned tree).",
                ),
                click.option(
                    "--storage",
                    type=click.Path(dir_okay=False, path_type=Path),
                    default=None,
                    help=f"SQLite file of the samples; a rerun with the same file resumes (default: OUTPUT/{storage}).",
                ),
            )
        ):
            f = opt(f)
        return f

    return wrap


@sweep.command("run")
@_grid_options
@_round_options
@_measure_options(
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
@output_option(
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the logs, report.md and upstream.patch go (default $TUNER_HOME/runs/sweep-<time>).",
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
    from tuner.sweep import live
    from tuner.sweep.table import render_table_patch
    from tuner.targets.archs import load_arch

    a = load_arch(arch)
    limits = _limits(rounds, min_rounds, max_rounds)
    cells = _cells(a, head_sizes, gqa_ratios, kv_types, query_batches, n_kv)
    out = out_dir or stamped_run_dir("sweep")
    bin_dir = find_bin_dir(build_dir, "test-backend-ops") if build_dir is not None else _default_build(arch, spec)
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
    }
    fa = timer == "fa-bench"
    if fa:
        identity["target_ms"] = target_ms
    store = live.SampleStore(storage or out / "sweep.sqlite3", {k: str(v) for k, v in identity.items()})
    try:
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
            f"{live.rounds_text(limits)} (paired)."
        )
        patch = render_table_patch(src.root, outcome.rules, a, note=note)
    out.mkdir(parents=True, exist_ok=True)
    (out / "upstream.patch").unlink(missing_ok=True)
    if patch:
        (out / "upstream.patch").write_text(patch)
    (out / "report.md").write_text(
        live.report_text(outcome, cells, limits=limits, identity=identity, patch=bool(patch))
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
@_measure_options(
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
@output_option(
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the logs, report.md and upstream.patch go (default $TUNER_HOME/runs/sweep-mmq-<time>).",
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
    from tuner.sweep import mmq, mmq_live
    from tuner.targets.archs import load_arch

    a = load_arch(arch)
    limits = _limits(rounds, min_rounds, max_rounds)
    cells = mmq.plan_mmq(a, types or mmq.MMQ_TYPES, batches or mmq.MMQ_BATCHES)
    mk = [mmq_live.parse_size(t) for t in sizes] if sizes else mmq_live.like_sizes(like or mmq_live.DEFAULT_LIKE)
    points, skipped = mmq_live.plan_points(cells, mk)
    if not points:
        raise UsageError(
            f"No point to time: every size's k ({sorted({k for _, k in mk})}) is a multiple of none of the types' "
            "blocks (32 or 256 values). Pass other --size or --type values."
        )
    out = out_dir or stamped_run_dir("sweep-mmq")
    bin_dir = find_bin_dir(build_dir, "libggml.so") if build_dir is not None else _default_build(arch, spec)
    cuda = backend.upper().startswith("CUDA")
    if target_ms is None:  # as `sweep run`: the target where the ops are a GPU's
        from tuner.measure.fa_bench import TARGET_MS

        target_ms = 0 if backend.upper().startswith("CPU") else TARGET_MS
    identity = {
        "arch": a.name, "backend": backend, "build": str(Path(bin_dir).resolve()), "timer": "mm-bench",
        "iters": iters, "target_ms": target_ms, "cache_mb": cache_mb, "cuda_graphs": "on" if cuda_graphs else "off",
    }  # fmt: skip
    store = mmq_live.MmqStore(storage or out / "mmq.sqlite3", {k: str(v) for k, v in identity.items()})
    try:
        forced_reason = _mmq_hook_reason(bin_dir, backend, out / "logs" / "hook-probe") if cuda else ""
        mmq_live.run_mmq_live(
            points, limits=limits, store=store, bin_dir=bin_dir, backend=backend, log_dir=out / "logs",
            iters=iters, cache_mb=cache_mb, forced_reason=forced_reason, cuda_graphs=cuda_graphs,
            target_ms=target_ms,
        )  # fmt: skip
        withhold = "" if cuda else f"the {backend} backend has no MMQ-vs-cuBLAS choice (both configs ran the same code)"
        outcome = mmq_live.compose_live(points, store.samples(), limits=limits, withhold=withhold)
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
    from tuner.sweep import mmq, mmq_live

    patch = None
    if outcome.choices:
        src = source.fetch_source(spec) if spec else source.fetch_source()
        note = (
            f"cuBLAS is faster than MMQ for these types and batch sizes on {a.name}: mm-bench, "
            f"{mmq_live.rounds_text(limits)} (paired), at every swept weight size."
        )
        patch = mmq.render_mmq_patch(src.root, outcome.choices, a, note=note)
    out.mkdir(parents=True, exist_ok=True)
    (out / "upstream.patch").unlink(missing_ok=True)
    if patch:
        (out / "upstream.patch").write_text(patch)
    report = mmq_live.report_text(outcome, points, limits=limits, identity=identity, skipped=skipped, patch=bool(patch))
    (out / "report.md").write_text(report)
    n_gap = len(outcome.no_verdict)
    click.echo(f"choices ({len(outcome.choices)}):")
    for c in outcome.choices:
        click.echo(f"  {c.text}")
    if not outcome.choices:
        click.echo(f"  none: {mmq_live.no_choice_text(outcome)}")
    click.echo(f"points with a verdict: {len(points) - n_gap} of {len(points)}")
    if n_gap:
        click.echo(f"points without a verdict: {n_gap} (a failed or missing sample; report.md lists each and why)")
    if skipped:
        click.echo(f"type/size pairs not swept (k not a multiple of the type's block): {len(skipped)}")
    click.echo(f"report: {out / 'report.md'}" + (f"\npatch: {out / 'upstream.patch'}" if patch else ""))


@sweep.command("confirm")
@click.argument("sweep_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--mmq",
    "mmq_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Output directory of `tuner sweep mmq`: its MMQ choices are confirmed too (GGML_TUNER_MMQ_CHOICES).",
)
@click.option(
    "--like",
    "likes",
    multiple=True,
    help="Model shapes, repeatable (default: llama-3.2-1b, llama-3.1-8b, qwen2.5-7b, gemma-3-12b-shape: head "
    "sizes 64, 128, 128 with GQA 7, and 256).",
)
@click.option(
    "--quant",
    default="Q4_K_M",
    show_default=True,
    help="Type of the random-weight models: Q4_K_M is written directly as random blocks of llama-quantize's "
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
@click.option("--rounds", type=click.IntRange(2, 100), default=3, show_default=True, help="Paired rounds per model.")
@click.option(
    "--reps", type=click.IntRange(1, 1000), default=3, show_default=True, help="llama-bench repetitions per call."
)
@_measure_options(
    build_help="Build (or bin) directory of a tuner build with the FA rules hook (and the MMQ hook for --mmq). "
    "Default: the sweeps' default build of the sweep's arch.",
    backend_help="Backend test-backend-ops checks the kept table on.",
    storage="confirm.sqlite3",
)
@click.option("--dry-run", is_flag=True, help="Print the plan (models, calls, estimated GPU time) and stop.")
@output_option(
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where e2e.md, PR.md, upstream.patch, the logs and the storage go (default: SWEEP_DIR/confirm).",
)
def confirm_cmd(
    sweep_dir: Path,
    mmq_dir: Path | None,
    likes: tuple[str, ...],
    quant: str,
    depths: tuple[int, ...],
    rounds: int,
    reps: int,
    build_dir: Path | None,
    backend: str,
    spec: str | None,
    storage: Path | None,
    dry_run: bool,
    out_dir: Path | None,
) -> None:
    """Confirm the sweep's table end to end with llama-bench on model shapes, and write PR.md (resumable).

    Per model: a random-weight model of the shape, quantized; paired interleaved rounds of upstream, its A/A
    twin and the table (the model shape's entries through GGML_TUNER_FA_RULES, MMQ choices through
    GGML_TUNER_MMQ_CHOICES), pp512 and tg128 at each depth; the output-equivalence gate. An entry is kept
    only where its model points are faster beyond noise and none slower; the rest are reported. Writes
    e2e.md, PR.md and upstream.patch (kept entries only) to -o. See docs/sweep.md.

    Example: tuner sweep confirm sweep-sm90 --mmq sweep-mmq-sm90 --rounds 3
    """
    from tuner.sweep import confirm

    table = confirm.load_table(sweep_dir, mmq_dir)
    likes = likes or confirm.DEFAULT_LIKE
    # an unknown name: its UsageError, exit 2; an MMQ choice counts only where the model's weights have its type
    plans = [confirm.plan_model(table, like, weight_types=confirm.planned_weight_types(like, quant)) for like in likes]
    click.echo(confirm.plan_text(table, plans, depths, rounds=rounds, reps=reps, quant=quant), nl=False)
    if dry_run:
        return
    out = out_dir or sweep_dir / "confirm"
    tools = ("llama-perplexity",) + (() if _quant_mode(quant) in ("f16", "direct") else ("llama-quantize",))
    if build_dir is None:
        bin_dir = _default_build(table.arch.name, spec, extra=tools)
    else:
        bin_dir = find_bin_dir(build_dir)
        missing = [t for t in tools if not (bin_dir / t).is_file()]
        if missing:
            raise UsageError(
                f"{bin_dir} has no {' or '.join(missing)}, which the confirmation needs (the output-equivalence "
                "gate runs llama-perplexity; the models are quantized with llama-quantize). Leave --build out to "
                "use the sweeps' default build with them added, or build them into this one."
            )
    _run_confirm(table, likes, out, Path(bin_dir), depths=depths, rounds=rounds, reps=reps, quant=quant,
                 backend=backend, spec=spec, storage=storage)  # fmt: skip


def _quant_mode(quant: str) -> str:
    """How confirm makes its models of ``--quant``: ``f16`` as synthesized, ``direct`` Q4_K_M blocks written
    directly (synth_cached(direct=True)), else ``quantize`` the f16 file with llama-quantize."""
    from tuner.targets.models import DIRECT_QUANTS

    if quant.lower() in ("f16", "none"):
        return "f16"
    return "direct" if quant.upper() in DIRECT_QUANTS else "quantize"


def _confirm_identity(table: Any, bin_dir: Path, *, quant: str, reps: int) -> dict[str, str]:
    """What one confirm storage's rounds belong to: the build, the models' type, -r and the table itself."""
    from tuner.sweep.confirm import PP, TG, table_id

    return {
        "arch": table.arch.name,
        "build": str(bin_dir.resolve()),
        "quant": quant.upper(),
        "models": _quant_mode(quant),
        "reps": str(reps),
        "tests": f"pp{PP},tg{TG}",
        "table": table_id(table),
    }


def _run_confirm(
    table: Any,
    likes: tuple[str, ...],
    out: Path,
    bin_dir: Path,
    *,
    depths: tuple[int, ...],
    rounds: int,
    reps: int,
    quant: str,
    backend: str,
    spec: str | None,
    storage: Path | None,
) -> None:
    from tuner import source
    from tuner.search.live import make_live_measure
    from tuner.sweep import confirm
    from tuner.targets.models import load_gguf_tensors, synth_cached

    src = source.fetch_source(spec) if spec else source.fetch_source()
    identity = _confirm_identity(table, bin_dir, quant=quant, reps=reps)
    store = confirm.ConfirmStore(storage or out / "confirm.sqlite3", identity)
    qbin = bin_dir / "llama-quantize"
    mode = _quant_mode(quant)
    qtype = None if mode == "f16" else quant  # f16: the synthesized model as written

    def measure(path: Path, like: str) -> Any:
        reps_by = {"pp": reps, "tg": reps}
        log_dir = out / "logs" / like
        return make_live_measure(
            bin_dir, path, pp=confirm.PP, tg=confirm.TG, reps=reps_by, log_dir=log_dir, era=src.era, arch=None
        )

    try:
        conf = confirm.confirm_models(
            table,
            likes,
            depths=depths,
            rounds=rounds,
            store=store,
            model_for=lambda like: Path(
                synth_cached(like, source=src, quant=qtype, quantize_bin=qbin, direct=mode == "direct")
            ),
            joint_for=lambda path, like: cast(Any, measure(path, like)).joint,  # search.live's both-phases call
            gate=lambda plan, path: confirm.gate_model(
                plan, path, bin_dir, arch=table.arch, era=src.era, store=store, work_dir=out / "equivalence"
            ),
            weight_types_of=lambda path: [t.ggml_type for t in load_gguf_tensors(path)],
            era=src.era,
        )
        ops = _backend_ops(conf, bin_dir, backend=backend, store=store, log_dir=out / "logs")
    finally:
        store.close()
    _confirm_emit(table, conf, ops, src, out=out, identity=identity, rounds=rounds)


def _backend_ops(conf: Any, bin_dir: Path, *, backend: str, store: Any, log_dir: Path) -> list[dict[str, Any]]:
    """test-backend-ops FLASH_ATTN_EXT and MUL_MAT with the kept entries' env (intervals widened, so every
    test case of a kept shape runs its kernel); stored, so a rerun with the same env does not run them again."""
    import dataclasses

    from tuner.plan.fa_rules import FaRule, Phase, rules_env
    from tuner.sweep import confirm, mmq

    rules = [
        FaRule(phase=Phase.DECODE, lo=0, hi=None, kernel=r.kernel, D=r.D, gqa=r.gqa, kv=r.kv) for r in conf.kept_rules
    ]
    choices = [dataclasses.replace(c, lo=0, hi=None) for c in conf.kept_mmq]
    env = ({"GGML_TUNER_FA_RULES": rules_env(dict.fromkeys(rules))} if rules else {}) | (
        {mmq.ENV: mmq.mmq_env(dict.fromkeys(choices))} if choices else {}
    )
    if not env:
        return []
    done = store.gate("test-backend-ops")
    out = []
    for op in ("FLASH_ATTN_EXT", "MUL_MAT"):
        rec = done.get(op)
        if rec is None or rec.get("env") != env:
            rec = confirm.backend_ops_check(bin_dir, op, env, log_dir / f"test-backend-ops-{op}.log", backend=backend)
            store.add_gate("test-backend-ops", op, rec)
        out.append(rec)
    return out


def _confirm_emit(
    table: Any, conf: Any, ops: Any, src: Any, *, out: Path, identity: dict[str, str], rounds: int
) -> None:
    """e2e.md, PR.md and upstream.patch (the kept entries only, on the pristine tree) in ``out``; the summary."""
    from tuner.sweep.confirm import kept_patch, unexplained_slower
    from tuner.sweep.confirm_report import e2e_text, pr_text

    patch = kept_patch(src.root, conf, table.arch)
    out.mkdir(parents=True, exist_ok=True)
    (out / "upstream.patch").unlink(missing_ok=True)
    if patch:
        (out / "upstream.patch").write_text(patch)
    (out / "e2e.md").write_text(e2e_text(conf, identity=identity, rounds=rounds))
    (out / "PR.md").write_text(pr_text(table, conf, backend_ops=ops, patch=bool(patch)))
    for f in conf.fates:
        click.echo(f"{'kept' if f.kept else 'reported'}: {f.text}: {f.why}")
    if not conf.fates:
        click.echo("the table has no entry to confirm")
    for where in unexplained_slower(conf.points):
        click.echo(f"slower beyond noise: {where}")
    click.echo(f"e2e: {out / 'e2e.md'}\nPR: {out / 'PR.md'}" + (f"\npatch: {out / 'upstream.patch'}" if patch else ""))


@sweep.command("export")
@click.argument("confirm_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--sweep",
    "sweep_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Output directory of `tuner sweep run` the confirmation was run on (default: CONFIRM_DIR's parent).",
)
@click.option(
    "--mmq",
    "mmq_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Output directory of `tuner sweep mmq`, where the confirmation was run with --mmq.",
)
@click.option(
    "--source", "spec", default=None, help="llama.cpp source SPEC the patch is rendered on (default: pinned)."
)
@click.option("--measured-on", default=None, help="The device the sweeps ran on, e.g. 'NVIDIA H100 80GB HBM3'.")
@output_option(
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Result folder, e.g. results/sm_90/fattn-mmq-table (new, empty or an earlier export; replaced whole).",
)
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
    t = m["table"]
    click.echo(
        f"{len(t['fa_rules'])} FlashAttention entr(ies) and {len(t['mmq_choices'])} MMQ choice(s) kept, "
        f"{len(t['reported'])} reported" + ("" if m["hashes"]["patch_sha256"] else "; no upstream.patch (nothing kept)")
    )
    click.echo(str(out_dir))
