"""``tuner export`` and ``tuner validate``, and the stage ``tuner search`` and ``tuner worker`` call
(:func:`search_and_export`, :func:`tune_worker`): resolve the request, run the search and export its result.
That stage lives in the command-line layer because ``search/`` and ``result/`` may not import each other.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tuner import interrupts, log
from tuner.cli._params import DIR, FILE, PATH, output_option
from tuner.errors import UsageError
from tuner.redact import redact
from tuner.rounds.budget import BudgetReached

LAST_ONE_TPE_EXPORT = "0c12e6a"
"""The last commit whose ``tuner export`` reads studies of the one-TPE search."""

if TYPE_CHECKING:
    from tuner.search.request import SearchRequest
    from tuner.search.study import SearchConfig
    from tuner.study.record import SearchOutcome


def export_study(
    study_name: str, *, storage: str, out_dir: Path, like: str | None = None, weight_type: str | None = None
) -> Path:
    """Write the result folder of the search study ``study_name`` (result stage, through
    :func:`tuner.result.export.staged_export`). UsageError: no such study, a study of the one-TPE search that
    came before the pipeline, or an ``out_dir`` an export may not replace; TunerError: nothing confirmed yet."""
    import optuna

    from tuner.result.export import check_out_dir
    from tuner.result.pipeline_export import export_pipeline
    from tuner.study.state import StudyState

    check_out_dir(out_dir)  # before any work: refusing after minutes of rendering would waste them
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError as err:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise UsageError(f"no study {study_name!r} in {redact(storage)}; it has {names}. Pass --study NAME.") from err
    if not StudyState(study).pipeline:
        raise UsageError(
            f"study {study_name!r} was made by the one-TPE search that came before the pipeline; this tuner "
            f"exports pipeline studies only. Export it with tuner at commit {LAST_ONE_TPE_EXPORT}, the last that "
            "reads such studies, or run `tuner search` again for a result this tuner can export and validate."
        )
    return export_pipeline(study_name, storage=storage, out_dir=out_dir, like=like, weight_type=weight_type)


def _announce(cfg: SearchConfig, request: SearchRequest) -> str:
    """Log what the search runs on; returns the storage URL as shown (a password never reaches a log)."""
    from tuner.source.spec import DEFAULT_SPEC

    shown = redact(cfg.storage_url)
    log.info(
        f"tuner search: arch {cfg.arch}, source {request.source_spec or DEFAULT_SPEC} (era {cfg.source.era}), model {cfg.model.name}, "
        f"depths {list(cfg.depths)}, pp{cfg.pp}/tg{cfg.tg}\n"
        f"  study {cfg.study!r} in {shown}; run dir {cfg.run_dir}\n"
        f"  {dashboard_hint(cfg.storage_url)}"
    )
    return shown


def _resolved(request: SearchRequest, *, worker: bool = False) -> SearchConfig:
    from tuner.search.request import resolve_search

    try:
        return resolve_search(request, worker=worker)
    except BudgetReached as stop:  # the build or model it needs would end past --time-budget
        raise BudgetReached(
            f"time budget reached before {stop}; nothing was started. Give a longer --time-budget."
        ) from None


def search_and_export(request: SearchRequest, out: Path | None = None) -> SearchOutcome:
    """Run (or resume) the search ``request`` asks for and export its result into ``out`` (default
    ``<run dir>/export``); returns the outcome. BudgetReached where the time budget stopped it."""
    from tuner.result.pipeline_export import summary_line
    from tuner.search.pipeline import run_pipeline

    cfg = _resolved(request)
    shown = _announce(cfg, request)
    out_dir = out or (cfg.run_dir / "export")

    def export(result: SearchOutcome) -> None:  # inside the run dir's lock: no second search exports here meanwhile
        log.info(f"\nSearch done in {time.monotonic() - t0:.0f} s.")
        export_study(cfg.study, storage=cfg.storage_url, out_dir=out_dir)
        log.info(
            f"\nExported the result to {out_dir}/ (config.toml, CMakeUserPresets.json, run.env, report.md; tuned.patch where the kernels differ from upstream's)."
        )

    t0 = cfg.started if cfg.started is not None else time.monotonic()  # the budget's clock
    try:
        with interrupts.sigterm_interrupts():
            result = run_pipeline(cfg, then=export)
    except BudgetReached as stop:
        raise BudgetReached(
            f"time budget reached during {stop} after {time.monotonic() - t0:.0f} s; everything measured so far is "
            f"in {shown}. Rerun the same command to resume; nothing was exported yet."
        ) from None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: say how to go on before `tuner: aborted`
        log.notice(
            f"interrupted after {time.monotonic() - t0:.0f} s; every finished round and trial is in {shown} "
            "(a trial cut off is run again). Rerun the same command to resume."
        )
        raise
    click.echo(summary_line(result))
    return result


def tune_worker(request: SearchRequest) -> int:
    """``tuner worker``: add tune trials to the study ``request`` names; returns the trials it holds afterwards.
    BudgetReached where the time budget stopped it."""
    from tuner.search.pipeline import run_tune_worker

    cfg = _resolved(request, worker=True)
    shown = _announce(cfg, request)
    try:
        with interrupts.sigterm_interrupts():
            n = run_tune_worker(cfg)
    except BudgetReached as stop:
        raise BudgetReached(f"time budget reached during {stop}; the trials so far are in {shown}.") from None
    log.info(
        f"\nDone: the study holds {n} tune trials. `tuner search` with the same --storage/--study confirms and exports."
    )
    return n


def dashboard_hint(storage_url: str) -> str:
    """How to watch the study live (the command carries no password: PGPASSWORD or ~/.pgpass supplies it)."""
    import importlib.util

    from tuner.result.report import dashboard_command

    if importlib.util.find_spec("optuna_dashboard") is not None:
        return f"open it live with: {dashboard_command(storage_url)}"
    return "to watch it live, install the dashboard extra: pip install -e '.[dashboard]' (then optuna-dashboard <storage URL>)"


@click.command()
@click.option("--study", required=True, help="Study name (as printed by tuner search).")
@click.option("--storage", help="Optuna storage URL (default: SQLite in --run-dir).")
@click.option("--run-dir", type=DIR, help="Run directory of the study (default ./tuner-runs/<study>).")
@output_option(
    "out_dir",
    type=DIR,
    required=True,
    help="Result folder, e.g. results/<arch>/<model>/ (replaced whole; never a llama.cpp checkout).",
)
@click.option("--like", help="Model shape for the roofline when the GGUF is not on this machine.")
@click.option("--weight-type", help="Weight type for --like (f16, q8_0, q4_k_m).")
def export(
    study: str, storage: str | None, run_dir: Path | None, out_dir: Path, like: str | None, weight_type: str | None
) -> None:
    """Export a study's winner: config.toml, tuned.patch, CMakeUserPresets.json, run.env, report.md, plots.

    -o is written whole and atomically: an existing export there is replaced only once the new one is
    complete. Copy CMakeUserPresets.json into a llama.cpp checkout (beside its CMakePresets.json) and
    `git apply` tuned.patch there; an export whose kernels are upstream's has no tuned.patch."""
    from tuner.search.study import default_run_dir
    from tuner.study.storage import check_storage, storage_guard

    if storage is None:
        db = (run_dir or default_run_dir(study)) / "study.db"
        if not db.is_file():
            raise UsageError(f"no study database at {db}. Pass --storage URL or --run-dir DIR of the search.")
        storage = f"sqlite:///{db.resolve()}"
    check_storage(storage, existing=True)  # search's and worker's check; a missing SQLite file is not created
    with storage_guard(storage):
        export_study(study, storage=storage, out_dir=out_dir, like=like, weight_type=weight_type)
    click.echo(str(out_dir))


@click.command()
@click.argument("paths", nargs=-1, type=PATH)
@click.option("--compile", "do_compile", is_flag=True, help="Also compile the touched TUs for the target.")
@click.option("--bench", "do_bench", is_flag=True, help="Also re-measure on matching hardware.")
@click.option(
    "--fetch",
    is_flag=True,
    help="Download a source a folder's SPEC names when the cache lacks it, or read its path: folder "
    "(default: fetch nothing; an uncached SPEC is a failed check).",
)
@click.option(
    "--gpu",
    "do_gpu",
    is_flag=True,
    help="On a GPU of the result's arch: build upstream.patch on the pristine tree, run test-backend-ops "
    "FLASH_ATTN_EXT on it and check it launches the tuned kernels (Nsight Compute).",
)
@click.option(
    "--soak",
    type=int,
    metavar="N",
    help="Also generate >= N tokens with each result's config (docs/soak.md uses 10000) and fail on t/s drift or a leak.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    type=PATH,
    help="With --gpu, --bench or --soak: the GGUF a result was measured on (matched by file name; repeatable).",
)
@click.option(
    "--upstream-bin",
    type=DIR,
    help="With --gpu: an existing build of the pristine tree + upstream.patch (default: build it).",
)
@click.option(
    "--tuned-bin",
    type=DIR,
    help="With --gpu: a tuner build to read the tuned kernels from live (default: config.toml's points).",
)
@click.option("--log-dir", type=DIR, help="With --gpu: where the runs' logs go (default: a temporary directory).")
@click.option(
    "--pack",
    type=FILE,
    help="With --gpu, one sweep table: also write its patched build to FILE (an xz tar), so a GPU machine "
    "without compilers or cores to spare runs the tests with --from-pack FILE. Builds without the GPU.",
)
@click.option(
    "--from-pack",
    type=FILE,
    help="With --gpu, one sweep table: install the patched build from FILE (written by --pack) instead of building.",
)
def validate(
    paths: tuple[Path, ...],
    do_compile: bool,
    do_bench: bool,
    do_gpu: bool,
    models: tuple[Path, ...],
    upstream_bin: Path | None,
    tuned_bin: Path | None,
    log_dir: Path | None,
    soak: int | None,
    pack: Path | None,
    from_pack: Path | None,
    fetch: bool,
) -> None:
    """Validate stored winners and sweep tables (default: results/). Exit 1 if any check fails.

    A folder is data: no code from it is compiled or run unless it is what tuner renders from the folder's
    own values, nothing it names is fetched (see --fetch), and only its regular files are read."""
    from tuner.result.upstream_check import check_gpu_args
    from tuner.result.validate import validate_paths

    gpu = None
    if do_gpu:
        gpu = {"upstream_bin": upstream_bin, "tuned_bin": tuned_bin, "log_dir": log_dir}
    elif upstream_bin or tuned_bin or log_dir or pack or from_pack:
        raise UsageError(
            "--upstream-bin, --tuned-bin, --log-dir, --pack and --from-pack belong to --gpu; add --gpu or drop them."
        )
    elif models and not do_bench and soak is None:
        raise UsageError(
            "--model belongs to --gpu, --bench or --soak (the checks that run a model); add one or drop it."
        )
    check_gpu_args(models, upstream_bin, tuned_bin)  # both None without --gpu
    from tuner.search.rebench import rebench
    from tuner.sweep.table_check import find_tables, validate_table

    if pack and from_pack:
        raise UsageError(
            "--pack and --from-pack are the two ends of one carry: pack on one machine, unpack on the other."
        )
    if (pack or from_pack) and (len(paths) != 1 or find_tables(paths) != [paths[0]]):
        raise UsageError(
            "--pack and --from-pack carry the build of one sweep table's patch: pass exactly one path, the "
            "table's folder (the one with its table.toml), e.g. results/sm_90/hopper-table."
        )

    roots = paths or (Path("results"),)
    checks = validate_paths(
        roots, compile=do_compile, bench=rebench if do_bench else None, gpu=gpu, models=list(models), fetch=fetch
    )
    # sweep tables (table.toml): their own checks; --gpu builds and tests their upstream.patch
    tables = find_tables(roots)
    tgpu = {"log_dir": log_dir, "pack": pack, "from_pack": from_pack}
    checks += [validate_table(t, gpu=tgpu if do_gpu else None, fetch=fetch) for t in tables]
    if not checks:
        log.warning("no results found (no config.toml or table.toml under the given paths)")
    bad = 0
    for c in checks:
        mark = "ok " if c.ok else "FAIL"
        click.echo(f"{mark} {c.path}")
        for f in c.findings:
            if not f.ok or f.detail:
                # a check that did not run is not a pass: no ✓ beside it
                mark = "✕" if not f.ok else "-" if f.detail.startswith("skipped") else "✓"
                click.echo(f"     {mark} {f.check}{': ' + f.detail if f.detail else ''}")
        bad += not c.ok
    click.echo(f"{len(checks) - bad} passed, {bad} failed")
    if soak is not None:
        from tuner.result.validate import soak_results

        bad += soak_results(roots, soak, model=models[0] if models else None, echo=click.echo)
    if bad:
        sys.exit(1)
