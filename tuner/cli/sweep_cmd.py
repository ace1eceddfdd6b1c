"""``tuner sweep``: the shape-wide sweep of FlashAttention kernel and MMQ-vs-cuBLAS choices (docs/sweep.md)."""

from __future__ import annotations

__all__ = ["sweep"]

import click

from tuner.cli._params import depths_option


@click.group()
def sweep() -> None:
    """Sweep llama.cpp's FlashAttention kernel choice and MMQ-vs-cuBLAS choice over a grid of shapes.

    Each cell times single ops at an exact shape, every legal kernel forced, in paired rounds with an
    A/A pair; the verdicts compose into one table per arch, emitted as a change to upstream's selection
    functions. See docs/sweep.md.
    """


@sweep.command("plan")
@click.option("--arch", default="sm_90", show_default=True, help="Target arch (see `tuner archs`).")
@click.option(
    "--head-size",
    "head_sizes",
    type=click.IntRange(1, 4096),
    multiple=True,
    help="Head sizes (default: all of the grid).",
)
@click.option("--gqa", "gqa_ratios", type=click.IntRange(1, 256), multiple=True, help="GQA ratios (default: all).")
@click.option("--kv", "kv_types", type=click.Choice(["f16", "q8_0"]), multiple=True, help="K/V types (default: all).")
@click.option(
    "--ne1",
    "query_batches",
    type=click.IntRange(1, 4096),
    multiple=True,
    help="Query columns Q->ne[1] (default: 1, 2, 4, 8).",
)
@click.option(
    "--n-kv",
    "n_kv",
    callback=depths_option,
    help="Comma-separated n_kv points, multiples of 256 (default: half-octaves 256..131072).",
)
@click.option("--rounds", type=click.IntRange(min=2), default=5, show_default=True, help="Paired rounds per cell.")
@click.option(
    "--per-call-s",
    type=click.FloatRange(min=0, min_open=True),
    default=0.05,
    show_default=True,
    help="Assumed seconds per timer call (one config of one cell in one round), for the time estimate.",
)
def plan_cmd(
    arch: str,
    head_sizes: tuple[int, ...],
    gqa_ratios: tuple[int, ...],
    kv_types: tuple[str, ...],
    query_batches: tuple[int, ...],
    n_kv: tuple[int, ...] | None,
    rounds: int,
    per_call_s: float,
) -> None:
    """Print the sweep's grid, its timer calls and the estimated GPU time (nothing runs)."""
    from tuner.sweep import grid, mmq
    from tuner.targets.archs import load_arch

    a = load_arch(arch)
    cells = grid.plan(
        a,
        head_sizes=head_sizes or grid.HEAD_SIZES,
        gqa_ratios=gqa_ratios or grid.GQA_RATIOS,
        kv_types=kv_types or grid.KV_TYPES,
        query_batches=query_batches or grid.QUERY_BATCHES,
        n_kv=n_kv or grid.N_KV,
    )
    click.echo(grid.dry_run_text(cells, rounds=rounds, per_call_s=per_call_s), nl=False)
    click.echo(mmq.mmq_dry_run_text(mmq.plan_mmq(a), rounds=rounds, per_call_s=per_call_s), nl=False)
