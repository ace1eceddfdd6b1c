"""What a search is configured with (:class:`SearchConfig`), which arch it times (:func:`resolve_arch`),
and where its study lives (SQLite in the run directory by default, or PostgreSQL shared by several
hosts). :mod:`tuner.search.pipeline` runs the search on it; builds live in ``$TUNER_HOME/builds``.

Studies made by the earlier one-TPE search (trials with anchors, the stored H100 results) keep their
read-back in :mod:`tuner.search.record` and their selection in :mod:`tuner.search.select` and
:mod:`tuner.search.winner`; ``PROFILES`` weighs the phases for those and for the sampler replay.
"""

from __future__ import annotations

__all__ = [
    "SearchConfig",
    "PROFILES",
    "check_storage_url",
    "make_storage",
    "resolve_arch",
]

import dataclasses
import logging
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner import log
from tuner.errors import UsageError
from tuner.redact import redact

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
            f"{arch.name} code runs here as {arch.cc // 10}-virtual PTX JIT-compiled for {newer[0]}: the kernels "
            f"and their legality are {arch.name}'s, the speed is {newer[0]}'s (clocks, bandwidth, SM count)."
        )
        return arch.name
    found = ", ".join(local) if local else "no GPU (only the CPU backend)"
    hint = (
        f" To run {arch.name}'s kernels on this newer GPU anyway (PTX JIT, measured speed is this GPU's), "
        "add --ptx-jit." if newer else ""
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


STORAGE_DIALECTS = ("sqlite", "postgresql", "postgres", "mysql", "mariadb")
"""Database dialects an Optuna RDB storage URL may name (``dialect[+driver]://...``)."""

_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>.*)", re.DOTALL)


def check_storage_url(url: str) -> str:
    """``url`` unchanged when it names a database that keeps the study; else a UsageError (exit 2).

    Refused: anything that is not ``dialect[+driver]://...`` with a known dialect, an in-memory SQLite
    (``sqlite://``, ``sqlite:///``, ``:memory:``, ``mode=memory``: nothing would be saved, yet a rerun
    is promised to resume), a SQLite file whose folder does not exist (SQLAlchemy would fail, or tuner
    would create folders outside the run dir unasked), a bad port. Passwords stay out of the message.
    """
    shown = redact(url)
    fix = ("Pass --storage sqlite:///PATH/study.db (an existing folder), postgresql://USER@HOST/DB, or leave "
           "--storage out for a SQLite study in the run dir.")
    if not isinstance(url, str) or not url or url != url.strip() or any(ord(c) < 32 or c.isspace() for c in url):
        raise UsageError(f"--storage {shown!r} is not a storage URL (it is empty or holds spaces or control "
                         f"characters). {fix}")
    m = _URL.fullmatch(url)
    if m is None:
        raise UsageError(f"--storage {shown!r} is not a storage URL (DIALECT://...). {fix}")
    dialect = m["scheme"].split("+", 1)[0].lower()
    if dialect not in STORAGE_DIALECTS:
        raise UsageError(f"--storage {shown!r}: unknown database {m['scheme']!r}; Optuna's RDB storage takes "
                         f"{', '.join(STORAGE_DIALECTS)}. {fix}")
    rest = m["rest"]
    if dialect == "sqlite":
        path, _, query = rest.partition("?")
        memory = (not path.startswith("/") or path in ("/", "/:memory:") or ":memory:" in path
                  or "mode=memory" in query.lower())
        if memory:
            raise UsageError(f"--storage {shown!r} keeps the study in memory: nothing would be saved and a rerun could "
                             f"not resume. {fix}")
        db = Path(path[1:])  # sqlite:///rel/x.db is relative, sqlite:////abs/x.db absolute
        if db.is_dir():
            raise UsageError(f"--storage {shown!r} names the folder {db}, not a database file. Add a file name, e.g. "
                             f"sqlite:///{(db / 'study.db')}.")
        if not db.parent.is_dir():
            raise UsageError(f"--storage {shown!r}: the folder {db.parent} does not exist, and tuner creates no "
                             f"folders outside the run dir unasked. Create it first (mkdir -p {db.parent}) or pick "
                             "a path in an existing folder.")
        return url
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a non-numeric or out-of-range port
    except ValueError as err:
        raise UsageError(f"--storage {shown!r} does not parse as a URL ({redact(err)}). {fix}") from None
    if not parts.hostname and "host=" not in parts.query:
        raise UsageError(f"--storage {shown!r} names no database host. {fix}")
    return url


def make_storage(url: str) -> Any:
    """The Optuna RDB storage at ``url`` (checked by :func:`check_storage_url`), with the tune trials' heartbeat
    and stale-trial retry; a UsageError that names the fix when it cannot be opened."""
    import optuna

    check_storage_url(url)
    try:
        with warnings.catch_warnings():
            # Heartbeats and stale-trial retry are experimental in Optuna 5; we rely on them knowingly.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=GRACE_S,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2),
                engine_kwargs={"pool_pre_ping": True} if url.startswith("postgresql") else None,
            )
    except ImportError as err:
        from tuner.extras import missing_module_error

        raise missing_module_error(err) or UsageError(
            f"storage {redact(url)!r} needs a database driver that is not installed ({err})."
        ) from None
    except Exception as err:  # sqlalchemy OperationalError and friends
        raise UsageError(
            f"cannot open the study storage {redact(url)!r}: {redact(_first_line(err))}. Check the URL, that the server "
            "is up and that the database exists (createdb NAME)."
        ) from None


HEARTBEAT_S = 10
"""Seconds between a running tune trial's heartbeats (a thread records them in the storage)."""
GRACE_S = 60
"""A RUNNING trial without a heartbeat for this long belongs to a process that died: it is failed and
re-run (Optuna's fail_stale_trials; a retry copy of it is queued)."""


def _first_line(err: BaseException) -> str:
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    return lines[0].strip()[:400] if lines else type(err).__name__


def default_run_dir(study: str) -> Path:
    return Path(os.environ.get("TUNER_RUNS", "tuner-runs")) / study
