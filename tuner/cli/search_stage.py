"""The stage ``tuner search`` and ``tuner worker`` call: resolve the request, run the search and export its
result. It lives in the command-line layer because ``search/`` and ``result/`` may not import each other.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from tuner import interrupts, log
from tuner.redact import redact
from tuner.rounds.budget import BudgetReached
from tuner.search.request import SearchRequest, resolve_search
from tuner.search.study import SearchConfig
from tuner.source.spec import DEFAULT_SPEC
from tuner.study.record import SearchOutcome


def _announce(cfg: SearchConfig, request: SearchRequest) -> str:
    """Log what the search runs on; returns the storage URL as shown (a password never reaches a log)."""
    shown = redact(cfg.storage_url)
    log.info(
        f"tuner search: arch {cfg.arch}, source {request.source_spec or DEFAULT_SPEC} (era {cfg.source.era}), model {cfg.model.name}, "
        f"depths {list(cfg.depths)}, pp{cfg.pp}/tg{cfg.tg}\n"
        f"  study {cfg.study!r} in {shown}; run dir {cfg.run_dir}\n"
        f"  {dashboard_hint(cfg.storage_url)}"
    )
    return shown


def _resolved(request: SearchRequest, *, worker: bool = False) -> SearchConfig:
    try:
        return resolve_search(request, worker=worker)
    except BudgetReached as stop:  # the build or model it needs would end past --time-budget
        raise BudgetReached(
            f"time budget reached before {stop}; nothing was started. Give a longer --time-budget."
        ) from None


def search_and_export(request: SearchRequest, out: Path | None = None) -> SearchOutcome:
    """Run (or resume) the search ``request`` asks for and export its result into ``out`` (default
    ``<run dir>/export``); returns the outcome. BudgetReached where the time budget stopped it."""
    from tuner.cli.export_cmd import export_study
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
