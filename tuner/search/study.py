"""What a search is configured with (:class:`SearchConfig`, its target resolved by
:func:`tuner.targets.target.resolve_target`), and where its study lives (SQLite in the run directory by default,
or PostgreSQL shared by several hosts).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from tuner.rounds.budget import Budget
from tuner.source.spec import Source
from tuner.targets.target import Target


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """A search as it runs: every setting resolved (:func:`tuner.search.request.resolve_search` chooses the
    defaults); a field with a default here is one that may be absent, never a second choice of a setting."""

    target: Target
    source: Source
    model: Path
    depths: tuple[int, ...]
    pp: int
    tg: int
    trials: int
    study: str
    run_dir: Path
    seed: int
    gate: bool
    min_rounds: int
    max_rounds: int
    ci_target: float
    """Percent half-width of a paired 95% CI at which rounds stop."""
    refine: int
    """Bisection steps at kernel boundaries."""
    confirm_extra: int
    """Depths the confirm stage adds between ladder depths (:func:`tuner.search.confirm.extra_depths`)."""
    reps_pp: int
    reps_tg: int
    """llama-bench repetitions per call (the median is the round's value; the first is discarded)."""
    time_budget: float | None = None
    """Seconds from ``started``; nothing starts that would end past it (a round, a trial, a build)."""
    started: float | None = None
    """``time.monotonic()`` at the command's start, which ``time_budget`` counts from (None: the pipeline's start)."""
    storage: str | None = None
    jobs: int | None = None
    variants: tuple[str, ...] | None = None
    fixed: Mapping[str, object] = dataclasses.field(default_factory=dict)
    worker: bool = False
    tune_knobs: tuple[str, ...] = ()
    tune_depths: tuple[int, ...] | None = None
    cpu_mask: tuple[int, ...] | None = None
    model_seconds: float | None = None
    """Seconds the CLI spent making the model before the search (``[cost] model_s``)."""
    prebuild_seconds: float | None = None
    """Seconds the CLI spent building upstream's variant for llama-quantize before the search (``build_s``)."""
    screen_method: str | None = None
    """``kernel``, ``llama-bench``, or None: chosen per target and study."""

    @property
    def arch(self) -> str:
        return self.target.name

    @property
    def budget(self) -> Budget:
        return Budget.counted_from(self.started, self.time_budget)

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{(self.run_dir / 'study.db').resolve()}"


def default_run_dir(study: str) -> Path:
    return Path(os.environ.get("TUNER_RUNS", "tuner-runs")) / study
