"""``tuner sweep confirm``, ``tuner sweep export`` and ``tuner sweep merge``: the sweep's table confirmed end
to end on model shapes, exported as a result folder, and exported tables joined into one (docs/sweep.md).
Registered on the ``sweep`` group by sweep_cmd, with the options the sweep commands share."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import click

from tuner.cli._params import (
    DIR,
    EXISTING_DIR,
    FILE,
    PATH,
    F,
    build_option,
    depths_option,
    number_option,
    output_option,
    round_limits,
    rounds_option,
    stacked,
)
from tuner.targets.defaults import DEFAULT_QUANT


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


@click.command("confirm")
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


@click.command("export")
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


@click.command("merge")
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
