"""What a search is configured with (:class:`SearchConfig`), which arch it times (:func:`resolve_arch`),
and where its study lives (SQLite in the run directory by default, or PostgreSQL shared by several
hosts). :mod:`tuner.search.pipeline` runs the search on it; builds live in ``$TUNER_HOME/builds``.

Studies made by the earlier one-TPE search (trials with anchors, the stored H100 results) keep their
read-back in :mod:`tuner.search.record` and their selection in :mod:`tuner.search.select` and
:mod:`tuner.search.winner`; ``PROFILES`` weighs the phases for those and for the sampler replay.
"""

from __future__ import annotations

__all__ = ["PROFILES", "SearchConfig", "check_storage_url", "make_storage", "resolve_arch"]

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner import log
from tuner.errors import UsageError
from tuner.study.storage import GRACE_S, HEARTBEAT_S, STORAGE_DIALECTS, check_storage_url, make_storage  # noqa: F401 - re-exported

logger = logging.getLogger(__name__)

PROFILES: dict[str, dict[str, float]] = {
    # weight of each phase in the single objective Optuna sees (geometric mean of speed ratios)
    "decode": {"pp": 0.2, "tg": 0.8},
    "prefill": {"pp": 0.8, "tg": 0.2},
    "balanced": {"pp": 0.5, "tg": 0.5},
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchConfig:
    arch: str
    """Target arch (already resolved: detected or explicitly given and present)."""
    source_spec: str
    model: Path
    depths: tuple[int, ...] = (0, 4096, 16384, 32768)
    pp: int = 512
    tg: int = 128
    trials: int | None = 20
    time_budget: float | None = None
    """Seconds; the search stops starting new trials after this."""
    profile: str = "balanced"
    storage: str | None = None
    study: str = "tuner"
    run_dir: Path = Path("tuner-runs/tuner")
    reps: int | None = None
    target_ci: float | None = 3.0
    """Percent half-width of the median's CI at which repetitions stop."""
    max_reps: int = 10
    jobs: int | None = None
    anchor_every: int = 4
    seed: int = 0
    gate: bool = True
    variants: tuple[str, ...] | None = None
    """Restrict the space's variants (None = all the space declares)."""
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Knob values pinned by the user (``--set``)."""
    worker: bool = False
    # screen -> compose -> tune -> confirm (tuner.search.pipeline)
    min_rounds: int = 3
    max_rounds: int = 6
    ci_target: float = 1.0
    """Percent half-width of a paired 95% CI at which rounds stop."""
    refine: int = 1
    """Bisection steps at kernel boundaries."""
    confirm_extra: int = 2
    """Depths the confirm stage adds between ladder depths."""
    cpu_mask: tuple[int, ...] | None = None
    """CPUs every llama-bench call is pinned to (``--cpu-mask``; None: not pinned)."""
    reps_pp: int = 8
    model_seconds: float | None = None
    """Seconds the CLI spent synthesizing/quantizing the model before the search (config.toml's ``[cost] model_s``)."""
    reps_tg: int = 3
    """llama-bench repetitions per call (the median is the round's value; the first is discarded)."""

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{(self.run_dir / 'study.db').resolve()}"


# --------------------------------------------------------------------------------------------
# arch resolution
# --------------------------------------------------------------------------------------------


def resolve_arch(requested: str | None, *, dry_run: bool = False, replay: bool = False, ptx_jit: bool = False) -> str:
    """The arch to tune for: the requested one if present here, else the local GPU, else ``cpu``.

    ``ptx_jit`` lets an NVIDIA target run on a newer local NVIDIA GPU through ``<cc>-virtual`` PTX
    (e.g. sm_89 code on an H100): the kernels are the target's, the clocks and memory are the
    local GPU's, and every report names the GPU that was measured.

    Raises:
        UsageError: ``--arch X`` names a GPU this machine does not have (and no --dry-run/--replay).
    """
    from tuner.targets.archs import detect_local_archs, load_arch, newer_nvidia

    local = detect_local_archs()
    if requested is None:
        return local[0] if local else "cpu"
    arch = load_arch(requested)  # unknown -> UsageError with suggestions
    if arch.name == "cpu" or dry_run or replay or arch.name in local:
        return arch.name
    newer = newer_nvidia(arch.cc or 0, local) if arch.vendor == "nvidia" else []
    if ptx_jit and newer:
        log.warning(
            f"{arch.name} code runs here as {(arch.cc or 0) // 10}-virtual PTX JIT-compiled for {newer[0]}: the kernels "
            f"and their legality are {arch.name}'s, the speed is {newer[0]}'s (clocks, bandwidth, SM count)."
        )
        return arch.name
    found = ", ".join(local) if local else "no GPU (only the CPU backend)"
    hint = (
        f" To run {arch.name}'s kernels on this newer GPU anyway (PTX JIT, measured speed is this GPU's), "
        "add --ptx-jit."
        if newer
        else ""
    )
    msg = (
        f"--arch {arch.name} asks for a {arch.vendor.upper()} {arch.family} GPU, but this machine has "
        f"{found}. tuner never benchmarks one device and reports it as another. Use "
        f"`tuner search --arch {arch.name} --dry-run` to render, constraint-check and compile-check "
        f"the whole space here, or run the same command on a machine with that GPU.{hint}"
    )
    raise UsageError(msg)


# --------------------------------------------------------------------------------------------
# the study
# --------------------------------------------------------------------------------------------


# The storage (make_storage, check_storage_url) is tuner.study.storage's, below search and result
# which both open studies; its names stay importable from here.


def default_run_dir(study: str) -> Path:
    return Path(os.environ.get("TUNER_RUNS", "tuner-runs")) / study
